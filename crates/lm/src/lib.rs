//! The library's front door: one dependency for the workspace's crates, and
//! the one GGUF loader that puts a model file's parts together.
//!
//! A GGUF file holds a model's weights and, in its `tokenizer.*` metadata,
//! the vocabulary, the chat template and the end tokens. Each crate below
//! owns one part and none reads another's (lm-tokenize reads no model file;
//! lm-model knows no tokenizer), so mapping one file to all of them is this
//! crate's job, done once: [`load_gguf`] gives a [`GgufModel`], its
//! [`Decoder`](lm_model::Decoder) and its [`GgufText`] (tokenizer, chat
//! template, end tokens). lm-cli and the fuzz targets load GGUF through it.
//! [`load`] also takes a Hugging Face model directory (`config.json`,
//! safetensors, `tokenizer.json`; [`load_hf_dir`]) and gives the same types.
//!
//! The parts are re-exported whole, so this is the only dependency a program
//! needs: [`lm_core`] (the `LanguageModel` trait, softmax, sequence
//! probability), [`lm_decode`] (sampling, the generation loop, beam search),
//! [`lm_model`] (the transformer and n-gram backends, the GGUF reader, the
//! models known by name) and [`lm_tokenize`] (tokenizers, streaming
//! detokenization, chat templates).
//!
//! # One call
//!
//! [`prelude`] brings what a program needs, and a loaded model answers in
//! one call: [`GgufModel::generate`] (text, ids or a chat),
//! [`GgufModel::chat`], [`GgufModel::generate_with`] (streaming through a
//! closure that can stop the run), [`GgufModel::stream`] (an iterator of
//! pieces) and [`GgufModel::score`] (a text's log-probability from the
//! start of a document). [`Options`] are greedy by default and become
//! lm-decode's `GenerationConfig` ([`GgufModel::generation_config`]), so
//! these calls run lm-decode's one loop and a program that needs more
//! starts from the same config. The README's "Use as a library" snippet,
//! which `examples/quickstart.rs` runs:
//!
//! ```no_run
//! use lm::prelude::*;
//!
//! fn main() -> Result<(), lm::Error> {
//!     let model = lm::load("SmolLM2-135M-Instruct.Q4_1.gguf")?; // a GGUF file or a Hugging Face directory
//!     let question = [Message::new("user", "What is 2 plus 2?")];
//!     let answer = model.chat(&question, &Options::default())?; // greedy, up to 256 tokens
//!     println!("{}", answer.text);
//!     Ok(())
//! }
//! ```
//!
//! `examples/chat_gguf.rs` chats with SmolLM2 through lm-decode's loop
//! directly, streaming the answer.
//!
//! # Build profile
//!
//! The decoder is numeric code: built without optimisations it runs about
//! 100 times slower. Cargo applies a workspace's per-package `opt-level` only
//! inside that workspace, so a program that depends on these crates builds
//! them unoptimised in its dev profile unless its own `Cargo.toml` says
//! otherwise. Copy these lines into it (every compute crate: the four
//! libraries and this one, their numeric dependencies, and the grammar
//! engine of structured output; `debug-assertions = false` also silences
//! lm-model's warning, which goes by debug assertions, the one build
//! setting code can see, and `overflow-checks = false` drops the checks the
//! dev profile puts on every integer operation of the kernels):
//!
//! ```toml
//! [profile.dev.package.lm-model]
//! opt-level = 3
//! debug-assertions = false
//! overflow-checks = false
//! [profile.dev.package.lm-core]
//! opt-level = 3
//! overflow-checks = false
//! [profile.dev.package.lm-decode]
//! opt-level = 3
//! overflow-checks = false
//! [profile.dev.package.lm-tokenize]
//! opt-level = 3
//! [profile.dev.package.lm]
//! opt-level = 3
//! [profile.dev.package.ndarray]
//! opt-level = 3
//! [profile.dev.package.matrixmultiply]
//! opt-level = 3
//! [profile.dev.package.half]
//! opt-level = 3
//! [profile.dev.package.tokenizers]
//! opt-level = 3
//! [profile.dev.package.llguidance]
//! opt-level = 3
//! [profile.dev.package.toktrie]
//! opt-level = 3
//! [profile.dev.package.derivre]
//! opt-level = 3
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod completion;
mod embed;
mod error;
mod gbnf;
mod gguf;
mod hf;
mod options;
pub mod prelude;
mod stream;
mod structured;

pub use completion::{Completion, Score};
pub use embed::{Embedder, Pooling, UnknownPooling, embed_tokens};
pub use error::{Error, TextError};
pub use gbnf::{GbnfError, gbnf_to_lark, is_gbnf};
pub use gguf::{GgufModel, GgufText, bpe_vocab, load_gguf, map_gguf, spm_vocab};
pub use hf::{HfGeneration, load, load_hf_dir, load_hf_dir_quantized};
pub use options::{Drafting, Options, Prompt};
pub use stream::Stream;
pub use structured::{FormatError, OutputFormat, StructuredOutput, bounded_json_whitespace};

pub use lm_core;
pub use lm_decode;
pub use lm_model;
pub use lm_tokenize;
