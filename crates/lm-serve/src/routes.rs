//! The HTTP endpoints: OpenAI's `/v1/completions`, `/v1/chat/completions`
//! and `/v1/models`, plus `/health`, `/tokenize`, `/detokenize` and
//! `/metrics`. A handler checks the request (fields, context and `n`
//! limits), queues one job per choice and answers with the events its
//! workers send: whole, or as server-sent events ending in `data: [DONE]`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lm_core::TokenId;
use lm_decode::{Candidate, GenerationConfig, SamplingConfig, StopReason, context_room};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::ServeConfig;
use crate::echo::{self, Echo};
use crate::error::ApiError;
use crate::formats::FormatCache;
use crate::metrics::Metrics;
use crate::reasoning::{self, ThinkSplitter, Thinking, content};
use crate::request::{self, Prompt, Sampling};
use crate::scheduler::{Event, Job, JobQueue};
use crate::surrogates::replace_lone_surrogates;
use crate::text::{ServedText, WithVariables};
use crate::tools::{self, Call, CallSplitter, ToolFormat, ToolMode};
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
    pub(crate) next_id: AtomicU64,
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
        // Outermost, so errors (401, 404, 413) carry the CORS headers too.
        .layer(middleware::from_fn_with_state(Arc::clone(&app), cors))
        .with_state(app)
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
async fn cors(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let origins = &app.config.cors_origins;
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

/// Counts every answer by status for `/metrics`.
async fn count(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    app.metrics.record_request(response.status().as_u16());
    response
}

/// With `--api-key`, every route but `/health` needs `Authorization: Bearer KEY`.
async fn require_key(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    if let Some(key) = &app.config.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        if !given.is_some_and(|given| same_bytes(given.as_bytes(), key.as_bytes())) {
            return ApiError::status(
                StatusCode::UNAUTHORIZED,
                "missing or incorrect API key: send 'Authorization: Bearer KEY'",
            )
            .with_code("invalid_api_key")
            .into_response();
        }
    }
    next.run(request).await
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
    if app.stopping.load(Ordering::Relaxed) {
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

/// The body as JSON: a body over the cap is a 413, bad JSON a 400.
pub(crate) fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than the server accepts (--max-body-bytes)".to_owned()
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
enum Kind {
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
        let text = WithVariables::new(&*app.text, &request.template_kwargs);
        // Message contents literal unless --parse-special (see ServedText).
        let (prompt, tools) = tools::encode_chat(
            &text,
            &request.messages,
            request.tools.as_ref(),
            &request.sampling,
            app.config.parse_special,
        )?;
        let on = app.config.reasoning;
        let thinking = reasoning::thinking(&text, on, &request.template_kwargs, &prompt);
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

/// One choice as it ends up.
#[derive(Debug, Default)]
struct Choice {
    text: String,
    logprobs: Vec<Value>,
    finish_reason: Option<&'static str>,
    n_prompt: usize,
    n_generated: usize,
    /// Why the choice has no answer: the request fails with it.
    error: Option<ApiError>,
    /// Characters of text before each token, for completions' `text_offset`.
    offset: usize,
    /// With `lm_trace`: one entry per token (see `trace.rs`).
    trace: Vec<Value>,
    /// A thinking template's reply: `text` is its content alone.
    thinking: Option<ThinkSplitter>,
}

/// OpenAI's name for why a choice ended: a `response_format` output
/// that is complete stops as an end token does.
fn finish_reason(reason: &StopReason) -> &'static str {
    match reason {
        StopReason::MaxNewTokens | StopReason::ContextBound => "length",
        StopReason::ConstraintComplete => "stop",
        _ => "stop",
    }
}

/// Shapes a request's events into its answer.
struct Answer {
    app: Arc<App>,
    kind: Kind,
    id: String,
    created: u64,
    n: usize,
    logprobs: Option<usize>,
    /// `lm_trace`: each choice carries its tokens' trace entries.
    trace: bool,
    /// How tool calls are written, when the request offers tools: the
    /// reply is read into `tool_calls`.
    tool_format: Option<&'static ToolFormat>,
    /// `echo`: the prompt every choice starts with.
    echo: Option<Echo>,
    /// Whether replies are split into reasoning and content.
    thinking: Option<Thinking>,
    /// Held until the answer is sent or dropped.
    _in_flight: InFlight,
}

impl Answer {
    /// A choice before its first event: empty, or starting with the echo.
    fn new_choice(&self) -> Choice {
        match &self.echo {
            None => Choice {
                thinking: self.thinking.map(ThinkSplitter::new),
                ..Choice::default()
            },
            Some(echo) => Choice {
                text: echo.text.clone(),
                logprobs: echo.entries.clone(),
                offset: echo.text.chars().count(),
                ..Choice::default()
            },
        }
    }

    /// The first chunk of each choice of a stream with `echo`: the prompt
    /// (and its logprobs), as vLLM streams it.
    fn echo_chunks(&self) -> std::collections::VecDeque<Value> {
        let Some(echo) = &self.echo else {
            return std::collections::VecDeque::new();
        };
        (0..self.n)
            .map(|index| {
                let mut chunk = self.chunk(index, &echo.text, None, None, false);
                if self.logprobs.is_some() {
                    chunk["choices"][0]["logprobs"] = Self::completion_logprobs(&echo.entries);
                }
                chunk
            })
            .collect()
    }

    /// The `logprobs` entry of one token in the endpoint's shape.
    fn logprob_entry(
        &self,
        token: TokenId,
        logprob: f64,
        top: &[Candidate],
        offset: usize,
    ) -> Value {
        let text = self.app.text.token_text(token);
        // The loop records more candidates for `lm_trace` than asked here.
        let top = &top[..top.len().min(self.logprobs.unwrap_or(0))];
        match self.kind {
            Kind::Chat => json!({
                "token": text,
                "logprob": logprob,
                "bytes": text.as_bytes(),
                "top_logprobs": top.iter().map(|c| {
                    let t = self.app.text.token_text(c.token);
                    json!({"token": t, "logprob": c.logprob, "bytes": t.as_bytes()})
                }).collect::<Vec<_>>(),
            }),
            Kind::Completion => {
                let top: serde_json::Map<String, Value> = top
                    .iter()
                    .map(|c| (self.app.text.token_text(c.token), json!(c.logprob)))
                    .collect();
                json!({"token": text, "logprob": logprob, "top": top, "offset": offset})
            }
        }
    }

    /// Completions' `logprobs` object from per-token entries.
    fn completion_logprobs(entries: &[Value]) -> Value {
        json!({
            "tokens": entries.iter().map(|e| e["token"].clone()).collect::<Vec<_>>(),
            "token_logprobs": entries.iter().map(|e| e["logprob"].clone()).collect::<Vec<_>>(),
            "top_logprobs": entries.iter().map(|e| e["top"].clone()).collect::<Vec<_>>(),
            "text_offset": entries.iter().map(|e| e["offset"].clone()).collect::<Vec<_>>(),
        })
    }

    fn logprobs_value(&self, entries: &[Value]) -> Value {
        match (self.logprobs, self.kind) {
            (None, _) => Value::Null,
            (Some(_), Kind::Chat) => json!({ "content": entries }),
            (Some(_), Kind::Completion) => Self::completion_logprobs(entries),
        }
    }

    /// Applies one event to its choice; returns the new text and the
    /// logprob and trace entries it adds, if any.
    fn apply(&self, choice: &mut Choice, event: Event) -> (String, Option<Value>, Option<Value>) {
        match event {
            Event::Token {
                token,
                logprob,
                top,
                text,
                trace,
            } => {
                let entry = (self.logprobs.is_some() && !self.app.end_tokens.contains(&token))
                    .then(|| self.logprob_entry(token, logprob, &top, choice.offset));
                if let Some(entry) = &entry {
                    choice.logprobs.push(entry.clone());
                }
                let traced = trace.map(|t| t.to_json(&*self.app.text, token, logprob, &top));
                if let Some(traced) = &traced {
                    choice.trace.push(traced.clone());
                }
                choice.offset += text.chars().count();
                let text = content(&mut choice.thinking, text, false);
                choice.text.push_str(&text);
                (text, entry, traced)
            }
            Event::Done {
                stop_reason: StopReason::Cancelled,
                n_prompt,
                n_generated,
                ..
            } => {
                // Only shutdown (or the client hanging up) cancels: the text
                // is truncated, and neither "stop" nor "length" says so.
                choice.error = Some(
                    ApiError::status(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "the server shut down before this answer was finished \
                             ({n_generated} tokens generated); retry on another server"
                        ),
                    )
                    .with_code("server_shutting_down")
                    .retry_after(5),
                );
                choice.n_prompt = n_prompt;
                choice.n_generated = n_generated;
                (String::new(), None, None)
            }
            Event::Done {
                text,
                stop_reason,
                n_prompt,
                n_generated,
            } => {
                let text = content(&mut choice.thinking, text, true);
                choice.text.push_str(&text);
                choice.finish_reason = Some(finish_reason(&stop_reason));
                choice.n_prompt = n_prompt;
                choice.n_generated = n_generated;
                (text, None, None)
            }
            Event::Failed(message) => {
                choice.error = Some(ApiError::status(StatusCode::BAD_REQUEST, message));
                choice.finish_reason = Some("stop");
                (String::new(), None, None)
            }
        }
    }

    fn usage(choices: &[Choice]) -> Value {
        let prompt = choices.first().map_or(0, |c| c.n_prompt);
        let completion: usize = choices.iter().map(|c| c.n_generated).sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    /// Waits for every choice and answers in one JSON body.
    async fn whole(self, mut receiver: UnboundedReceiver<(usize, Event)>) -> Response {
        let mut choices: Vec<Choice> = (0..self.n).map(|_| self.new_choice()).collect();
        let mut n_open = self.n;
        while n_open > 0 {
            let Some((index, event)) = receiver.recv().await else {
                break;
            };
            let ends = !matches!(event, Event::Token { .. });
            self.apply(&mut choices[index], event);
            n_open -= usize::from(ends);
        }
        if let Some(error) = choices.iter().find_map(|c| c.error.clone()) {
            return error.into_response();
        }
        if choices.iter().any(|c| c.finish_reason.is_none()) {
            return ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "a generation ended without an answer",
            )
            .into_response();
        }
        let body_choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(index, c)| match self.kind {
                Kind::Completion => json!({
                    "index": index,
                    "text": c.text,
                    "logprobs": self.logprobs_value(&c.logprobs),
                    "finish_reason": c.finish_reason,
                }),
                Kind::Chat => {
                    let calls = self.tool_format.and_then(|f| f.parse(&c.text));
                    let (mut message, finish_reason) = match calls {
                        Some((content, calls)) => (
                            json!({
                                "role": "assistant",
                                "content": (!content.is_empty()).then_some(content),
                                "tool_calls": self.tool_calls_json(&calls),
                            }),
                            // Cut by max_tokens after a complete call: "length".
                            c.finish_reason
                                .filter(|&r| r == "length")
                                .or(Some("tool_calls")),
                        ),
                        None => (
                            json!({"role": "assistant", "content": c.text}),
                            c.finish_reason,
                        ),
                    };
                    if let Some(r) = c.thinking.as_ref().and_then(ThinkSplitter::reasoning) {
                        message["reasoning_content"] = json!(r);
                    }
                    json!({
                        "index": index,
                        "message": message,
                        "logprobs": self.logprobs_value(&c.logprobs),
                        "finish_reason": finish_reason,
                    })
                }
            })
            .zip(&choices)
            .map(|(mut body, c)| {
                if self.trace {
                    body["lm_trace"] = json!(c.trace);
                }
                body
            })
            .collect();
        axum::Json(json!({
            "id": self.id,
            "object": match self.kind { Kind::Completion => "text_completion", Kind::Chat => "chat.completion" },
            "created": self.created,
            "model": self.app.model_id(),
            "choices": body_choices,
            "usage": Self::usage(&choices),
        }))
        .into_response()
    }

    /// `calls` as OpenAI's `tool_calls`, each with a fresh id.
    fn tool_calls_json(&self, calls: &[Call]) -> Vec<Value> {
        let salt = self.created ^ self.app.next_id.load(Ordering::Relaxed);
        calls.iter().map(|call| call.to_json(salt)).collect()
    }

    /// The last chunks of a streamed choice that called tools, as OpenAI
    /// sends them: the content not yet sent (if any), then per call one
    /// chunk with its index, id, type and name (empty arguments) and one
    /// with its arguments, then an empty delta with `finish_reason:
    /// "tool_calls"` (`"length"` when `cut` by `max_tokens` after a
    /// complete call).
    fn tool_call_chunks(
        &self,
        index: usize,
        content: &str,
        calls: &[Call],
        first: bool,
        cut: bool,
    ) -> Vec<Value> {
        let mut chunks = Vec::with_capacity(2 * calls.len() + 2);
        if first || !content.is_empty() {
            chunks.push(self.chunk(index, content, None, None, first));
        }
        let with_delta = |delta: Value, finish: Option<&str>| {
            let mut chunk = self.chunk(index, "", None, finish, false);
            chunk["choices"][0]["delta"] = delta;
            chunk
        };
        for (k, call) in self.tool_calls_json(calls).into_iter().enumerate() {
            let opening = json!({"tool_calls": [{
                "index": k, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }]});
            chunks.push(with_delta(opening, None));
            let arguments = json!({"tool_calls": [{
                "index": k, "function": {"arguments": call["function"]["arguments"]},
            }]});
            chunks.push(with_delta(arguments, None));
        }
        let finish = if cut { "length" } else { "tool_calls" };
        chunks.push(with_delta(json!({}), Some(finish)));
        chunks
    }

    /// One streamed chunk with one choice.
    fn chunk(
        &self,
        index: usize,
        text: &str,
        entry: Option<Value>,
        finish: Option<&str>,
        first: bool,
    ) -> Value {
        let logprobs = match entry {
            None => Value::Null,
            Some(entry) => self.logprobs_value(&[entry]),
        };
        let choice = match self.kind {
            Kind::Completion => json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
            }),
            Kind::Chat => {
                let delta = match (first, finish) {
                    (true, _) => json!({"role": "assistant", "content": text}),
                    (false, Some(_)) if text.is_empty() => json!({}),
                    _ => json!({"content": text}),
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id,
            "object": match self.kind { Kind::Completion => "text_completion", Kind::Chat => "chat.completion.chunk" },
            "created": self.created,
            "model": self.app.model_id(),
            "choices": [choice],
        })
    }

    /// Server-sent events: a chunk per token that adds text (or a logprob),
    /// a last chunk per choice with its `finish_reason`, the usage when
    /// asked, then `data: [DONE]`. Dropping the stream (the client went
    /// away) drops the receiver, which cancels the choices.
    fn stream(
        self,
        receiver: UnboundedReceiver<(usize, Event)>,
        include_usage: bool,
    ) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
        struct Progress {
            answer: Answer,
            receiver: UnboundedReceiver<(usize, Event)>,
            choices: Vec<Choice>,
            started: Vec<bool>,
            /// Per choice, when tools are offered: what is content and
            /// what is a call.
            splitters: Vec<Option<CallSplitter>>,
            /// Chunks to send before reading the next event.
            pending: std::collections::VecDeque<Value>,
            n_open: usize,
            include_usage: bool,
            /// 0: choices running, 1: usage sent (or skipped), 2: done.
            phase: u8,
        }
        let n = self.n;
        let progress = Progress {
            choices: (0..n).map(|_| self.new_choice()).collect(),
            started: vec![false; n],
            splitters: (0..n)
                .map(|_| self.tool_format.map(CallSplitter::new))
                .collect(),
            pending: self.echo_chunks(),
            n_open: n,
            receiver,
            include_usage,
            answer: self,
            phase: 0,
        };
        let stream = futures_util::stream::unfold(progress, |mut p| async move {
            loop {
                if let Some(chunk) = p.pending.pop_front() {
                    return Some((Ok(SseEvent::default().data(chunk.to_string())), p));
                }
                if p.phase == 0 && p.n_open == 0 {
                    p.phase = 1;
                    if p.include_usage {
                        let mut usage = p.answer.chunk(0, "", None, None, false);
                        usage["choices"] = json!([]);
                        usage["usage"] = Answer::usage(&p.choices);
                        return Some((Ok(SseEvent::default().data(usage.to_string())), p));
                    }
                }
                match p.phase {
                    1 => {
                        p.phase = 2;
                        return Some((Ok(SseEvent::default().data("[DONE]")), p));
                    }
                    2 => return None,
                    _ => {}
                }
                let Some((index, event)) = p.receiver.recv().await else {
                    p.n_open = 0;
                    continue;
                };
                let ends = !matches!(event, Event::Token { .. });
                let (mut text, entry, traced) = p.answer.apply(&mut p.choices[index], event);
                if ends {
                    p.n_open -= 1;
                    if let Some(error) = &p.choices[index].error {
                        let body = error.body();
                        return Some((Ok(SseEvent::default().data(body.to_string())), p));
                    }
                }
                let first = !p.started[index];
                let thinker = p.choices[index].thinking.as_mut();
                let reasoning = thinker.map(ThinkSplitter::take_fresh).unwrap_or_default();
                if let Some(splitter) = &mut p.splitters[index] {
                    text = splitter.push(&text);
                }
                if ends && let Some(splitter) = p.splitters[index].take() {
                    let (rest, calls) = splitter.finish();
                    text.push_str(&rest);
                    if !calls.is_empty() {
                        let chunk = p.answer.chunk(index, "", None, None, false);
                        p.pending.extend(reasoning::alone(chunk, &reasoning));
                        p.started[index] = true;
                        let cut = p.choices[index].finish_reason == Some("length");
                        let chunks = p.answer.tool_call_chunks(index, &text, &calls, first, cut);
                        p.pending.extend(chunks);
                        continue;
                    }
                }
                if text.is_empty()
                    && reasoning.is_empty()
                    && entry.is_none()
                    && traced.is_none()
                    && !ends
                    && !(first && p.answer.kind == Kind::Chat)
                {
                    continue;
                }
                p.started[index] = true;
                let finish = if ends {
                    p.choices[index].finish_reason
                } else {
                    None
                };
                let mut chunk = p.answer.chunk(index, &text, entry, finish, first);
                reasoning::add_to_chunk(&mut chunk, &reasoning);
                if let Some(traced) = traced {
                    chunk["choices"][0]["lm_trace"] = json!([traced]);
                }
                return Some((Ok(SseEvent::default().data(chunk.to_string())), p));
            }
        });
        Sse::new(stream)
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
