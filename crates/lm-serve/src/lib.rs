//! An OpenAI-compatible HTTP server over any [`LanguageModel`], with
//! continuous batching: `lm-cli serve` runs it, and a program can embed it.
//!
//! ```text
//! POST /v1/completions, /v1/chat/completions   (stream: server-sent events)
//! GET  /v1/models, /health, /metrics            POST /tokenize, /detokenize
//! ```
//!
//! One scheduler thread owns the model's forward passes and runs, at each
//! step, one batched pass over the next token of every active sequence
//! (see `scheduler.rs`); each request runs lm-decode's one generation loop,
//! so its tokens are those it gets alone. docs/serving.md has the details:
//! the scheduler, the limits, scaling out. [`Server::bind_models`] serves
//! several models, each with its own scheduler, picked by a request's
//! `model` and unloaded when idle (see `hub.rs`).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! let lm::GgufModel { decoder, text, .. } = lm::load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let config = lm_serve::ServeConfig::default();
//! let server = lm_serve::Server::bind(Arc::new(decoder), Arc::new(text), config)?;
//! println!("listening on http://{}", server.local_addr());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod answer;
mod echo;
mod embeddings;
mod error;
mod formats;
#[doc(hidden)]
pub mod fuzz;
mod guided;
mod hub;
mod metrics;
mod persist;
mod reasoning;
mod request;
mod routes;
mod scheduler;
mod state_size;
mod surrogates;
mod text;
mod tools;
mod trace;
mod webui;

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lm_core::LanguageModel;

pub use error::ServeError;
pub use persist::{CACHE_FILE, CacheDir, CacheNotes, PersistError, SaveReport, SavedState};
pub use routes::is_cors_origin;
pub use state_size::StateSize;
pub use text::{OutputFormatError, ServedText, TemplateVariables, TextFailure};

use crate::metrics::Metrics;
use crate::routes::App;
use crate::scheduler::JobQueue;

/// How long shutdown waits, after the grace, for cancelled requests to
/// answer and for connections to close.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// The server's settings (`lm-cli serve`'s flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// Where to listen (127.0.0.1:8080 by default: loopback only).
    pub addr: SocketAddr,
    /// When set, every endpoint but `/health` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Origins a browser page may call from (`https://app.example`, or `*`
    /// for any): preflight `OPTIONS` is answered without the key and every
    /// answer to them carries `Access-Control-Allow-Origin`. Empty: no CORS.
    pub cors_origins: Vec<String>,
    /// Sequences generated at once (the batch size); a request's `n` may
    /// not exceed it.
    pub parallel: usize,
    /// Sequences that may wait for a slot; beyond, requests get a 429.
    pub queue_len: usize,
    /// The largest request body accepted; a larger one gets a 413.
    pub max_body_bytes: usize,
    /// How long shutdown waits for in-flight requests before cancelling them.
    pub shutdown_grace: Duration,
    /// Prompts are read in chunks of this many tokens, one chunk per step,
    /// so a long prompt never stalls the running sequences for longer.
    pub prefill_chunk_len: NonZeroUsize,
    /// The model as the user named it (a name, or a file's path); the
    /// server shows it by its short id ([`ServeConfig::model_id`]).
    pub model_name: String,
    /// The prefix cache's budget: finished sequences' states are kept up to
    /// this many bytes (least recently used dropped first), and a request
    /// starts from the longest kept prefix of its prompt. 0 keeps nothing.
    pub cache_bytes: usize,
    /// Read special-token text inside chat message contents as those
    /// tokens (`--parse-special`). Off by default: contents are literal, so
    /// a client cannot open a turn by writing `<|im_start|>system`.
    pub parse_special: bool,
    /// Answer requests whatever `model` they name (`--any-model`). Off by
    /// default: a `model` other than the served id
    /// ([`ServeConfig::model_id`]) is a 404 `model_not_found`, as OpenAI
    /// answers.
    pub any_model: bool,
    /// The most compiled `response_format`s alive at once (kept or used by
    /// running requests; about 100 MB each on Gemma 3's vocabulary, a few
    /// MB on SmolLM2's): a request needing one more gets a 429.
    pub max_formats: usize,
    /// Serve the chat page at `GET /` (on by default; `--no-webui` turns it
    /// off, and `/` is then a 404).
    pub webui: bool,
    /// Keep the prefix cache's states in this directory across restarts
    /// (`--cache-dir`): read at start, written on shutdown and on
    /// `POST /slots/save`. `None` (the default): the cache lives and dies
    /// with the process.
    pub cache_dir: Option<CacheDir>,
    /// Values for the fields a completion or chat request leaves out
    /// (absent or `null`): a Hugging Face directory's
    /// `generation_config.json` temperature, top-p and top-k, as vLLM's
    /// `--generation-config auto` takes them. Empty by default: OpenAI's
    /// defaults.
    pub request_defaults: serde_json::Map<String, serde_json::Value>,
    /// Split a thinking template's `<think>...</think>` out of chat
    /// replies into `reasoning_content` (on by default; `--reasoning off`
    /// leaves replies whole in `content`; see `reasoning.rs`).
    pub reasoning: bool,
    /// Speculative decoding (`--draft`): every sequence's loop verifies
    /// this drafter's proposals, so several tokens can come out of one
    /// pass; the tokens are those of the plain loop, greedy or sampled
    /// with the same seed (prompt lookup's drafts are point masses).
    /// `None` (the default):
    /// the plain loop.
    pub draft: Option<SpeculativeDrafter>,
}

