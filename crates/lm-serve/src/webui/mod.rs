//! The chat page at `GET /` (issue 41): one HTML file, its CSS and plain
//! JavaScript inline, embedded in the binary with `include_str!` (no build
//! step; nothing is fetched from anywhere but this server, which the page's
//! Content-Security-Policy enforces). The page talks to the server's own
//! `/v1/chat/completions` with `stream: true`, `logprobs` and the project's
//! `lm_trace` (see `trace.rs`); it shows each token coloured by its
//! probability, the top alternatives before and after the sampling stages
//! with the draw `u`, and one step's distribution re-softmaxed from its raw
//! logits at any temperature (lesson 000's worked table, in the page).
//!
//! The Content-Security-Policy allows no inline code but the page's own:
//! its one `<script>` and one `<style>` are named by their SHA-256 hashes
//! (computed once, at the first request), so an injected script or style
//! would not run.
//!
//! The page is served without the API key (it holds no data); with
//! `--api-key` it asks for the key and sends it as `Authorization: Bearer`.
//! `--no-webui` ([`crate::ServeConfig::webui`] false) leaves `/` to the 404.

use std::sync::LazyLock;

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

/// The page: HTML with its CSS and JavaScript inline.
const PAGE: &str = include_str!("index.html");

/// Only the page's own script and style, requests only to this server, no
/// frames.
static CONTENT_SECURITY_POLICY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; \
         img-src data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        source_hash(inline(PAGE, "script")),
        source_hash(inline(PAGE, "style")),
    )
});

/// The text of `page`'s one `<tag>` element, as the browser hashes it
/// (everything between `<tag>` and `</tag>`).
fn inline<'a>(page: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = page.find(&open).map(|i| i + open.len());
    let text = start.and_then(|start| Some(&page[start..start + page[start..].find(&close)?]));
    text.unwrap_or_else(|| panic!("the page has one <{tag}> element"))
}

/// A CSP hash source: `sha256-` and the base64 of the text's SHA-256.
fn source_hash(text: &str) -> String {
    format!("sha256-{}", base64(&Sha256::digest(text.as_bytes())))
}

/// Standard base64 with padding (RFC 4648, section 4): the page's CSP
/// hashes, and the embeddings' `encoding_format: "base64"`.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * k)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

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
            (
                header::CONTENT_SECURITY_POLICY,
                CONTENT_SECURITY_POLICY.as_str(),
            ),
        ],
        PAGE,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::{CONTENT_SECURITY_POLICY, PAGE, base64, inline, source_hash};

    #[test]
    fn base64_is_rfc_4648s() {
        // RFC 4648, section 10.
        for (bytes, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(bytes.as_bytes()), want);
        }
    }

    #[test]
    fn the_policy_names_the_pages_script_and_style_by_hash_and_no_unsafe_inline() {
        // `printf 'alert(1)' | openssl dgst -sha256 -binary | base64`
        assert_eq!(
            source_hash("alert(1)"),
            "sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI="
        );
        let csp = CONTENT_SECURITY_POLICY.as_str();
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        let script = inline(PAGE, "script");
        assert!(script.contains("\"use strict\";") && !script.contains("</script>"));
        assert!(
            csp.contains(&format!("script-src '{}'", source_hash(script))),
            "{csp}"
        );
        let style = inline(PAGE, "style");
        assert!(
            csp.contains(&format!("style-src '{}'", source_hash(style))),
            "{csp}"
        );
        assert_eq!(PAGE.matches("<script").count(), 1, "one script to hash");
        assert_eq!(PAGE.matches("<style").count(), 1, "one style to hash");
        // Hashes cover elements, not attributes: no `style="..."` and no
        // `on...="..."` handler in the markup.
        let markup = PAGE.replace(script, "");
        let handler = markup.split(" on").skip(1).find(|rest| {
            let name_len = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            name_len > 0 && rest[name_len..].starts_with("=")
        });
        assert_eq!(handler, None, "an inline event handler");
        assert!(!markup.contains(" style="), "an inline style attribute");
    }

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
