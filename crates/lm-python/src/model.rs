//! `lm.Model`: a loaded model (the facade's `GgufModel`) and its methods.
//! Each method converts its arguments, calls the facade or lm-decode with
//! the GIL released, and converts the result back.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use lm::{Drafting, GgufModel};
use lm_core::{LanguageModel, Rows, TokenId};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::errors::{self, LmError, invalid};
use crate::openai;
use crate::run::{Completion, Run, TextStream};
use crate::settings::{self, Defaults, Request};
use crate::tokenizer::{self, Tokenizer};

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

    /// The keywords of a call on a prompt of `n_prompt` tokens.
    fn request<'py>(
        &self,
        kwargs: Option<&Bound<'py, PyDict>>,
        defaults: Defaults,
        n_prompt: usize,
    ) -> PyResult<Request<'py>> {
        let context_length = self.inner.decoder.context_length();
        let request = settings::parse(kwargs, defaults, context_length, n_prompt)?;
        if request.num_beams.is_none()
            && kwargs.is_some_and(|k| k.contains("length_penalty").unwrap_or(false))
        {
            return Err(invalid("length_penalty needs num_beams"));
        }
        Ok(request)
    }

    /// `draft=` as the facade's [`Drafting`]: "prompt-lookup", a `Model`,
    /// or a path loaded here (pass a `Model` to load it once).
    fn drafting(&self, py: Python<'_>, draft: &Bound<'_, PyAny>) -> PyResult<Drafting> {
        let model = if let Ok(model) = draft.cast::<Model>() {
            Arc::clone(&model.get().inner)
        } else if draft
            .extract::<String>()
            .is_ok_and(|text| text == "prompt-lookup")
        {
            return Ok(Drafting::PromptLookup);
        } else {
            let path = draft.extract::<PathBuf>().map_err(|_| {
                invalid("draft: expected \"prompt-lookup\", a model path or an lm.Model")
            })?;
            Arc::new(py.detach(|| lm::load(&path)).map_err(errors::from_lm)?)
        };
        let (target, drafted) = (self.inner.decoder.vocab_size(), model.decoder.vocab_size());
        if target != drafted {
            return Err(invalid(format!(
                "draft: the draft model has {drafted} token ids, this model {target}: they must share the vocabulary"
            )));
        }
        Ok(Drafting::Model(model))
    }

    /// Starts a generation from `prompt` as `request` says (speculative
    /// with a draft).
    pub fn start(&self, py: Python<'_>, prompt: &[TokenId], request: Request<'_>) -> PyResult<Run> {
        let mut options = request.options;
        if let Some(draft) = &request.draft {
            options.draft = Some(self.drafting(py, draft)?);
        }
        Run::start(&self.inner, prompt, &options)
    }

    /// A `Completion` (the best beam with `num_beams`), or a `TextStream`
    /// when `stream`.
    fn generate_ids(
        &self,
        py: Python<'_>,
        prompt: Vec<TokenId>,
        stream: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let request = self.request(kwargs, settings::GENERATE, prompt.len())?;
        if let Some(num_beams) = request.num_beams {
            if stream || request.draft.is_some() {
                return Err(invalid(
                    "num_beams: beam search takes neither stream=True nor draft",
                ));
            }
            return Ok(Py::new(py, self.beam_search(py, prompt, &request, num_beams)?)?.into_any());
        }
        let run = self.start(py, &prompt, request)?;
        if stream {
            return Ok(Py::new(py, TextStream::new(run))?.into_any());
        }
        let run = run.finish(py)?;
        Ok(Py::new(py, Completion::new(run))?.into_any())
    }

    /// The best hypothesis of lm-decode's beam search (through the facade).
    fn beam_search(
        &self,
        py: Python<'_>,
        prompt: Vec<TokenId>,
        request: &Request<'_>,
        num_beams: usize,
    ) -> PyResult<Completion> {
        let model = &self.inner;
        let (options, alpha) = (&request.options, request.length_penalty);
        // Ctrl-C between two steps stops the search and raises.
        let mut interrupt = None;
        let beams = py
            .detach(|| {
                model.beam_search_with(
                    &prompt,
                    options,
                    num_beams,
                    alpha,
                    |_| match Python::attach(|py| py.check_signals()) {
                        Ok(()) => ControlFlow::Continue(()),
                        Err(error) => {
                            interrupt = Some(error);
                            ControlFlow::Break(())
                        }
                    },
                )
            })
            .map_err(errors::from_lm)?;
        if let Some(error) = interrupt {
            return Err(error);
        }
        let best = beams
            .into_iter()
            .next()
            .ok_or_else(|| LmError::new_err("beam search gave no hypothesis"))?;
        let mut shown = best.tokens.as_slice();
        if let Some((last, rest)) = shown.split_last()
            && model.text.end_ids.contains(last)
        {
            shown = rest;
        }
        let text = tokenizer::decode(model, shown, true)?;
        Ok(Completion::from_hypothesis(best, prompt, text))
    }

    /// `generate([p1, p2, ...])`: every prompt through the facade's
    /// batch (the multi-sequence forward), a list of `Completion`s.
    fn generate_batch(
        &self,
        py: Python<'_>,
        prompts: &Bound<'_, PyList>,
        stream: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let ids = prompts
            .iter()
            .map(|prompt| self.prompt_ids(&prompt))
            .collect::<PyResult<Vec<_>>>()?;
        let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
        let request = self.request(kwargs, settings::GENERATE, longest)?;
        if stream || request.draft.is_some() || request.num_beams.is_some() {
            return Err(invalid(
                "a batch of prompts takes neither stream=True, draft nor num_beams",
            ));
        }
        let model = &self.inner;
        let options = &request.options;
        let runs = py
            .detach(|| {
                let prompts: Vec<lm::Prompt<'_>> =
                    ids.iter().map(|ids| lm::Prompt::Ids(ids)).collect();
                model.generate_batch(&prompts, options)
            })
            .map_err(errors::from_lm)?;
        let completions = runs
            .into_iter()
            .map(|run| Py::new(py, Completion::new(run)))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, completions)?.into_any().unbind())
    }

    /// How a `create_*` result is written; refuses what the OpenAI shapes
    /// here do not carry (beams, streamed log-probabilities, a streamed
    /// echo).
    fn shape(
        &self,
        kind: openai::Kind,
        request: &Request<'_>,
        stream: bool,
    ) -> PyResult<openai::Shape> {
        if request.num_beams.is_some() {
            return Err(invalid(
                "num_beams: the create_* methods do not run beam search (generate does)",
            ));
        }
        if stream && (request.logprobs.is_some() || request.echo) {
            return Err(invalid(
                "logprobs and echo are not supported with stream=True",
            ));
        }
        if request.echo && request.logprobs.is_some() {
            return Err(invalid(
                "echo=True with logprobs (the prompt's log-probabilities) is not supported",
            ));
        }
        Ok(openai::Shape {
            kind,
            model: Arc::clone(&self.inner),
            name: self.name(),
            logprobs: request.logprobs.is_some(),
            echo: None,
            prompt_chars: 0,
        })
    }
}

