//! Model backends behind lm-core's [`lm_core::LanguageModel`] trait.
//!
//! - [`ngram`]: count-based n-gram models (maximum likelihood, add-k,
//!   interpolated modified Kneser-Ney), ARPA files, KenLM-style scoring.
//! - [`transformer`]: a decoder-only transformer with a KV cache, the lessons'
//!   seven-token toy decoder, and the llama architecture.
//! - [`catalog`]: the models known by name and the folder they are fetched into.
//! - [`gguf`]: a bounds-checked, memory-mapped GGUF reader.
//! - [`quant`]: GGML weight types and the kernels that multiply with them.
//!
//! lm-model never chooses tokens: it turns prefixes into logits.
#![deny(missing_docs)]

pub mod catalog;
mod dispatch;
pub mod gguf;
pub mod ngram;
pub mod quant;
pub mod transformer;
