//! The HTTP endpoints: OpenAI's `/v1/completions`, `/v1/chat/completions`
//! and `/v1/models`, plus `/health`, `/tokenize`, `/detokenize` and
//! `/metrics`. A handler checks the request (fields, context and `n`
//! limits), queues one job per choice and answers with the events its
//! workers send: whole, or as server-sent events ending in `data: [DONE]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lm_core::TokenId;
use lm_decode::{GenerationConfig, SamplingConfig, context_room};
use serde_json::{Value, json};
use tokio::sync::mpsc::unbounded_channel;

use crate::ServeConfig;
use crate::answer::Answer;
use crate::echo;
use crate::error::ApiError;
use crate::formats::FormatCache;
use crate::metrics::Metrics;
use crate::reasoning::{self, Thinking};
use crate::request::{self, Prompt, Sampling};
use crate::scheduler::{Job, JobQueue};
use crate::surrogates::replace_lone_surrogates;
use crate::text::ServedText;
use crate::tools::{self, ToolMode};
use crate::trace;

/// Most new tokens a request may ask of a model without a context bound.
const MAX_TOKENS_UNBOUNDED: u64 = 1 << 16;
/// `max_tokens` of a completion that does not say (OpenAI's default).
const DEFAULT_COMPLETION_TOKENS: u64 = 16;

/// What every handler shares.
pub(crate) struct App {
    /// The id the model is served as: `/v1/models`, each answer's `model`,
    /// and what a request's `model` is compared with.
    pub(crate) model_id: String,
    pub(crate) text: Arc<dyn ServedText>,
    pub(crate) queue: Arc<JobQueue>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: ServeConfig,
    pub(crate) vocab_size: usize,
    pub(crate) context_length: Option<usize>,
    pub(crate) end_tokens: Vec<TokenId>,
    pub(crate) banned_tokens: Vec<TokenId>,
    /// The compiled `response_format`s.
    pub(crate) formats: FormatCache,
    /// Set once shutdown began: new work gets a 503.
    pub(crate) stopping: AtomicBool,
    /// Requests queued or generating, until their answer is sent (or the
    /// client is gone): shutdown drains them.
    pub(crate) in_flight: tokio::sync::watch::Sender<usize>,
    pub(crate) created: u64,
    /// The number in the next answer's id (`cmpl-N`); a several-model
    /// server's models share one, so no two answers share an id.
    pub(crate) next_id: Arc<AtomicU64>,
    /// What saves the prefix cache (`--cache-dir`; `POST /slots/save`).
    pub(crate) saved_cache: Option<Arc<dyn crate::persist::SaveCache>>,
    /// The served model, for scoring an echoed prompt (`echo.rs`).
    pub(crate) scorer: Arc<dyn echo::ScorePrompt>,
    /// `/v1/embeddings`' model, once given ([`crate::Server::with_embeddings`]).
    pub(crate) embedder: std::sync::OnceLock<lm::Embedder>,
    /// Held by a request running on the model beside the scheduler (an
    /// echo scored, inputs embedded), so one such runs at a time.
    pub(crate) direct_lock: tokio::sync::Mutex<()>,
}

/// The router over `app`.
pub(crate) fn router(app: Arc<App>) -> Router {
    let origins = cors_state(&app.config);
    api_router(app)
        // Outermost, so errors (401, 404, 413) carry the CORS headers too.
        .layer(middleware::from_fn_with_state(origins, cors))
}

/// [`router`] without CORS: what a several-model server's front (`hub.rs`)
/// forwards to, its own CORS layer outside.
pub(crate) fn api_router(app: Arc<App>) -> Router {
    let limit = app.config.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route("/slots/save", post(save_slots))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            require_key,
        ))
        .route("/health", get(health))
        // The chat page needs no key: it asks for it (see webui).
        .merge(crate::webui::router(app.config.webui))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&app), count))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

/// What the [`cors`] middleware reads: the `--cors` origins.
pub(crate) fn cors_state(config: &ServeConfig) -> Arc<[String]> {
    config.cors_origins.clone().into()
}

/// Whether `text` can be a `--cors` origin ([`crate::ServeConfig::cors_origins`]):
/// `*`, or `scheme://host[:port]` (what browsers send in `Origin`: no path,
/// no trailing slash).
pub fn is_cors_origin(text: &str) -> bool {
    if text == "*" {
        return true;
    }
    let Some((scheme, host)) = text.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        && !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"/?#".contains(&b))
}