/// Whether `prompt` is a batch: a non-empty list of strings or of id
/// lists (a list of ints is one prompt's ids).
fn as_batch<'a, 'py>(prompt: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, PyList>> {
    let list = prompt.cast::<PyList>().ok()?;
    let first = list.get_item(0).ok()?;
    (first.is_instance_of::<PyString>() || first.is_instance_of::<PyList>()).then_some(list)
}

#[pymethods]
impl Model {
    /// The model's tokenizer as an object (encode, decode, vocab_size,
    /// bos_token_id, eos_token_id, ...), as HF's and llama-cpp-python's.
    #[getter]
    fn tokenizer(&self) -> Tokenizer {
        Tokenizer::new(Arc::clone(&self.inner))
    }

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
        tokenizer::encode(py, &self.inner, text, add_bos, special)
    }

    /// The text of `ids`. `special`: write special tokens out (else they
    /// are left out). Incomplete UTF-8 at the end reads as U+FFFD.
    #[pyo3(signature = (ids, special=true))]
    fn detokenize(&self, ids: Vec<TokenId>, special: bool) -> PyResult<String> {
        tokenizer::decode(&self.inner, &ids, special)
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
    /// ids). Keywords: see `lm/__init__.pyi` (`draft=` decodes
    /// speculatively, `num_beams=` runs beam search). Returns a
    /// `Completion`, or with `stream=True` a `TextStream` of text pieces;
    /// a list of prompts (strs or id lists) runs as one batch and returns
    /// a list of `Completion`s.
    #[pyo3(signature = (prompt, stream=false, **kwargs))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        stream: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        if let Some(prompts) = as_batch(prompt) {
            return self.generate_batch(py, prompts, stream, kwargs);
        }
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
        let prompt_text = match prompt.extract::<String>() {
            Ok(text) => text,
            Err(_) => tokenizer::decode(&self.inner, &self.prompt_ids(prompt)?, true)?,
        };
        let prompt = self.prompt_ids(prompt)?;
        let request = self.request(kwargs, settings::COMPLETION, prompt.len())?;
        let shape = self.shape(openai::Kind::Completion, &request, stream)?;
        let shape = openai::Shape {
            echo: request.echo.then_some(prompt_text.clone()),
            prompt_chars: prompt_text.chars().count(),
            ..shape
        };
        let run = self.start(py, &prompt, request)?;
        openai::respond(py, shape, run, stream)
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
        let request = self.request(kwargs, settings::CHAT_COMPLETION, prompt.len())?;
        if request.echo {
            return Err(invalid(
                "echo: create_chat_completion has no echo (create_completion has)",
            ));
        }
        let shape = self.shape(openai::Kind::Chat, &request, stream)?;
        let run = self.start(py, &prompt, request)?;
        openai::respond(py, shape, run, stream)
    }

    /// The path, vocabulary size and context length.
    fn __repr__(&self) -> String {
        format!(
            "Model(path={:?}, vocab_size={}, context_length={})",
            self.name(),
            self.vocab_size(),
            self.context_length()
                .map_or_else(|| "None".to_owned(), |n| n.to_string())
        )
    }
}
