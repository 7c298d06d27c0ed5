//! The shared vocabulary of the workspace: logits, softmax with temperature,
//! log-probabilities, sequence probability by the chain rule, losses, and the
//! [`LanguageModel`] trait that every backend implements (the extension point
//! for a new backend).
//!
//! A model behind `&`, `Box`, `Rc` or `Arc` is a model, every method
//! forwarded. Adapters change one thing each: [`Uncached`] re-reads the whole
//! prefix (lesson 001's reference), [`Bounded`] tightens the context bound,
//! [`Counting`] counts the positions read; the last two are [`Adapted`] models
//! with a [`ForwardHook`], the one shape a new adapter takes.
//!
//! Structured output is a [`Constraint`] (compiled once, shared) whose
//! [`ConstraintState`] gives each step a [`TokenMask`] of the tokens that
//! may come next; lm-decode applies it before the choice.
//!
//! lm-core does no I/O and knows no model. Every other crate depends on it, and
//! it depends on none of them (see `docs/ARCHITECTURE.md`).
//!
//! ```
//! use lm_core::softmax;
//! // Lesson 000, "A worked example: temperature on three logits", T = 0.5.
//! let p = softmax(&[2.0, 1.0, 0.0], 0.5).unwrap();
//! assert_eq!(format!("{:.3} {:.3} {:.3}", p[0], p[1], p[2]), "0.867 0.117 0.016");
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod adapter;
mod constraint;
pub mod cpu;
mod distribution;
mod error;
mod loss;
mod model;
mod sequence;
mod softmax;

pub use adapter::{Adapted, Bounded, ContextBound, Counting, ForwardCounts, ForwardHook};
pub use constraint::{Constraint, ConstraintState, SequenceChoice, TokenMask};
pub use distribution::{argmax, sample_inverse_cdf};
pub use error::{Error, error_chain};
pub use loss::{cross_entropy, kl_divergence, label_smoothed_target};
pub use model::{
    Detokenize, LanguageModel, Prefix, Rows, SequenceState, Uncached, check_token_ids,
};
pub use sequence::{LogProb, perplexity, sequence_logprob};
pub use softmax::{
    log_softmax, log_softmax_into, log_sum_exp, softmax, softmax_into, softmax_weight,
    softmax_weights_into,
};

/// A token id: an index into a model's vocabulary.
pub type TokenId = u32;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
