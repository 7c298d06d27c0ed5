//! `POST /v1/embeddings`: OpenAI's embeddings endpoint over the facade's
//! [`lm::Embedder`] (final hidden states, pooled by `--pooling`,
//! L2-normalised). The vectors are computed on the model directly, beside
//! the scheduler's batch, one request at a time ([`App::direct_lock`]),
//! each input from a fresh state: an input's vector is the same bits alone
//! or among others.
//!
//! `input` is a string, a list of strings, a list of token ids or a list of
//! such lists; `encoding_format` is `float` or `base64` (little-endian
//! `f32` bytes); `dimensions` other than the model's width is a 400 (no
//! truncation is trained into these vectors); `user` is ignored.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lm_core::TokenId;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::request::{Fields, check_model};
use crate::routes::{App, InFlight, json_body};

/// The most inputs one request may hold (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// What one input is.
#[derive(Debug, Clone, PartialEq)]
enum Input {
    Text(String),
    Tokens(Vec<TokenId>),
}

/// A `/v1/embeddings` body, read and checked.
#[derive(Debug, Clone, PartialEq)]
struct EmbeddingRequest {
    inputs: Vec<Input>,
    base64: bool,
    dimensions: Option<i64>,
    model: Option<String>,
}

/// Reads a `/v1/embeddings` body.
fn read(body: &Value) -> Result<EmbeddingRequest, ApiError> {
    let f = Fields::of(body)?;
    let inputs = inputs(f.get("input"))?;
    let base64 = match f.get("encoding_format") {
        None => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(v) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("'encoding_format' must be \"float\" or \"base64\", got {v}"),
            ));
        }
    };
    let model = f.string("model")?.map(str::to_owned);
    Ok(EmbeddingRequest {
        inputs,
        base64,
        dimensions: f.integer_in("dimensions", 1, i64::MAX)?,
        model,
    })
}

/// `input`: a string, strings, token ids, or lists of token ids; none
/// empty, at most [`MAX_INPUTS`].
fn inputs(value: Option<&Value>) -> Result<Vec<Input>, ApiError> {
    const SHAPE: &str = "'input' must be a string, an array of strings, an array of token ids \
                         or an array of arrays of token ids";
    let refuse = |message: String| ApiError::invalid("input", message);
    let ids = |items: &[Value]| -> Result<Vec<TokenId>, ApiError> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|id| TokenId::try_from(id).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| refuse("'input' token ids must be non-negative integers".into()))
    };
    let inputs = match value {
        None => return Err(refuse("'input' is required".into())),
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(refuse("'input' must not be empty".into()));
        }
        Some(Value::Array(items)) if items.len() > MAX_INPUTS => {
            return Err(refuse(format!(
                "'input' may hold at most {MAX_INPUTS} inputs, got {}",
                items.len()
            )));
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|v| Input::Text(v.as_str().unwrap_or_default().to_owned()))
            .collect(),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![Input::Tokens(ids(items)?)]
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|v| ids(v.as_array().map_or(&[][..], Vec::as_slice)).map(Input::Tokens))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(refuse(SHAPE.into())),
    };
    if let Some(i) = inputs.iter().position(|input| match input {
        Input::Text(s) => s.is_empty(),
        Input::Tokens(ids) => ids.is_empty(),
    }) {
        return Err(refuse(format!("'input[{i}]' is empty")));
    }
    Ok(inputs)
}

