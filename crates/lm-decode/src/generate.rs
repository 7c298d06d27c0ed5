//! The generation loop, written once: predict, choose, record, append, stop.
//!
//! Tokens reach the model lazily. The prompt is read once (prefill,
//! [`Rows::Last`]), then each chosen token is fed alone, and the final chosen
//! token is never fed (nothing would read its logits). With a cache that is
//! lesson 001's 3 + 1 + 1 + 1 + 1 = 7 positions for 5 steps from a 3-token
//! prompt; through [`lm_core::Uncached`] the same calls re-read
//! 3 + 4 + 5 + 6 + 7 = 25.
//!
//! ```text
//! prefill(prompt) ─> logits ─> choose t1 ─> record ─> append ─> stop? ─> feed t1 ─> logits ─> choose t2 ...
//! ```

use std::num::NonZeroUsize;
use std::ops::ControlFlow;

use crate::constraint::OutputConstraint;
use crate::error::{Error, Result};
use crate::hook::{GenerationHook, finish, prefill, settle};
use crate::row::{Row, continue_row, prepare};
use crate::sampler::SamplingConfig;
use crate::stop::StopReason;
use crate::trace::{Generation, Step};
use crate::truncate::Truncation;

use lm_core::{Detokenize, LanguageModel, SequenceState, TokenId};

/// Everything the loop needs besides the model and the prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// The most tokens to generate (the safety limit every run needs).
    pub max_new_tokens: usize,
    /// The end tokens cannot be chosen before this many tokens are
    /// generated (HF's `min_new_tokens`): the policy masks them, the trace
    /// keeps the model's own probabilities.
    pub min_new_tokens: usize,
    /// The sampling policy and seed.
    pub sampling: SamplingConfig,
    /// Tokens that end the response when chosen (SmolLM2 has three: 0, 2, 4).
    pub end_tokens: Vec<TokenId>,
    /// Strings that end the response when the generated text contains them;
    /// they need a detokenizer.
    pub stop_strings: Vec<String>,
    /// Read the prompt in chunks of at most this many tokens (`None`: in one
    /// call), so a hook can stop a long prefill between chunks.
    pub prefill_chunk_len: Option<NonZeroUsize>,
    /// How many top candidates each step records (0: none).
    pub n_top_candidates: usize,
    /// What to do with a prompt that does not fit the context.
    pub truncation: Truncation,
    /// How many outputs [`generate_many`] returns for one prompt.
    pub num_return_sequences: usize,
    /// Structured output: only tokens that continue a valid output of this
    /// constraint are chosen, end tokens only once it is complete, and the
    /// run stops when nothing more can follow
    /// ([`StopReason::ConstraintComplete`]). `None`: unconstrained.
    pub constraint: Option<OutputConstraint>,
    /// The random stream of the (first) output; output j of
    /// [`generate_many`] and batch row j use `rng_stream + j` (named apart
    /// from [`generate_streaming`], which streams steps, not numbers).
    pub rng_stream: u64,
}

/// How many new tokens fit in a context of `context_length` positions
/// after a prompt of `n_prompt` tokens (`None`: no bound), the sum behind
/// lm-cli's `--max-new-tokens` note and lm-serve's `max_tokens` check.
///
/// ```
/// assert_eq!(lm_decode::context_room(Some(8), 5), Some(3));
/// assert_eq!(lm_decode::context_room(Some(8), 9), Some(0));
/// assert_eq!(lm_decode::context_room(None, 9), None);
/// ```
pub fn context_room(context_length: Option<usize>, n_prompt: usize) -> Option<usize> {
    context_length.map(|max| max.saturating_sub(n_prompt))
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 20,
            min_new_tokens: 0,
            sampling: SamplingConfig::default(),
            end_tokens: Vec::new(),
            stop_strings: Vec::new(),
            prefill_chunk_len: None,
            n_top_candidates: 0,
            truncation: Truncation::Refuse,
            num_return_sequences: 1,
            constraint: None,
            rng_stream: 0,
        }
    }
}

