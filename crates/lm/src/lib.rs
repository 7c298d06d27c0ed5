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
//! ```no_run
//! let model = lm::load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let ids = model.text.tokenizer.encode("The capital of France is")?;
//! let config = lm::lm_decode::GenerationConfig {
//!     end_tokens: model.text.end_ids.clone(),
//!     ..Default::default()
//! };
//! let generation = lm::lm_decode::generate(&model.decoder, &ids, &config, None)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `examples/chat_gguf.rs` chats with SmolLM2 through the chat template,
//! streaming the answer.
//!
//! # Build profile
//!
//! The decoder is numeric code: built without optimisations it runs about
//! 100 times slower. Cargo applies a workspace's per-package `opt-level` only
//! inside that workspace, so a program that depends on these crates builds
//! them unoptimised in its dev profile unless its own `Cargo.toml` says
//! otherwise. Copy these lines into it (the compute crates and their heavy
//! dependencies; `debug-assertions = false` also silences lm-model's warning,
//! which goes by debug assertions, the one build setting code can see):
//!
//! ```toml
//! [profile.dev.package.lm-model]
//! opt-level = 3
//! debug-assertions = false
//! [profile.dev.package.lm-core]
//! opt-level = 3
//! [profile.dev.package.lm-decode]
//! opt-level = 3
//! [profile.dev.package.lm-tokenize]
//! opt-level = 3
//! [profile.dev.package.ndarray]
//! opt-level = 3
//! [profile.dev.package.matrixmultiply]
//! opt-level = 3
//! [profile.dev.package.half]
//! opt-level = 3
//! [profile.dev.package.tokenizers]
//! opt-level = 3
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod gguf;
mod hf;
mod structured;

pub use error::{Error, TextError};
pub use gguf::{GgufModel, GgufText, bpe_vocab, load_gguf, spm_vocab};
pub use hf::{HfGeneration, load, load_hf_dir};
pub use structured::{FormatError, OutputFormat, StructuredOutput};

pub use lm_core;
pub use lm_decode;
pub use lm_model;
pub use lm_tokenize;
