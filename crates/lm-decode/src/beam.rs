//! Beam search with the GNMT length penalty (lesson 002: the original
//! Transformer used beam size 4 and alpha = 0.6).
//!
//! ```text
//! score(Y) = ln p(Y | prompt) / ((5 + |Y|) / 6)^alpha      |Y| = generated tokens only
//! ```
//!
//! Each step extends every live beam by every token, ranks the candidates by
//! their log-probability, and keeps the best `num_beams` that do not end. A
//! candidate ending in an end token is set aside as a finished hypothesis
//! (never extended) if it ranks among the best `num_beams` of its step. The
//! search runs to `max_new_tokens` (or the context bound); the answer is the
//! `num_beams` best of the finished and surviving hypotheses by score.
//! Beams fork by cloning the model state; a token chosen at the last step is
//! never fed.

use crate::constraint::ConstraintRow;
use crate::generate::fit_within_limits;
use crate::hook::with_fallible_hook;
use crate::{Error, OutputConstraint, Result, StopReason, Truncation};
use lm_core::{LanguageModel, Rows, TokenId, TokenMask};
use std::cmp::Ordering;
use std::ops::ControlFlow;

/// Beam-search parameters, named as in HF transformers.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamConfig {
    /// Beam width B (>= 1).
    pub num_beams: usize,
    /// The exponent alpha of the length penalty (0: plain log-probability).
    pub length_penalty: f32,
    /// The most tokens a hypothesis may have.
    pub max_new_tokens: usize,
    /// Tokens that finish a hypothesis.
    pub end_tokens: Vec<TokenId>,
    /// What to do with a prompt that does not fit the context.
    pub truncation: Truncation,
    /// Structured output: every hypothesis stays in the constraint's
    /// language (each beam keeps its own state, forked with the beam); an
    /// end token extends a beam only once its output is complete, and a
    /// beam that can go no further finishes as
    /// [`StopReason::ConstraintComplete`].
    pub constraint: Option<OutputConstraint>,
}

impl Default for BeamConfig {
    /// Lesson 002's setting: B = 4, alpha = 0.6, 20 new tokens.
    fn default() -> Self {
        Self {
            num_beams: 4,
            length_penalty: 0.6,
            max_new_tokens: 20,
            end_tokens: Vec::new(),
            truncation: Truncation::Refuse,
            constraint: None,
        }
    }
}

/// One result of a beam search.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// The generated tokens (an end token, if any, is the last).
    pub tokens: Vec<TokenId>,
    /// The model's log-probability of `tokens` given the prompt.
    pub logprob: f64,
    /// The model's log-probability of each token; they sum to `logprob`.
    pub step_logprobs: Vec<f64>,
    /// `logprob` divided by the length penalty: the ranking key.
    pub score: f64,
    /// Why this hypothesis stopped growing.
    pub stop_reason: StopReason,
}

/// The GNMT score `logprob / ((5 + n_tokens) / 6)^alpha`.
///
/// ```
/// // alpha = 0 leaves the log-probability; one token at alpha = 1 divides by 1.
/// assert_eq!(lm_decode::length_penalized_score(-2.0, 7, 0.0), -2.0);
/// assert_eq!(lm_decode::length_penalized_score(-2.0, 1, 1.0), -2.0);
/// assert_eq!(lm_decode::length_penalized_score(-2.0, 7, 1.0), -1.0);
/// ```
pub fn length_penalized_score(logprob: f64, n_tokens: usize, alpha: f32) -> f64 {
    let penalty = ((5.0 + n_tokens as f64) / 6.0).powf(f64::from(alpha));
    logprob / penalty
}

/// Beam search from `prompt`; returns up to `num_beams` hypotheses, best
/// score first (ties: lower token sequence first).
///
/// ```
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// use lm_decode::{beam_search, BeamConfig};
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
/// // A model that always prefers token 0: the best two-token hypothesis is [0, 0].
/// let config = BeamConfig { num_beams: 2, length_penalty: 0.0, max_new_tokens: 2, ..BeamConfig::default() };
/// let best = beam_search(&Fixed, &[1], &config).unwrap();
/// assert_eq!(best[0].tokens, vec![0, 0]);
/// assert_eq!(best.len(), 2);
/// ```
pub fn beam_search<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    config: &BeamConfig,
) -> Result<Vec<Hypothesis>> {
    beam_search_streaming(model, prompt, config, |_| {
        Ok::<_, Error>(ControlFlow::Continue(()))
    })
}