/// Who drafts the tokens a sequence's speculative loop verifies
/// (`ServeConfig::draft`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpeculativeDrafter {
    /// Prompt lookup (lm-decode's `PromptLookup`): the tokens that followed
    /// the earlier place in the sequence agreeing longest with its end, up
    /// to `max_tokens` per pass. No second model, so nothing runs outside
    /// the scheduler.
    PromptLookup {
        /// The most tokens proposed per pass (`--draft-tokens`; it proposes
        /// fewer while its drafts are rejected).
        max_tokens: NonZeroUsize,
    },
}

impl SpeculativeDrafter {
    /// A fresh drafter for one sequence.
    pub(crate) fn start(self) -> lm_decode::PromptLookup {
        match self {
            Self::PromptLookup { max_tokens } => lm_decode::PromptLookup::new(max_tokens.get()),
        }
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api_key: None,
            cors_origins: Vec::new(),
            parallel: 4,
            queue_len: 64,
            max_body_bytes: 1 << 20,
            shutdown_grace: Duration::from_secs(10),
            prefill_chunk_len: NonZeroUsize::new(512).expect("not zero"),
            model_name: "lm".to_owned(),
            cache_bytes: 256 << 20,
            parse_special: false,
            any_model: false,
            max_formats: 8,
            webui: true,
            cache_dir: None,
            request_defaults: serde_json::Map::new(),
            reasoning: true,
            draft: None,
        }
    }
}

impl ServeConfig {
    /// The served model's id, in `/v1/models` and every response, and the
    /// name a request's `model` must give: `model_name`, or the file stem
    /// when it is a path (`/models/SmolLM2-135M-Instruct-Q4_1.gguf` ->
    /// `SmolLM2-135M-Instruct-Q4_1`), so no answer shows where the file is.
    ///
    /// ```
    /// let config = lm_serve::ServeConfig {
    ///     model_name: "/models/SmolLM2-135M-Instruct-Q4_1.gguf".into(),
    ///     ..Default::default()
    /// };
    /// assert_eq!(config.model_id(), "SmolLM2-135M-Instruct-Q4_1");
    /// ```
    pub fn model_id(&self) -> String {
        let name = &self.model_name;
        let path = std::path::Path::new(name);
        let is_path = name.contains(std::path::is_separator) || name.ends_with(".gguf");
        match path.file_stem() {
            Some(stem) if is_path => stem.to_string_lossy().into_owned(),
            _ => name.clone(),
        }
    }
}

/// A bound server, ready to [`Server::run`]: its scheduler and workers are
/// running, its socket is listening.
pub struct Server {
    listener: std::net::TcpListener,
    front: Front,
    /// The one model's scheduler and workers (a several-model server's
    /// are its models', in `hub.rs`).
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What answers a [`Server`]'s requests: one model's routes, or the front
/// of several ([`Server::bind_models`]).
#[derive(Clone)]
enum Front {
    One {
        app: Arc<App>,
        cancel: Arc<AtomicBool>,
    },
    Many(Arc<hub::Hub>),
}

impl Front {
    fn config(&self) -> &ServeConfig {
        match self {
            Self::One { app, .. } => &app.config,
            Self::Many(hub) => &hub.config,
        }
    }

