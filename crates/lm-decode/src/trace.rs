//! The record a generation leaves: one [`Step`] per chosen token and the
//! [`Generation`] that holds them.
//!
//! Every step keeps two probabilities of its token side by side (lesson 001,
//! "The probability of each default run"): the *policy's* (after penalties,
//! temperature and filters, renormalised: the distribution the token was drawn
//! from) and the *model's* (softmax at T = 1 of the raw logits). At T = 1 with
//! no filters they agree; at T = 0.5 the selected token's share differs.
//!
//! A step also keeps what lesson 000 needs to replay a draw by hand: the
//! uniform draw `u` (none for greedy) and how many candidates each stage of
//! the chain left ([`StageCounts`]). Walking the policy's candidates in id
//! order and taking the first whose running total exceeds `u`
//! ([`lm_core::sample_inverse_cdf`]) gives the chosen token.
//!
//! The loop records a step with a `Recorder` right after choosing its token,
//! before appending it and checking the stop rules; then it adds the text
//! the token made final ([`Step::text`]).

use crate::sampler::{Sampler, Selection};
use crate::stop::StopReason;
use lm_core::{LogProb, TokenId};
use std::cmp::Ordering;

/// One entry of a top-N list.
///
/// Its `logprob` is computed as the step's own (`Step::logprob` for the
/// model's list, `Step::policy_logprob` for the policy's), in `f64`, so the
/// chosen token's entry equals the step's value bit for bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The token.
    pub token: TokenId,
    /// Its probability.
    pub prob: f32,
    /// Its natural-log probability.
    pub logprob: f64,
    /// Its raw logit: the model's row before any stage of the chain (what a
    /// front end re-softmaxes at a temperature of its own).
    pub logit: f32,
}

/// One turn of the loop: the prefix read, the token chosen and its odds.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// 0 for the first generated token.
    pub index: usize,
    /// Tokens read before choosing: prompt length + `index`. The prefix is
    /// `prompt + tokens[..index]` (see [`Generation::prefix`]).
    pub prefix_len: usize,
    /// The chosen token.
    pub token: TokenId,
    /// The uniform draw in [0, 1) the token was sampled with; `None` when
    /// greedy (the choice ignores any draw).
    pub u: Option<f64>,
    /// How many candidates each stage of the chain left.
    pub n_candidates: StageCounts,
    /// Mirostat's bound on the surprise (bits) this step truncated at; `None`
    /// without mirostat.
    pub mirostat_mu: Option<f32>,
    /// Its probability under the policy (1 for greedy).
    pub policy_prob: f32,
    /// Its probability under the model (softmax of the raw logits at T = 1).
    pub model_prob: f32,
    /// The model's natural-log probability of the token.
    pub logprob: f64,
    /// The policy's natural-log probability of the token.
    pub policy_logprob: f64,
    /// The model's chain-rule log-probability of the generated tokens so far,
    /// this one included.
    pub running_logprob: LogProb,
    /// The same under the policy: the probability of the run as sampled.
    pub running_policy_logprob: LogProb,
    /// The N most probable tokens under the model (before any transform).
    pub model_top: Vec<Candidate>,
    /// The N most probable tokens under the policy (after every transform;
    /// removed tokens never appear).
    pub policy_top: Vec<Candidate>,
    /// Whether a drafter proposed this position (speculative decoding) and
    /// what the target made of it. A sampled drafted step's `u` is the
    /// acceptance draw (accepted) or the draw over the residual
    /// distribution (replaced), so only undrafted steps replay by the
    /// inverse CDF over `policy_top`'s distribution.
    pub draft: DraftMark,
    /// The text this token made final, for a front end to print or stream
    /// as it comes (often empty; always empty without a detokenizer). The
    /// loop decodes each token once, in the prompt's context, and holds
    /// back what could still change: a trailing incomplete character and
    /// the bytes that could start a stop string (see [`crate::TextDeltas`]).
    /// The steps' texts followed by [`Generation::held_back_text`] are the
    /// generated text without end tokens, cut before a stop string.
    pub text: String,
}

