//! A decoder-only causal transformer on ndarray, built from blocks that both
//! the lessons' seven-token toy decoder and the llama architecture use.
//!
//! - [`config`]: the typed shape of a model ([`TransformerConfig`]).
//! - [`norm`], [`rope`], [`attention`], [`ffn`], [`linear`]: the blocks.
//! - [`kv_cache`]: the per-sequence key/value cache, forkable without copying
//!   the shared prefix.
//! - [`model`]: weights ([`Decoder`]) apart from per-sequence state
//!   ([`DecoderState`]), the cached forward pass, and the uncached reference.
//! - [`toy`]: the lessons' toy decoder ([`ToyDecoder`]).
//! - [`llama`]: the llama architecture from a GGUF file ([`Llama`]), its
//!   weights multiplied in their quantized blocks.
//!
//! Both models implement [`lm_core::LanguageModel`] with [`DecoderState`] as
//! their state, and both have an uncached path: [`lm_core::Uncached`] around
//! the model, and [`Decoder::reference_logits`], written apart from the
//! cache code with an explicit mask matrix.
//!
//! ```
//! use lm_core::{LanguageModel, Rows, SequenceState};
//! use lm_model::transformer::ToyDecoder;
//!
//! let toy = ToyDecoder::new();
//! let prompt = ToyDecoder::encode("<start> the cat").unwrap();
//! let mut state = toy.new_state();
//! let mut logits = Vec::new();
//! toy.forward(&mut state, &prompt, Rows::Last, &mut logits).unwrap();
//! assert_eq!((logits.len(), state.pos()), (7, 3));
//! ```

pub mod attention;
pub mod config;
mod error;
pub mod ffn;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod model;
pub mod norm;
pub mod rope;
pub mod toy;

pub use config::{FfnKind, KvPrecision, NormKind, PositionKind, TransformerConfig};
pub use error::TransformerError;
pub use kv_cache::{KvCache, KvShape};
pub use linear::Linear;
pub use llama::Llama;
pub use model::{Decoder, DecoderState, DecoderWeights, LayerWeights};
pub use toy::{TOY_VOCAB, ToyArchitecture, ToyDecoder};