    fn router(&self) -> axum::Router {
        match self {
            Self::One { app, .. } => routes::router(Arc::clone(app)),
            Self::Many(hub) => hub::router(Arc::clone(hub)),
        }
    }

    /// New work and `/health` get a 503 from now on.
    fn begin_drain(&self) {
        match self {
            Self::One { app, .. } => app.stopping.store(true, Ordering::Relaxed),
            Self::Many(hub) => hub.stopping.store(true, Ordering::Relaxed),
        }
    }

    /// Completes once no request is in flight.
    async fn idle(&self) {
        match self {
            Self::One { app, .. } => app.idle().await,
            Self::Many(hub) => hub.idle().await,
        }
    }

    /// Cancels the running requests (each answers a 503).
    async fn cancel(&self) {
        match self {
            Self::One { cancel, .. } => cancel.store(true, Ordering::Relaxed),
            Self::Many(hub) => hub.cancel().await,
        }
    }

    /// Stops the workers and waits for them (blocking), saving the prefix
    /// caches kept on disk.
    fn finish(self, threads: Vec<std::thread::JoinHandle<()>>) {
        match self {
            Self::One { app, .. } => {
                app.queue.close();
                for thread in threads {
                    let _ = thread.join();
                }
                persist::save_on_shutdown(&app);
            }
            Self::Many(hub) => hub.unload_all(),
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.local_addr())
            .field("config", self.front.config())
            .finish_non_exhaustive()
    }
}

/// A model loaded for serving ([`Server::bind_loaded`], or one of
/// [`Server::bind_models`]'): its weights, its text side and its settings,
/// checked and not yet started.
pub struct LoadedModel {
    config: ServeConfig,
    start: Box<dyn FnOnce(ServeConfig, Shared) -> Started + Send>,
    embedder: Option<lm::Embedder>,
}

/// A started model: the state its routes share, its cancel flag, its
/// scheduler and workers.
type Started = (Arc<App>, Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("config", &self.config)
            .field("embeddings", &self.embedder.is_some())
            .finish_non_exhaustive()
    }
}

/// A model the server can serve: shared by the worker threads, with states
/// the prefix cache can size ([`StateSize`]) and `--cache-dir` can save
/// ([`SavedState`]). Every such [`LanguageModel`] is one.
pub trait ServedModel:
    LanguageModel<State: StateSize + SavedState + Send + 'static> + Send + Sync + 'static
{
}

impl<M> ServedModel for M where
    M: LanguageModel<State: StateSize + SavedState + Send + 'static> + Send + Sync + 'static
{
}

impl LoadedModel {
    /// `model`, whose text side is `text`, served with `config`'s
    /// settings, as [`Server::bind`] takes them; in a several-model server
    /// the front's settings (address, key, CORS, body limit, grace,
    /// `any_model`, chat page) are [`Server::bind_models`]' and the id is
    /// its [`ModelSource::id`].
    pub fn new<M>(
        model: Arc<M>,
        text: Arc<dyn ServedText>,
        config: ServeConfig,
    ) -> Result<Self, ServeError>
    where
        M: ServedModel,
    {
        check(&config)?;
        persist::check::<M::State>(&config)?;
        Ok(Self {
            config,
            start: Box::new(move |config, shared| start(model, text, config, shared)),
            embedder: None,
        })
    }

    /// Serves `POST /v1/embeddings` for this model with `embedder`, as
    /// [`Server::with_embeddings`] does for one.
    pub fn with_embeddings(mut self, embedder: lm::Embedder) -> Self {
        self.embedder = Some(embedder);
        self
    }
}

/// How a several-model server loads one of its models, at start and again
/// after `idle_unload` unloaded it.
pub type LoadModel = Arc<dyn Fn() -> Result<LoadedModel, ServeError> + Send + Sync>;