/// What speculative decoding did at one step of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftMark {
    /// No draft covered this position: the target chose as the plain loop
    /// does (always, outside speculative decoding).
    #[default]
    NotDrafted,
    /// The drafted token was accepted: it is the step's token.
    Accepted,
    /// The drafted token was rejected and the target chose this step's
    /// token instead (greedy: its argmax; sampling: from the residual
    /// `norm(max(0, p - q))`).
    Replaced {
        /// The rejected draft.
        draft: TokenId,
    },
}

/// A stage of the sampling chain, as the trace names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// The logits row as the model gave it: the vocabulary.
    Vocabulary,
    /// The raw-logit transforms (penalties, logit bias, bans): a banned or
    /// `-inf` token is out.
    Penalties,
    /// The output constraint (structured output): only the tokens that
    /// can continue a valid output, and the end tokens once it is complete.
    Constraint,
    /// Temperature: removes nothing when sampling; greedy (T = 0) keeps the
    /// one token it chooses.
    Temperature,
    /// [`crate::sampler::TopNSigma`].
    TopNSigma,
    /// [`crate::sampler::TopK`].
    TopK,
    /// [`crate::sampler::Typical`].
    Typical,
    /// [`crate::sampler::TopP`].
    TopP,
    /// [`crate::sampler::MinP`].
    MinP,
    /// [`crate::sampler::Xtc`].
    Xtc,
    /// The epsilon cutoff (`sampler::EpsilonCutoff`).
    EpsilonCutoff,
    /// The eta cutoff (`sampler::EtaCutoff`).
    EtaCutoff,
    /// Mirostat's truncation by the running surprise bound mu
    /// (`sampler::Mirostat`).
    Mirostat,
    /// A filter added with [`Sampler::push_filter`].
    Custom,
}

impl Stage {
    /// The stage's name in the trace and the JSON: `vocabulary`,
    /// `penalties`, `constraint`, `temperature`, then each filter by its
    /// setting's name in [`crate::SamplingConfig`] (`top_n_sigma`, `top_k`,
    /// `typical_p`, `top_p`, `min_p`, `epsilon_cutoff`, `eta_cutoff`; XTC,
    /// which has two settings, is `xtc`), `mirostat`, and
    /// `custom`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Vocabulary => "vocabulary",
            Self::Penalties => "penalties",
            Self::Constraint => "constraint",
            Self::Temperature => "temperature",
            Self::TopNSigma => "top_n_sigma",
            Self::TopK => "top_k",
            Self::Typical => "typical_p",
            Self::TopP => "top_p",
            Self::MinP => "min_p",
            Self::Xtc => "xtc",
            Self::EpsilonCutoff => "epsilon_cutoff",
            Self::EtaCutoff => "eta_cutoff",
            Self::Mirostat => "mirostat",
            Self::Custom => "custom",
        }
    }
}

/// How many candidates (tokens still in play) each stage of one step left,
/// in the chain's order: the vocabulary, the penalties, the output
/// constraint (when there is one), temperature, then
/// each filter that ran (a greedy step runs none). A count is of tokens in
/// play; at a very low temperature some of them may have a probability that
/// rounds to 0.
///
/// Held inline (no allocation per step): a chain of more than
/// [`StageCounts::CAPACITY`] stages keeps the count after its last stage in
/// the last entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageCounts {
    entries: [(Stage, u32); StageCounts::CAPACITY],
    len: usize,
}

impl Default for StageCounts {
    fn default() -> Self {
        Self {
            entries: [(Stage::Vocabulary, 0); Self::CAPACITY],
            len: 0,
        }
    }
}

impl StageCounts {
    /// The most stages recorded: the vocabulary, the penalties, the
    /// constraint, temperature, the eight built-in filters, mirostat and
    /// three filters of one's own ([`Sampler::push_filter`]).
    pub const CAPACITY: usize = 16;

