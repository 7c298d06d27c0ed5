//! llama-cpp-python's OpenAI-shaped results, so a script written for its
//! `Llama.create_completion` / `create_chat_completion` runs with a changed
//! import: the dicts, and with `stream=True` the iterator of chunk dicts.
//!
//! ```text
//! completion:  {"id": "cmpl-…", "object": "text_completion", "created", "model",
//!               "choices": [{"text", "index": 0, "logprobs", "finish_reason"}], "usage"}
//!   logprobs=N: {"tokens", "text_offset", "token_logprobs", "top_logprobs": [{text: logprob}]}
//! chat:        {"id": "chatcmpl-…", "object": "chat.completion", …,
//!               "choices": [{"index": 0, "message": {"role": "assistant", "content"}, …}], "usage"}
//!   logprobs=True, top_logprobs=N: {"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": None}
//! chat chunks: delta {"role": "assistant"}, then {"content": piece} …, then {} with finish_reason
//! ```

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use lm::GgufModel;
use lm_core::TokenId;
use lm_decode::SamplingConfig;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::LmError;
use crate::run::{Completion, Event, Run, lock};
use crate::tokenizer;

/// Which of the two endpoints' shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// How a response is written: which endpoint, for which model, with
/// what extras.
#[derive(Debug, Clone)]
pub struct Shape {
    pub kind: Kind,
    /// The model, for the token texts of `logprobs`.
    pub model: Arc<GgufModel>,
    /// The model's name in the dicts.
    pub name: String,
    /// Whether the choice carries `logprobs`.
    pub logprobs: bool,
    /// `echo=True`: the prompt's text, which leads the completion's.
    pub echo: Option<String>,
    /// The prompt's length in characters (completions' `text_offset`
    /// counts from the prompt's start, as llama-cpp-python's).
    pub prompt_chars: usize,
}

/// The fields every dict and chunk of one response shares.
#[derive(Debug, Clone)]
struct Header {
    shape: Shape,
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

impl Header {
    fn new(shape: Shape) -> Self {
        let prefix = match shape.kind {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        };
        Self {
            kind: shape.kind,
            id: format!("{prefix}-{:016x}", SamplingConfig::fresh_seed()),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
            model: shape.name.clone(),
            shape,
        }
    }

    /// The text of one token, as its `logprobs` entry names it.
    fn token_text(&self, id: TokenId) -> PyResult<String> {
        tokenizer::decode(&self.shape.model, &[id], true)
    }

