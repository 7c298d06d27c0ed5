//! Speculative decoding: a cheap [`Drafter`] proposes up to k tokens, the
//! target model reads the last chosen token and all k drafts in one forward
//! pass ([`Rows::All`]), and the loop accepts the drafts the target agrees
//! with plus one token of the target's own. The weights stream once for up to
//! k + 1 tokens.
//!
//! ```text
//! history ... t | d1 d2 d3          (t chosen but unfed; d* drafted)
//! forward([t, d1, d2, d3], All) -> rows r0 r1 r2 r3
//! r0 verifies d1, r1 verifies d2, r2 verifies d3, r3 gives a bonus token
//! d1 accepted, d2 rejected -> the target's token c replaces it; stop there
//! truncate the state to history.len() - 1 (t d1 fed, c unfed), draft again
//! ```
//!
//! Greedy: a draft is accepted when it is the target's argmax, so the output
//! is the plain greedy output, id for id. Sampling: the rejection rule of
//! Leviathan et al. 2023 (accept d with probability min(1, p(d) / q(d)); on
//! rejection draw from `norm(max(0, p - q))`) on the policy's distribution
//! `p` (the sampler's, after penalties, temperature and filters), so each
//! token is distributed exactly as the policy's. A drafter without a
//! distribution is a point mass (`q(d) = 1`), for which the rule is the
//! plain loop's own choice: draw the token from `p` with the step's `u`
//! (accepted with probability `p(d)`, and distributed as `p`) and accept
//! `d` when it is that token, so a seed gives the plain loop's ids.
//!
//! Every token goes through [`Row`]'s turn (record, append, stop rules), so
//! stop strings, end tokens, `max_new_tokens`, the context bound, the hook
//! and the trace behave as in [`crate::generate_with_hook`]; each [`Step`]
//! carries the target's probabilities and a [`DraftMark`].

use crate::error::{Error, Result};
use crate::generate::{GenerationConfig, run_from_state};
use crate::hook::GenerationHook;
use crate::rng::TokenRng;
use crate::row::Row;
use crate::sampler::{Sampler, Selection};
use crate::stop::StopReason;
use crate::trace::{DraftMark, Generation, Step};
use lm_core::{Detokenize, LanguageModel, Rows, SequenceState, TokenId};
use std::ops::ControlFlow;

/// Proposes the tokens the target model will probably choose next.
///
/// The loop asks for at most `max_tokens` (what the limits leave room for)
/// and then says how many the target accepted, so a drafter can adapt how
/// many it proposes to its recent acceptance rate.
pub trait Drafter {
    /// Writes up to `max_tokens` proposed continuations of `context` (the
    /// prompt and every token generated so far) into `draft`, which the loop
    /// has cleared. Proposing nothing is allowed: the loop then decodes one
    /// token as the plain loop does.
    fn propose(&mut self, context: &[TokenId], max_tokens: usize, draft: &mut Draft) -> Result<()>;

    /// How many of the last `n_proposed` tokens the target accepted (a
    /// prefix of the draft).
    fn observe(&mut self, n_proposed: usize, n_accepted: usize);
}

impl<D: Drafter + ?Sized> Drafter for &mut D {
    fn propose(&mut self, context: &[TokenId], max_tokens: usize, draft: &mut Draft) -> Result<()> {
        (**self).propose(context, max_tokens, draft)
    }

    fn observe(&mut self, n_proposed: usize, n_accepted: usize) {
        (**self).observe(n_proposed, n_accepted);
    }
}

/// The tokens a [`Drafter`] proposes, each either a point mass (a drafter
/// without probabilities, as prompt lookup) or drawn from a distribution
/// `q` over the vocabulary (a draft model), which the sampling rule needs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    /// Each token and, for a sampled one, the start of its `q` in `probs`.
    entries: Vec<(TokenId, Option<usize>)>,
    probs: Vec<f32>,
}

impl Draft {
    /// Proposes `token` with certainty (`q` is a point mass on it).
    pub fn push(&mut self, token: TokenId) {
        self.entries.push((token, None));
    }

    /// Proposes `token`, drawn from `q` (one probability per vocabulary
    /// entry; `q[token]` must be positive).
    pub fn push_sampled(&mut self, token: TokenId, q: &[f32]) {
        self.entries.push((token, Some(self.probs.len())));
        self.probs.extend_from_slice(q);
    }