    /// The stages and their counts, in the chain's order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Stage, usize)> + '_ {
        self.entries[..self.len]
            .iter()
            .map(|&(stage, n)| (stage, n as usize))
    }

    /// The count after the first `stage` of that kind, if it ran.
    pub fn get(&self, stage: Stage) -> Option<usize> {
        self.iter().find(|&(s, _)| s == stage).map(|(_, n)| n)
    }

    /// The candidates left at the end of the chain: those the policy's
    /// probabilities are spread over.
    pub fn last(&self) -> Option<usize> {
        self.len.checked_sub(1).map(|i| self.entries[i].1 as usize)
    }

    /// Forgets every count (the sampler starts each row with this).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Keeps the first `len` counts.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Records that `stage` left `n` candidates.
    pub(crate) fn push(&mut self, stage: Stage, n: usize) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        let index = self.len.min(Self::CAPACITY - 1);
        self.entries[index] = (stage, n);
        self.len = index + 1;
    }
}

/// The trace of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The prompt as the model read it (after any truncation).
    pub prompt: Vec<TokenId>,
    /// Tokens the truncation policy dropped from the prompt.
    pub n_prompt_dropped: usize,
    /// The generated tokens; an end token that stopped the loop is the last.
    pub tokens: Vec<TokenId>,
    /// One step per generated token.
    pub steps: Vec<Step>,
    /// Why the loop stopped.
    pub stop_reason: StopReason,
    /// The generated text, when a detokenizer was given: what the prompt's
    /// decoded text grew by (the steps' texts followed by
    /// [`Generation::held_back_text`], decoded once), without end tokens, cut
    /// at the first byte of a stop string that stopped it.
    pub text: Option<String>,
    /// The random stream the tokens were drawn from (see [`crate::TokenRng`]).
    pub rng_stream: u64,
    /// The text no step handed out ([`Step::text`]): what was held back when
    /// the run ended (an incomplete character, or bytes that could have
    /// started a stop string). A front end that streamed the steps' texts
    /// prints it last.
    pub held_back_text: String,
}

impl Generation {
    /// True when the model or a stop string ended the run, false when a limit
    /// truncated it.
    pub fn is_finished(&self) -> bool {
        self.stop_reason.is_finished()
    }

    /// The model's chain-rule log-probability of the generated tokens.
    pub fn logprob(&self) -> LogProb {
        self.steps
            .last()
            .map(|step| step.running_logprob)
            .unwrap_or_default()
    }

    /// The policy's chain-rule log-probability of the generated tokens.
    pub fn policy_logprob(&self) -> LogProb {
        self.steps
            .last()
            .map(|step| step.running_policy_logprob)
            .unwrap_or_default()
    }

    /// The prefix read before step `index`, as its two parts
    /// (`prompt`, `tokens[..index]`); `None` past the last step.
    pub fn prefix(&self, index: usize) -> Option<(&[TokenId], &[TokenId])> {
        (index < self.steps.len()).then(|| (self.prompt.as_slice(), &self.tokens[..index]))
    }
}

/// Writes the trace as the loop runs: one [`Step`] per chosen token, with
/// the running chain-rule totals and the top-N lists, reusing one scratch
/// buffer for the partial selections.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    n_top: usize,
    steps: Vec<Step>,
    running: LogProb,
    running_policy: LogProb,
    order: Vec<TokenId>,
}

impl Recorder {
    /// Records `n_top` candidates per step, with room for `n_steps` steps.
    pub(crate) fn new(n_top: usize, n_steps: usize) -> Self {
        Self {
            n_top,
            steps: Vec::with_capacity(n_steps),
            running: LogProb::default(),
            running_policy: LogProb::default(),
            order: Vec::new(),
        }
    }