    /// The choice's `logprobs` object in the endpoint's shape.
    fn logprobs<'py>(&self, py: Python<'py>, run: &Completion) -> PyResult<Bound<'py, PyDict>> {
        let (ids, logprobs, tops) = run.tokens();
        let dict = PyDict::new(py);
        match self.kind {
            Kind::Completion => {
                let (mut texts, mut offsets, mut top_dicts) = (Vec::new(), Vec::new(), Vec::new());
                let mut offset = self.shape.prompt_chars;
                for ((&id, &logprob), top) in ids.iter().zip(logprobs).zip(tops) {
                    let text = self.token_text(id)?;
                    offsets.push(offset);
                    offset += text.chars().count();
                    // llama-cpp-python's alternatives include the chosen token.
                    let alternatives = PyDict::new(py);
                    for &(token, value) in top {
                        alternatives.set_item(self.token_text(token)?, value)?;
                    }
                    alternatives.set_item(&text, logprob)?;
                    top_dicts.push(alternatives);
                    texts.push(text);
                }
                dict.set_item("tokens", texts)?;
                dict.set_item("text_offset", offsets)?;
                dict.set_item("token_logprobs", logprobs.to_vec())?;
                dict.set_item("top_logprobs", top_dicts)?;
            }
            Kind::Chat => {
                let entry = |id: TokenId, logprob: f64| -> PyResult<Bound<'py, PyDict>> {
                    let text = self.token_text(id)?;
                    let item = PyDict::new(py);
                    item.set_item("token", &text)?;
                    item.set_item("logprob", logprob)?;
                    // OpenAI's bytes: a list of ints (UTF-8), not a bytes object.
                    let bytes: Vec<u16> = text.bytes().map(u16::from).collect();
                    item.set_item("bytes", bytes)?;
                    Ok(item)
                };
                let mut content = Vec::new();
                for ((&id, &logprob), top) in ids.iter().zip(logprobs).zip(tops) {
                    let item = entry(id, logprob)?;
                    let alternatives = top
                        .iter()
                        .map(|&(token, value)| entry(token, value))
                        .collect::<PyResult<Vec<_>>>()?;
                    item.set_item("top_logprobs", alternatives)?;
                    content.push(item);
                }
                dict.set_item("content", content)?;
                dict.set_item("refusal", py.None())?;
            }
        }
        Ok(dict)
    }

    /// A dict with the shared fields and `object`, holding `choice`.
    fn wrap<'py>(
        &self,
        py: Python<'py>,
        object: &str,
        choice: Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("id", &self.id)?;
        dict.set_item("object", object)?;
        dict.set_item("created", self.created)?;
        dict.set_item("model", &self.model)?;
        choice.set_item("index", 0)?;
        if !choice.contains("logprobs")? {
            choice.set_item("logprobs", py.None())?;
        }
        dict.set_item("choices", vec![choice])?;
        Ok(dict)
    }

    /// One streamed chunk: a piece of text, the role opening a chat, or
    /// (with `finish_reason`) the last one.
    fn chunk<'py>(
        &self,
        py: Python<'py>,
        content: Option<&str>,
        role: bool,
        finish_reason: Option<&str>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let choice = PyDict::new(py);
        let object = match self.kind {
            Kind::Completion => {
                choice.set_item("text", content.unwrap_or_default())?;
                "text_completion"
            }
            Kind::Chat => {
                let delta = PyDict::new(py);
                if role {
                    delta.set_item("role", "assistant")?;
                }
                if let Some(content) = content {
                    delta.set_item("content", content)?;
                }
                choice.set_item("delta", delta)?;
                "chat.completion.chunk"
            }
        };
        choice.set_item("finish_reason", finish_reason)?;
        self.wrap(py, object, choice)
    }

    /// The whole response of a finished run.
    fn response<'py>(&self, py: Python<'py>, run: &Completion) -> PyResult<Bound<'py, PyDict>> {
        let choice = PyDict::new(py);
        let object = match self.kind {
            Kind::Completion => {
                let echo = self.shape.echo.as_deref().unwrap_or_default();
                choice.set_item("text", format!("{echo}{}", run.text()))?;
                "text_completion"
            }
            Kind::Chat => {
                let message = PyDict::new(py);
                message.set_item("role", "assistant")?;
                message.set_item("content", run.text())?;
                choice.set_item("message", message)?;
                "chat.completion"
            }
        };
        choice.set_item("finish_reason", run.finish_reason())?;
        if self.shape.logprobs {
            choice.set_item("logprobs", self.logprobs(py, run)?)?;
        }
        let dict = self.wrap(py, object, choice)?;
        let (prompt_tokens, completion_tokens) = run.counts();
        let usage = PyDict::new(py);
        usage.set_item("prompt_tokens", prompt_tokens)?;
        usage.set_item("completion_tokens", completion_tokens)?;
        usage.set_item("total_tokens", prompt_tokens + completion_tokens)?;
        dict.set_item("usage", usage)?;
        Ok(dict)
    }
}

/// The response dict of a run, or with `stream` its chunk iterator.
pub fn respond(py: Python<'_>, shape: Shape, run: Run, stream: bool) -> PyResult<Py<PyAny>> {
    let header = Header::new(shape);
    if stream {
        let chunks = ChunkStream {
            header,
            run: Mutex::new(run),
            started: Mutex::new(false),
        };
        return Ok(Py::new(py, chunks)?.into_any());
    }
    let run = Completion::new(run.finish(py)?);
    Ok(header.response(py, &run)?.into_any().unbind())
}

/// The chunks of a streamed `create_completion` or
/// `create_chat_completion`; breaking out of the loop stops the run.
#[pyclass(frozen, module = "lm")]
#[derive(Debug)]
pub struct ChunkStream {
    header: Header,
    run: Mutex<Run>,
    /// Whether the opening chunk (a chat's role) was sent.
    started: Mutex<bool>,
}

#[pymethods]
impl ChunkStream {
    /// The stream is its own iterator.
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next chunk dict; `StopIteration` after the one with a
    /// `finish_reason`.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let mut run = lock(&self.run)?;
        let mut started = self
            .started
            .lock()
            .map_err(|_| LmError::new_err("poisoned"))?;
        if !*started {
            *started = true;
            if self.header.kind == Kind::Chat {
                return self.header.chunk(py, None, true, None).map(Some);
            }
        }
        match run.next(py)? {
            Some(Event::Piece(text)) => self.header.chunk(py, Some(&text), false, None).map(Some),
            Some(Event::Done(run)) => {
                let run = Completion::new(*run);
                let content = match self.header.kind {
                    Kind::Completion => Some(""),
                    Kind::Chat => None,
                };
                self.header
                    .chunk(py, content, false, Some(run.finish_reason()))
                    .map(Some)
            }
            None => Ok(None),
        }
    }
}
