//! Model backends behind lm-core's [`lm_core::LanguageModel`] trait: they turn
//! prefixes into logits and never choose tokens.
//!
//! # Entry points
//!
//! - Transformers: [`Decoder`] is the model (weights, shared by `&self`) and
//!   [`DecoderState`] one sequence (its KV cache and position). [`Llama`]
//!   builds one from a GGUF file; [`Toy`] builds the lessons' seven-token
//!   toy decoder. [`Decoder::reference_logits`] is the uncached,
//!   explicit-mask reference path.
//! - Count-based n-gram models: [`NgramModel`] and its state, trained with
//!   [`ngram::train`] or [`NgramCounts`], read from ARPA, scored as KenLM does
//!   (the [`ngram`] module holds the backend's functions and constants).
//!   `examples/count_model.rs` trains one from a string, scores and samples.
//! - Files: [`GgufFile`], a bounds-checked, memory-mapped GGUF reader; the
//!   models known by name and their folder are in [`catalog`].
//! - Errors: each part returns its own enum ([`GgufError`],
//!   [`TransformerError`], [`NgramError`], [`QuantError`],
//!   [`catalog::CatalogError`]); [`Error`] wraps them with one variant per
//!   failure, and `?` converts into it.
//!
//! # Extension points
//!
//! - [`lm_core::LanguageModel`] (in lm-core) is the trait every backend
//!   implements; a new backend implements it.
//! - A new transformer architecture is a constructor of a [`Decoder`]: a
//!   [`TransformerConfig`] and [`DecoderWeights`] (layers of [`Linear`],
//!   [`Norm`] and [`FeedForward`] weights), checked by [`Decoder::new`], as
//!   [`Llama`] and [`Toy`] do.
//! - [`QMatrix`] multiplies GGML blocks with a chosen [`Kernel`]; it is public
//!   for benchmarks and the kernel tests that compare the kernels.
//!
//! The blocks of a forward pass (attention, RoPE, the KV cache's layout, the
//! dot kernels) are private: they trust the shapes [`Decoder::new`] checked.
#![deny(missing_docs)]

pub mod catalog;
mod dispatch;
mod error;
mod gguf;
pub mod ngram;
mod quant;
mod transformer;

pub use error::{Error, Result};
pub use gguf::{GgufError, GgufFile, MetadataValue, Summary, TensorInfo, TensorView};
pub use ngram::{NgramCounts, NgramError, NgramModel, NgramState, Smoothing, TrainOptions};
pub use quant::{GgmlType, Kernel, QMatrix, QuantError};
pub use transformer::{
    CHUNK_LEN as KV_CHUNK_LEN, Decoder, DecoderState, DecoderWeights, FeedForward, FfnKind,
    KvCache, KvPrecision, KvShape, LayerWeights, Linear, Llama, Norm, NormKind, PositionKind,
    TOY_VOCAB, Toy, ToyArchitecture, TransformerConfig, TransformerError,
};
