//! Tokenizers for the workspace's models: byte-level BPE from a GGUF
//! vocabulary ([`BpeVocab`]) or any Hugging Face `tokenizer.json`, built on
//! the `tokenizers` crate; SentencePiece from a GGUF vocabulary
//! ([`SpmVocab`]: Llama 2, Mistral, Gemma), merged by score as llama.cpp
//! does; streaming, UTF-8-safe detokenization ([`TextStream`]); and Jinja
//! chat templates rendered with minijinja ([`ChatTemplate`]).
//!
//! lm-tokenize depends on lm-core only: it reads no model file. The `lm`
//! crate's GGUF loader fills a [`BpeVocab`] or [`SpmVocab`] from a file's
//! metadata. Tokenization matches llama.cpp's for the supported
//! pre-tokenizers and for SentencePiece (see `crates/lm/tests/`).
//!
//! ```
//! use lm_tokenize::{BpeVocab, Tokenizer};
//! let vocab = BpeVocab {
//!     model: "gpt2".into(),
//!     pre: Some("smollm".into()),
//!     tokens: vec!["a".into(), "b".into(), "ab".into(), "Ġ".into(), "Ġab".into()],
//!     merges: vec!["a b".into(), "Ġ ab".into()],
//!     ..BpeVocab::default()
//! };
//! let tokenizer = Tokenizer::from_bpe_vocab(vocab).unwrap();
//! // "ab ab" splits into "ab" and " ab"; the byte-level space is "Ġ".
//! assert_eq!(tokenizer.encode("ab ab").unwrap(), vec![2, 4]);
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod chat;
mod error;
mod pre_tokenizer;
mod spm;
mod stream;
mod token_bytes;
mod tokenizer;
mod vocab;

pub use chat::{ChatPart, ChatTemplate, MAX_RENDERED_BYTES, Message, TEMPLATE_FUEL};
pub use error::{BackendError, TokenizeError};
pub use stream::TextStream;
pub use token_bytes::{TokenBytes, byte_level_char};
pub use tokenizer::{HfTokenizerConfig, TextPart, Tokenizer};
pub use vocab::{BpeVocab, SpmVocab, TokenType};