/// Progress of a beam search, reported after each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeamStep {
    /// 0 for the first step (every hypothesis has `index + 1` tokens).
    pub index: usize,
    /// Beams still growing after this step.
    pub n_live: usize,
    /// Hypotheses finished by an end token so far.
    pub n_finished: usize,
}

/// [`beam_search`] with a hook called after every step. `Ok(Break)` stops
/// the search: the live beams become hypotheses stopped by
/// [`StopReason::Cancelled`] and are ranked with the finished ones as at the
/// end of a full search (the way [`crate::generate_streaming`] stops
/// generation). An `Err` from the hook ends the search with that error; the
/// search's own errors reach the caller as `E` through `From<Error>`.
///
/// ```
/// use std::ops::ControlFlow;
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// use lm_decode::{beam_search_streaming, BeamConfig, StopReason};
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
/// // Stopped after the second of ten steps: two-token hypotheses, cancelled.
/// let config = BeamConfig { num_beams: 2, max_new_tokens: 10, ..BeamConfig::default() };
/// let stop_after_two = |step: &lm_decode::BeamStep| {
///     let flow = if step.index == 1 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) };
///     Ok::<_, lm_decode::Error>(flow)
/// };
/// let best = beam_search_streaming(&Fixed, &[1], &config, stop_after_two).unwrap();
/// assert_eq!(best[0].tokens, vec![0, 0]);
/// assert_eq!(best[0].stop_reason, StopReason::Cancelled);
/// ```
pub fn beam_search_streaming<M: LanguageModel, E: From<Error>>(
    model: &M,
    prompt: &[TokenId],
    config: &BeamConfig,
    on_step: impl FnMut(&BeamStep) -> std::result::Result<ControlFlow<()>, E>,
) -> Result<Vec<Hypothesis>, E> {
    with_fallible_hook(on_step, |on_step| search(model, prompt, config, on_step))
}

