//! Several models behind one address (`lm-cli serve --model A --model B`,
//! [`crate::Server::bind_models`]): the front picks a model by the
//! request's `model` field and forwards the request, unchanged, to that
//! model's own routes (its scheduler, prefix cache and chat template),
//! loading the model first when an idle unload had freed it.
//!
//! ```text
//! request ──> front: /health, /v1/models, /metrics and the chat page answered here
//!               │   else: the body's `model` names a slot (none: the first)
//!               v
//!             slot ──(unloaded: one load, concurrent requests wait for it)──> model's routes
//!               ^                                                                  │
//!               └──── in flight until the answer's last byte (a stream's too) ─────┘
//! ```
//!
//! The idle sweep unloads a slot only under its lock, with none of its
//! requests in flight and none ended for `idle_unload`; a request counts
//! itself in flight before it takes the lock, so it either stops the
//! unload or finds the model unloaded and loads it: no request is ever cut
//! by an unload.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::StreamExt;
use lm_core::error_chain;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::error::ApiError;
use crate::metrics::{Metrics, ModelMetrics, render_models};
use crate::routes::{self, BODY_TOO_LARGE};
use crate::surrogates::replace_lone_surrogates;
use crate::{
    CacheNotes, LoadModel, LoadedModel, ModelSource, SchedulerHandle, ServeConfig, ServeError,
    Shared,
};

/// The front of a several-model server.
pub(crate) struct Hub {
    /// The server's settings (address, key, CORS, body limit, grace,
    /// `any_model`, chat page); each model has its own for the rest.
    pub(crate) config: ServeConfig,
    slots: Vec<Slot>,
    idle_unload: Option<Duration>,
    /// Set once shutdown began: new work gets a 503, nothing is loaded.
    pub(crate) stopping: AtomicBool,
    /// Requests forwarded or waiting for a load, until their answer ends.
    in_flight: tokio::sync::watch::Sender<usize>,
    /// The answers the front gives itself (its own routes, a missing key,
    /// an unknown model, a body too large, a failed load): every answer a
    /// model's routes did not count.
    front: Metrics,
    /// Every model's `--cache-dir` notes ([`crate::Server::cache_notes`]).
    pub(crate) notes: CacheNotes,
    created: u64,
}

/// One model: how to load it, and its routes while loaded.
struct Slot {
    id: String,
    load: LoadModel,
    /// Kept across reloads, so its counters only grow.
    metrics: Arc<Metrics>,
    /// The front's answer numbering and cache notes (every slot's are the
    /// same).
    next_id: Arc<AtomicU64>,
    notes: CacheNotes,
    /// Held while loading, unloading and counting a request in.
    running: tokio::sync::Mutex<Option<Running>>,
    loaded: AtomicBool,
    n_in_flight: AtomicUsize,
    /// When its last request ended (or it was loaded).
    last_used: Mutex<Instant>,
    n_loads: AtomicU64,
    n_unloads: AtomicU64,
    /// The model's context length, known from its first load.
    context_length: Mutex<Option<usize>>,
}

/// A loaded model: its routes and what keeps its workers running.
struct Running {
    router: Router,
    handle: SchedulerHandle,
}