/// One model of a several-model server ([`Server::bind_models`]).
#[derive(Clone)]
pub struct ModelSource {
    /// The id it is served as: in `/v1/models`, in each answer's `model`,
    /// and what a request's `model` names to pick it.
    pub id: String,
    /// Loads it (reads its weights); called at start and again on demand
    /// after an idle unload.
    pub load: LoadModel,
}

impl std::fmt::Debug for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSource")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Binds `config.addr` and starts the scheduler and `config.parallel`
    /// workers for `model`, whose text side is `text`.
    pub fn bind<M>(
        model: Arc<M>,
        text: Arc<dyn ServedText>,
        config: ServeConfig,
    ) -> Result<Self, ServeError>
    where
        M: ServedModel,
    {
        Self::bind_loaded(LoadedModel::new(model, text, config)?)
    }

    /// [`Server::bind`] for a model loaded with its settings, its
    /// embeddings too when it has them.
    pub fn bind_loaded(model: LoadedModel) -> Result<Self, ServeError> {
        let LoadedModel {
            config,
            start,
            embedder,
        } = model;
        let listener = listen(config.addr)?;
        let (app, cancel, threads) = start(config, Shared::default());
        let server = Self {
            listener,
            front: Front::One { app, cancel },
            threads,
        };
        Ok(match embedder {
            Some(embedder) => server.with_embeddings(embedder),
            None => server,
        })
    }

    /// Binds `config.addr` and serves several models, each under its
    /// [`ModelSource::id`] with its own scheduler, prefix cache and chat
    /// template; a request's `model` picks one, and one without `model`
    /// gets the first. Every model is loaded here (a load that fails is
    /// the error); with `idle_unload`, a model with no request for that
    /// long is unloaded and loaded again by the next request naming it.
    ///
    /// `config`'s address, API key, CORS origins, body limit, shutdown
    /// grace, `any_model` (an unknown `model` gets the first model) and
    /// chat page are the server's; each model's other settings are those
    /// its [`LoadedModel`] was made with. Two models with one id, or none,
    /// is an [`ServeError::InvalidSetting`].
    pub fn bind_models(
        models: Vec<ModelSource>,
        config: ServeConfig,
        idle_unload: Option<Duration>,
    ) -> Result<Self, ServeError> {
        check(&config)?;
        let hub = hub::Hub::new(models, config, idle_unload)?;
        let listener = listen(hub.config.addr)?;
        Ok(Self {
            listener,
            front: Front::Many(Arc::new(hub)),
            threads: Vec::new(),
        })
    }

    /// Serves `POST /v1/embeddings` with `embedder` (the served model's
    /// weights, pooled as it says); without it that route is a 400. `lm-cli
    /// serve` gives one for every transformer. A several-model server
    /// takes each model's from its [`LoadedModel::with_embeddings`], and
    /// ignores this.
    pub fn with_embeddings(self, embedder: lm::Embedder) -> Self {
        if let Front::One { app, .. } = &self.front {
            // Set once: a second embedder is ignored, as the first answers.
            let _ = app.embedder.set(embedder);
        }
        self
    }

    /// With `--cache-dir`, what reading the cache file at start came to
    /// and, once the server stopped, what saving it did (one line each;
    /// a several-model server's lines are every model's, each naming its
    /// file).
    pub fn cache_notes(&self) -> Option<CacheNotes> {
        match &self.front {
            Front::One { app, .. } => app.saved_cache.as_ref().map(|saver| saver.notes().clone()),
            Front::Many(hub) => Some(hub.notes.clone()),
        }
    }

    /// The address the server listens on (the port chosen when
    /// `config.addr` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.front.config().addr)
    }

    /// Serves until `shutdown` completes, then drains: new work and
    /// `/health` get a 503 while in-flight requests finish for up to
    /// `shutdown_grace`; what is left is cancelled and answers a 503 (a
    /// stream, an error event), never a truncated success. Returns once the
    /// workers have stopped.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Self {
            listener,
            front,
            threads,
        } = self;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(ServeError::Io)?;
        let (drained_tx, mut drained_rx) = tokio::sync::watch::channel(false);
        // While draining, the listener stays open: new work and `/health`
        // get a 503 instead of a refused connection.
        let drain = {
            let front = front.clone();
            async move {
                shutdown.await;
                front.begin_drain();
                let grace = front.config().shutdown_grace;
                if tokio::time::timeout(grace, front.idle()).await.is_err() {
                    log::warn!(
                        "shutdown grace of {grace:?} over: cancelling the requests still running"
                    );
                    front.cancel().await;
                    // Each cancelled request answers its 503 (or error event).
                    let _ = tokio::time::timeout(CANCEL_WAIT, front.idle()).await;
                }
                let _ = drained_tx.send(true);
            }
        };
        let sweep = match &front {
            Front::Many(hub) => Some(tokio::spawn(Arc::clone(hub).sweep())),
            Front::One { .. } => None,
        };
        let server = axum::serve(listener, front.router())
            .with_graceful_shutdown(drain)
            .into_future();
        tokio::pin!(server);
        // A connection that never finishes its request holds graceful
        // shutdown open: it gets CANCEL_WAIT after the drain, then is dropped.
        let result = tokio::select! {
            result = &mut server => result.map_err(ServeError::Io),
            () = async {
                let _ = drained_rx.wait_for(|drained| *drained).await;
                tokio::time::sleep(CANCEL_WAIT).await;
            } => Ok(()),
        };
        if let Some(sweep) = sweep {
            sweep.abort();
        }
        front.cancel().await;
        let _ = tokio::task::spawn_blocking(move || front.finish(threads)).await;
        result
    }

    /// [`Server::run`] on a thread and runtime of its own, until
    /// [`RunningServer::stop`] (or the handle is dropped): for a program or
    /// a benchmark without a tokio runtime.
    pub fn spawn(self) -> Result<RunningServer, ServeError> {
        let addr = self.local_addr();
        let runtime = http_runtime()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lm-serve".into())
            .spawn(move || {
                runtime.block_on(self.run(async {
                    let _ = stopped.await;
                }))
            })
            .map_err(ServeError::Io)?;
        Ok(RunningServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// [`Server::run`] on a runtime of its own until Ctrl-C or SIGTERM:
    /// what `lm-cli serve` calls, for a program without a tokio runtime.
    pub fn run_until_signal(self) -> Result<(), ServeError> {
        let runtime = http_runtime()?;
        runtime.block_on(self.run(shutdown_signal()))
    }
}

/// The server's routes without a socket, for an application to mount
/// under its own path and middleware (`Router::nest("/llm", router)`) and
/// serve itself: the scheduler and workers of [`Server::bind`] start here,
/// and run until the returned [`SchedulerHandle`] is dropped (keep it as
/// long as the routes are served).
///
/// The routes are [`Server`]'s, `/health` and the chat page included;
/// shutdown draining is the application's (dropping the handle cancels
/// what still runs, and later requests get a 503).
pub fn router<M>(
    model: Arc<M>,
    text: Arc<dyn ServedText>,
    config: ServeConfig,
) -> Result<(axum::Router, SchedulerHandle), ServeError>
where
    M: ServedModel,
{
    check(&config)?;
    persist::check::<M::State>(&config)?;
    let (app, cancel, threads) = start(model, text, config, Shared::default());
    let router = routes::router(Arc::clone(&app));
    Ok((
        router,
        SchedulerHandle {
            app,
            cancel,
            threads,
        },
    ))
}

/// Keeps the scheduler and workers behind a [`router`] running; dropping
/// it stops them (running requests are cancelled) and waits for them.
pub struct SchedulerHandle {
    pub(crate) app: Arc<App>,
    pub(crate) cancel: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl SchedulerHandle {
    /// Wraps what [`start`] started.
    pub(crate) fn new((app, cancel, threads): Started) -> Self {
        Self {
            app,
            cancel,
            threads,
        }
    }
}

impl SchedulerHandle {
    /// Serves `POST /v1/embeddings` on the [`router`]'s routes with
    /// `embedder`, as [`Server::with_embeddings`] does; without it that
    /// route is a 400.
    pub fn serve_embeddings(&self, embedder: lm::Embedder) {
        // Set once: a second embedder is ignored, as the first answers.
        let _ = self.app.embedder.set(embedder);
    }
}

impl std::fmt::Debug for SchedulerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerHandle")
            .field("config", &self.app.config)
            .finish_non_exhaustive()
    }
}