    /// The proposed tokens, in order.
    pub fn tokens(&self) -> impl ExactSizeIterator<Item = TokenId> + '_ {
        self.entries.iter().map(|&(token, _)| token)
    }

    /// How many tokens are proposed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is proposed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every proposal.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.probs.clear();
    }

    /// Keeps the first `n` proposals.
    fn truncate(&mut self, n: usize) {
        if let Some(&(_, Some(start))) = self.entries.get(n) {
            self.probs.truncate(start);
        }
        self.entries.truncate(n);
    }

    /// Checks every token id and distribution against the vocabulary.
    fn check(&self, vocab_size: usize) -> Result<()> {
        lm_core::check_token_ids(self.tokens(), vocab_size)?;
        for (index, &(token, start)) in self.entries.iter().enumerate() {
            let Some(start) = start else { continue };
            let end = self.entries[index + 1..]
                .iter()
                .find_map(|&(_, start)| start)
                .unwrap_or(self.probs.len());
            let q = &self.probs[start..end];
            if q.len() != vocab_size {
                return Err(Error::DraftDistributionLength {
                    len: q.len(),
                    vocab_size,
                });
            }
            let q_token = q[token as usize];
            if !(q_token > 0.0 && q_token.is_finite()) {
                return Err(Error::DraftTokenNotInDistribution {
                    token,
                    prob: q_token,
                });
            }
        }
        Ok(())
    }

    /// The `index`th token and its distribution (`None`: a point mass).
    fn get(&self, index: usize, vocab_size: usize) -> (TokenId, Option<&[f32]>) {
        let (token, start) = self.entries[index];
        (
            token,
            start.map(|start| &self.probs[start..start + vocab_size]),
        )
    }
}

/// What speculation did over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Tokens the drafter proposed and the target verified.
    pub drafted_tokens: usize,
    /// Drafted tokens the target accepted.
    pub accepted_tokens: usize,
    /// Forward passes of the target after the prompt (the plain loop makes
    /// one per generated token but the last).
    pub target_passes: usize,
}

impl SpeculationStats {
    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted_tokens == 0 {
            0.0
        } else {
            self.accepted_tokens as f64 / self.drafted_tokens as f64
        }
    }
}

/// [`crate::generate_with_hook`] with a drafter: the same tokens for
/// greedy and, with point-mass drafts ([`Draft::push`]: prompt lookup, a
/// greedy draft model), for sampling with the same seed; the same
/// distribution for drafts drawn from a `q` ([`Draft::push_sampled`]);
/// fewer passes over the target when drafts are accepted.
///
/// ```
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// use std::ops::ControlFlow;
/// use lm_decode::{generate, generate_speculative, GenerationConfig, PromptLookup, SamplingConfig, Step};
/// # /// Prefers the token after the last one read (a 4-token vocabulary).
/// # struct Counter;
/// # impl LanguageModel for Counter {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 4 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, state: &mut Prefix, tokens: &[TokenId], rows: Rows,
/// #                logits: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         logits.clear();
/// #         for &t in tokens {
/// #             state.tokens.push(t);
/// #             let next = (t as usize + 1) % 4;
/// #             logits.extend((0..4).map(|i| if i == next { 2.0 } else { 0.0 }));
/// #         }
/// #         if rows == Rows::Last { let n = logits.len(); logits.drain(..n - 4); }
/// #         Ok(())
/// #     }
/// # }
/// let config = GenerationConfig { max_new_tokens: 12, sampling: SamplingConfig::greedy(),
///                                 ..GenerationConfig::default() };
/// let plain = generate(&Counter, &[0, 1, 2, 3], &config, None).unwrap();
/// let hook = |_: &Step| Ok::<_, lm_decode::Error>(ControlFlow::Continue(()));
/// let (run, stats) =
///     generate_speculative(&Counter, &[0, 1, 2, 3], &config, None, PromptLookup::default(), hook)
///         .unwrap();
/// assert_eq!(run.tokens, plain.tokens);
/// assert!(stats.target_passes < 11, "drafts were accepted: {stats:?}");
/// ```
pub fn generate_speculative<M: LanguageModel, H: GenerationHook>(
    model: &M,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    drafter: impl Drafter,
    hook: H,
) -> Result<(Generation, SpeculationStats), H::Error> {
    let state = model.new_state();
    generate_speculative_from_state(model, state, prompt, config, detokenizer, drafter, hook)
        .map(|(generation, stats, _)| (generation, stats))
}