    /// Records the step that chose `selection` from `logits` (the model's
    /// row after `prefix_len` tokens) under `sampler`, which has just
    /// computed its policy for that row.
    pub(crate) fn record(
        &mut self,
        logits: &[f32],
        sampler: &Sampler,
        selection: Selection,
        prefix_len: usize,
        draft: DraftMark,
    ) -> lm_core::Result<()> {
        let token = selection.token;
        let model_row = match sampler.model_log_normaliser() {
            Some(log_sum) => ModelRow::from_log_sum(log_sum),
            None => ModelRow::new(logits)?,
        };
        let logprob = model_row.logprob(logits[token as usize]);
        let policy_logprob = ln_prob(selection.policy_prob);
        self.running.push_ln(logprob);
        self.running_policy.push_ln(policy_logprob);
        top_n(logits, self.n_top, f32::NEG_INFINITY, &mut self.order);
        let model_top = self
            .order
            .iter()
            .map(|&id| {
                let logprob = model_row.logprob(logits[id as usize]);
                Candidate {
                    token: id,
                    prob: logprob.exp() as f32,
                    logprob,
                    logit: logits[id as usize],
                }
            })
            .collect();
        let probs = sampler.policy_probs();
        top_n(probs, self.n_top, 0.0, &mut self.order);
        let policy_top = self
            .order
            .iter()
            .map(|&id| {
                let prob = probs[id as usize];
                Candidate {
                    token: id,
                    prob,
                    logprob: ln_prob(prob),
                    logit: logits[id as usize],
                }
            })
            .collect();
        self.steps.push(Step {
            index: self.steps.len(),
            prefix_len,
            token,
            policy_prob: selection.policy_prob,
            model_prob: logprob.exp() as f32,
            logprob,
            policy_logprob,
            running_logprob: self.running,
            running_policy_logprob: self.running_policy,
            model_top,
            policy_top,
            u: selection.u,
            n_candidates: *sampler.stage_counts(),
            mirostat_mu: sampler.mirostat_mu(),
            draft,
            text: String::new(),
        });
        Ok(())
    }

    /// The step recorded last, for the row to add what it learns after
    /// recording it (the text).
    pub(crate) fn last_mut(&mut self) -> &mut Step {
        self.steps
            .last_mut()
            .expect("the trace is read only after a step was recorded")
    }

    /// The steps, in order.
    pub(crate) fn into_steps(self) -> Vec<Step> {
        self.steps
    }
}

/// The policy's natural-log probability of a token of probability `prob`:
/// one computation for the chosen token and the policy's top list.
fn ln_prob(prob: f32) -> f64 {
    f64::from(prob).ln()
}

/// The model's own distribution over one logits row: `ln p_i = z_i -
/// ln sum_j exp(z_j)`, the normaliser computed once per row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ModelRow {
    log_sum: f64,
}

impl ModelRow {
    /// The normaliser of a logits row (NaN, +inf or an all -inf row are
    /// errors, as everywhere).
    pub(crate) fn new(logits: &[f32]) -> lm_core::Result<Self> {
        Ok(Self {
            log_sum: lm_core::log_sum_exp(logits)?,
        })
    }

    /// The row whose normaliser `ln sum_j exp(z_j)` is already known.
    pub(crate) fn from_log_sum(log_sum: f64) -> Self {
        Self { log_sum }
    }

    /// The natural-log probability of a logit of this row.
    pub(crate) fn logprob(&self, logit: f32) -> f64 {
        f64::from(logit) - self.log_sum
    }
}

/// Writes the ids of the `n` largest `values` above `floor` into `order`,
/// best first (ties: lower id first), by partial selection.
pub(crate) fn top_n(values: &[f32], n: usize, floor: f32, order: &mut Vec<TokenId>) {
    order.clear();
    if n == 0 {
        return;
    }
    order.extend(
        values
            .iter()
            .enumerate()
            .filter(|&(_, &v)| v > floor)
            .map(|(id, _)| id as TokenId),
    );
    let by_value = |a: &TokenId, b: &TokenId| -> Ordering {
        values[*b as usize]
            .total_cmp(&values[*a as usize])
            .then(a.cmp(b))
    };
    if n < order.len() {
        order.select_nth_unstable_by(n - 1, by_value);
        order.truncate(n);
    }
    order.sort_unstable_by(by_value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_longer_than_the_capacity_keeps_its_last_count_last() {
        let mut counts = StageCounts::default();
        assert_eq!(counts.last(), None);
        counts.push(Stage::Vocabulary, 100);
        for n in (80..99).rev() {
            counts.push(Stage::Custom, n);
        }
        counts.push(Stage::MinP, 3);
        assert_eq!(counts.iter().len(), StageCounts::CAPACITY);
        assert_eq!(counts.last(), Some(3));
        assert_eq!(counts.get(Stage::MinP), Some(3));
        assert_eq!(counts.get(Stage::Vocabulary), Some(100));
        counts.clear();
        assert_eq!(counts.iter().len(), 0);
    }
}