impl Drop for SchedulerHandle {
    fn drop(&mut self) {
        self.app.stopping.store(true, Ordering::Relaxed);
        self.cancel.store(true, Ordering::Relaxed);
        self.app.queue.close();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        persist::save_on_shutdown(&self.app);
    }
}

/// Refuses settings no server can run with.
fn check(config: &ServeConfig) -> Result<(), ServeError> {
    if config.parallel == 0 {
        return Err(ServeError::InvalidSetting {
            name: "parallel",
            reason: "at least one sequence must be able to run".into(),
        });
    }
    if config.max_formats == 0 {
        return Err(ServeError::InvalidSetting {
            name: "max-formats",
            reason: "at least one response format must fit".into(),
        });
    }
    if let Some(origin) = config.cors_origins.iter().find(|o| !is_cors_origin(o)) {
        return Err(ServeError::InvalidSetting {
            name: "cors",
            reason: format!("'{origin}' is not an origin (scheme://host[:port], no path) or '*'"),
        });
    }
    Ok(())
}

/// Binds `addr`, non-blocking for tokio.
fn listen(addr: SocketAddr) -> Result<std::net::TcpListener, ServeError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
    listener.set_nonblocking(true).map_err(ServeError::Io)?;
    Ok(listener)
}

/// What a started model counts into, given by whoever starts it: a
/// several-model server keeps a model's metrics across its reloads,
/// numbers every model's answers from one counter and gathers every
/// model's `--cache-dir` notes in one list.
#[derive(Default, Clone)]
pub(crate) struct Shared {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) next_id: Arc<AtomicU64>,
    pub(crate) notes: CacheNotes,
}