/// [`generate_speculative`] from a state that has already read the first
/// `state.pos()` tokens of `prompt`, as [`crate::generate_from_state`] is
/// for the plain loop (the prefix cache's users: lm-serve): only the rest
/// of the prompt is read, and the state comes back after the run, having
/// read the prompt and every generated token but the last (rejected drafts
/// rolled back), ready to be kept.
///
/// ```
/// use std::ops::ControlFlow;
/// use lm_core::{LanguageModel, Prefix, Rows, SequenceState, TokenId};
/// use lm_decode::{generate, generate_speculative_from_state, GenerationConfig, PromptLookup,
///                 SamplingConfig, Step};
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
/// let config = GenerationConfig { max_new_tokens: 9, sampling: SamplingConfig::greedy(), ..Default::default() };
/// let prompt = [0, 1, 2, 0, 1, 2];
/// // A state that has read the first four prompt tokens.
/// let mut state = Next.new_state();
/// Next.forward(&mut state, &prompt[..4], Rows::Last, &mut Vec::new()).unwrap();
/// // The hook stops the run at its fifth token, inside a verified draft.
/// let hook = |step: &Step| {
///     Ok::<_, lm_decode::Error>(if step.index == 4 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
/// };
/// let (run, stats, state) = generate_speculative_from_state(
///     &Next, state, &prompt, &config, None, PromptLookup::default(), hook).unwrap();
/// assert_eq!(run.tokens, generate(&Next, &prompt, &config, None).unwrap().tokens[..5]);
/// assert_eq!(stats.accepted_tokens, 3, "{stats:?}");
/// // Read: the prompt and the tokens but the last (the draft's tail dropped).
/// assert_eq!(state.pos(), prompt.len() + 5 - 1);
/// ```
pub fn generate_speculative_from_state<M: LanguageModel, H: GenerationHook>(
    model: &M,
    state: M::State,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    mut drafter: impl Drafter,
    hook: H,
) -> Result<(Generation, SpeculationStats, M::State), H::Error> {
    let mut stats = SpeculationStats::default();
    let (generation, state) = run_from_state(
        model,
        state,
        prompt,
        config,
        detokenizer,
        hook,
        |state, logits, row, on_step| {
            let result = speculate(model, state, logits, row, &mut drafter, &mut stats, on_step);
            // However the loop ended, the state keeps what the history
            // holds but its last token (a stop inside a verified draft
            // leaves the draft's tail read).
            let kept = row.history.len().saturating_sub(1);
            if state.pos() > kept {
                state.truncate(kept);
            }
            result
        },
    )?;
    Ok((generation, stats, state))
}