/// The search behind [`beam_search_streaming`], with a hook that can only
/// continue or cancel.
fn search<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    config: &BeamConfig,
    on_step: &mut dyn FnMut(&BeamStep) -> ControlFlow<()>,
) -> Result<Vec<Hypothesis>> {
    let num_beams = config.num_beams;
    Error::check(num_beams, num_beams >= 1, |value| Error::InvalidNumBeams {
        value,
    })?;
    let alpha = config.length_penalty;
    Error::check(alpha, alpha.is_finite(), |value| {
        Error::InvalidLengthPenalty { value }
    })?;
    let fitted = fit_within_limits(
        model,
        prompt,
        &config.end_tokens,
        config.max_new_tokens,
        config.truncation,
    )?;
    let vocab_size = model.vocab_size();
    let (n_steps, limit_reason) = match model.context_length() {
        Some(max) if max - fitted.tokens.len() < config.max_new_tokens => {
            (max - fitted.tokens.len(), StopReason::ContextBound)
        }
        _ => (config.max_new_tokens, StopReason::MaxNewTokens),
    };
    let mut root = Beam {
        state: model.new_state(),
        logits: Vec::new(),
        tokens: Vec::new(),
        step_logprobs: Vec::new(),
        logprob: 0.0,
        constraint: None,
    };
    if let Some(constraint) = &config.constraint {
        let mut row = ConstraintRow::begin(constraint, vocab_size)?;
        let mut mask = TokenMask::new(vocab_size);
        if row.prepare(&mut mask, &config.end_tokens)? {
            return Ok(vec![root.into_hypothesis(
                config.length_penalty,
                StopReason::ConstraintComplete,
            )]);
        }
        root.constraint = Some((row, mask));
    }
    if n_steps == 0 {
        return Ok(vec![
            root.into_hypothesis(config.length_penalty, limit_reason),
        ]);
    }
    model.forward(
        &mut root.state,
        &fitted.tokens,
        Rows::Last,
        &mut root.logits,
    )?;
    let mut beams = vec![root];
    // Why the live beams stop: the limit, unless the hook cancels first.
    let mut stop_reason = limit_reason;
    let mut finished: Vec<Hypothesis> = Vec::new();
    let mut row_logprobs = vec![0.0f32; vocab_size];
    let mut candidates: Vec<Extension> = Vec::new();
    for step in 0..n_steps {
        candidates.clear();
        for (beam_idx, beam) in beams.iter().enumerate() {
            if beam.logits.len() != vocab_size {
                return Err(Error::LogitsLength {
                    len: beam.logits.len(),
                    vocab_size,
                });
            }
            lm_core::log_softmax_into(&beam.logits, 1.0, &mut row_logprobs)?;
            let allowed = beam.constraint.as_ref().map(|(_, mask)| mask);
            for (token, &lp) in row_logprobs.iter().enumerate() {
                if lp > f32::NEG_INFINITY
                    && allowed.is_none_or(|mask| mask.is_allowed(token as TokenId))
                {
                    let step_logprob = f64::from(lp);
                    candidates.push(Extension {
                        total: beam.logprob + step_logprob,
                        beam_idx,
                        token: token as TokenId,
                        step_logprob,
                    });
                }
            }
        }
        let n_wanted = config
            .num_beams
            .saturating_mul(1 + config.end_tokens.len())
            .min(candidates.len());
        if n_wanted < candidates.len() {
            candidates.select_nth_unstable_by(n_wanted - 1, Extension::best_first);
            candidates.truncate(n_wanted);
        }
        candidates.sort_unstable_by(Extension::best_first);
        let is_last_step = step + 1 == n_steps;
        let mut next_beams = Vec::with_capacity(config.num_beams);
        for (rank, extension) in candidates.iter().enumerate() {
            if next_beams.len() == config.num_beams {
                break;
            }
            let Some(parent) = beams.get(extension.beam_idx) else {
                continue;
            };
            let mut child = Beam {
                state: parent.state.clone(),
                logits: Vec::new(),
                tokens: parent.tokens.clone(),
                step_logprobs: parent.step_logprobs.clone(),
                logprob: extension.total,
                constraint: None,
            };
            child.tokens.push(extension.token);
            child.step_logprobs.push(extension.step_logprob);
            if config.end_tokens.contains(&extension.token) {
                if rank < config.num_beams {
                    finished.push(child.into_hypothesis(
                        config.length_penalty,
                        StopReason::EndToken(extension.token),
                    ));
                }
                continue;
            }
            if let Some((row, mask)) = &parent.constraint {
                let mut row = row.fork();
                row.advance(extension.token)?;
                let mut mask = mask.clone();
                if row.prepare(&mut mask, &config.end_tokens)? {
                    if rank < config.num_beams {
                        finished.push(child.into_hypothesis(
                            config.length_penalty,
                            StopReason::ConstraintComplete,
                        ));
                    }
                    continue;
                }
                child.constraint = Some((row, mask));
            }
            if !is_last_step {
                model.forward(
                    &mut child.state,
                    &[extension.token],
                    Rows::Last,
                    &mut child.logits,
                )?;
            }
            next_beams.push(child);
        }
        beams = next_beams;
        if beams.is_empty() {
            break;
        }
        let progress = BeamStep {
            index: step,
            n_live: beams.len(),
            n_finished: finished.len(),
        };
        if !is_last_step && on_step(&progress).is_break() {
            stop_reason = StopReason::Cancelled;
            break;
        }
    }
    finished.extend(
        beams
            .into_iter()
            .map(|beam| beam.into_hypothesis(config.length_penalty, stop_reason.clone())),
    );
    finished.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.tokens.cmp(&b.tokens))
    });
    finished.truncate(config.num_beams);
    Ok(finished)
}

/// A live partial hypothesis with its own model state (and its own place
/// in the output constraint, with the mask of its next step).
struct Beam<S> {
    state: S,
    logits: Vec<f32>,
    tokens: Vec<TokenId>,
    step_logprobs: Vec<f64>,
    logprob: f64,
    constraint: Option<(ConstraintRow, TokenMask)>,
}

impl<S> Beam<S> {
    fn into_hypothesis(self, alpha: f32, stop_reason: StopReason) -> Hypothesis {
        Hypothesis {
            score: length_penalized_score(self.logprob, self.tokens.len(), alpha),
            tokens: self.tokens,
            logprob: self.logprob,
            step_logprobs: self.step_logprobs,
            stop_reason,
        }
    }
}

/// One beam extended by one token.
#[derive(Debug, Clone, Copy)]
struct Extension {
    total: f64,
    beam_idx: usize,
    token: TokenId,
    step_logprob: f64,
}

impl Extension {
    /// Higher total first; ties by beam, then token, for a fixed order.
    fn best_first(a: &Self, b: &Self) -> Ordering {
        b.total
            .total_cmp(&a.total)
            .then(a.beam_idx.cmp(&b.beam_idx))
            .then(a.token.cmp(&b.token))
    }
}
