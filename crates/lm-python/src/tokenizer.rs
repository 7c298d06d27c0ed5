//! `model.tokenizer`: the model's tokenizer as an object of its own, with
//! the names HF's tokenizers and llama-cpp-python's `Llama.tokenizer()`
//! use (`encode`, `decode`, `vocab_size`, `bos_token_id`, ...), so code
//! that takes a tokenizer object runs with this one. `Model.tokenize` and
//! `Model.detokenize` are the same two functions.

use std::sync::Arc;

use lm::GgufModel;
use lm_core::{LanguageModel, TokenId};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{self, invalid};

/// Token ids of `text` (a str, or UTF-8 bytes); see [`Tokenizer::encode`].
pub fn encode(
    py: Python<'_>,
    model: &GgufModel,
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
    let tokenizer = &model.text.tokenizer;
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

/// The text of `ids`, special tokens written out or left out.
pub fn decode(model: &GgufModel, ids: &[TokenId], special: bool) -> PyResult<String> {
    let tokenizer = &model.text.tokenizer;
    if special {
        tokenizer.decode(ids)
    } else {
        tokenizer.decode_skipping_special(ids)
    }
    .map_err(errors::from_tokenize)
}

/// The tokenizer of a loaded model (`model.tokenizer`).
#[pyclass(frozen, module = "lm")]
#[derive(Debug)]
pub struct Tokenizer {
    model: Arc<GgufModel>,
}

impl Tokenizer {
    /// The tokenizer of `model`.
    pub fn new(model: Arc<GgufModel>) -> Self {
        Self { model }
    }
}

#[pymethods]
impl Tokenizer {
    /// Token ids of `text` (str or UTF-8 bytes). `add_bos`: prepend BOS
    /// when the vocabulary asks for it (HF's `add_special_tokens`).
    /// `special`: read special-token text such as `<|im_start|>` as the
    /// control token.
    #[pyo3(signature = (text, add_bos=true, special=false))]
    fn encode(
        &self,
        py: Python<'_>,
        text: &Bound<'_, PyAny>,
        add_bos: bool,
        special: bool,
    ) -> PyResult<Vec<TokenId>> {
        encode(py, &self.model, text, add_bos, special)
    }

    /// The text of `ids`; `skip_special_tokens` leaves special tokens out
    /// (HF's name). Incomplete UTF-8 at the end reads as U+FFFD.
    #[pyo3(signature = (ids, skip_special_tokens=false))]
    fn decode(&self, ids: Vec<TokenId>, skip_special_tokens: bool) -> PyResult<String> {
        decode(&self.model, &ids, !skip_special_tokens)
    }

    /// The vocabulary's text of each id (byte-level form, e.g. "Ġthe"), as
    /// HF's `convert_ids_to_tokens`.
    fn convert_ids_to_tokens(&self, ids: Vec<TokenId>) -> PyResult<Vec<String>> {
        let tokenizer = &self.model.text.tokenizer;
        ids.into_iter()
            .map(|id| {
                tokenizer
                    .token_text(id)
                    .map(str::to_owned)
                    .ok_or_else(|| invalid(format!("token id {id} is not in the vocabulary")))
            })
            .collect()
    }

    /// The id whose vocabulary text is exactly `token`, else `None` (HF's
    /// `convert_tokens_to_ids` for one token).
    fn token_to_id(&self, token: &str) -> Option<TokenId> {
        self.model.text.tokenizer.token_id(token)
    }

    /// The number of token ids (the width of a logits row).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.model.decoder.vocab_size()
    }

    /// The beginning-of-sequence id, if the vocabulary names one.
    #[getter]
    fn bos_token_id(&self) -> Option<TokenId> {
        self.model.text.tokenizer.bos_id()
    }

    /// The end-of-sequence id, if the vocabulary names one.
    #[getter]
    fn eos_token_id(&self) -> Option<TokenId> {
        self.model.text.tokenizer.eos_id()
    }

    /// The ids that end a generation (EOS and the end-of-turn tokens).
    #[getter]
    fn end_ids(&self) -> Vec<TokenId> {
        self.model.text.end_ids.clone()
    }

    /// Whether `id` is a special (control) token.
    fn is_special(&self, id: TokenId) -> bool {
        self.model.text.tokenizer.is_special(id)
    }

    /// The vocabulary size, so `len(tokenizer)` works as with HF.
    fn __len__(&self) -> usize {
        self.vocab_size()
    }

    /// Itself: llama-cpp-python's `llm.tokenizer()` is a method call.
    fn __call__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The vocabulary size and special ids.
    fn __repr__(&self) -> String {
        let id = |id: Option<TokenId>| id.map_or_else(|| "None".to_owned(), |id| id.to_string());
        format!(
            "Tokenizer(vocab_size={}, bos_token_id={}, eos_token_id={})",
            self.vocab_size(),
            id(self.bos_token_id()),
            id(self.eos_token_id())
        )
    }
}