/// The loop from the prompt's logits: the first token as the plain loop
/// chooses it, then rounds of draft, verify in one pass, accept, roll back.
fn speculate<M: LanguageModel>(
    model: &M,
    state: &mut M::State,
    mut logits: Vec<f32>,
    row: &mut Row<'_>,
    drafter: &mut dyn Drafter,
    stats: &mut SpeculationStats,
    on_step: &mut dyn FnMut(&Step) -> ControlFlow<()>,
) -> Result<()> {
    let vocab_size = row.vocab_size();
    let mut draft = Draft::default();
    let mut fed = Vec::new();
    let mut residual = Vec::new();
    let mut pending: Option<std::ops::Range<usize>> = Some(0..vocab_size);
    loop {
        // A row of `logits` to choose from without a draft (the prompt's, or
        // the last token's when nothing was drafted).
        if let Some(range) = pending.take() {
            let flow = on_step(row.advance(&logits[range])?);
            if stopped(row, flow) {
                return Ok(());
            }
        }
        // Invariant: the state has read every token of the history but the last.
        debug_assert_eq!(state.pos() + 1, row.history.len());
        let max_tokens = draft_room(row);
        draft.clear();
        if max_tokens > 0 {
            drafter.propose(&row.history, max_tokens, &mut draft)?;
            draft.truncate(max_tokens);
            draft.check(vocab_size)?;
        }
        let last = *row.history.last().expect("a token was chosen");
        stats.target_passes += 1;
        if draft.is_empty() {
            model.forward(state, &[last], Rows::Last, &mut logits)?;
            pending = Some(0..vocab_size);
            continue;
        }
        fed.clear();
        fed.push(last);
        fed.extend(draft.tokens());
        model.forward(state, &fed, Rows::All, &mut logits)?;
        if logits.len() != fed.len() * vocab_size {
            return Err(Error::LogitsRows {
                len: logits.len(),
                n_rows: fed.len(),
                vocab_size,
            });
        }
        let n_drafted = draft.len();
        stats.drafted_tokens += n_drafted;
        let mut n_accepted = 0;
        for index in 0..=n_drafted {
            let rows = &logits[index * vocab_size..(index + 1) * vocab_size];
            let step = if index < n_drafted {
                let (token, q) = draft.get(index, vocab_size);
                row.advance_with(rows, |sampler, rng, history, rows| {
                    verify(sampler, rng, history, rows, token, q, &mut residual)
                })?
            } else {
                row.advance(rows)?
            };
            let accepted = step.draft == DraftMark::Accepted;
            n_accepted += usize::from(accepted);
            let flow = on_step(step);
            if stopped(row, flow) {
                stats.accepted_tokens += n_accepted;
                drafter.observe(n_drafted, n_accepted);
                return Ok(());
            }
            if !accepted {
                break;
            }
        }
        stats.accepted_tokens += n_accepted;
        drafter.observe(n_drafted, n_accepted);
        // Forget the rejected drafts: the state keeps what the history holds
        // but its last token.
        state.truncate(row.history.len() - 1);
    }
}

/// True when the row stopped, by a stop rule or by the hook (cancelled).
fn stopped(row: &mut Row<'_>, flow: ControlFlow<()>) -> bool {
    if row.stop_reason.is_some() {
        return true;
    }
    if flow.is_break() {
        row.stop_reason = Some(StopReason::Cancelled);
        return true;
    }
    false
}

/// How many drafts the next pass can verify: the round emits at most
/// drafts + 1 tokens within `max_new_tokens`, and the pass feeds the last
/// token and the drafts within the context bound.
fn draft_room(row: &Row<'_>) -> usize {
    let n_generated = row.generated().len();
    let by_limit = row
        .config()
        .max_new_tokens
        .saturating_sub(n_generated)
        .saturating_sub(1);
    match row.context_length() {
        Some(max) => by_limit.min(max.saturating_sub(row.history.len())),
        None => by_limit,
    }
}

/// Accepts or replaces the drafted `token` (drawn from `q`, or a point mass
/// when `q` is `None`) under the policy for `logits` after `history`.
fn verify(
    sampler: &mut Sampler,
    rng: &mut TokenRng,
    history: &[TokenId],
    logits: &[f32],
    token: TokenId,
    q: Option<&[f32]>,
    residual: &mut Vec<f32>,
) -> Result<(Selection, DraftMark)> {
    let q = match q {
        Some(q) if !sampler.is_greedy() => q,
        // Greedy, or a point mass: choose as the plain loop does, with the
        // same draw from the same stream, and accept the draft when it is
        // the choice. A point mass is then accepted with probability p(d)
        // and the token is p's, as the rejection rule gives, and a seed
        // gives the plain loop's ids.
        _ => {
            let u = if sampler.is_greedy() {
                0.0
            } else {
                rng.next_uniform()
            };
            let selection = sampler.select(logits, history, u)?;
            let mark = if selection.token == token {
                DraftMark::Accepted
            } else {
                DraftMark::Replaced { draft: token }
            };
            return Ok((selection, mark));
        }
    };
    let p = sampler.policy(logits, history)?;
    let (selection, mark) = accept_or_replace(p, rng, token, q, residual)?;
    sampler.chose(selection.token);
    Ok((selection, mark))
}

