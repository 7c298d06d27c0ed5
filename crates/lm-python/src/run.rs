//! One generation on a worker thread, and what Python sees of it: a
//! `Completion` (the finished run) or a `TextStream` (its text as it comes).
//!
//! ```text
//! Python thread                         worker thread
//! ─────────────                         ─────────────
//! Worker::start ──spawn──────────────>  lm_decode::generate_streaming(model, ids, config)
//! next(): GIL released, wait 100 ms <── Event::Piece(step.text) per step
//!         check_signals (Ctrl-C)        hook: cancel flag set? Break (StopReason::Cancelled)
//!                                   <── Event::Done(Generation | error)
//! drop (loop broken, Ctrl-C) ──────> cancel flag; join
//! ```
//!
//! The loop is lm-decode's, unchanged; the thread only lets Python wait
//! without the GIL and stop the run between two steps.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use lm::GgufModel;
use lm_core::TokenId;
use lm_decode::{Generation, GenerationConfig, StopReason};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::{self, LmError};

/// How long a waiting Python thread sleeps between two looks at its
/// signals (Ctrl-C is noticed within this).
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// What the worker sends.
#[derive(Debug)]
enum Message {
    Piece(String),
    Done(Result<Generation, lm_decode::Error>),
}

/// What the Python side reads from a [`Worker`].
#[derive(Debug)]
pub enum Event {
    /// Final text (each piece is never revised: see `lm_decode::TextDeltas`).
    Piece(String),
    /// The run ended.
    Done(Box<Generation>),
}

/// A generation running on its own thread.
#[derive(Debug)]
pub struct Worker {
    messages: Receiver<Message>,
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The finished run, kept while its held-back text is handed out.
    pending: Option<Box<Generation>>,
    done: bool,
}

impl Worker {
    /// Starts generating from `prompt` on a new thread.
    pub fn start(
        model: Arc<GgufModel>,
        prompt: Vec<TokenId>,
        config: GenerationConfig,
    ) -> PyResult<Self> {
        let (sender, messages) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::clone(&cancel);
        let thread = std::thread::Builder::new()
            .name("lm-generate".into())
            .spawn(move || {
                let tokenizer = &model.text.tokenizer;
                let run = lm_decode::generate_streaming(
                    &model.decoder,
                    &prompt,
                    &config,
                    Some(tokenizer),
                    |step| {
                        let stop = cancelled.load(Ordering::Relaxed)
                            || (!step.text.is_empty()
                                && sender.send(Message::Piece(step.text.clone())).is_err());
                        Ok::<_, lm_decode::Error>(if stop {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        })
                    },
                );
                // The reader may be gone (the stream was dropped).
                let _ = sender.send(Message::Done(run));
            })
            .map_err(|error| LmError::new_err(format!("starting a generation thread: {error}")))?;
        Ok(Self {
            messages,
            cancel,
            thread: Some(thread),
            pending: None,
            done: false,
        })
    }

    /// The next event, waiting without the GIL; `None` after `Done`.
    /// Ctrl-C (a pending signal) cancels the run and raises.
    pub fn next(&mut self, py: Python<'_>) -> PyResult<Option<Event>> {
        if let Some(run) = self.pending.take() {
            self.done = true;
            return Ok(Some(Event::Done(run)));
        }
        if self.done {
            return Ok(None);
        }
        loop {
            let messages = &mut self.messages;
            let received = py.detach(move || messages.recv_timeout(SIGNAL_POLL));
            if let Err(error) = py.check_signals() {
                self.stop();
                return Err(error);
            }
            match received {
                Ok(Message::Piece(text)) => return Ok(Some(Event::Piece(text))),
                Ok(Message::Done(Ok(mut run))) => {
                    let held = std::mem::take(&mut run.held_back_text);
                    if held.is_empty() {
                        self.done = true;
                        return Ok(Some(Event::Done(Box::new(run))));
                    }
                    self.pending = Some(Box::new(run));
                    return Ok(Some(Event::Piece(held)));
                }
                Ok(Message::Done(Err(error))) => {
                    self.done = true;
                    return Err(errors::from_decode(error));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.done = true;
                    return Err(LmError::new_err(
                        "the generation thread ended without a result",
                    ));
                }
            }
        }
    }

    /// Reads to the end: the finished run.
    pub fn finish(mut self, py: Python<'_>) -> PyResult<Generation> {
        loop {
            match self.next(py)? {
                Some(Event::Done(run)) => return Ok(*run),
                Some(Event::Piece(_)) => {}
                None => return Err(LmError::new_err("the generation was already read")),
            }
        }
    }