/// Generates from `prompt` until a [`StopReason`]; the detokenizer is needed
/// only for stop strings and [`Generation::text`].
///
/// ```
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// use lm_decode::{generate, GenerationConfig, SamplingConfig, StopReason};
///
/// /// Prefers the token after the last one read (a 4-token vocabulary).
/// struct Counter;
/// impl LanguageModel for Counter {
///     type State = Prefix;
///     fn vocab_size(&self) -> usize { 4 }
///     fn context_length(&self) -> Option<usize> { None }
///     fn new_state(&self) -> Prefix { Prefix::default() }
///     fn forward(&self, state: &mut Prefix, tokens: &[TokenId], _rows: Rows,
///                logits: &mut Vec<f32>) -> lm_core::Result<()> {
///         state.tokens.extend_from_slice(tokens);
///         let next = (state.tokens[state.tokens.len() - 1] as usize + 1) % 4;
///         logits.clear();
///         logits.extend((0..4).map(|i| if i == next { 2.0 } else { 0.0 }));
///         Ok(())
///     }
/// }
///
/// let config = GenerationConfig {
///     max_new_tokens: 10,
///     sampling: SamplingConfig::greedy(),
///     end_tokens: vec![0],
///     ..GenerationConfig::default()
/// };
/// let run = generate(&Counter, &[1], &config, None).unwrap();
/// assert_eq!(run.tokens, vec![2, 3, 0]);
/// assert_eq!(run.stop_reason, StopReason::EndToken(0));
/// assert!(run.is_finished());
/// assert_eq!(run.steps[1].prefix_len, 2);
/// ```
pub fn generate<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
) -> Result<Generation> {
    generate_streaming(model, prompt, config, detokenizer, |_| {
        Ok::<_, Error>(ControlFlow::Continue(()))
    })
}

/// [`generate`] with a hook that sees each [`Step`] as soon as its token is
/// chosen. The hook returns `Ok(ControlFlow::Break(()))` to stop the loop
/// there ([`StopReason::Cancelled`], unless the step ended the run anyway),
/// e.g. on Ctrl-C; the chosen token is kept and never fed to the model.
///
/// The hook may fail (a detokenizer or a write error while streaming text):
/// its error ends the run and is returned as it is. The loop's own errors
/// reach the caller as the same type `E` through `From<Error>`, so a hook
/// that never fails names `lm_decode::Error`, and an application passes its
/// own error type (or `anyhow::Error`).
///
/// ```
/// use std::ops::ControlFlow;
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// use lm_decode::{generate_streaming, GenerationConfig, SamplingConfig};
/// # struct Fixed;
/// # impl LanguageModel for Fixed {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 2 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], _r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         s.tokens.extend_from_slice(t);
/// #         *l = vec![1.0, 0.0];
/// #         Ok(())
/// #     }
/// # }
/// #[derive(Debug)]
/// enum AppError {
///     Decode(lm_decode::Error),
///     Unprintable(TokenId),
/// }
/// impl From<lm_decode::Error> for AppError {
///     fn from(error: lm_decode::Error) -> Self { AppError::Decode(error) }
/// }
///
/// let config = GenerationConfig { sampling: SamplingConfig::greedy(), ..GenerationConfig::default() };
/// // Token 0 cannot be shown: the hook fails, and so does the run.
/// let run = generate_streaming(&Fixed, &[1], &config, None, |step| match step.token {
///     0 => Err(AppError::Unprintable(0)),
///     _ => Ok(ControlFlow::Continue(())),
/// });
/// assert!(matches!(run, Err(AppError::Unprintable(0))));
/// // A hook that never fails names the crate's error.
/// let run = generate_streaming(&Fixed, &[1], &config, None, |_| {
///     Ok::<_, lm_decode::Error>(ControlFlow::Continue(()))
/// });
/// assert_eq!(run.unwrap().tokens.len(), 20);
/// ```
pub fn generate_streaming<M: LanguageModel, E: From<Error>>(
    model: &M,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    on_step: impl FnMut(&Step) -> std::result::Result<ControlFlow<()>, E>,
) -> Result<Generation, E> {
    generate_with_hook(model, prompt, config, detokenizer, on_step)
}