/// Speculative sampling's rule (Leviathan et al. 2023; Chen et al. 2023):
/// accept the draft `token` with probability `min(1, p / q)`, else draw from
/// `norm(max(0, p - q))`.
fn accept_or_replace(
    p: &[f32],
    rng: &mut TokenRng,
    token: TokenId,
    q: &[f32],
    residual: &mut Vec<f32>,
) -> Result<(Selection, DraftMark)> {
    let p_token = p[token as usize];
    let q_token = q[token as usize];
    let u = rng.next_uniform();
    if u < f64::from(p_token) / f64::from(q_token) {
        let selection = Selection {
            token,
            policy_prob: p_token,
            u: Some(u),
        };
        return Ok((selection, DraftMark::Accepted));
    }
    residual.clear();
    residual.extend(p.iter().zip(q).map(|(&p, &q)| (p - q).max(0.0)));
    let total: f64 = residual.iter().map(|&r| f64::from(r)).sum();
    if total <= 0.0 {
        // p <= q everywhere (rounding): the draft's odds were the policy's.
        let selection = Selection {
            token,
            policy_prob: p_token,
            u: Some(u),
        };
        return Ok((selection, DraftMark::Accepted));
    }
    let scale = (1.0 / total) as f32;
    residual.iter_mut().for_each(|r| *r *= scale);
    let u_residual = rng.next_uniform();
    let chosen = lm_core::sample_inverse_cdf(residual, u_residual)?;
    let selection = Selection {
        token: chosen,
        policy_prob: p[chosen as usize],
        u: Some(u_residual),
    };
    Ok((selection, DraftMark::Replaced { draft: token }))
}

/// How many tokens a drafter proposes next, adapted to its acceptance,
/// because a rejected draft costs the target a row of its pass: it starts
/// at one token, doubles (up to `max_draft`) after a fully accepted draft,
/// halves after a draft rejected anywhere (replaying SmolLM2's grounded
/// answer, halving on a partial acceptance too took K = 8 from 0.86x to
/// 1.01x of plain decoding at this machine's cost per row, where keeping k
/// proposed the same doomed tail again), and at 0 it rests,
/// probing again with one token after a rest of [`DraftLength::MIN_REST`]
/// plain steps; each probe rejected outright doubles the rest (up to
/// [`DraftLength::MAX_REST`]) and an accepted token resets it, so free
/// generation with few matches drafts rarely. Every drafter of this crate
/// uses it, and a drafter written elsewhere can too.
#[derive(Debug, Clone)]
pub struct DraftLength {
    max_draft: usize,
    n_draft: usize,
    /// Plain steps to rest before the next probe, and those rested so far.
    rest: usize,
    n_rested: usize,
}

impl DraftLength {
    /// The shortest rest between probes, in plain steps.
    pub const MIN_REST: usize = 8;
    /// The longest rest between probes, in plain steps.
    pub const MAX_REST: usize = 128;

    /// A schedule of at most `max_draft` tokens per proposal.
    pub fn new(max_draft: usize) -> Self {
        Self {
            max_draft,
            n_draft: 1.min(max_draft),
            rest: Self::MIN_REST,
            n_rested: 0,
        }
    }

    /// How many tokens the next proposal may hold (0 while resting).
    pub fn current(&self) -> usize {
        self.n_draft
    }

    /// The length of the proposal about to be made: 0 while resting (the
    /// call counts one step of the rest), 1 for a probe after the rest.
    pub fn next_length(&mut self) -> usize {
        if self.n_draft == 0 {
            self.n_rested += 1;
            if self.n_rested < self.rest {
                return 0;
            }
            self.n_rested = 0;
            self.n_draft = 1.min(self.max_draft);
        }
        self.n_draft
    }

    /// Adapts to a proposal of `n_proposed` tokens of which the target
    /// accepted the first `n_accepted`.
    pub fn observe(&mut self, n_proposed: usize, n_accepted: usize) {
        if n_accepted > 0 {
            self.rest = Self::MIN_REST;
        }
        if n_accepted == n_proposed {
            self.n_draft = (self.n_draft * 2).clamp(1, self.max_draft);
        } else {
            if n_accepted == 0 && self.n_draft == 1 {
                // A probe (or a one-token draft) rejected: rest longer.
                self.rest = (self.rest * 2).min(Self::MAX_REST);
            }
            self.n_draft /= 2;
        }
    }
}