impl Hub {
    /// Checks the ids and loads every model.
    pub(crate) fn new(
        models: Vec<ModelSource>,
        config: ServeConfig,
        idle_unload: Option<Duration>,
    ) -> Result<Self, ServeError> {
        if models.is_empty() {
            return Err(ServeError::InvalidSetting {
                name: "model",
                reason: "no model to serve".into(),
            });
        }
        for (index, model) in models.iter().enumerate() {
            check_id(&model.id)?;
            if models[..index].iter().any(|earlier| earlier.id == model.id) {
                return Err(ServeError::InvalidSetting {
                    name: "model",
                    reason: format!(
                        "two models are served as '{}' (name them apart with ID=SPEC)",
                        model.id
                    ),
                });
            }
        }
        if idle_unload.is_some_and(|idle| idle.is_zero()) {
            return Err(ServeError::InvalidSetting {
                name: "idle-unload",
                reason: "a model must be allowed to idle for some time".into(),
            });
        }
        let next_id = Arc::default();
        let notes = CacheNotes::default();
        let slots = models
            .into_iter()
            .map(|ModelSource { id, load }| {
                let loaded = load()?;
                let mut slot = Slot {
                    id,
                    load,
                    metrics: Arc::default(),
                    next_id: Arc::clone(&next_id),
                    notes: notes.clone(),
                    running: tokio::sync::Mutex::new(None),
                    loaded: AtomicBool::new(false),
                    n_in_flight: AtomicUsize::new(0),
                    last_used: Mutex::new(Instant::now()),
                    n_loads: AtomicU64::new(0),
                    n_unloads: AtomicU64::new(0),
                    context_length: Mutex::new(None),
                };
                *slot.running.get_mut() = Some(slot.start(loaded));
                Ok(slot)
            })
            .collect::<Result<_, ServeError>>()?;
        Ok(Self {
            config,
            slots,
            idle_unload,
            stopping: AtomicBool::new(false),
            in_flight: tokio::sync::watch::Sender::new(0),
            front: Metrics::default(),
            notes,
            created: routes::unix_now(),
        })
    }

    /// Completes once no request is in flight.
    pub(crate) async fn idle(&self) {
        let _ = self.in_flight.subscribe().wait_for(|&n| n == 0).await;
    }

    /// Cancels every loaded model's running requests (each answers a 503).
    pub(crate) async fn cancel(&self) {
        for slot in &self.slots {
            if let Some(running) = &*slot.running.lock().await {
                running.handle.cancel.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Unloads every model, waiting for its workers and saving its prefix
    /// cache when it keeps one on disk (blocking).
    pub(crate) fn unload_all(&self) {
        for slot in &self.slots {
            drop(slot.running.blocking_lock().take());
            slot.loaded.store(false, Ordering::Relaxed);
        }
    }

    /// Unloads, every so often, the models idle for `idle_unload`, until
    /// shutdown begins; without `idle_unload`, returns at once.
    pub(crate) async fn sweep(self: Arc<Self>) {
        let Some(idle) = self.idle_unload else {
            return;
        };
        let tick = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        while !self.stopping.load(Ordering::Relaxed) {
            tokio::time::sleep(tick).await;
            for slot in &self.slots {
                slot.unload_if_idle(idle).await;
            }
        }
    }

    /// The slot a request body names in `model`: the first when it names
    /// none (or, with `any_model`, one not served), else a 404.
    fn pick(&self, body: &[u8]) -> Result<usize, ApiError> {
        #[derive(serde::Deserialize)]
        struct Named {
            model: Option<Value>,
        }
        let named = serde_json::from_slice::<Named>(&replace_lone_surrogates(body))
            .ok()
            .and_then(|named| named.model);
        // Not JSON, or `model` not a string: the first model's routes say
        // what is wrong with it.
        let Some(Value::String(name)) = named else {
            return Ok(0);
        };
        match self.slots.iter().position(|slot| slot.id == name) {
            Some(index) => Ok(index),
            None if self.config.any_model => Ok(0),
            None => {
                let served: Vec<&str> = self.slots.iter().map(|slot| slot.id.as_str()).collect();
                Err(crate::request::model_not_found(&name, &served))
            }
        }
    }

    /// Slot `index`'s routes, loading the model first if it is unloaded
    /// (requests arriving meanwhile wait for this one load). The caller
    /// counted the request in flight on the slot first, so the sweep
    /// leaves the model loaded from then on.
    async fn enter(&self, index: usize) -> Result<Router, ApiError> {
        let slot = &self.slots[index];
        let mut running = slot.running.lock().await;
        if running.is_none() {
            if self.stopping.load(Ordering::Relaxed) {
                return Err(shutting_down());
            }
            let load = Arc::clone(&slot.load);
            let loaded = tokio::task::spawn_blocking(move || load())
                .await
                .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
                .map_err(|error| {
                    log::error!("loading the model '{}' failed: {error}", slot.id);
                    ApiError::status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!(
                            "the model '{}' could not be loaded: {}",
                            slot.id,
                            error_chain(&error)
                        ),
                    )
                })?;
            *running = Some(slot.start(loaded));
        }
        let Some(Running { router, .. }) = &*running else {
            return Err(ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error: the model is not loaded",
            ));
        };
        Ok(router.clone())
    }
}

impl Slot {
    /// Starts a loaded model under this slot's id and metrics.
    fn start(&self, loaded: LoadedModel) -> Running {
        let LoadedModel {
            config,
            start,
            embedder,
        } = loaded;
        let config = ServeConfig {
            model_name: self.id.clone(),
            ..config
        };
        let shared = Shared {
            metrics: Arc::clone(&self.metrics),
            next_id: Arc::clone(&self.next_id),
            notes: self.notes.clone(),
        };
        let handle = SchedulerHandle::new(start(config, shared));
        if let Some(embedder) = embedder {
            handle.serve_embeddings(embedder);
        }
        *lock(&self.context_length) = handle.app.context_length;
        *lock(&self.last_used) = Instant::now();
        self.n_loads.fetch_add(1, Ordering::Relaxed);
        self.loaded.store(true, Ordering::Relaxed);
        log::info!("loaded the model '{}'", self.id);
        Running {
            router: routes::api_router(Arc::clone(&handle.app)),
            handle,
        }
    }

