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

use crate::{
    DraftMark, Error, FittedPrompt, Generation, OutputConstraint, Result, Sampler, SamplingConfig,
    Selection, Step, StopReason, StopSearch, TokenRng, Truncation,
    constraint::ConstraintRow,
    fit_prompt,
    hook::{GenerationHook, finish, prefill, settle},
    trace::Recorder,
};
use std::num::NonZeroUsize;
use std::ops::ControlFlow;

use lm_core::{Detokenize, LanguageModel, Rows, SequenceState, TokenId};

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
    mut state: M::State,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    mut hook: H,
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
        continue_row(model, &mut state, &mut logits, &mut row, &mut |step| {
            settle(hook.on_step(step), &mut hook_error)
        })?;
        Ok((row.into_generation(), state))
    })();
    finish(result, hook_error)
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

/// Checks the config against the prompt and fits the prompt.
pub(crate) fn prepare<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
) -> Result<FittedPrompt> {
    let n = config.num_return_sequences;
    Error::check(n, n >= 1, |value| Error::InvalidNumReturnSequences {
        value,
    })?;
    if let Some(index) = config.stop_strings.iter().position(String::is_empty) {
        return Err(Error::EmptyStopString { index });
    }
    if !config.stop_strings.is_empty() && detokenizer.is_none() {
        return Err(Error::StopStringsNeedDetokenizer {
            n_strings: config.stop_strings.len(),
        });
    }
    fit_within_limits(
        model,
        prompt,
        &config.end_tokens,
        config.max_new_tokens,
        config.truncation,
    )
}

/// The checks sampling and beam search share: the end tokens are in the
/// vocabulary and, without a context bound, `prompt_len + max_new_tokens`
/// fits in `usize`; then the prompt is fitted to the context by the
/// truncation policy.
pub(crate) fn fit_within_limits<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    end_tokens: &[TokenId],
    max_new_tokens: usize,
    truncation: Truncation,
) -> Result<FittedPrompt> {
    lm_core::check_token_ids(end_tokens.iter().copied(), model.vocab_size())?;
    // A context bound ends the run first, so only an unbounded model can
    // overflow the history length.
    let unbounded = model.context_length().is_none();
    if unbounded && prompt.len().checked_add(max_new_tokens).is_none() {
        return Err(Error::MaxNewTokensOverflow {
            prompt_len: prompt.len(),
            max_new_tokens,
        });
    }
    fit_prompt(prompt, model.context_length(), truncation, max_new_tokens)
}

/// Runs the loop from logits already computed for `row.history`: each turn
/// the row chooses, records, appends and checks the stop rules
/// ([`Row::advance`]), the hook sees the step, and the model predicts from
/// the new token unless the row stopped.
pub(crate) fn continue_row<M: LanguageModel>(
    model: &M,
    state: &mut M::State,
    logits: &mut Vec<f32>,
    row: &mut Row<'_>,
    on_step: &mut dyn FnMut(&Step) -> ControlFlow<()>,
) -> Result<()> {
    loop {
        // choose, record, append, stop?
        let step = row.advance(logits)?;
        let token = step.token;
        let flow = on_step(step);
        if row.stop_reason.is_some() {
            return Ok(());
        }
        if flow.is_break() {
            row.stop_reason = Some(StopReason::Cancelled);
            return Ok(());
        }
        // predict
        model.forward(state, &[token], Rows::Last, logits)?;
    }
}

/// The most new tokens a row reserves room for up front (history and trace);
/// past it they grow as needed, so `max_new_tokens` is a limit, never an
/// allocation size.
const PLAUSIBLE_NEW_TOKENS: usize = 4096;