/// [`generate_streaming`] with a [`GenerationHook`], which can also stop
/// the run between prefill chunks (`config.prefill_chunk_len`): cancelled
/// with no step, the rest of the prompt unread.
pub fn generate_with_hook<M: LanguageModel, H: GenerationHook>(
    model: &M,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    hook: H,
) -> Result<Generation, H::Error> {
    generate_from_state(model, model.new_state(), prompt, config, detokenizer, hook)
        .map(|(generation, _)| generation)
}

/// [`generate_with_hook`] from a state that has already read the first
/// `state.pos()` tokens of `prompt` (a cached prefix: the previous turn of a
/// chat, a shared system prompt), so only the rest of the prompt is read.
/// The caller vouches that those tokens are `prompt[..state.pos()]`; the
/// model cannot check. The last prompt token is always read (its logits
/// choose the first token), so a state that has read that far or further is
/// truncated first; a prompt the truncation policy shortened is read from
/// the start.
///
/// Returns the run and the state after it, which has read the prompt and
/// every generated token but the last (never fed), ready to be kept for the
/// next request that shares the prefix. The tokens are those a fresh state
/// gives when the model's logits do not depend on how the prompt was split
/// into calls (true of lm-model's decoder, whose rows are computed alone).
///
/// ```
/// use std::ops::ControlFlow;
/// use lm_core::{LanguageModel, Prefix, Rows, SequenceState, TokenId};
/// use lm_decode::{generate, generate_from_state, GenerationConfig, SamplingConfig};
/// # struct Next;
/// # impl LanguageModel for Next {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 5 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], _r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         s.tokens.extend_from_slice(t);
/// #         let next = (s.tokens[s.tokens.len() - 1] as usize + 1) % 5;
/// #         *l = (0..5).map(|i| if i == next { 1.0 } else { 0.0 }).collect();
/// #         Ok(())
/// #     }
/// # }
/// let config = GenerationConfig { max_new_tokens: 3, sampling: SamplingConfig::greedy(), ..Default::default() };
/// let hook = |_: &lm_decode::Step| Ok::<_, lm_decode::Error>(ControlFlow::Continue(()));
/// let (first, state) = generate_from_state(&Next, Next.new_state(), &[0, 1], &config, None, hook).unwrap();
/// assert_eq!(first.tokens, vec![2, 3, 4]);
/// assert_eq!(state.pos(), 4); // 0 1 2 3 read; 4 never fed
/// // The next prompt extends the first run: only its new tokens are read.
/// let (second, _) = generate_from_state(&Next, state, &[0, 1, 2, 3, 4, 0], &config, None, hook).unwrap();
/// assert_eq!(second.tokens, generate(&Next, &[0, 1, 2, 3, 4, 0], &config, None).unwrap().tokens);
/// ```
pub fn generate_from_state<M: LanguageModel, H: GenerationHook>(
    model: &M,
    state: M::State,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    hook: H,
) -> Result<(Generation, M::State), H::Error> {
    run_from_state(
        model,
        state,
        prompt,
        config,
        detokenizer,
        hook,
        |state, mut logits, row, on_step| continue_row(model, state, &mut logits, row, on_step),
    )
}