    /// Unloads the model if it is loaded, has no request in flight and
    /// has had none for `idle`: its workers stop, its weights and caches
    /// are freed (its prefix cache saved first when kept on disk).
    async fn unload_if_idle(&self, idle: Duration) {
        // A slot being loaded or entered is not idle.
        let Ok(mut running) = self.running.try_lock() else {
            return;
        };
        if running.is_none()
            || self.n_in_flight.load(Ordering::SeqCst) > 0
            || lock(&self.last_used).elapsed() < idle
        {
            return;
        }
        let stopped = running.take();
        // Under the lock, so a request for it waits until it is gone.
        let _ = tokio::task::spawn_blocking(move || drop(stopped)).await;
        self.metrics.record_cache_usage(0, 0);
        self.loaded.store(false, Ordering::Relaxed);
        self.n_unloads.fetch_add(1, Ordering::Relaxed);
        log::info!("unloaded the model '{}' after {idle:?} idle", self.id);
    }

    /// One of its requests ended.
    fn leave(&self) {
        *lock(&self.last_used) = Instant::now();
        self.n_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The front's routes.
pub(crate) fn router(hub: Arc<Hub>) -> Router {
    let origins = routes::cors_state(&hub.config);
    Router::new()
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&hub),
            require_key,
        ))
        .route("/health", get(health))
        .merge(crate::webui::router(hub.config.webui))
        .fallback(forward)
        .layer(middleware::from_fn_with_state(Arc::clone(&hub), count))
        // Outermost, so every answer, forwarded or not, carries them.
        .layer(middleware::from_fn_with_state(origins, routes::cors))
        .with_state(hub)
}

/// A request in flight at the front (and on its slot, once entered).
struct InFlight {
    hub: Arc<Hub>,
    slot: Option<usize>,
}