/// Starts the scheduler and `config.parallel` workers for `model`,
/// counting into `shared`: the state every route shares, the cancel flag
/// and the threads.
fn start<M>(
    model: Arc<M>,
    text: Arc<dyn ServedText>,
    config: ServeConfig,
    shared: Shared,
) -> Started
where
    M: ServedModel,
{
    let Shared {
        metrics,
        next_id,
        notes,
    } = shared;
    let queue = Arc::new(JobQueue::new(config.queue_len.max(config.parallel)));
    let cancel = Arc::new(AtomicBool::new(false));
    let cache = scheduler::prefix_cache::<M::State>(config.cache_bytes);
    let saved_cache = config
        .cache_dir
        .clone()
        .map(|dir| persist::open(dir, &*model, &cache, &metrics, notes));
    let app = Arc::new(App {
        model_id: config.model_id(),
        vocab_size: model.vocab_size(),
        context_length: model.context_length(),
        end_tokens: text.end_tokens(),
        banned_tokens: text.banned_tokens(),
        formats: formats::FormatCache::new(config.max_formats),
        text: Arc::clone(&text),
        queue: Arc::clone(&queue),
        metrics: Arc::clone(&metrics),
        config,
        stopping: AtomicBool::new(false),
        in_flight: tokio::sync::watch::Sender::new(0),
        created: routes::unix_now(),
        next_id,
        saved_cache,
        scorer: Arc::new(echo::Direct(Arc::clone(&model))),
        embedder: std::sync::OnceLock::new(),
        direct_lock: tokio::sync::Mutex::new(()),
    });
    let settings = scheduler::Settings {
        n_workers: app.config.parallel,
        step_tokens: app.config.prefill_chunk_len.get(),
        draft: app.config.draft,
    };
    let threads = scheduler::start(
        model,
        text,
        queue,
        settings,
        Arc::clone(&cancel),
        metrics,
        cache,
    );
    (app, cancel, threads)
}

/// The runtime of the HTTP side: two workers (generation runs on the
/// scheduler's threads, not here).
fn http_runtime() -> Result<tokio::runtime::Runtime, ServeError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("lm-serve-http")
        .enable_all()
        .build()
        .map_err(ServeError::Io)
}

/// A server running on its own thread ([`Server::spawn`]); dropping the
/// handle stops it as [`RunningServer::stop`] does.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServeError>>>,
}

impl RunningServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shuts down as a signal would (in-flight requests get the grace) and
    /// waits for the server's thread.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.stop_now()
    }

    fn stop_now(&mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = self.stop_now();
        }
    }
}

/// Completes on Ctrl-C (SIGINT) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