    /// Asks the loop to stop after its current step.
    fn stop(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Drop for Worker {
    /// A stream dropped early (a `break`, an exception) cancels its run and
    /// waits for the thread, without the GIL, so no computation outlives it.
    fn drop(&mut self) {
        self.stop();
        if let Some(thread) = self.thread.take() {
            Python::attach(|py| py.detach(|| thread.join())).ok();
        }
    }
}

/// A finished generation.
#[pyclass(frozen, module = "lm")]
#[derive(Debug)]
pub struct Completion {
    /// The generated text (without end tokens, cut before a stop string).
    #[pyo3(get)]
    text: String,
    /// The generated token ids (an end token that stopped the run is last).
    #[pyo3(get)]
    ids: Vec<TokenId>,
    /// The model's log-probability of each generated token (natural log,
    /// before the sampling policy).
    #[pyo3(get)]
    logprobs: Vec<f64>,
    /// The prompt's ids as the model read them.
    #[pyo3(get)]
    prompt_ids: Vec<TokenId>,
    /// Why it stopped: "end_token", "stop_string", "max_new_tokens",
    /// "context_length", "cancelled" or "constraint_complete".
    #[pyo3(get)]
    stop_reason: &'static str,
    /// The stop string that ended the run, if one did.
    #[pyo3(get)]
    stop_string: Option<String>,
    /// True when the model, a stop string or a constraint ended the run;
    /// false when a limit cut it.
    #[pyo3(get)]
    finished: bool,
}

impl Completion {
    /// The Python view of a run.
    pub fn new(run: Generation) -> Self {
        let (stop_reason, stop_string) = stop_reason(&run.stop_reason);
        Self {
            finished: run.is_finished(),
            logprobs: run.steps.iter().map(|step| step.logprob).collect(),
            text: run.text.unwrap_or_default(),
            ids: run.tokens,
            prompt_ids: run.prompt,
            stop_reason,
            stop_string,
        }
    }

    /// OpenAI's `finish_reason`: "stop" when the run ended on its own,
    /// "length" when a limit cut it.
    pub fn finish_reason(&self) -> &'static str {
        if self.finished { "stop" } else { "length" }
    }

    /// The generated text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How many tokens the prompt and the output have.
    pub fn counts(&self) -> (usize, usize) {
        (self.prompt_ids.len(), self.ids.len())
    }
}

/// The name of a stop reason, and the stop string when it is one.
pub fn stop_reason(reason: &StopReason) -> (&'static str, Option<String>) {
    match reason {
        StopReason::EndToken(_) => ("end_token", None),
        StopReason::StopString(text) => ("stop_string", Some(text.clone())),
        StopReason::MaxNewTokens => ("max_new_tokens", None),
        StopReason::ContextBound => ("context_length", None),
        StopReason::Cancelled => ("cancelled", None),
        StopReason::ConstraintComplete => ("constraint_complete", None),
        _ => ("other", None),
    }
}

#[pymethods]
impl Completion {
    /// The generated text, so `print(model.generate(...))` prints it.
    fn __str__(&self) -> String {
        self.text.clone()
    }

    /// The text, the number of tokens and the stop reason.
    fn __repr__(&self) -> String {
        format!(
            "Completion(text={:?}, n_tokens={}, stop_reason={:?})",
            self.text,
            self.ids.len(),
            self.stop_reason
        )
    }
}

/// The generated text, piece by piece, as the model computes it; breaking
/// out of the loop (or dropping the stream) stops the generation.
#[pyclass(frozen, module = "lm")]
#[derive(Debug)]
pub struct TextStream {
    worker: Mutex<Worker>,
    /// The finished run, once the stream is exhausted.
    result: Mutex<Option<Py<Completion>>>,
}

impl TextStream {
    /// A stream over a started worker.
    pub fn new(worker: Worker) -> Self {
        Self {
            worker: Mutex::new(worker),
            result: Mutex::new(None),
        }
    }
}

/// The worker of a stream, refused when another thread is reading it.
pub fn lock(worker: &Mutex<Worker>) -> PyResult<std::sync::MutexGuard<'_, Worker>> {
    worker
        .try_lock()
        .map_err(|_| PyRuntimeError::new_err("this stream is being read by another thread"))
}

#[pymethods]
impl TextStream {
    /// The stream is its own iterator.
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next piece of text; `StopIteration` at the end.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut worker = lock(&self.worker)?;
        loop {
            match worker.next(py)? {
                Some(Event::Piece(text)) => return Ok(Some(text)),
                Some(Event::Done(run)) => {
                    let completion = Py::new(py, Completion::new(*run))?;
                    *self
                        .result
                        .lock()
                        .map_err(|_| LmError::new_err("poisoned"))? = Some(completion);
                }
                None => return Ok(None),
            }
        }
    }

    /// The finished run (ids, logprobs, stop reason) once the loop has
    /// ended, else `None`.
    #[getter]
    fn result(&self, py: Python<'_>) -> Option<Py<Completion>> {
        let result = self.result.lock().ok()?;
        result.as_ref().map(|completion| completion.clone_ref(py))
    }

    /// Stops the generation now (as breaking out of the loop does).
    fn close(&self) {
        if let Ok(worker) = self.worker.try_lock() {
            worker.stop();
        }
    }
}
