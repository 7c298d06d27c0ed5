//! The chat page at `GET /` (issue 41): one HTML file, its CSS and plain
//! JavaScript inline, embedded in the binary with `include_str!` (no build
//! step; nothing is fetched from anywhere but this server, which the page's
//! Content-Security-Policy enforces). The page talks to the server's own
//! `/v1/chat/completions` with `stream: true` and `logprobs`, so it needs
//! nothing the OpenAI API lacks; it shows each token coloured by its
//! probability, the top alternatives, and one step's distribution
//! re-softmaxed at any temperature (lesson 000's worked table, in the page).
//!
//! The page is served without the API key (it holds no data); with
//! `--api-key` it asks for the key and sends it as `Authorization: Bearer`.
//! `--no-webui` ([`crate::ServeConfig::webui`] false) leaves `/` to the 404.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The page: HTML with its CSS and JavaScript inline.
const PAGE: &str = include_str!("index.html");

/// Only inline script and style, requests only to this server, no frames.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src data: blob:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The routes of the page: `GET /` when `enabled`, none otherwise.
pub(crate) fn router<S: Clone + Send + Sync + 'static>(enabled: bool) -> Router<S> {
    if enabled {
        Router::new().route("/", get(page))
    } else {
        Router::new()
    }
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        ],
        PAGE,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::PAGE;

    #[test]
    fn the_page_is_small_and_self_contained() {
        assert!(PAGE.len() < 100 * 1024, "{} bytes", PAGE.len());
        for outside in ["src=\"http", "href=\"http", "@import", "url(http"] {
            assert!(
                !PAGE.contains(outside),
                "the page refers outside: {outside}"
            );
        }
    }
}