/// One sequence being generated: its policy, random stream, history, trace
/// and scratch buffers. Shared by the single, many and batch loops, so a row
/// behaves the same whichever loop drives it.
pub(crate) struct Row<'a> {
    config: &'a GenerationConfig,
    detokenizer: Option<&'a dyn Detokenize>,
    sampler: Sampler,
    rng: TokenRng,
    vocab_size: usize,
    context_length: Option<usize>,
    /// Prompt followed by the generated tokens.
    pub(crate) history: Vec<TokenId>,
    n_prompt: usize,
    n_prompt_dropped: usize,
    trace: Recorder,
    /// The stop-string search over the generated text, when there are stop
    /// strings (and so a detokenizer).
    stop_search: Option<StopSearch<'a>>,
    text: Option<String>,
    rng_stream: u64,
    /// The row's place in the output constraint, if any.
    constraint: Option<ConstraintRow>,
    /// Set once the row has stopped.
    pub(crate) stop_reason: Option<StopReason>,
    /// The logits row with the end tokens masked, while fewer than
    /// `min_new_tokens` are generated.
    masked: Vec<f32>,
}

impl<'a> Row<'a> {
    pub(crate) fn new<M: LanguageModel>(
        model: &M,
        fitted: FittedPrompt,
        config: &'a GenerationConfig,
        detokenizer: Option<&'a dyn Detokenize>,
        rng_stream: u64,
    ) -> Result<Self> {
        let mut sampler = Sampler::new(&config.sampling)?;
        let mut constraint = config
            .constraint
            .as_ref()
            .map(|constraint| ConstraintRow::start(constraint, model.vocab_size(), &mut sampler))
            .transpose()?;
        let mut stop_reason = (config.max_new_tokens == 0).then_some(StopReason::MaxNewTokens);
        if let (Some(row), Some(mask), None) =
            (&mut constraint, sampler.allowed_mut(), &stop_reason)
            && row.prepare(mask, &config.end_tokens)?
        {
            stop_reason = Some(StopReason::ConstraintComplete);
        }
        let n_prompt = fitted.tokens.len();
        let context_length = model.context_length();
        let room = context_length.map_or(config.max_new_tokens, |max| {
            config.max_new_tokens.min(max.saturating_sub(n_prompt))
        });
        // Room for what a run plausibly generates; a huge `max_new_tokens`
        // runs until another stop rule, growing the buffers as it goes.
        let reserved = room.min(PLAUSIBLE_NEW_TOKENS);
        let mut history = fitted.tokens;
        history.reserve(reserved);
        Ok(Self {
            config,
            detokenizer,
            rng: TokenRng::with_stream(sampler.seed(), rng_stream),
            sampler,
            vocab_size: model.vocab_size(),
            context_length,
            history,
            n_prompt,
            n_prompt_dropped: fitted.n_dropped,
            trace: Recorder::new(config.n_top_candidates, reserved),
            stop_search: detokenizer
                .filter(|_| !config.stop_strings.is_empty())
                .map(|detokenizer| StopSearch::new(detokenizer, &config.stop_strings, &[])),
            text: None,
            rng_stream,
            masked: Vec::new(),
            constraint,
            stop_reason,
        })
    }

    /// Reads the prompt into a new state in chunks of the configured length
    /// (`after_chunk` may stop it between chunks): the state, the logits
    /// after the last token read, and whether the whole prompt was read.
    pub(crate) fn read_prompt<M: LanguageModel>(
        &self,
        model: &M,
        after_chunk: impl FnMut(usize, usize) -> ControlFlow<()>,
    ) -> Result<(M::State, Vec<f32>, ControlFlow<()>)> {
        let mut state = model.new_state();
        let mut logits = Vec::new();
        let chunk_len = self.config.prefill_chunk_len;
        let read = prefill(
            model,
            &mut state,
            &self.history,
            chunk_len,
            &mut logits,
            after_chunk,
        )?;
        Ok((state, logits, read))
    }

    /// The generated tokens so far.
    pub(crate) fn generated(&self) -> &[TokenId] {
        &self.history[self.n_prompt..]
    }

    /// One turn after the model's prediction (`logits`, the row after
    /// `history`): choose a token, record its step, append it, decide
    /// whether the row stops. Every loop (single, many, batch) runs this.
    pub(crate) fn advance(&mut self, logits: &[f32]) -> Result<&Step> {
        self.advance_with(logits, |sampler, rng, history, logits| {
            let u = if sampler.is_greedy() {
                0.0
            } else {
                rng.next_uniform()
            };
            Ok((sampler.select(logits, history, u)?, DraftMark::NotDrafted))
        })
    }