/// The handler of `POST /v1/embeddings`.
pub(crate) async fn embeddings(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match answer(&app, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn answer(app: &Arc<App>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let request = read(&json_body(body)?)?;
    check_model(
        request.model.as_deref(),
        app.model_id(),
        app.config.any_model,
    )?;
    let Some(embedder) = app.embedder.get().cloned() else {
        return Err(ApiError::invalid(
            "model",
            "this server's model gives no embeddings (a transformer served by lm-cli serve does; \
             a library server needs Server::with_embeddings)",
        ));
    };
    let width = embedder.width();
    if let Some(asked) = request.dimensions
        && usize::try_from(asked).ok() != Some(width)
    {
        return Err(ApiError::invalid(
            "dimensions",
            format!(
                "'dimensions' must be this model's width, {width}: its vectors cannot be shortened"
            ),
        ));
    }
    let mut token_lists = Vec::with_capacity(request.inputs.len());
    for (i, input) in request.inputs.into_iter().enumerate() {
        let ids = match input {
            Input::Text(text) => app
                .text
                .encode(&text)
                .map_err(|e| ApiError::invalid("input", format!("'input[{i}]': {e}")))?,
            Input::Tokens(ids) => ids,
        };
        check_tokens(&embedder, i, &ids)?;
        token_lists.push(ids);
    }
    let in_flight = InFlight::new(app);
    if app.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )
        .retry_after(5));
    }
    let n_prompt: usize = token_lists.iter().map(Vec::len).sum();
    let vectors = {
        let _turn = app.direct_lock.lock().await;
        tokio::task::spawn_blocking(move || {
            token_lists
                .iter()
                .map(|ids| embedder.embed_tokens(ids))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::invalid("input", e.to_string()))?
    };
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if request.base64 {
                json!(base64_f32(vector))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    drop(in_flight);
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": app.model_id(),
        "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt},
    }))
    .into_response())
}

/// Input `i`'s ids are in the vocabulary and fit the context.
fn check_tokens(embedder: &lm::Embedder, i: usize, ids: &[TokenId]) -> Result<(), ApiError> {
    let vocab_size = embedder.vocab_size();
    if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(ApiError::invalid(
            "input",
            format!(
                "'input[{i}]' holds {id}, not a token id of this model (vocabulary of {vocab_size})"
            ),
        ));
    }
    if ids.is_empty() {
        return Err(ApiError::invalid("input", format!("'input[{i}]' is empty")));
    }
    match embedder.max_tokens() {
        Some(max) if ids.len() > max => Err(ApiError::invalid(
            "input",
            format!(
                "this model's maximum context length is {max} tokens, and 'input[{i}]' has {}",
                ids.len()
            ),
        )
        .with_code("context_length_exceeded")),
        _ => Ok(()),
    }
}

/// `vector`'s little-endian `f32` bytes in standard base64 (what OpenAI's
/// `encoding_format: "base64"` returns and its client decodes).
fn base64_f32(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    crate::webui::base64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // 1.0f32 is 00 00 80 3f; 1.0, -2.0 is 00 00 80 3f 00 00 00 c0.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
        assert_eq!(base64_f32(&[1.0, -2.0, 0.5]), "AACAPwAAAMAAAAA/");
        assert_eq!(base64_f32(&[]), "");
    }

    #[test]
    fn every_input_shape_is_read_and_bad_ones_name_the_field() {
        let inputs = |input: Value| read(&json!({"input": input})).map(|r| r.inputs);
        assert_eq!(inputs(json!("a")).unwrap(), vec![Input::Text("a".into())]);
        assert_eq!(
            inputs(json!(["a", "b"])).unwrap(),
            vec![Input::Text("a".into()), Input::Text("b".into())]
        );
        assert_eq!(
            inputs(json!([1, 2])).unwrap(),
            vec![Input::Tokens(vec![1, 2])]
        );
        assert_eq!(
            inputs(json!([[1], [2, 3]])).unwrap(),
            vec![Input::Tokens(vec![1]), Input::Tokens(vec![2, 3])]
        );
        for bad in [
            json!(null),
            json!(3),
            json!([]),
            json!(""),
            json!(["a", ""]),
            json!([[1], []]),
            json!([-1]),
            json!(["a", 1]),
            json!(vec!["a"; MAX_INPUTS + 1]),
        ] {
            let error = inputs(bad.clone()).unwrap_err();
            assert_eq!(error.param.as_deref(), Some("input"), "{bad}");
        }
        for (body, param) in [
            (
                json!({"input": "a", "encoding_format": "hex"}),
                "encoding_format",
            ),
            (json!({"input": "a", "dimensions": 0}), "dimensions"),
            (json!({"input": "a", "model": 1}), "model"),
        ] {
            assert_eq!(read(&body).unwrap_err().param.as_deref(), Some(param));
        }
        let r = read(
            &json!({"input": "a", "encoding_format": "base64", "dimensions": 576,
                             "user": "x", "model": "m"}),
        )
        .unwrap();
        assert_eq!(
            (r.base64, r.dimensions, r.model.as_deref()),
            (true, Some(576), Some("m"))
        );
    }
}