/// CORS for `--cors` origins: a preflight (`OPTIONS` with
/// `Access-Control-Request-Method`) is answered here, before the API key
/// is asked for (browsers send none with it); any other answer to an
/// allowed origin gets `Access-Control-Allow-Origin`. Requests from other
/// origins, or with no `--cors`, get no CORS headers, so browsers refuse
/// them.
pub(crate) async fn cors(
    State(origins): State<Arc<[String]>>,
    request: Request,
    next: Next,
) -> Response {
    let allowed = request.headers().get(header::ORIGIN).and_then(|origin| {
        if origins.iter().any(|o| o == "*") {
            Some(HeaderValue::from_static("*"))
        } else {
            origins
                .iter()
                .any(|o| o.as_bytes() == origin.as_bytes())
                .then(|| origin.clone())
        }
    });
    let Some(allow_origin) = allowed else {
        return next.run(request).await;
    };
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        let allow_headers = request
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
        let mut response = StatusCode::NO_CONTENT.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allow_headers);
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("86400"),
        );
        response
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("retry-after"),
    );
    headers.append(header::VARY, HeaderValue::from_static("origin"));
    response
}

/// Seconds since the Unix epoch: the `created` of responses and models.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl App {
    /// `body` with [`ServeConfig::request_defaults`] where it leaves a
    /// field out (absent or `null`).
    fn with_request_defaults(&self, mut body: Value) -> Value {
        if let Some(fields) = body.as_object_mut() {
            for (name, value) in &self.config.request_defaults {
                if fields.get(name).is_none_or(Value::is_null) {
                    fields.insert(name.clone(), value.clone());
                }
            }
        }
        body
    }

    /// A 404 when the request names a model this server does not serve
    /// ([`request::check_model`]).
    fn check_requested_model(&self, sampling: &Sampling) -> Result<(), ApiError> {
        request::check_model(
            sampling.model.as_deref(),
            self.model_id(),
            self.config.any_model,
        )
    }

    /// The served model's id ([`crate::ServeConfig::model_id`]).
    pub(crate) fn model_id(&self) -> &str {
        &self.model_id
    }

    fn id(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Completes once no request is in flight.
    pub(crate) async fn idle(&self) {
        let _ = self.in_flight.subscribe().wait_for(|&n| n == 0).await;
    }
}

/// One request in flight, from its queueing to the end of its answer.
pub(crate) struct InFlight(Arc<App>);

impl InFlight {
    pub(crate) fn new(app: &Arc<App>) -> Self {
        app.in_flight.send_modify(|n| *n += 1);
        Self(Arc::clone(app))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.send_modify(|n| *n -= 1);
    }
}

/// Counts every answer by status for `/metrics`, and marks it [`Counted`].
async fn count(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    app.metrics.record_request(response.status().as_u16());
    response.extensions_mut().insert(Counted);
    response
}

/// An answer a model's routes counted, so a several-model server's front
/// (`hub.rs`) does not count it again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counted;

/// With `--api-key`, every route but `/health` needs `Authorization: Bearer KEY`.
async fn require_key(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    match check_key(&app.config, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

/// A 401 unless `headers` carry `config`'s API key (or it has none).
pub(crate) fn check_key(config: &ServeConfig, headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(key) = &config.api_key {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        if !given.is_some_and(|given| same_bytes(given.as_bytes(), key.as_bytes())) {
            return Err(ApiError::status(
                StatusCode::UNAUTHORIZED,
                "missing or incorrect API key: send 'Authorization: Bearer KEY'",
            )
            .with_code("invalid_api_key"));
        }
    }
    Ok(())
}

/// The credentials of a `Bearer` authorization: the scheme in any case,
/// then one or more spaces (RFC 7235: `bearer  KEY`, `BEARER KEY`).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once([' ', '\t'])?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches([' ', '\t']))
}

/// Compares without stopping at the first difference (no timing hint).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found() -> ApiError {
    ApiError::status(StatusCode::NOT_FOUND, "no such endpoint")
}

async fn health(State(app): State<Arc<App>>) -> Response {
    health_answer(app.stopping.load(Ordering::Relaxed))
}

