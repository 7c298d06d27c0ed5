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
use crate::constraint::OutputConstraint;
use crate::error::{Error, Result};
use crate::hook::with_fallible_hook;
use crate::row::fit_within_limits;
use crate::sampler::{Sampler, SamplingConfig};
use crate::stop::StopReason;
use crate::trace::Candidate;
use crate::trace::top_n;
use crate::truncate::Truncation;
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
    /// Penalties, logit bias and bans applied to each beam's logits before
    /// its log-probabilities (as HF's logits processors in beam search): the
    /// hypotheses are ranked by the adjusted log-probabilities.
    pub adjustments: LogitAdjustments,
    /// How many of the model's most probable tokens each step records
    /// ([`Hypothesis::top_candidates`]; 0: none).
    pub n_top_candidates: usize,
    /// Structured output: every hypothesis stays in the constraint's
    /// language (each beam keeps its own state, forked with the beam); an
    /// end token extends a beam only once its output is complete, and a
    /// beam that can go no further finishes as
    /// [`StopReason::ConstraintComplete`].
    pub constraint: Option<OutputConstraint>,
}

/// Beam search's raw-logit stage: a [`SamplingConfig`] of which beam
/// search applies the penalties, the logit bias and the bans (as HF's
/// logits processors in beam search). It ranks at T = 1 and draws nothing,
/// so it reads no temperature, filter or seed (lm-cli refuses those flags
/// with `--num-beams`); they are still validated.
pub type LogitAdjustments = SamplingConfig;