/// The drafter that needs no second model: the earlier place in the context
/// (prompt and output) whose preceding tokens agree longest with the
/// context's end proposes the tokens that followed it (prompt lookup
/// decoding, Saxena 2023; llama.cpp's `lookup` example). Strong when the output
/// copies the input (repeating, editing, summarising, code).
///
/// It drafts only when the match is long enough to be trusted, because a
/// rejected draft is not free: the verifying pass of k + 1 tokens costs
/// more than a plain step (on an AMD EPYC Zen 4 with SmolLM2, 1.9 steps for
/// two tokens and 5.4 for nine). The bar starts at `min_ngram` tokens (3 by
/// default), rises by one after each draft rejected at its first token (up
/// to [`PromptLookup::MAX_BAR`]) and drops back after a draft accepted
/// whole: an acceptance-based confidence in the spirit of llama.cpp's
/// n-gram cache, which drafts only from n-grams seen often enough with the
/// same continuation. In SmolLM2's greedy answer to `cargo xtask bench
/// --speculative`'s grounded task the first drafted token was right 28% of
/// the time after a 1-token match, 46% after 2 and 80-90% after 3 or more;
/// in its free story 17%, 33% and 46% after 1, 2 and 3 (the rising bar's
/// case). Replaying both answers and seven more, the bar and the longest
/// match took the grounded task from 1.03x to 1.06x of plain decoding at
/// the Zen 4's pass costs (from 1.22x to 1.36x where a pass of n tokens
/// costs about 0.7 + 0.3n steps), and the worst task from 0.91x to
/// 0.98x. How many it proposes adapts ([`DraftLength`]).
#[derive(Debug, Clone)]
pub struct PromptLookup {
    max_ngram: usize,
    min_ngram: usize,
    /// The shortest match drafted from now (`min_ngram` when drafts pass).
    bar: usize,
    length: DraftLength,
}

impl Default for PromptLookup {
    /// Matches of 3 tokens or more (compared up to 32), up to 8 drafts.
    fn default() -> Self {
        Self::new(8)
    }
}

/// Where a match continues: `follow` is the index after the earlier
/// occurrence, `len` how many tokens before it agree with the context's end.
#[derive(Debug, Clone, Copy)]
struct Match {
    follow: usize,
    len: usize,
}

impl PromptLookup {
    /// The highest the bar rises after rejected drafts.
    pub const MAX_BAR: usize = 12;

    /// Proposes up to `max_draft` tokens from matches of 3 tokens or more
    /// (compared up to 32).
    pub fn new(max_draft: usize) -> Self {
        Self {
            max_ngram: 32,
            min_ngram: 3,
            bar: 3,
            length: DraftLength::new(max_draft),
        }
    }

    /// Drafts from matches of at least `min_ngram` tokens, comparing up to
    /// `max_ngram` (both at least 1; `min_ngram` is raised to 1 and
    /// `max_ngram` to `min_ngram`).
    pub fn with_ngram_range(mut self, min_ngram: usize, max_ngram: usize) -> Self {
        self.min_ngram = min_ngram.max(1);
        self.max_ngram = max_ngram.max(self.min_ngram);
        self.bar = self.min_ngram;
        self
    }

    /// How many tokens the next proposal may hold (before the loop's room).
    pub fn n_draft(&self) -> usize {
        self.length.current()
    }

    /// The shortest match the next proposal is drafted from.
    pub fn bar(&self) -> usize {
        self.bar
    }

    /// The `max_tokens` tokens that follow the earlier occurrence of the
    /// context's end that agrees with it longest (the latest of equals),
    /// when at least `min_ngram` tokens agree; else none. Past the context's
    /// end the copy goes on from its own start, as an overlapping copy does
    /// (inside a repeated run the occurrence just before the end has one
    /// token after it, and the run goes on).
    pub fn lookup(&self, context: &[TokenId], max_tokens: usize) -> Vec<TokenId> {
        self.find(context)
            .map(|found| copy(context, found, max_tokens).collect())
            .unwrap_or_default()
    }

    /// The longest match of the context's end (compared up to `max_ngram`
    /// tokens) if at least `min_ngram` tokens long.
    fn find(&self, context: &[TokenId]) -> Option<Match> {
        let &last = context.last()?;
        let len = context.len();
        let mut best = Match { follow: 0, len: 0 };
        // Earlier occurrences end before `follow` < len, latest first.
        for follow in (1..len).rev() {
            if context[follow - 1] != last {
                continue;
            }
            let agree = context[..follow]
                .iter()
                .rev()
                .zip(context.iter().rev())
                .take(self.max_ngram)
                .take_while(|(a, b)| a == b)
                .count();
            if agree > best.len {
                best = Match { follow, len: agree };
                if agree == self.max_ngram {
                    break;
                }
            }
        }
        (best.len >= self.min_ngram).then_some(best)
    }
}

