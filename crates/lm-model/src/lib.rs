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
//! - Files: [`GgufFile`], a bounds-checked GGUF reader (the file read into
//!   huge pages, or mapped); the models known by name and their folder are
//!   in [`catalog`].
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
//! - [`QMatrix`] multiplies GGML blocks with a chosen [`Kernel`] (the fastest
//!   the CPU runs, or `LM_KERNEL`'s: [`Kernel::from_env`]); it is public
//!   for benchmarks and the kernel tests that compare the kernels.
//!
//! The blocks of a forward pass (attention, RoPE, the KV cache's layout, the
//! dot kernels) are private: they trust the shapes [`Decoder::new`] checked.
//!
//! To load a GGUF file's model together with its tokenizer, chat template
//! and end tokens, use the `lm` crate's `load_gguf` (lm-model knows no
//! tokenizer); its `examples/chat_gguf.rs` chats with SmolLM2.
//!
//! # Build profile
//!
//! A decoder is numeric code: unoptimised it runs about 100 times slower.
//! Cargo applies a workspace's per-package `opt-level` only inside that
//! workspace, so a program that depends on lm-model builds it at
//! `opt-level = 0` in its dev profile unless its own `Cargo.toml` says
//! otherwise. Copy these lines into it:
//!
//! ```toml
//! [profile.dev.package.lm-model]
//! opt-level = 3
//! debug-assertions = false
//! [profile.dev.package.lm-core]
//! opt-level = 3
//! [profile.dev.package.ndarray]
//! opt-level = 3
//! [profile.dev.package.matrixmultiply]
//! opt-level = 3
//! [profile.dev.package.half]
//! opt-level = 3
//! ```
//!
//! (and `lm-decode`, `lm-tokenize` and `tokenizers` likewise when you use
//! them). The first [`Decoder`] built logs a warning through the `log`
//! facade when lm-model was compiled with debug assertions: code cannot see
//! the opt-level, and debug assertions are what the dev profile turns on
//! with opt-level 0. `debug-assertions = false` above silences it; the
//! workspace's own tests keep lm-model's assertions on.
#![deny(missing_docs)]
// `unsafe` lives in `kernels` (which allows it) and in the two
// operating-system calls that cannot be safe, each alone in one function:
// `allocator::set_mmap_threshold` and `gguf::map_read_only`, which maps a
// model file (and a safetensors shard for `hf`).
#![deny(unsafe_code)]

mod allocator;
mod build_profile;
pub mod catalog;
mod error;
mod gguf;
mod hf;
mod kernels;
pub mod ngram;
mod quant;
mod thread_scratch;
mod transformer;

pub use allocator::map_large_allocations;
pub use error::{Error, Result};
pub use gguf::{GgufError, GgufFile, MetadataValue, Summary, TensorInfo, TensorView};
pub use gguf::{GgufWriter, SourceError, WriteError};
pub use hf::{HfError, SUPPORTED_HF_CLASSES, open_hf_dir, open_hf_dir_quantized};
pub use ngram::{NgramCounts, NgramError, NgramModel, NgramState, Smoothing, TrainOptions};
pub use quant::QuantizeError;
#[doc(hidden)]
pub use quant::packed::panels_for_bench;

/// The wrapping sum of `words`, read with the loads of this process's
/// kernel path (`LM_KERNEL`'s or the fastest) and, with `prefetch`, the
/// panel kernels' prefetches: memory read as fast as the kernels stream
/// weights, for `cargo xtask bench`'s read bound.
#[doc(hidden)]
pub fn sum_words_as_kernels_read(words: &[u64], prefetch: bool) -> u64 {
    kernels::read::sum_words(kernels::dispatch::Dispatch::detect(), words, prefetch)
}
pub use quant::{
    GgmlType, KERNEL_ENV, Kernel, NonFinite, PACK_ENV, Packing, QMatrix, QuantError,
    SUPPORTED_TYPES,
};
#[doc(hidden)]
pub use transformer::AttentionWorkload;
pub use transformer::{
    ArchOptions, AttentionKind, CHUNK_LEN as KV_CHUNK_LEN, Decoder, DecoderState, DecoderWeights,
    FeedForward, FfnKind, Gating, KvCache, KvPrecision, KvShape, LayerWeights, Linear, Llama,
    MoeOptions, Norm, NormKind, PositionKind, QkvBias, RopeMode, RopeOptions,
    SUPPORTED_ARCHITECTURES, SharedExpertOptions, SlidingWindow, TOY_VOCAB, Toy, ToyArchitecture,
    TransformerConfig, TransformerError,
};
pub use transformer::{ModelFingerprint, STATE_MAGIC, STATE_VERSION, StateFileError};
