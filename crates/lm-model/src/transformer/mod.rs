//! A decoder-only causal transformer on ndarray, built from blocks that both
//! the lessons' seven-token toy decoder and the llama architecture use.
//!
//! - `config`: the typed shape of a model ([`TransformerConfig`]).
//! - `norm`, `rope`, `attention`, `ffn`, `moe`, `linear`: the blocks.
//! - `kv_cache`: the per-sequence key/value cache, forkable without copying
//!   the shared prefix.
//! - `model`: weights ([`Decoder`]) apart from per-sequence state
//!   ([`DecoderState`]) and the cached forward pass.
//! - `reference`: the uncached reference pass on plain ndarray operations
//!   ([`Decoder::reference_logits`]).
//! - `toy`: the lessons' toy decoder ([`Toy`]).
//! - `arch`: the supported architectures (llama and Mixtral, qwen2, qwen3,
//!   gemma3, qwen3moe, olmoe, gemma2, olmo2, phi3, qwen2moe, dots1, gpt-oss) and the
//!   mapping of their GGUF metadata to a configuration.
//! - `llama`: a GGUF file's decoder ([`Llama`]), its weights multiplied in
//!   their quantized blocks.
//! - `state_file`: a [`DecoderState`] as bytes, stamped with its model's
//!   [`ModelFingerprint`] ([`DecoderState::write_to`], [`Decoder::read_state`]).
//!
//! [`Decoder`] implements [`lm_core::LanguageModel`] with [`DecoderState`]
//! as its state; the toy and llama are constructors of a `Decoder`. There are
//! two uncached paths: [`lm_core::Uncached`] around the model, and
//! [`Decoder::reference_logits`], written apart from the cache code with an
//! explicit mask matrix.
//!
//! The block modules are private to the crate: after [`Decoder::new`] has
//! checked every shape, they index directly and treat a length mismatch as
//! a bug (a panic), never as a value to skip or fill.
//!
//! ```
//! use lm_core::{LanguageModel, Rows, SequenceState};
//! use lm_model::Toy;
//!
//! let toy = Toy::decoder();
//! let prompt = Toy::encode("<start> the cat").unwrap();
//! let mut state = toy.new_state();
//! let mut logits = Vec::new();
//! toy.forward(&mut state, &prompt, Rows::Last, &mut logits).unwrap();
//! assert_eq!((logits.len(), state.pos()), (7, 3));
//! ```

mod arch;
mod attention;
mod attention_workload;
mod config;
mod error;
mod ffn;
mod kv_cache;
mod linear;
mod llama;
mod model;
mod moe;
mod norm;
mod reference;
mod rope;
mod state_file;
mod toy;

pub use arch::SUPPORTED as SUPPORTED_ARCHITECTURES;
#[doc(hidden)]
pub use attention_workload::AttentionWorkload;
pub use config::{
    ArchOptions, AttentionKind, FfnKind, Gating, KvPrecision, MoeOptions, NormKind, PositionKind,
    RopeMode, RopeOptions, SharedExpertOptions, SlidingWindow, TransformerConfig,
};
pub use error::TransformerError;
pub use ffn::FeedForward;
pub use kv_cache::{CHUNK_LEN, KvCache, KvShape};
pub use linear::Linear;
pub use llama::Llama;
pub use model::{Decoder, DecoderState, DecoderWeights, LayerWeights, QkvBias};
pub use norm::Norm;
pub use state_file::{ModelFingerprint, STATE_MAGIC, STATE_VERSION, StateFileError};
pub use toy::{TOY_VOCAB, Toy, ToyArchitecture};
