//! `lm.Model`: a loaded model (the facade's `GgufModel`) and its methods.
//! Each method converts its arguments, calls the facade or lm-decode with
//! the GIL released, and converts the result back.

use std::path::PathBuf;
use std::sync::Arc;

use lm::GgufModel;
use lm_core::{LanguageModel, Rows, TokenId};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::errors::{self, invalid};
use crate::openai;
use crate::run::{Completion, Run, TextStream};
use crate::settings::{self, Defaults};

/// A loaded model: its weights, tokenizer, chat template and end tokens.
/// Immutable and shared: any number of threads may generate from it.
#[pyclass(frozen, module = "lm")]
#[derive(Debug)]
pub struct Model {
    inner: Arc<GgufModel>,
    path: PathBuf,
}

impl Model {
    /// Wraps a loaded model.
    pub fn new(inner: GgufModel, path: PathBuf) -> Self {
        Self {
            inner: Arc::new(inner),
            path,
        }
    }

    /// The model's name in OpenAI-shaped results: the path it came from.
    pub fn name(&self) -> String {
        self.path.display().to_string()
    }

    /// The ids of a prompt: a string is encoded by the facade (as `lm-cli
    /// generate` encodes it), a list of ints is taken as it is.
    fn prompt_ids(&self, prompt: &Bound<'_, PyAny>) -> PyResult<Vec<TokenId>> {
        if prompt.is_instance_of::<PyString>() {
            let text = prompt.extract::<String>()?;
            return self.inner.prompt_ids(&text).map_err(errors::from_lm);
        }
        prompt
            .extract::<Vec<TokenId>>()
            .map_err(|_| invalid("prompt: expected a string or a list of token ids"))
    }

    /// The ids of a chat's prompt, rendered by the facade with the model's
    /// template (messages' contents kept literal).
    fn chat_ids(&self, messages: &Bound<'_, PyAny>) -> PyResult<Vec<TokenId>> {
        let messages = settings::messages(messages)?;
        self.inner.prompt_ids(&messages).map_err(errors::from_lm)
    }

    /// Starts a generation from `prompt` with the keywords' settings.
    pub fn start(
        &self,
        prompt: Vec<TokenId>,
        kwargs: Option<&Bound<'_, PyDict>>,
        defaults: Defaults,
    ) -> PyResult<Run> {
        let context_length = self.inner.decoder.context_length();
        let options = settings::parse(kwargs, defaults, context_length, prompt.len())?;
        Run::start(&self.inner, &prompt, &options)
    }

    /// A `Completion`, or a `TextStream` when `stream`.
    fn generate_ids(
        &self,
        py: Python<'_>,
        prompt: Vec<TokenId>,
        stream: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let run = self.start(prompt, kwargs, settings::GENERATE)?;
        if stream {
            return Ok(Py::new(py, TextStream::new(run))?.into_any());
        }
        let run = run.finish(py)?;
        Ok(Py::new(py, Completion::new(run))?.into_any())
    }
}

#[pymethods]
impl Model {
    /// The most positions (prompt plus generated tokens) the model reads.
    #[getter]
    fn context_length(&self) -> Option<usize> {
        self.inner.decoder.context_length()
    }

