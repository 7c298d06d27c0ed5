//! Decoding policies and the generation loop: every way of turning a
//! next-token distribution into a token, and the loop that repeats it
//! (predict, choose, append, stop). Works with any [`lm_core::LanguageModel`];
//! depends on lm-core only.
//!
//! # The policy chain
//!
//! A [`Sampler`] applies small transforms in a fixed order, then one selector
//! (the order is printed by its `Debug`):
//!
//! ```text
//! raw logits
//!   -> repetition, presence, frequency penalties   (history-aware, sampler::penalties)
//!   -> logit bias, banned tokens                   (sampler::bias)
//!   -> output constraint: a mask of allowed tokens (structured output, GenerationConfig::constraint)
//!   -> temperature                                 (T = 0: greedy, lowest id on ties)
//!   -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> XTC
//!                                                  (llama.cpp's order; each renormalises what
//!                                                   it keeps and keeps at least min_keep)
//!   -> selector: Greedy, or Sample by inverse CDF with a uniform draw u
//! ```
//!
//! Randomness is [`TokenRng`] (ChaCha20, seeded from a `u64`; output j of
//! [`generate_many`] and batch row j use ChaCha stream j, so 0 is the single
//! run). Selection takes `u` as an argument so tests can supply it by hand.
//!
//! # The loop
//!
//! Each turn reads as the lesson does: predict (the model's logits row),
//! choose (the policy and one uniform draw), record (the [`Step`]), append,
//! stop. [`generate`] feeds the prompt once, then one token per step, never
//! the final one; it stops on an end token, a stop string, `max_new_tokens`, or
//! the model's context bound, and says which ([`StopReason`]; only the first
//! two count as finished). Each [`Step`] records the prefix length, the token,
//! its probability under the policy and under the model (softmax at T = 1 of
//! the raw logits), both log-probabilities with running chain-rule totals
//! ([`Step::running_logprob`] is the model's), and top-N candidates before
//! and after the transforms. [`generate_batch`] runs several prompts with a
//! [`FinishedMask`]; [`beam_search`] and [`enumerate_continuations`] search.
//! [`generate_speculative`] verifies a [`Drafter`]'s proposals (such as
//! [`PromptLookup`]) several at a time in one pass of the model: the same
//! tokens as [`generate`] when greedy, and when sampling with the same seed
//! from point-mass drafts (prompt lookup's).
//! [`generate_streaming`] and [`beam_search_streaming`] show each step to a
//! hook that may cancel the run or fail with the caller's own error.
//! [`StopReason`] prints as the sentence a front end shows.
//!
//! # Scoring
//!
//! [`score_continuation`] is the loop's inverse (teacher forcing): given a
//! prompt and a continuation, the model's log-probability of each
//! continuation token, their sum and the perplexity ([`ContinuationScore`]),
//! each position read once.
//!
//! # Examples
//!
//! One program per first task, each short enough to read at once:
//!
//! - `examples/custom_model.rs`: your own [`lm_core::LanguageModel`] (a
//!   bigram table over seven words), sampled with top-p and searched with
//!   beam search (`cargo run -p lm-decode --example custom_model`).
//! - `examples/score_text.rs`: a count model trained from a string with
//!   lm-model, scoring a sentence word by word
//!   (`cargo run -p lm-decode --example score_text`).
//!
//! Their claims are checked by the crate's tests, which compile each
//! example as a module.
//!
//! ```
//! use lm_core::{LanguageModel, Prefix, Rows, TokenId};
//! use lm_decode::{generate, GenerationConfig, SamplingConfig, StopReason};
//!
//! /// Two tokens; after token 0 it prefers 1 and after 1 it prefers 0.
//! struct Flip;
//! impl LanguageModel for Flip {
//!     type State = Prefix;
//!     fn vocab_size(&self) -> usize { 2 }
//!     fn context_length(&self) -> Option<usize> { Some(8) }
//!     fn new_state(&self) -> Prefix { Prefix::default() }
//!     fn forward(&self, state: &mut Prefix, tokens: &[TokenId], _rows: Rows,
//!                logits: &mut Vec<f32>) -> lm_core::Result<()> {
//!         self.check_input(state.tokens.len(), tokens)?;
//!         state.tokens.extend_from_slice(tokens);
//!         let last = state.tokens[state.tokens.len() - 1];
//!         *logits = if last == 0 { vec![0.0, 2.0] } else { vec![2.0, 0.0] };
//!         Ok(())
//!     }
//! }
//!
//! let config = GenerationConfig {
//!     max_new_tokens: 4,
//!     sampling: SamplingConfig { temperature: 0.5, top_k: Some(1), seed: 7, ..SamplingConfig::default() },
//!     n_top_candidates: 2,
//!     ..GenerationConfig::default()
//! };
//! let run = generate(&Flip, &[0], &config, None).unwrap();
//! assert_eq!(run.tokens, vec![1, 0, 1, 0]);
//! assert_eq!(run.stop_reason, StopReason::MaxNewTokens);
//! assert!(!run.is_finished(), "a limit truncates");
//! // top-k 1 leaves one token: probability 1 under the policy, 0.881 under the model.
//! assert_eq!(run.steps[0].policy_prob, 1.0);
//! assert_eq!(format!("{:.3}", run.steps[0].model_prob), "0.881");
//! ```
//!
//! # Extension points
//!
//! What a user composes is public; the machinery between (the selector, the
//! scratch buffers, the trace recorder) is not.
//!
//! - Any [`lm_core::LanguageModel`] runs here, and so does a model behind
//!   `&`, `Box`, `Arc` or one of lm-core's adapters (`Uncached`, `Bounded`,
//!   `Counting`).
//! - A custom filter after temperature implements
//!   [`sampler::CandidateFilter`] over [`sampler::Candidates`] (the tokens in
//!   play, their logits and weights, with partial sorting) and joins the
//!   chain with [`Sampler::push_filter`].
//! - A custom edit of the raw logits implements [`sampler::LogitTransform`]
//!   (it sees the [`sampler::History`]: the tokens so far and their
//!   [`sampler::TokenCounts`]) and joins with
//!   [`Sampler::push_transform`].
//! - The built-in links ([`sampler::TopNSigma`], [`sampler::TopK`],
//!   [`sampler::Typical`], [`sampler::TopP`], [`sampler::MinP`],
//!   [`sampler::Xtc`], [`sampler::Temperature`], the penalties, bias and
//!   bans) validate their parameter on construction, each refusal a typed
//!   [`Error`] whose message names the setting;
//!   [`SamplingConfig::validate`] runs those checks and names the field, so
//!   a front end checks a flag or a request field with the rule the sampler
//!   applies, and [`SamplingConfig::FIELDS`] names each setting's flag and
//!   request field.
//! - Structured output: any [`lm_core::Constraint`] (the facade's
//!   llguidance engine, or your own) in [`GenerationConfig::constraint`] or
//!   [`BeamConfig::constraint`] as an [`OutputConstraint`]; its mask runs
//!   after the raw-logit stage and before temperature, end tokens come
//!   only once it accepts, and [`StopReason::ConstraintComplete`] ends a
//!   run that can go no further.
//! - Stop strings and [`Generation::text`] read text through
//!   [`lm_core::Detokenize`], decoded incrementally and once per token
//!   ([`IncrementalText`], [`StopSearch`], [`TextDeltas`]); each [`Step`]
//!   carries the text its token made final ([`Step::text`], holding back
//!   what a stop string or an incomplete character could still change), so
//!   a front end streams it without decoding again.
//! - A caller that must stop a long prompt between prefill chunks (Ctrl-C)
//!   implements [`GenerationHook`] and calls [`generate_with_hook`] with
//!   `GenerationConfig::prefill_chunk_len` set.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod batch;
mod beam;
mod constraint;
mod deltas;
mod error;
mod exhaustive;
mod generate;
mod hook;
mod prefix_cache;
mod rank;
mod rng;
mod row;
pub mod sampler;
mod score;
mod select;
mod speculative;
mod stop;
mod trace;
mod truncate;

