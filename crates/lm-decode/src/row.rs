//! One sequence of the generation loop ([`Row`]): its state, its sampler,
//! its constraint, its stop rules and what it records, advanced one token at
//! a time. The single, many, batch and speculative loops all run rows, so a
//! sequence gives the same tokens whichever loop runs it. The row decodes
//! each token once ([`TextDeltas`]): the text finds the stop strings and
//! goes out in the step ([`Step::text`]), so front ends print it without
//! decoding again. Also the checks and prompt fitting every loop starts
//! with ([`prepare`]).

use std::ops::ControlFlow;

use crate::constraint::ConstraintRow;
use crate::deltas::TextDeltas;
use crate::error::{Error, Result};
use crate::generate::{GenerationConfig, context_room};
use crate::hook::prefill;
use crate::rng::TokenRng;
use crate::sampler::{Sampler, Selection};
use crate::stop::StopReason;
use crate::trace::{DraftMark, Generation, Recorder, Step};
use crate::truncate::{FittedPrompt, Truncation, fit_prompt};
use lm_core::{Detokenize, LanguageModel, Rows, TokenId};

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
    sampler: Sampler,
    rng: TokenRng,
    vocab_size: usize,
    context_length: Option<usize>,
    /// Prompt followed by the generated tokens.
    pub(crate) history: Vec<TokenId>,
    n_prompt: usize,
    pub(crate) n_prompt_dropped: usize,
    trace: Recorder,
    /// The generated text, decoded once per token after the prompt, searched
    /// for the stop strings and handed out in final pieces (with a
    /// detokenizer).
    deltas: Option<TextDeltas<'a>>,
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
        let mut sampler = match detokenizer {
            Some(detokenizer) => {
                Sampler::with_text(&config.sampling, model.vocab_size(), detokenizer)?
            }
            None => Sampler::new(&config.sampling)?,
        };
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
        let room = context_room(context_length, n_prompt).map_or(config.max_new_tokens, |room| {
            config.max_new_tokens.min(room)
        });
        // Room for what a run plausibly generates; a huge `max_new_tokens`
        // runs until another stop rule, growing the buffers as it goes.
        let reserved = room.min(PLAUSIBLE_NEW_TOKENS);
        let deltas = detokenizer.map(|detokenizer| {
            TextDeltas::new(
                detokenizer,
                &fitted.tokens,
                &config.end_tokens,
                &config.stop_strings,
            )
        });
        let mut history = fitted.tokens;
        history.reserve(reserved);
        Ok(Self {
            config,
            rng: TokenRng::with_stream(sampler.seed(), rng_stream),
            sampler,
            vocab_size: model.vocab_size(),
            context_length,
            history,
            n_prompt,
            n_prompt_dropped: fitted.n_dropped,
            trace: Recorder::new(config.n_top_candidates, reserved),
            deltas,
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
    /// whether the row stops, and add the text the token made final to its
    /// step. Every loop (single, many, batch) runs this.
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
        let (text, stop_found) = match &mut self.deltas {
            Some(deltas) => {
                let found = deltas.push(selection.token);
                (deltas.take_final(), found.map(|(_, index)| index))
            }
            None => (String::new(), None),
        };
        self.stop_reason = self.check_stop(selection.token, stop_found)?;
        let step = self.trace.last_mut();
        step.text = text;
        Ok(step)
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

    /// The stop rules after `token` was appended, in [`StopReason`]'s order
    /// (`stop_found`: the index of the stop string the text now holds); on
    /// the way, the constraint moves past the token and prepares the next
    /// turn's mask.
    fn check_stop(
        &mut self,
        token: TokenId,
        stop_found: Option<usize>,
    ) -> Result<Option<StopReason>> {
        if self.config.end_tokens.contains(&token) {
            return Ok(Some(StopReason::EndToken(token)));
        }
        if let Some(index) = stop_found {
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
    pub(crate) fn into_generation(mut self) -> Generation {
        let stop_reason = self.stop_reason.clone().unwrap_or(StopReason::MaxNewTokens);
        let held_back_text = self
            .deltas
            .as_mut()
            .map(TextDeltas::finish)
            .unwrap_or_default();
        // The text the steps handed out and the held-back rest: decoded once,
        // as the stop strings were searched in it.
        let text = self.deltas.as_ref().map(TextDeltas::text);
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
            held_back_text,
        }
    }
}