    /// The number of token ids (the width of a logits row).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.decoder.vocab_size()
    }

    /// The Jinja chat template stored with the model, if any.
    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.inner.text.tokenizer.chat_template().map(str::to_owned)
    }

    /// The beginning-of-sequence token id, if the vocabulary names one.
    #[getter]
    fn bos_id(&self) -> Option<TokenId> {
        self.inner.text.tokenizer.bos_id()
    }

    /// The end-of-sequence token id, if the vocabulary names one.
    #[getter]
    fn eos_id(&self) -> Option<TokenId> {
        self.inner.text.tokenizer.eos_id()
    }

    /// The ids that end a generation (EOS and the end-of-turn tokens).
    #[getter]
    fn end_ids(&self) -> Vec<TokenId> {
        self.inner.text.end_ids.clone()
    }

    /// The path the model was loaded from.
    #[getter]
    fn path(&self) -> String {
        self.name()
    }

    /// Token ids of `text` (a str, or UTF-8 bytes as llama-cpp-python
    /// takes). `add_bos`: prepend BOS when the vocabulary asks for it.
    /// `special`: read special-token text (`<|im_start|>`) as the control
    /// token instead of as plain text.
    #[pyo3(signature = (text, add_bos=true, special=false))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: &Bound<'_, PyAny>,
        add_bos: bool,
        special: bool,
    ) -> PyResult<Vec<TokenId>> {
        let text = if let Ok(bytes) = text.cast::<PyBytes>() {
            std::str::from_utf8(bytes.as_bytes())
                .map_err(|error| invalid(format!("text: not UTF-8: {error}")))?
                .to_owned()
        } else {
            text.extract::<String>()
                .map_err(|_| invalid("text: expected str or bytes"))?
        };
        let tokenizer = &self.inner.text.tokenizer;
        let mut ids = py
            .detach(|| {
                if special {
                    tokenizer.encode(&text)
                } else {
                    tokenizer.encode_literal(&text)
                }
            })
            .map_err(errors::from_tokenize)?;
        if !add_bos && tokenizer.add_bos() && ids.first() == tokenizer.bos_id().as_ref() {
            ids.remove(0);
        }
        Ok(ids)
    }

    /// The text of `ids`. `special`: write special tokens out (else they
    /// are left out). Incomplete UTF-8 at the end reads as U+FFFD.
    #[pyo3(signature = (ids, special=true))]
    fn detokenize(&self, ids: Vec<TokenId>, special: bool) -> PyResult<String> {
        let tokenizer = &self.inner.text.tokenizer;
        if special {
            tokenizer.decode(&ids)
        } else {
            tokenizer.decode_skipping_special(&ids)
        }
        .map_err(errors::from_tokenize)
    }

    /// The model's logits after each of `ids`, read from a fresh sequence in
    /// one forward pass: a float32 array of shape (len(ids), vocab_size)
    /// that owns the engine's buffer (no copy).
    fn logits<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<TokenId>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        if ids.is_empty() {
            return Err(invalid("ids: expected at least one token id"));
        }
        let decoder = &self.inner.decoder;
        let rows = py
            .detach(|| {
                let mut state = decoder.new_state();
                let mut logits = Vec::new();
                decoder
                    .forward(&mut state, &ids, Rows::All, &mut logits)
                    .map(|()| logits)
            })
            .map_err(errors::from_core)?;
        PyArray1::from_vec(py, rows).reshape([ids.len(), decoder.vocab_size()])
    }

    /// The log-probability (natural log) of each token of `text` read from
    /// the start of a document (the facade's `score`: after SmolLM2's
    /// `<|endoftext|>`, Gemma's BOS; else after the text's first token,
    /// which is then not scored). A float64 array; `.sum()` is the text's
    /// log-probability.
    fn score<'py>(&self, py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let model = &self.inner;
        let score = py.detach(|| model.score(text)).map_err(errors::from_lm)?;
        Ok(PyArray1::from_vec(py, score.logprobs))
    }

    /// Generates a continuation of `prompt` (a str, or a list of token
    /// ids). Keywords: see `lm/__init__.pyi`. Returns a `Completion`, or
    /// with `stream=True` a `TextStream` of text pieces.
    #[pyo3(signature = (prompt, stream=false, **kwargs))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        stream: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let prompt = self.prompt_ids(prompt)?;
        self.generate_ids(py, prompt, stream, kwargs)
    }

    /// The assistant's reply to `messages` (a list of {"role", "content"}
    /// dicts) in the model's chat template. Same keywords and result as
    /// `generate`.
    #[pyo3(signature = (messages, stream=false, **kwargs))]
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        stream: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let prompt = self.chat_ids(messages)?;
        self.generate_ids(py, prompt, stream, kwargs)
    }

    /// llama-cpp-python's `Llama.create_completion`: a "text_completion"
    /// dict, or with `stream=True` an iterator of its chunks.
    #[pyo3(signature = (prompt, stream=false, **kwargs))]
    fn create_completion(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        stream: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let prompt = self.prompt_ids(prompt)?;
        let run = self.start(prompt, kwargs, settings::COMPLETION)?;
        openai::respond(py, self.name(), openai::Kind::Completion, run, stream)
    }

    /// llama-cpp-python's `Llama.create_chat_completion`: a
    /// "chat.completion" dict, or with `stream=True` an iterator of
    /// "chat.completion.chunk" dicts.
    #[pyo3(signature = (messages, stream=false, **kwargs))]
    fn create_chat_completion(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        stream: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let prompt = self.chat_ids(messages)?;
        let run = self.start(prompt, kwargs, settings::CHAT_COMPLETION)?;
        openai::respond(py, self.name(), openai::Kind::Chat, run, stream)
    }

    /// The path, vocabulary size and context length.
    fn __repr__(&self) -> String {
        format!(
            "Model(path={:?}, vocab_size={}, context_length={:?})",
            self.name(),
            self.vocab_size(),
            self.context_length()
        )
    }
}