    /// [`Row::advance`] with the choice made by `choose`, which gets the
    /// row's sampler, random stream, history and the checked logits row, and
    /// must leave the sampler's policy computed for that row (the trace reads
    /// it). Speculative decoding chooses here by accepting or replacing a
    /// drafted token.
    pub(crate) fn advance_with(
        &mut self,
        logits: &[f32],
        choose: impl FnOnce(
            &mut Sampler,
            &mut TokenRng,
            &[TokenId],
            &[f32],
        ) -> Result<(Selection, DraftMark)>,
    ) -> Result<&Step> {
        if logits.len() != self.vocab_size {
            return Err(Error::LogitsLength {
                len: logits.len(),
                vocab_size: self.vocab_size,
            });
        }
        // Before `min_new_tokens`, the policy sees the end tokens masked.
        let policy_logits = if self.generated().len() < self.config.min_new_tokens
            && !self.config.end_tokens.is_empty()
        {
            self.masked.clear();
            self.masked.extend_from_slice(logits);
            for &end in &self.config.end_tokens {
                if let Some(z) = self.masked.get_mut(end as usize) {
                    *z = f32::NEG_INFINITY;
                }
            }
            &self.masked
        } else {
            logits
        };
        let (selection, mark) = choose(
            &mut self.sampler,
            &mut self.rng,
            &self.history,
            policy_logits,
        )?;
        self.trace
            .record(logits, &self.sampler, selection, self.history.len(), mark)?;
        self.history.push(selection.token);
        self.stop_reason = self.check_stop(selection.token)?;
        Ok(self.trace.last())
    }

    /// The row's vocabulary size (the length of every logits row).
    pub(crate) fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The row's config.
    pub(crate) fn config(&self) -> &GenerationConfig {
        self.config
    }

    /// The model's context bound.
    pub(crate) fn context_length(&self) -> Option<usize> {
        self.context_length
    }

    /// The stop rules after `token` was appended, in [`StopReason`]'s order;
    /// on the way, the constraint moves past the token and prepares the
    /// next turn's mask.
    fn check_stop(&mut self, token: TokenId) -> Result<Option<StopReason>> {
        if self.config.end_tokens.contains(&token) {
            return Ok(Some(StopReason::EndToken(token)));
        }
        if let Some(search) = &mut self.stop_search
            && let Some((_, index)) = search.push(token)
        {
            self.text = Some(search.text_before_stop());
            return Ok(Some(StopReason::StopString(
                self.config.stop_strings[index].clone(),
            )));
        }
        if let (Some(row), Some(mask)) = (&mut self.constraint, self.sampler.allowed_mut()) {
            row.advance(token)?;
            if row.prepare(mask, &self.config.end_tokens)? {
                return Ok(Some(StopReason::ConstraintComplete));
            }
        }
        if self.generated().len() >= self.config.max_new_tokens {
            return Ok(Some(StopReason::MaxNewTokens));
        }
        if self
            .context_length
            .is_some_and(|max| self.history.len() >= max)
        {
            return Ok(Some(StopReason::ContextBound));
        }
        Ok(None)
    }

    /// The trace; a row that never stopped (an error cut it short) reports
    /// the new-token limit.
    pub(crate) fn into_generation(self) -> Generation {
        let stop_reason = self.stop_reason.clone().unwrap_or(StopReason::MaxNewTokens);
        let text = match (&self.text, self.detokenizer) {
            (Some(text), _) => Some(text.clone()),
            (None, Some(detokenizer)) => {
                let generated = self.generated();
                let shown = match stop_reason {
                    StopReason::EndToken(_) => &generated[..generated.len().saturating_sub(1)],
                    _ => generated,
                };
                Some(detokenizer.decode(shown))
            }
            (None, None) => None,
        };
        let mut history = self.history;
        let tokens = history.split_off(self.n_prompt);
        Generation {
            prompt: history,
            n_prompt_dropped: self.n_prompt_dropped,
            tokens,
            steps: self.trace.into_steps(),
            stop_reason,
            text,
            rng_stream: self.rng_stream,
        }
    }
}
