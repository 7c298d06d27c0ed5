//! [`Error`]: why a GGUF file gave no model, or a loaded model no
//! completion or score; and [`TextError`]: why its metadata gave no
//! tokenizer.

use std::path::PathBuf;

use lm_decode::sampler::InvalidSetting;
use lm_model::GgufError;
use lm_tokenize::TokenizeError;

use crate::structured::FormatError;

/// Why [`load`](crate::load), [`load_gguf`](crate::load_gguf) or [`GgufText::open`](crate::GgufText::open)
/// failed (each of those variants names the file and carries the part's own
/// error), or why a loaded model's one-call
/// [`generate`](crate::GgufModel::generate), [`chat`](crate::GgufModel::chat)
/// or [`score`](crate::GgufModel::score) did: so one `?` covers a program.
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
        /// lm-model's reason (boxed: it is the largest part, and an error
        /// is passed up by value).
        #[source]
        source: Box<lm_model::Error>,
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
    /// A prompt or text the tokenizer refused.
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    /// A chat the model cannot render: no chat template, or one that
    /// refuses these messages.
    #[error(transparent)]
    Chat(#[from] TextError),
    /// An output format the grammar engine refused.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A sampling setting out of its range (the message names the field).
    #[error(transparent)]
    Setting(#[from] InvalidSetting),
    /// The generation loop or the scorer refused the input or the model's
    /// output (an empty prompt, a prompt beyond the context, ...).
    #[error(transparent)]
    Decode(#[from] lm_decode::Error),
    /// [`score`](crate::GgufModel::score) was given a text with nothing to
    /// score: no token, or one token and no document-start token to read it
    /// after.
    #[error(
        "nothing to score in a text of {n_tokens} token(s) (with no document-start token, the first token is only the context)"
    )]
    NothingToScore {
        /// The text's length in tokens.
        n_tokens: usize,
    },
    /// A [`Stream`](crate::Stream)'s generation thread could not start.
    #[error("starting the generation thread")]
    Thread(#[source] std::io::Error),
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