/// What every run from a state shares, whichever loop `drive` is (the
/// plain one, the speculative one): check and fit the prompt, start the
/// row, read the part of the prompt `state` has not read in chunks (the
/// hook may stop between them), then `drive` the row from the logits after
/// the prompt, the hook seeing each step. Returns the run and the state.
pub(crate) fn run_from_state<M: LanguageModel, H: GenerationHook>(
    model: &M,
    mut state: M::State,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    mut hook: H,
    drive: impl FnOnce(
        &mut M::State,
        Vec<f32>,
        &mut Row<'_>,
        &mut dyn FnMut(&Step) -> ControlFlow<()>,
    ) -> Result<()>,
) -> Result<(Generation, M::State), H::Error> {
    let mut hook_error = None;
    let result = (|| {
        let fitted = prepare(model, prompt, config, detokenizer)?;
        let mut row = Row::new(model, fitted, config, detokenizer, config.rng_stream)?;
        if row.stop_reason.is_some() {
            return Ok((row.into_generation(), state));
        }
        let start = if row.n_prompt_dropped > 0 {
            0
        } else {
            state.pos().min(row.history.len().saturating_sub(1))
        };
        state.truncate(start);
        let mut logits = Vec::new();
        let read = prefill(
            model,
            &mut state,
            &row.history[start..],
            config.prefill_chunk_len,
            &mut logits,
            |n, total| {
                settle(
                    hook.after_prefill_chunk(start + n, start + total),
                    &mut hook_error,
                )
            },
        )?;
        if read.is_break() {
            row.stop_reason = Some(StopReason::Cancelled);
            return Ok((row.into_generation(), state));
        }
        drive(&mut state, logits, &mut row, &mut |step| {
            settle(hook.on_step(step), &mut hook_error)
        })?;
        Ok((row.into_generation(), state))
    })();
    finish(result, hook_error)
}

/// No hook: `()` only continues, for a caller of [`crate::generate_speculative`],
/// [`crate::generate_cached`] or [`generate_with_hook`] that watches nothing
/// (as [`generate`] is [`generate_streaming`] without one).
///
/// ```
/// # use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// use lm_decode::{GenerationConfig, PromptLookup, SamplingConfig, generate_speculative};
/// # struct Next;
/// # impl LanguageModel for Next {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 3 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], rows: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         l.clear();
/// #         for &token in t {
/// #             s.tokens.push(token);
/// #             l.extend((0..3).map(|i| if i == (token as usize + 1) % 3 { 1.0 } else { 0.0 }));
/// #         }
/// #         if rows == Rows::Last { let n = l.len(); l.drain(..n - 3); }
/// #         Ok(())
/// #     }
/// # }
/// let config = GenerationConfig { max_new_tokens: 4, sampling: SamplingConfig::greedy(), ..Default::default() };
/// let (run, _) = generate_speculative(&Next, &[0], &config, None, PromptLookup::default(), ()).unwrap();
/// assert_eq!(run.tokens, vec![1, 2, 0, 1]);
/// ```
impl GenerationHook for () {
    type Error = Error;

    fn on_step(&mut self, _step: &Step) -> Result<ControlFlow<()>> {
        Ok(ControlFlow::Continue(()))
    }
}

/// `config.num_return_sequences` outputs for one prompt, reading the prompt
/// once and forking the state; the outputs then step together (one
/// [`LanguageModel::forward_batch`] per token, see [`crate::generate_batch`]).
/// Output j draws from stream `config.rng_stream + j`, so output 0 is
/// exactly what [`generate`] returns.
pub fn generate_many<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
) -> Result<Vec<Generation>> {
    let n = config.num_return_sequences;
    let fitted = prepare(model, prompt, config, detokenizer)?;
    let mut rows = Vec::with_capacity(n);
    for j in 0..n {
        let rng_stream = config.rng_stream.wrapping_add(j as u64);
        rows.push(Row::new(
            model,
            fitted.clone(),
            config,
            detokenizer,
            rng_stream,
        )?);
    }
    // Every row has the same config: all stop before reading, or none does.
    if rows[0].stop_reason.is_none() {
        let (state, logits, read) = rows[0].read_prompt(model, |_, _| ControlFlow::Continue(()))?;
        debug_assert!(read.is_continue(), "nothing here stops a prefill");
        let states = vec![state; n];
        let logits = vec![logits; n];
        let mut mask = crate::FinishedMask::new(n);
        crate::batch::run_together(
            model,
            &mut rows,
            (0..n).collect(),
            states,
            logits,
            &mut mask,
        )?;
    }
    Ok(rows.into_iter().map(Row::into_generation).collect())
}