/// `GET /health`: ok, or a 503 once shutdown began.
pub(crate) fn health_answer(stopping: bool) -> Response {
    if stopping {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "stopping"})),
        )
            .into_response()
    } else {
        axum::Json(json!({"status": "ok"})).into_response()
    }
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": app.model_id(),
            "object": "model",
            "created": app.created,
            "owned_by": "lm",
            "context_length": app.context_length,
        }],
    }))
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(app.queue.len()),
    )
        .into_response()
}

/// `POST /slots/save` (llama-server's name): writes the prefix cache to
/// `--cache-dir` now, and answers how many states and bytes; a 400 without
/// `--cache-dir`, a 500 naming the failure.
async fn save_slots(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let Some(saver) = app.saved_cache.clone() else {
        return Err(ApiError::status(
            StatusCode::BAD_REQUEST,
            "the server keeps no cache on disk (start it with --cache-dir DIR)",
        ));
    };
    let started = Instant::now();
    let saved = tokio::task::spawn_blocking(move || saver.save().map(|r| (r, saver.file())))
        .await
        .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let (report, file) = saved.map_err(|error| {
        ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the prefix cache was not saved: {error}"),
        )
    })?;
    Ok(axum::Json(json!({
        "n_saved": report.n_states,
        "n_written": report.n_bytes,
        "filename": file.file_name().map(|name| name.to_string_lossy().into_owned()),
        "timings": {"save_ms": started.elapsed().as_secs_f64() * 1e3},
    }))
    .into_response())
}

/// The 413's message.
pub(crate) const BODY_TOO_LARGE: &str =
    "the request body is larger than the server accepts (--max-body-bytes)";

/// The body as JSON: a body over the cap is a 413, bad JSON a 400.
pub(crate) fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            BODY_TOO_LARGE.to_owned()
        } else {
            rejection.body_text()
        };
        ApiError::status(status, message)
    })?;
    serde_json::from_slice(&replace_lone_surrogates(&bytes))
        .map_err(|e| ApiError::invalid("body", format!("the request body is not valid JSON: {e}")))
}

async fn tokenize(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = (|| {
        let body = json_body(body)?;
        let content = body
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid("content", "'content' must be a string"))?;
        let tokens = app
            .text
            .encode(content)
            .map_err(|e| ApiError::invalid("content", e.to_string()))?;
        Ok::<_, ApiError>(axum::Json(json!({ "tokens": tokens })))
    })();
    result.into_response()
}

async fn detokenize(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = (|| {
        let body = json_body(body)?;
        let tokens = token_ids(body.get("tokens"), "tokens", app.vocab_size)?;
        let content = app.text.detokenizer().decode(&tokens);
        Ok::<_, ApiError>(axum::Json(json!({ "content": content })))
    })();
    result.into_response()
}

/// Token ids from a JSON array, each checked against the vocabulary.
fn token_ids(
    value: Option<&Value>,
    param: &str,
    vocab_size: usize,
) -> Result<Vec<TokenId>, ApiError> {
    let items = value.and_then(Value::as_array).ok_or_else(|| {
        ApiError::invalid(param, format!("'{param}' must be an array of token ids"))
    })?;
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .filter(|&id| id < vocab_size as u64)
                .map(|id| id as TokenId)
                .ok_or_else(|| {
                    ApiError::invalid(
                        param,
                        format!("'{param}' holds {v}, not a token id of this model (vocabulary of {vocab_size})"),
                    )
                })
        })
        .collect()
}

/// Which endpoint a response is shaped for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Completion,
    Chat,
}

async fn completions(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let prepared = (|| {
        let request = request::completion(&app.with_request_defaults(json_body(body)?))?;
        app.check_requested_model(&request.sampling)?;
        let (prompt, text) = match request.prompt {
            Prompt::Text(text) => (
                app.text
                    .encode(&text)
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
                text,
            ),
            Prompt::Tokens(ids) => {
                let ids = token_ids(Some(&json!(ids)), "prompt", app.vocab_size)?;
                let text = if request.echo {
                    app.text.detokenizer().decode(&ids)
                } else {
                    String::new()
                };
                (ids, text)
            }
        };
        let echo = request.echo.then_some(text);
        Ok::<_, ApiError>((prompt, request.sampling, request.logprobs, echo))
    })();
    match prepared {
        Ok((prompt, sampling, logprobs, echo)) => {
            run(
                &app,
                Kind::Completion,
                prompt,
                sampling,
                logprobs,
                None,
                echo,
                None,
            )
            .await
        }
        Err(error) => error.into_response(),
    }
}