/// The `n` tokens after `found`: `context[found.follow..]`, repeated from
/// there past the context's end (token j is `context[follow + j % period]`).
fn copy(context: &[TokenId], found: Match, n: usize) -> impl Iterator<Item = TokenId> + '_ {
    let period = context.len() - found.follow;
    (0..n).map(move |j| context[found.follow + j % period])
}

impl Drafter for PromptLookup {
    fn propose(&mut self, context: &[TokenId], max_tokens: usize, draft: &mut Draft) -> Result<()> {
        // Below the bar no draft is made and no step of a rest is counted.
        let Some(found) = self.find(context).filter(|found| found.len >= self.bar) else {
            return Ok(());
        };
        let n = self.length.next_length().min(max_tokens);
        for token in copy(context, found, n) {
            draft.push(token);
        }
        Ok(())
    }

    fn observe(&mut self, n_proposed: usize, n_accepted: usize) {
        self.length.observe(n_proposed, n_accepted);
        if n_accepted == n_proposed {
            self.bar = self.min_ngram;
        } else if n_accepted == 0 {
            let max_bar = Self::MAX_BAR.clamp(self.min_ngram, self.max_ngram);
            self.bar = (self.bar + 1).min(max_bar);
        }
    }
}

/// A draft model: any [`LanguageModel`] over the target's vocabulary (a
/// smaller GGUF model with the same tokenizer) proposes its greedy
/// continuation, as point masses, so the rule is the same for greedy and
/// sampled targets. It keeps its own state across rounds and rolls it back
/// to the longest prefix it shares with the context (rejected drafts), so
/// each round reads only the new tokens. How many it proposes adapts
/// ([`DraftLength`]).
pub struct ModelDrafter<M: LanguageModel> {
    model: M,
    state: M::State,
    /// The tokens `state` has read.
    read: Vec<TokenId>,
    logits: Vec<f32>,
    length: DraftLength,
}

impl<M: LanguageModel> std::fmt::Debug for ModelDrafter<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDrafter")
            .field("n_read", &self.read.len())
            .field("length", &self.length)
            .finish_non_exhaustive()
    }
}

impl<M: LanguageModel> ModelDrafter<M> {
    /// Drafts up to `max_draft` tokens with `model`.
    pub fn new(model: M, max_draft: usize) -> Self {
        let state = model.new_state();
        Self {
            model,
            state,
            read: Vec::new(),
            logits: Vec::new(),
            length: DraftLength::new(max_draft),
        }
    }

    /// Brings the state to `context`, reading at least its last token, and
    /// leaves the logits after it.
    fn catch_up(&mut self, context: &[TokenId]) -> Result<()> {
        let shared = self
            .read
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len().saturating_sub(1));
        self.state.truncate(shared);
        self.read.truncate(shared);
        let new = &context[shared..];
        self.model
            .forward(&mut self.state, new, Rows::Last, &mut self.logits)?;
        self.read.extend_from_slice(new);
        Ok(())
    }
}

impl<M: LanguageModel> Drafter for ModelDrafter<M> {
    fn propose(&mut self, context: &[TokenId], max_tokens: usize, draft: &mut Draft) -> Result<()> {
        let mut n = self.length.next_length().min(max_tokens);
        if let Some(max) = self.model.context_length() {
            // Each drafted token but the last is read by the draft model.
            n = n.min((max + 1).saturating_sub(context.len()));
        }
        if n == 0 || context.is_empty() {
            return Ok(());
        }
        self.catch_up(context)?;
        for index in 0..n {
            let token = lm_core::argmax(&self.logits)?;
            draft.push(token);
            if index + 1 < n {
                self.model
                    .forward(&mut self.state, &[token], Rows::Last, &mut self.logits)?;
                self.read.push(token);
            }
        }
        Ok(())
    }

    fn observe(&mut self, n_proposed: usize, n_accepted: usize) {
        self.length.observe(n_proposed, n_accepted);
    }
}