impl Default for BeamConfig {
    /// Lesson 002's setting: B = 4, alpha = 0.6, 20 new tokens.
    fn default() -> Self {
        Self {
            num_beams: 4,
            length_penalty: 0.6,
            max_new_tokens: 20,
            end_tokens: Vec::new(),
            truncation: Truncation::Refuse,
            adjustments: LogitAdjustments::default(),
            n_top_candidates: 0,
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
    /// Each token's log-probability after the config's adjustments (the
    /// model's own when there are none): what the search ranks by.
    pub adjusted_step_logprobs: Vec<f64>,
    /// The sum of the adjusted log-probabilities, divided by the length
    /// penalty: the ranking key.
    pub score: f64,
    /// For each step, the model's most probable tokens
    /// (`n_top_candidates` of them, best first).
    pub top_candidates: Vec<Vec<Candidate>>,
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
/// continue or cancel: start from the prompt, then at each step score every
/// extension of every live beam, keep the best, grow them (setting finished
/// ones aside), and at the end rank what finished with what is still live.
fn search<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    config: &BeamConfig,
    on_step: &mut dyn FnMut(&BeamStep) -> ControlFlow<()>,
) -> Result<Vec<Hypothesis>> {
    let plan = Plan::new(model, prompt, config)?;
    let mut scratch = Scratch::new(plan.vocab_size, config)?;
    let root = match plan.root(model, config)? {
        Ok(root) => root,
        Err(done) => return Ok(vec![done]),
    };
    let mut beams = vec![root];
    let mut finished: Vec<Hypothesis> = Vec::new();
    // Why the live beams stop: the limit, unless the hook cancels first.
    let mut stop_reason = plan.limit_reason.clone();
    for step in 0..plan.n_steps {
        scratch.score_extensions(&beams, &plan, config)?;
        scratch.keep_best(config);
        let is_last_step = step + 1 == plan.n_steps;
        beams = grow(model, &beams, &scratch, config, is_last_step, &mut finished)?;
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
    Ok(rank(finished, beams, config, stop_reason))
}

/// What a search is asked to do, checked and fitted before it starts.
struct Plan {
    /// The prompt, fitted to the context.
    prompt: Vec<TokenId>,
    vocab_size: usize,
    /// Steps to run: `max_new_tokens`, or fewer where the context ends first.
    n_steps: usize,
    /// Why beams that reach `n_steps` stop.
    limit_reason: StopReason,
}

impl Plan {
    fn new<M: LanguageModel>(model: &M, prompt: &[TokenId], config: &BeamConfig) -> Result<Self> {
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
        let (n_steps, limit_reason) = match model.context_length() {
            Some(max) if max - fitted.tokens.len() < config.max_new_tokens => {
                (max - fitted.tokens.len(), StopReason::ContextBound)
            }
            _ => (config.max_new_tokens, StopReason::MaxNewTokens),
        };
        Ok(Self {
            prompt: fitted.tokens,
            vocab_size: model.vocab_size(),
            n_steps,
            limit_reason,
        })
    }

    /// The one beam the search starts from, having read the prompt; or the
    /// whole answer when no token can be added (the constraint is complete
    /// before any, or there is no step to take).
    fn root<M: LanguageModel>(
        &self,
        model: &M,
        config: &BeamConfig,
    ) -> Result<std::result::Result<Beam<M::State>, Hypothesis>> {
        let mut root = Beam {
            state: model.new_state(),
            logits: Vec::new(),
            tokens: Vec::new(),
            step_logprobs: Vec::new(),
            adjusted_step_logprobs: Vec::new(),
            top_candidates: Vec::new(),
            logprob: 0.0,
            adjusted_logprob: 0.0,
            constraint: None,
        };
        if let Some(constraint) = &config.constraint {
            let mut row = ConstraintRow::begin(constraint, self.vocab_size)?;
            let mut mask = TokenMask::new(self.vocab_size);
            if row.prepare(&mut mask, &config.end_tokens)? {
                let done = StopReason::ConstraintComplete;
                return Ok(Err(root.into_hypothesis(config.length_penalty, done)));
            }
            root.constraint = Some((row, mask));
        }
        if self.n_steps == 0 {
            let done = self.limit_reason.clone();
            return Ok(Err(root.into_hypothesis(config.length_penalty, done)));
        }
        model.forward(&mut root.state, &self.prompt, Rows::Last, &mut root.logits)?;
        Ok(Ok(root))
    }
}

/// A step's working buffers, reused from step to step.
struct Scratch {
    /// The penalties, bias and bans (`None` when there are none).
    adjust: Option<Sampler>,
    /// One beam's log-probabilities under the model, then adjusted.
    row_logprobs: Vec<f32>,
    adjusted_logprobs: Vec<f32>,
    /// The prompt and one beam's tokens, for the penalties.
    history: Vec<TokenId>,
    order: Vec<TokenId>,
    /// Each live beam's top tokens at this step.
    beam_tops: Vec<Vec<Candidate>>,
    /// Every allowed extension of every live beam, then the best of them.
    candidates: Vec<Extension>,
}

impl Scratch {
    fn new(vocab_size: usize, config: &BeamConfig) -> Result<Self> {
        Ok(Self {
            adjust: Sampler::raw_logit_stage(&config.adjustments)?,
            row_logprobs: vec![0.0; vocab_size],
            adjusted_logprobs: vec![0.0; vocab_size],
            history: Vec::new(),
            order: Vec::new(),
            beam_tops: Vec::new(),
            candidates: Vec::new(),
        })
    }

    /// Every extension of every beam by a token its adjustments and its
    /// constraint allow, with the model's and the adjusted log-probability;
    /// and each beam's top tokens under the model.
    fn score_extensions<S>(
        &mut self,
        beams: &[Beam<S>],
        plan: &Plan,
        config: &BeamConfig,
    ) -> Result<()> {
        let vocab_size = plan.vocab_size;
        self.candidates.clear();
        self.beam_tops.clear();
        for (beam_idx, beam) in beams.iter().enumerate() {
            if beam.logits.len() != vocab_size {
                return Err(Error::LogitsLength {
                    len: beam.logits.len(),
                    vocab_size,
                });
            }
            lm_core::log_softmax_into(&beam.logits, 1.0, &mut self.row_logprobs)?;
            top_n(
                &self.row_logprobs,
                config.n_top_candidates,
                f32::NEG_INFINITY,
                &mut self.order,
            );
            let row_logprobs = &self.row_logprobs;
            self.beam_tops.push(
                self.order
                    .iter()
                    .map(|&token| {
                        let logprob = row_logprobs[token as usize];
                        Candidate {
                            token,
                            prob: logprob.exp(),
                            logprob: f64::from(logprob),
                            logit: beam.logits[token as usize],
                        }
                    })
                    .collect(),
            );
            let ranked = match &mut self.adjust {
                Some(sampler) => {
                    self.history.clear();
                    self.history.extend_from_slice(&plan.prompt);
                    self.history.extend_from_slice(&beam.tokens);
                    sampler.policy(&beam.logits, &self.history)?;
                    lm_core::log_softmax_into(
                        sampler.adjusted_logits(),
                        1.0,
                        &mut self.adjusted_logprobs,
                    )?;
                    &self.adjusted_logprobs
                }
                None => &self.row_logprobs,
            };
            let allowed = beam.constraint.as_ref().map(|(_, mask)| mask);
            for (token, (&adjusted, &lp)) in ranked.iter().zip(&self.row_logprobs).enumerate() {
                if adjusted > f32::NEG_INFINITY
                    && allowed.is_none_or(|mask| mask.is_allowed(token as TokenId))
                {
                    self.candidates.push(Extension {
                        total: beam.adjusted_logprob + f64::from(adjusted),
                        beam_idx,
                        token: token as TokenId,
                        step_logprob: f64::from(lp),
                        adjusted_step_logprob: f64::from(adjusted),
                    });
                }
            }
        }
        Ok(())
    }

    /// Keeps the best extensions, best first: enough for `num_beams` live
    /// beams even when each end token takes a place.
    fn keep_best(&mut self, config: &BeamConfig) {
        let candidates = &mut self.candidates;
        let n_wanted = config
            .num_beams
            .saturating_mul(1 + config.end_tokens.len())
            .min(candidates.len());
        if n_wanted < candidates.len() {
            candidates.select_nth_unstable_by(n_wanted - 1, Extension::best_first);
            candidates.truncate(n_wanted);
        }
        candidates.sort_unstable_by(Extension::best_first);
    }
}

/// The next step's live beams: each kept extension in rank order forks its
/// parent, until `num_beams` live. One that ends (an end token, or its
/// constraint complete) is set aside in `finished` if it ranks among the
/// best `num_beams`; a live one reads its token, except at the last step.
fn grow<M: LanguageModel>(
    model: &M,
    beams: &[Beam<M::State>],
    scratch: &Scratch,
    config: &BeamConfig,
    is_last_step: bool,
    finished: &mut Vec<Hypothesis>,
) -> Result<Vec<Beam<M::State>>> {
    let mut next_beams = Vec::with_capacity(config.num_beams);
    for (rank, extension) in scratch.candidates.iter().enumerate() {
        if next_beams.len() == config.num_beams {
            break;
        }
        let Some(parent) = beams.get(extension.beam_idx) else {
            continue;
        };
        let mut child = parent.extended(extension);
        if config.n_top_candidates > 0 {
            child
                .top_candidates
                .push(scratch.beam_tops[extension.beam_idx].clone());
        }
        let ranks = rank < config.num_beams;
        if config.end_tokens.contains(&extension.token) {
            if ranks {
                let done = StopReason::EndToken(extension.token);
                finished.push(child.into_hypothesis(config.length_penalty, done));
            }
            continue;
        }
        if let Some((row, mask)) = &parent.constraint {
            let mut row = row.fork();
            row.advance(extension.token)?;
            let mut mask = mask.clone();
            if row.prepare(&mut mask, &config.end_tokens)? {
                if ranks {
                    let done = StopReason::ConstraintComplete;
                    finished.push(child.into_hypothesis(config.length_penalty, done));
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
    Ok(next_beams)
}

/// The answer: the finished hypotheses and the live beams (stopped by
/// `stop_reason`), the `num_beams` best by score, ties by tokens.
fn rank<S>(
    mut finished: Vec<Hypothesis>,
    beams: Vec<Beam<S>>,
    config: &BeamConfig,
    stop_reason: StopReason,
) -> Vec<Hypothesis> {
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
    finished
}

/// A live partial hypothesis with its own model state (and its own place
/// in the output constraint, with the mask of its next step).
struct Beam<S> {
    state: S,
    logits: Vec<f32>,
    tokens: Vec<TokenId>,
    step_logprobs: Vec<f64>,
    adjusted_step_logprobs: Vec<f64>,
    top_candidates: Vec<Vec<Candidate>>,
    logprob: f64,
    adjusted_logprob: f64,
    constraint: Option<(ConstraintRow, TokenMask)>,
}

impl<S: Clone> Beam<S> {
    /// A fork of this beam with `extension`'s token appended (its state not
    /// yet advanced, its constraint not yet forked).
    fn extended(&self, extension: &Extension) -> Self {
        let mut child = Self {
            state: self.state.clone(),
            logits: Vec::new(),
            tokens: self.tokens.clone(),
            step_logprobs: self.step_logprobs.clone(),
            adjusted_step_logprobs: self.adjusted_step_logprobs.clone(),
            top_candidates: self.top_candidates.clone(),
            logprob: self.logprob + extension.step_logprob,
            adjusted_logprob: extension.total,
            constraint: None,
        };
        child.tokens.push(extension.token);
        child.step_logprobs.push(extension.step_logprob);
        child
            .adjusted_step_logprobs
            .push(extension.adjusted_step_logprob);
        child
    }
}

impl<S> Beam<S> {
    fn into_hypothesis(self, alpha: f32, stop_reason: StopReason) -> Hypothesis {
        Hypothesis {
            score: length_penalized_score(self.adjusted_logprob, self.tokens.len(), alpha),
            tokens: self.tokens,
            logprob: self.logprob,
            step_logprobs: self.step_logprobs,
            adjusted_step_logprobs: self.adjusted_step_logprobs,
            top_candidates: self.top_candidates,
            stop_reason,
        }
    }
}

/// One beam extended by one token.
#[derive(Debug, Clone, Copy)]
struct Extension {
    /// The adjusted log-probability of the extended hypothesis.
    total: f64,
    beam_idx: usize,
    token: TokenId,
    /// The model's log-probability of the token.
    step_logprob: f64,
    /// Its adjusted log-probability.
    adjusted_step_logprob: f64,
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