async fn chat_completions(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let request = request::chat(&app.with_request_defaults(json_body(body)?))?;
        app.check_requested_model(&request.sampling)?;
        let text = &*app.text;
        // Message contents literal unless --parse-special (see ServedText).
        let (prompt, tools) = tools::encode_chat(
            text,
            &request.messages,
            &request.template_kwargs,
            request.tools.as_ref(),
            &request.sampling,
            app.config.parse_special,
        )?;
        let on = app.config.reasoning;
        let thinking = reasoning::thinking(text, on, &request.template_kwargs, &prompt);
        Ok::<_, ApiError>((prompt, request.sampling, request.logprobs, tools, thinking))
    })();
    match prepared {
        Ok((prompt, sampling, logprobs, tools, thinking)) => {
            run(
                &app,
                Kind::Chat,
                prompt,
                sampling,
                logprobs,
                tools,
                None,
                thinking,
            )
            .await
        }
        Err(error) => error.into_response(),
    }
}

/// The generation config of choice `index` after checking the limits.
fn generation_config(
    app: &App,
    kind: Kind,
    n_prompt: usize,
    s: &Sampling,
    logprobs: Option<usize>,
) -> Result<GenerationConfig, ApiError> {
    if n_prompt == 0 {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if s.n > app.config.parallel {
        return Err(ApiError::invalid(
            "n",
            format!(
                "'n' is {}, more than this server generates at once (--parallel {})",
                s.n, app.config.parallel
            ),
        ));
    }
    let max_new_tokens = max_new_tokens(app.context_length, kind, n_prompt, s.max_tokens)?;
    if let Some(&(id, _)) = s
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= app.vocab_size)
    {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "'logit_bias' names token {id}, beyond the vocabulary of {}",
                app.vocab_size
            ),
        ));
    }
    Ok(GenerationConfig {
        max_new_tokens: usize::try_from(max_new_tokens).unwrap_or(usize::MAX),
        sampling: SamplingConfig {
            banned_tokens: app.banned_tokens.clone(),
            // No seed: a fresh one, so unseeded requests differ.
            seed: s.seed.unwrap_or_else(SamplingConfig::fresh_seed),
            ..s.policy.clone()
        },
        end_tokens: app.end_tokens.clone(),
        stop_strings: s.stop.clone(),
        prefill_chunk_len: Some(app.config.prefill_chunk_len),
        n_top_candidates: trace::n_top_candidates(logprobs, s.trace),
        num_return_sequences: 1,
        rng_stream: 0,
        ..GenerationConfig::default()
    })
}

/// The most tokens a choice may generate: `max_tokens` if the context has
/// room for it, else a 400; without it, what the context leaves (a
/// completion at most [`DEFAULT_COMPLETION_TOKENS`]).
fn max_new_tokens(
    context_length: Option<usize>,
    kind: Kind,
    n_prompt: usize,
    max_tokens: Option<u64>,
) -> Result<u64, ApiError> {
    let (Some(ctx), Some(room)) = (context_length, context_room(context_length, n_prompt)) else {
        return match max_tokens {
            Some(n) if n > MAX_TOKENS_UNBOUNDED => Err(ApiError::invalid(
                "max_tokens",
                format!("'max_tokens' may be at most {MAX_TOKENS_UNBOUNDED} for this model"),
            )),
            Some(n) => Ok(n),
            None if kind == Kind::Completion => Ok(DEFAULT_COMPLETION_TOKENS),
            None => Ok(MAX_TOKENS_UNBOUNDED),
        };
    };
    let room = room as u64;
    if room == 0 {
        let param = match kind {
            Kind::Completion => "prompt",
            Kind::Chat => "messages",
        };
        return Err(ApiError::invalid(
            param,
            format!(
                "this model's maximum context length is {ctx} tokens, and the prompt has {n_prompt}"
            ),
        )
        .with_code("context_length_exceeded"));
    }
    match (max_tokens, kind) {
        (Some(n), _) if n > room => Err(ApiError::invalid(
            "max_tokens",
            format!(
                "this model's maximum context length is {ctx} tokens; you requested {} \
                 ({n_prompt} in the prompt, {n} for the completion)",
                n_prompt as u64 + n
            ),
        )
        .with_code("context_length_exceeded")),
        (Some(n), _) => Ok(n),
        (None, Kind::Completion) => Ok(DEFAULT_COMPLETION_TOKENS.min(room)),
        (None, Kind::Chat) => Ok(room),
    }
}