impl InFlight {
    fn new(hub: &Arc<Hub>) -> Self {
        hub.in_flight.send_modify(|n| *n += 1);
        Self {
            hub: Arc::clone(hub),
            slot: None,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(index) = self.slot {
            self.hub.slots[index].leave();
        }
        self.hub.in_flight.send_modify(|n| *n -= 1);
    }
}

/// Every request but the front's own: to the model its body names, with
/// the key checked first (so no request without it loads a model).
async fn forward(State(hub): State<Arc<Hub>>, request: Request) -> Response {
    if let Err(error) = routes::check_key(&hub.config, request.headers()) {
        return error.into_response();
    }
    // Counted before the check, so shutdown either waits for this request
    // or this request sees it began.
    let mut in_flight = InFlight::new(&hub);
    if hub.stopping.load(Ordering::SeqCst) {
        return shutting_down().into_response();
    }
    let (parts, body) = request.into_parts();
    let bytes = if parts.method == Method::GET || parts.method == Method::HEAD {
        Default::default()
    } else {
        match axum::body::to_bytes(body, hub.config.max_body_bytes).await {
            Ok(bytes) => bytes,
            Err(error) => {
                let too_large = std::error::Error::source(&error)
                    .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
                return if too_large {
                    ApiError::status(StatusCode::PAYLOAD_TOO_LARGE, BODY_TOO_LARGE)
                } else {
                    ApiError::invalid(
                        "body",
                        format!("the request body could not be read: {error}"),
                    )
                }
                .into_response();
            }
        }
    };
    let index = match hub.pick(&bytes) {
        Ok(index) => index,
        Err(error) => return error.into_response(),
    };
    hub.slots[index].n_in_flight.fetch_add(1, Ordering::SeqCst);
    in_flight.slot = Some(index);
    let router = match hub.enter(index).await {
        Ok(router) => router,
        Err(error) => return error.into_response(),
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    let Ok(response) = router.oneshot(request).await;
    // The request stays in flight until its answer's body is sent or
    // dropped (a stream's end).
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _in_flight = &in_flight;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// Counts, in the front's metrics, every answer no model's routes counted.
async fn count(State(hub): State<Arc<Hub>>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.extensions().get::<routes::Counted>().is_none() {
        hub.front.record_request(response.status().as_u16());
    }
    response
}

/// With `--api-key`, the front's own routes but `/health` need it too.
async fn require_key(State(hub): State<Arc<Hub>>, request: Request, next: Next) -> Response {
    match routes::check_key(&hub.config, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

async fn health(State(hub): State<Arc<Hub>>) -> Response {
    routes::health_answer(hub.stopping.load(Ordering::Relaxed))
}

/// Every model, loaded or not (`loaded` says which).
async fn models(State(hub): State<Arc<Hub>>) -> Response {
    let data: Vec<Value> = hub
        .slots
        .iter()
        .map(|slot| {
            json!({
                "id": slot.id,
                "object": "model",
                "created": hub.created,
                "owned_by": "lm",
                "context_length": *lock(&slot.context_length),
                "loaded": slot.loaded.load(Ordering::Relaxed),
            })
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// Each model's metrics labelled `model="ID"`, and its load state.
async fn metrics(State(hub): State<Arc<Hub>>) -> Response {
    let models: Vec<ModelMetrics<'_>> = hub
        .slots
        .iter()
        .map(|slot| {
            // A slot being loaded or unloaded has no queue to read.
            let queue_depth = slot.running.try_lock().ok().map_or(0, |running| {
                running
                    .as_ref()
                    .map_or(0, |running| running.handle.app.queue.len())
            });
            ModelMetrics {
                id: Some(&slot.id),
                metrics: &slot.metrics,
                queue_depth,
                loaded: Some([
                    u64::from(slot.loaded.load(Ordering::Relaxed)),
                    slot.n_loads.load(Ordering::Relaxed),
                    slot.n_unloads.load(Ordering::Relaxed),
                    slot.n_in_flight.load(Ordering::Relaxed) as u64,
                ]),
            }
        })
        .collect();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        render_models(Some(&hub.front), &models),
    )
        .into_response()
}

/// An id a request can name and the server shows as given: not empty, and
/// not what [`ServeConfig::model_id`] would shorten (a path, `.gguf`).
fn check_id(id: &str) -> Result<(), ServeError> {
    let shown = ServeConfig {
        model_name: id.to_owned(),
        ..ServeConfig::default()
    }
    .model_id();
    if id.is_empty() || shown != id {
        return Err(ServeError::InvalidSetting {
            name: "model",
            reason: format!("'{id}' cannot be a model id (empty, a path or ending in .gguf)"),
        });
    }
    Ok(())
}

fn shutting_down() -> ApiError {
    ApiError::status(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is shutting down",
    )
    .retry_after(5)
}

/// A plain mutex's value; a panic elsewhere does not poison these
/// (a time, a length).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
