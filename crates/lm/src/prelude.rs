//! What a program that generates, chats or scores needs, in one import:
//! `use lm::prelude::*;`.
//!
//! The loaders and the loaded model with its one-call methods; the options
//! and what the calls give; the chat message; lm-decode's config, trace and
//! loop for a program that goes further; the model trait; `ControlFlow`,
//! which a streaming closure returns.

pub use std::ops::ControlFlow;

pub use crate::{
    Completion, Drafting, Error, GgufModel, GgufText, Options, OutputFormat, Prompt, Score, Stream,
    load, load_gguf, load_hf_dir,
};
pub use crate::{Embedder, Pooling};
pub use lm_core::{LanguageModel, SequenceState, TokenId};
pub use lm_decode::{
    Generation, GenerationConfig, SamplingConfig, Step, StopReason, generate, generate_streaming,
    score_continuation,
};
pub use lm_model::Decoder;
pub use lm_tokenize::{Message, Tokenizer};
