//! One generation as Python sees it: a `Completion` (the finished run) or a
//! `TextStream` (its text as it comes), both read from the facade's
//! [`lm::Stream`] (the loop on a thread of its own).
//!
//! ```text
//! Python thread                              generation thread (lm::Stream)
//! Run::next(): GIL released, wait for <───── a piece of text per step
//!              a piece; then check_signals   (Ctrl-C: cancel, raise KeyboardInterrupt)
//!              end of pieces: finish() ───── join: lm::Completion or the error
//! drop (loop left, Ctrl-C) ────────────────> cancel: the run stops at its next step; joined
//! ```
//!
//! The loop is lm-decode's, through the facade, unchanged; this module only
//! lets Python wait without the GIL and stop the run between two steps.

use std::sync::{Arc, Mutex};

use lm::{GgufModel, Options};
use lm_core::TokenId;
use lm_decode::{Candidate, Hypothesis, StopReason};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::{self, LmError};

/// What the Python side reads from a [`Run`].
#[derive(Debug)]
pub enum Event {
    /// Final text (each piece is never revised: see `lm_decode::TextDeltas`).
    Piece(String),
    /// The run ended.
    Done(Box<lm::Completion>),
}

/// A generation running on its own thread (the facade's [`lm::Stream`]).
#[derive(Debug)]
pub struct Run {
    /// `None` once the run has ended and been joined.
    stream: Option<lm::Stream>,
}

impl Run {
    /// Starts generating from `prompt` on a new thread.
    pub fn start(model: &Arc<GgufModel>, prompt: &[TokenId], options: &Options) -> PyResult<Self> {
        let stream = Arc::clone(model)
            .stream(prompt, options)
            .map_err(errors::from_lm)?;
        Ok(Self {
            stream: Some(stream),
        })
    }

    /// The next event, waiting without the GIL; `None` after `Done`.
    /// Ctrl-C (a pending signal) cancels the run and raises.
    pub fn next(&mut self, py: Python<'_>) -> PyResult<Option<Event>> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(None);
        };
        let piece = py.detach(|| stream.next());
        if let Err(error) = py.check_signals() {
            stream.cancel();
            return Err(error);
        }
        if let Some(text) = piece {
            return Ok(Some(Event::Piece(text)));
        }
        let stream = self.stream.take().expect("the stream is there");
        let completion = py
            .detach(move || stream.finish())
            .map_err(errors::from_lm)?;
        Ok(Some(Event::Done(Box::new(completion))))
    }

    /// Reads to the end: the finished run.
    pub fn finish(mut self, py: Python<'_>) -> PyResult<lm::Completion> {
        loop {
            match self.next(py)? {
                Some(Event::Done(run)) => return Ok(*run),
                Some(Event::Piece(_)) => {}
                None => return Err(LmError::new_err("the generation was already read")),
            }
        }
    }

    /// Asks the run to stop after its current step.
    fn stop(&self) {
        if let Some(stream) = &self.stream {
            stream.cancel();
        }
    }
}

impl Drop for Run {
    /// A run dropped early (a `break`, an exception) is cancelled and its
    /// thread joined without the GIL, so no computation outlives it.
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            stream.cancel();
            Python::attach(|py| py.detach(move || drop(stream)));
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
    /// Per generated token, the `logprobs=N` most probable tokens under
    /// the model and their log-probabilities, best first (empty lists when
    /// not asked).
    #[pyo3(get)]
    top_logprobs: Vec<Top>,
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
    pub fn new(run: lm::Completion) -> Self {
        let (stop_reason, stop_string) = stop_reason(run.stop_reason());
        let top_logprobs = run
            .generation
            .steps
            .iter()
            .map(|step| top_pairs(&step.model_top))
            .collect();
        Self {
            finished: run.is_finished(),
            logprobs: run.logprobs(),
            top_logprobs,
            ids: run.ids().to_vec(),
            text: run.text,
            prompt_ids: run.generation.prompt,
            stop_reason,
            stop_string,
        }
    }

    /// The Python view of a beam-search hypothesis read after `prompt`;
    /// `text` is its tokens' text without a final end token.
    pub fn from_hypothesis(hypothesis: Hypothesis, prompt: Vec<TokenId>, text: String) -> Self {
        let (stop_reason, stop_string) = stop_reason(&hypothesis.stop_reason);
        Self {
            finished: !matches!(
                hypothesis.stop_reason,
                StopReason::MaxNewTokens | StopReason::ContextBound | StopReason::Cancelled
            ),
            text,
            ids: hypothesis.tokens,
            logprobs: hypothesis.step_logprobs,
            top_logprobs: hypothesis
                .top_candidates
                .iter()
                .map(|top| top_pairs(top))
                .collect(),
            prompt_ids: prompt,
            stop_reason,
            stop_string,
        }
    }

    /// The generated ids, each token's log-probability and its top
    /// alternatives, without an end token that stopped the run (its text
    /// is not in the completion's, so OpenAI-shaped `logprobs` leave it
    /// out, as lm-serve's and llama-cpp-python's do).
    pub fn tokens(&self) -> (&[TokenId], &[f64], &[Top]) {
        let n = self.ids.len() - usize::from(self.stop_reason == "end_token");
        (&self.ids[..n], &self.logprobs[..n], &self.top_logprobs[..n])
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

/// One step's top alternatives: (id, log-probability), best first.
pub type Top = Vec<(TokenId, f64)>;

/// Top candidates as (id, log-probability) pairs.
fn top_pairs(top: &[Candidate]) -> Top {
    top.iter()
        .map(|candidate| (candidate.token, widen(candidate.logprob)))
        .collect()
}

/// A log-probability as `f64` (lm-decode's candidates carry `f32` or
/// `f64`, whichever the trace uses).
fn widen(logprob: impl Into<f64>) -> f64 {
    logprob.into()
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
    run: Mutex<Run>,
    /// The finished run, once the stream is exhausted.
    result: Mutex<Option<Py<Completion>>>,
}

impl TextStream {
    /// A stream over a started run.
    pub fn new(run: Run) -> Self {
        Self {
            run: Mutex::new(run),
            result: Mutex::new(None),
        }
    }
}

/// The run of a stream, refused when another thread is reading it.
pub fn lock(run: &Mutex<Run>) -> PyResult<std::sync::MutexGuard<'_, Run>> {
    run.try_lock()
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
        let mut run = lock(&self.run)?;
        loop {
            match run.next(py)? {
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
        if let Ok(run) = self.run.try_lock() {
            run.stop();
        }
    }
}
