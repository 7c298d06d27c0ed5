//! The crate's errors: [`ServeError`] for the embedding program (binding,
//! serving), and `ApiError`, an HTTP answer in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`) that names the field
//! or limit at fault.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address could not be bound (in use, no permission).
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Accepting or serving connections failed.
    #[error("serving HTTP failed")]
    Io(#[source] std::io::Error),
    /// A setting that cannot work (no worker, an empty queue).
    #[error("invalid server setting {name}: {reason}")]
    InvalidSetting {
        /// The setting's name, as `lm-cli serve` spells its flag.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A several-model server's model could not be loaded at start.
    #[error("cannot load the model '{id}'")]
    Load {
        /// The id it is served as.
        id: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// An error answered to an HTTP client.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// The request field at fault, when there is one.
    pub(crate) param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, ...).
    pub(crate) code: Option<&'static str>,
    /// Seconds to wait before retrying (429, 503).
    pub(crate) retry_after: Option<u64>,
}

/// A policy setting lm-decode refused: a 400 naming its request field.
impl From<lm_decode::sampler::InvalidSetting> for ApiError {
    fn from(refused: lm_decode::sampler::InvalidSetting) -> Self {
        let field = lm_decode::SamplingConfig::FIELDS
            .iter()
            .find(|field| field.name == refused.field)
            .map_or(refused.field, |field| field.api);
        Self::invalid(field, refused.to_string())
    }
}

impl ApiError {
    /// A 400 about `param`.
    pub(crate) fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_owned()),
            code: None,
            retry_after: None,
        }
    }

    /// An answer with `status` and no field at fault.
    pub(crate) fn status(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub(crate) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// OpenAI's `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body, `{"error": {...}}`.
    pub(crate) fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
