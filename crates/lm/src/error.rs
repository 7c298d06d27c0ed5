//! [`Error`]: why a GGUF file gave no model, and [`TextError`]: why its
//! metadata gave no tokenizer.

use std::path::PathBuf;

use lm_model::GgufError;
use lm_tokenize::TokenizeError;

/// Why [`load`](crate::load), [`load_gguf`](crate::load_gguf) or [`GgufText::open`](crate::GgufText::open)
/// failed; each variant names the file and carries the part's own error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No file at the path.
    #[error("model file {} not found", path.display())]
    FileMissing {
        /// The path given.
        path: PathBuf,
    },
    /// A file that is no readable GGUF, met when reading only its
    /// tokenizer ([`GgufText::open`](crate::GgufText::open)).
    #[error("opening {}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The GGUF reader's reason.
        #[source]
        source: GgufError,
    },
    /// A file that is no readable GGUF, or weights that build no decoder.
    #[error("loading {}", path.display())]
    Model {
        /// The file.
        path: PathBuf,
        /// lm-model's reason.
        #[source]
        source: lm_model::Error,
    },
    /// A Hugging Face directory whose config.json, safetensors or JSON
    /// side files are missing or malformed (the error names the file and
    /// the field or tensor).
    #[error("loading a Hugging Face model directory")]
    Hf {
        /// lm-model's reason.
        #[source]
        source: lm_model::HfError,
    },
    /// A Hugging Face `tokenizer.json` that builds no tokenizer, or a
    /// `tokenizer_config.json` whose tokens it refuses.
    #[error("reading the tokenizer {}", path.display())]
    HfTokenizer {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: TokenizeError,
    },
    /// Tokenizer metadata that builds no tokenizer.
    #[error("reading the tokenizer of {}", path.display())]
    Text {
        /// The file.
        path: PathBuf,
        /// What was wrong with the metadata.
        #[source]
        source: TextError,
    },
}

/// Why a GGUF file's `tokenizer.*` metadata gave no [`GgufText`](crate::GgufText).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    /// A missing required key, or a key holding the wrong type.
    #[error(transparent)]
    Metadata(#[from] GgufError),
    /// A vocabulary or chat template that lm-tokenize refuses.
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    /// A chat was asked of a file without `tokenizer.chat_template`.
    #[error("the model has no chat template")]
    NoChatTemplate,
}