pub use batch::{FinishedMask, generate_batch};
pub use beam::{
    BeamConfig, BeamStep, Hypothesis, LogitAdjustments, beam_search, beam_search_streaming,
    length_penalized_score,
};
pub use constraint::OutputConstraint;
pub use deltas::TextDeltas;
pub use error::{Error, Result};
pub use exhaustive::{Continuation, Enumeration, enumerate_best, enumerate_continuations};
pub use generate::{
    GenerationConfig, context_room, generate, generate_from_state, generate_many,
    generate_streaming, generate_with_hook,
};
pub use hook::GenerationHook;
pub use prefix_cache::{CacheLimit, CachedGeneration, PrefixCache, generate_cached, tokens_reused};
pub use rng::TokenRng;
pub use sampler::{Sampler, SamplerOrder, SamplingConfig, Selection};
pub use score::{ContinuationScore, score_continuation, score_continuation_in_chunks};
pub use speculative::{
    Draft, DraftLength, Drafter, ModelDrafter, PromptLookup, SpeculationStats,
    generate_speculative, generate_speculative_from_state,
};
pub use stop::{IncrementalText, StopReason, StopSearch, find_stop_string};
pub use trace::{Candidate, DraftMark, Generation, Stage, StageCounts, Step};
pub use truncate::{FittedPrompt, Truncation, fit_prompt, room_for_new_tokens};