/// Queues the request's `n` choices and answers with their events; with
/// `echo` (the prompt's text), each choice starts with the prompt.
#[allow(clippy::too_many_arguments)] // one request's parts
async fn run(
    app: &Arc<App>,
    kind: Kind,
    prompt: Vec<TokenId>,
    sampling: Sampling,
    logprobs: Option<usize>,
    tools: Option<ToolMode>,
    echo: Option<String>,
    thinking: Option<Thinking>,
) -> Response {
    // Counted before the check, so shutdown either waits for this request
    // or this request sees it began.
    let in_flight = InFlight::new(app);
    if app.stopping.load(Ordering::SeqCst) {
        return ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )
        .retry_after(5)
        .into_response();
    }
    let mut config = match generation_config(app, kind, prompt.len(), &sampling, logprobs) {
        Ok(config) => config,
        Err(error) => return error.into_response(),
    };
    let enforced = match &tools {
        Some(ToolMode {
            grammar: Some(grammar),
            ..
        }) => Some((grammar, "tools")),
        _ => sampling
            .response_format
            .as_ref()
            .map(|format| (format, sampling.format_param)),
    };
    if let Some((format, param)) = enforced {
        match app
            .formats
            .constraint_for(&app.text, format, app.vocab_size, param)
            .await
        {
            Ok(constraint) => config.constraint = Some(constraint),
            Err(error) => return error.into_response(),
        }
    }
    let echo = match echo {
        Some(text) => match echo::prepare(app, text, &prompt, logprobs).await {
            Ok(echo) => Some(echo),
            Err(error) => return error.into_response(),
        },
        None => None,
    };
    let (events, receiver) = unbounded_channel();
    let enqueued = Instant::now();
    let jobs: Vec<Job> = (0..sampling.n)
        .map(|index| Job {
            index,
            prompt: prompt.clone(),
            config: GenerationConfig {
                rng_stream: index as u64,
                ..config.clone()
            },
            events: events.clone(),
            enqueued,
            trace: sampling.trace,
        })
        .collect();
    drop(events);
    if app.queue.push_all(jobs).is_err() {
        return ApiError::status(
            StatusCode::TOO_MANY_REQUESTS,
            "the server is busy: every slot is taken and the queue is full; retry later",
        )
        .with_code("rate_limit_exceeded")
        .retry_after(1)
        .into_response();
    }
    let answer = Answer {
        app: Arc::clone(app),
        kind,
        id: app.id(match kind {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        }),
        created: unix_now(),
        n: sampling.n,
        logprobs,
        trace: sampling.trace,
        tools_enforced: tools.as_ref().is_some_and(|t| t.grammar.is_some()),
        tool_format: tools.map(|t| t.format),
        echo,
        thinking,
        _in_flight: in_flight,
    };
    if sampling.stream {
        answer
            .stream(receiver, sampling.include_usage)
            .into_response()
    } else {
        answer.whole(receiver).await
    }
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, is_cors_origin};

    #[test]
    fn bearer_scheme_is_case_insensitive_and_takes_any_run_of_spaces() {
        for (value, token) in [
            ("Bearer k1", Some("k1")),
            ("bearer k1", Some("k1")),
            ("BEARER   k1", Some("k1")),
            ("Bearer\tk1 ", Some("k1")),
            ("Basic k1", None),
            ("Bearerk1", None),
            ("Bearer", None),
        ] {
            assert_eq!(bearer_token(value), token, "{value:?}");
        }
    }

    #[test]
    fn an_origin_is_a_scheme_and_host_without_a_path() {
        for (text, ok) in [
            ("*", true),
            ("https://app.example", true),
            ("http://localhost:5173", true),
            ("https://app.example/", false),
            ("app.example", false),
            ("https://", false),
            ("https://a b", false),
        ] {
            assert_eq!(is_cors_origin(text), ok, "{text:?}");
        }
    }
}
