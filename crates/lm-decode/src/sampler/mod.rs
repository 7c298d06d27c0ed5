//! The sampling policy: an ordered chain of small logit transforms, then one
//! selector.
//!
//! ```text
//! raw logits ─ RepetitionPenalty ─ PresencePenalty ─ FrequencyPenalty ─ Dry
//!            ─ NoRepeatNgram ─ LogitBias ─ BannedTokens
//!            ─ constraint mask (structured output, when set)
//!            ─ Temperature (or DynamicTemperature) ─ TopNSigma ─ TopK ─ Typical ─ TopP
//!            ─ MinP ─ Xtc ─ EpsilonCutoff ─ EtaCutoff
//!            ─ Mirostat's truncation (when on)
//!            ─ Selector (Greedy | Sample by inverse CDF)
//! ```
//!
//! The filters run in llama.cpp's default order (`top_n_sigma;top_k;typ_p;
//! top_p;min_p;xtc`), then HF's cutoffs; each keeps at least
//! [`Candidates::min_keep`] tokens. A [`SamplerOrder`] runs exactly the
//! stages it names, in its order (temperature may come after filters, as in
//! llama.cpp's default, which puts it last). Mirostat and DRY keep state or
//! read text: the bound mu is this sampler's (one per sequence), and DRY's
//! sequence breakers are matched in the text of a [`Sampler::with_text`].
//!
//! The first stage ([`LogitTransform`]) edits the raw logits, token by token,
//! knowing the history. Temperature then sets the scale of the probabilities
//! (`exp(z / T)`), and the filters ([`CandidateFilter`]) shrink the set of
//! candidates, each seeing the distribution renormalised over what the
//! previous one kept (lesson 002: "temperature first, then top-k or top-p").
//! The policy distribution is the survivors' renormalised probabilities,
//! written over the whole vocabulary (0 for removed tokens). The order is the
//! one printed by `Debug`:
//!
//! ```
//! use lm_decode::{Sampler, SamplingConfig};
//! let config = SamplingConfig { temperature: 0.7, top_k: Some(40), top_p: Some(0.9), ..SamplingConfig::default() };
//! let sampler = Sampler::new(&config).unwrap();
//! assert_eq!(
//!     format!("{sampler:?}"),
//!     "Sampler { chain: [Temperature(0.7), TopK(40), TopP(0.9)], selector: Sample }"
//! );
//! ```

mod bias;
mod config;
mod cutoff;
mod dry;
mod dynatemp;
mod min_p;
mod mirostat;
mod no_repeat_ngram;
mod penalties;
mod temperature;
mod top_k;
mod top_n_sigma;
mod top_p;
mod typical;
mod xtc;

pub use bias::{BannedTokens, LogitBias};
pub use config::{Field, InvalidSetting, SamplerOrder, SamplingConfig};
pub use cutoff::{EpsilonCutoff, EtaCutoff};
pub use dry::{Dry, SequenceBreakers};
pub use dynatemp::DynamicTemperature;
pub use min_p::MinP;
pub use mirostat::Mirostat;
pub use no_repeat_ngram::NoRepeatNgram;
pub use penalties::{FrequencyPenalty, PresencePenalty, RepetitionPenalty, TokenCounts};
pub(crate) use temperature::DynamicScale;
pub use temperature::Temperature;
pub use top_k::TopK;
pub use top_n_sigma::TopNSigma;
pub use top_p::TopP;
pub use typical::Typical;
pub use xtc::Xtc;

use crate::error::{Error, Result};
use crate::rank::{BestFirst, WorstOnTop};
use crate::rng::TokenRng;
use crate::select::Selector;
use crate::trace::{Stage, StageCounts};
use config::BreakerText;
use lm_core::{Detokenize, TokenId, TokenMask};
use std::cmp::Ordering;
use std::fmt;

/// A transform of the raw logits that may depend on the history: penalties,
/// bias, bans. Runs before temperature. An extension point: a new transform
/// joins the chain with [`Sampler::push_transform`].
pub trait LogitTransform: fmt::Debug + Send + Sync {
    /// Adjusts `logits` in place, knowing the `history`.
    fn apply(&self, logits: &mut [f32], history: &History<'_>);

    /// Checks the token ids this transform names against the vocabulary.
    fn check_vocabulary(&self, _vocab_size: usize) -> Result<()> {
        Ok(())
    }
}

/// What a [`LogitTransform`] knows of the sequence so far (`Default`: an
/// empty history).
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    /// Every token read so far, prompt included, oldest first (DRY and
    /// `no_repeat_ngram_size` match sequences in it).
    pub tokens: &'a [TokenId],
    /// How often each token occurs in the penalties' window (the last
    /// [`SamplingConfig::penalty_last_n`] tokens, or all).
    pub counts: &'a TokenCounts,
}

impl Default for History<'_> {
    fn default() -> Self {
        static EMPTY: TokenCounts = TokenCounts::EMPTY;
        Self::new(&[], &EMPTY)
    }
}

impl<'a> History<'a> {
    /// The history `tokens`, with `counts` of its penalty window.
    pub fn new(tokens: &'a [TokenId], counts: &'a TokenCounts) -> Self {
        Self { tokens, counts }
    }
}

/// A filter that removes candidates after temperature: top-n-sigma, top-k,
/// typical, top-p, min-p, XTC. A filter keeps at least one candidate and at
/// least [`Candidates::min_keep`]; the built-in ones other than typical and
/// XTC keep the most probable one. An extension point:
/// a new filter works on [`Candidates`] and joins the chain with
/// [`Sampler::push_filter`].
pub trait CandidateFilter: fmt::Debug + Send + Sync {
    /// Removes candidates in place.
    fn apply(&self, candidates: &mut Candidates);

    /// The stage the trace names this filter by (a filter of one's own is
    /// [`Stage::Custom`]).
    fn stage(&self) -> Stage {
        Stage::Custom
    }
}

/// The tokens still in play after the raw-logit stage, with their adjusted
/// logits and the temperature that scales them into probabilities.
///
/// The first `n_sorted` entries are sorted best first (higher logit, then
/// lower id) and are no worse than any later entry; filters grow that sorted
/// prefix only as far as they need (partial selection). Weights are computed
/// when asked for: one at a time by [`lm_core::softmax_weight`], and the
/// total of a large set in one vectorised pass
/// ([`lm_core::softmax_weights_into`], the same bits per weight), kept until
/// a filter removes a candidate.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    entries: Vec<(TokenId, f32)>,
    /// Sum of the weights of `entries`, while it is known.
    total: Option<f64>,
    temperature: f32,
    max_logit: f32,
    n_sorted: usize,
    /// Scratch for [`Candidates::total_weight`]: logits, then weights.
    logits: Vec<f32>,
    weights: Vec<f32>,
    /// Scratch for [`Candidates::sort_prefix`].
    heap: Vec<Best>,
    /// See [`Candidates::min_keep`]; kept across [`Candidates::reset`].
    min_keep: usize,
    /// The random filters' draws for this row (see [`Candidates::next_draw`]).
    draws: Option<Draws>,
    /// Scratch for filters that rank by a key of their own (typical).
    pub(crate) ranked: Vec<(f64, u32)>,
    /// Scratch: which entries a filter keeps.
    pub(crate) kept: Vec<bool>,
}

/// Where the candidates of a policy start: their temperature, the stage
/// that counts them, and how many stage counts precede it.
#[derive(Debug, Clone, Copy)]
struct Start {
    temperature: f32,
    in_play: Stage,
    n_counted: usize,
}

/// Where the random filters' draws come from: 0 takes each coin's "yes"
/// branch, 1 its "no" branch.
#[derive(Debug, Clone)]
// One per `Candidates`, set per step: boxing the stream would allocate.
#[allow(clippy::large_enum_variant)]
enum Draws {
    /// ChaCha20 keyed by the step's draw.
    Stream(TokenRng),
    /// One value for every draw.
    Fixed(f64),
}

/// [`Candidates::keep_best`] sorts a kept set of up to this many.
pub const SORTED_KEEP: usize = 256;

/// From this many candidates up, [`Candidates::total_weight`] gathers the
/// logits and sums their weights in one vectorised pass.
const BULK_TOTAL: usize = 256;

impl Candidates {
    /// Every token whose logit is not -inf, in id order, at temperature
    /// `temperature` (0 is the greedy limit: the best logits weigh 1, the
    /// rest 0; +inf is uniform). NaN or +inf logits, or none unmasked, are
    /// errors.
    pub fn from_logits(logits: &[f32], temperature: f32) -> Result<Self> {
        let mut candidates = Self::default();
        candidates.reset(logits, temperature)?;
        Ok(candidates)
    }

    /// Refills from `logits` without allocating once warm.
    pub fn reset(&mut self, logits: &[f32], temperature: f32) -> Result<()> {
        Temperature::new(temperature)?;
        self.max_logit = logits[lm_core::argmax(logits)? as usize];
        self.entries.clear();
        self.entries
            .extend((0..).zip(logits).map(|(id, &z): (TokenId, _)| (id, z)));
        // Masked tokens are rare: one vectorised test, then a filter if any.
        if logits
            .iter()
            .fold(false, |any, &z| any | (z == f32::NEG_INFINITY))
        {
            self.entries.retain(|&(_, z)| z > f32::NEG_INFINITY);
        }
        self.total = None;
        self.temperature = temperature;
        self.n_sorted = 0;
        self.draws = None;
        Ok(())
    }

    /// The same candidates asked to keep at least `n` tokens in every
    /// filter (see [`Candidates::min_keep`]).
    #[must_use]
    pub fn with_min_keep(mut self, n: usize) -> Self {
        self.min_keep = n;
        self
    }

    /// Sets [`Candidates::min_keep`]; a [`Candidates::reset`] keeps it.
    pub fn set_min_keep(&mut self, n: usize) {
        self.min_keep = n;
    }

    /// The fewest tokens a filter leaves (llama.cpp's and HF's `min_keep`;
    /// at least 1; fewer only when fewer are in play).
    pub fn min_keep(&self) -> usize {
        self.min_keep.max(1)
    }

    /// Gives the random filters (XTC) their source of draws for this row;
    /// `None` (what [`Candidates::reset`] leaves) asks them for the
    /// distribution they draw from instead of one draw of it.
    pub fn set_draws(&mut self, draws: Option<TokenRng>) {
        self.draws = draws.map(Draws::Stream);
    }

    /// The next uniform draw in [0, 1) for a random filter, if this row has
    /// draws (see [`Candidates::set_draws`]).
    pub fn next_draw(&mut self) -> Option<f64> {
        self.draws.as_mut().map(|draws| match draws {
            Draws::Stream(rng) => rng.next_uniform(),
            Draws::Fixed(draw) => *draw,
        })
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no candidate is left.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The `(id, adjusted logit)` pairs; the first [`Candidates::n_sorted`]
    /// are sorted best first.
    pub fn entries(&self) -> &[(TokenId, f32)] {
        &self.entries
    }

    /// The candidate ids, in the current order.
    pub fn ids(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.entries.iter().map(|&(id, _)| id)
    }

    /// How many leading entries are sorted.
    pub fn n_sorted(&self) -> usize {
        self.n_sorted
    }

    /// The temperature the weights are at.
    pub fn temperature(&self) -> f32 {
        self.temperature
    }

    /// Puts the weights at `temperature` from here on (the temperature
    /// stage, where an order puts it after a filter; dynamic temperature).
    /// The candidates and their order stay.
    pub fn set_temperature(&mut self, temperature: Temperature) {
        if self.temperature != temperature.value() {
            self.temperature = temperature.value();
            self.total = None;
        }
    }

    /// The largest logit of the row, or of the candidates after a filter
    /// that removed the best ones ([`Candidates::rebase`]).
    pub fn max_logit(&self) -> f32 {
        self.max_logit
    }

    /// The unnormalised probability `exp((z - z_max) / T)` of a logit: the
    /// ratio of its probability to the best token's (within a few parts in
    /// 10^7; see [`lm_core::softmax_weights_into`]). At T = 0 (the greedy
    /// limit) the best logits weigh 1 and the rest 0.
    pub fn weight(&self, logit: f32) -> f64 {
        if self.temperature == 0.0 {
            return if logit == self.max_logit { 1.0 } else { 0.0 };
        }
        f64::from(lm_core::softmax_weight(
            logit,
            self.max_logit,
            self.temperature,
        ))
    }

    /// The sum of the weights: the normaliser of the current candidates.
    pub fn total_weight(&mut self) -> f64 {
        if let Some(total) = self.total {
            return total;
        }
        let mut total = None;
        if self.entries.len() >= BULK_TOTAL && self.temperature > 0.0 {
            self.logits.clear();
            self.logits.extend(self.entries.iter().map(|&(_, z)| z));
            // The vectorised pass shifts by the largest gathered logit, so it
            // gives the same weights only while the row's maximum is still a
            // candidate (the built-in filters keep it; a custom one may not).
            let max = self.max_logit;
            if self
                .logits
                .iter()
                .fold(false, |found, &z| found | (z == max))
            {
                self.weights.resize(self.logits.len(), 0.0);
                total = lm_core::softmax_weights_into(
                    &self.logits,
                    self.temperature,
                    &mut self.weights,
                )
                .ok();
            }
        }
        let total =
            total.unwrap_or_else(|| self.entries.iter().map(|&(_, z)| self.weight(z)).sum());
        self.total = Some(total);
        total
    }

    /// Makes the first `n` entries (at most all) the best `n`, sorted, by
    /// partial selection of the unsorted rest and a sort of that part only.
    ///
    /// A few best of many (top-k, top-p's first round) are found by one scan
    /// that keeps the best so far in a heap, so most entries cost a single
    /// comparison with the worst of them; larger selections use
    /// `select_nth_unstable_by`.
    pub fn sort_prefix(&mut self, n: usize) {
        let n = n.min(self.entries.len());
        if n <= self.n_sorted {
            return;
        }
        let tail = &mut self.entries[self.n_sorted..];
        let n_tail = n - self.n_sorted;
        if n_tail < tail.len() {
            if n_tail <= tail.len() / 16 {
                let nth = nth_best(tail, n_tail, &mut self.heap);
                // Exactly n_tail entries are at least as good as the nth.
                let (nth_id, nth_logit) = nth;
                let mut n_front = 0;
                for start in (0..tail.len()).step_by(SCAN_CHUNK) {
                    let end = (start + SCAN_CHUNK).min(tail.len());
                    if max_logit(&tail[start..end]) < nth_logit {
                        continue;
                    }
                    for index in start..end {
                        let (id, z) = tail[index];
                        if z > nth_logit || (z == nth_logit && id <= nth_id) {
                            tail.swap(n_front, index);
                            n_front += 1;
                        }
                    }
                }
            } else {
                tail.select_nth_unstable_by(n_tail - 1, best_first);
            }
        }
        tail[..n_tail].sort_unstable_by(best_first);
        self.n_sorted = n;
    }

    /// The rank of the first of the best candidates, in order, for which
    /// `found(rank, weight)` holds, sorting only as far as it walks: the best
    /// `first_round`, then four times as many each round, so a walk that
    /// stops early costs one small sort (top-p's nucleus, XTC's top choices).
    /// `None` when no candidate is found.
    pub fn find_ranked(
        &mut self,
        first_round: usize,
        mut found: impl FnMut(usize, f64) -> bool,
    ) -> Option<usize> {
        let n = self.entries.len();
        let mut n_walked = 0;
        let mut n_sorted = first_round.min(n);
        loop {
            self.sort_prefix(n_sorted);
            while n_walked < n_sorted {
                let (_, logit) = self.entries[n_walked];
                if found(n_walked, self.weight(logit)) {
                    return Some(n_walked);
                }
                n_walked += 1;
            }
            if n_sorted == n {
                return None;
            }
            n_sorted = n_sorted.saturating_mul(4).min(n);
        }
    }

    /// Keeps the `k` best candidates (higher logit, then lower id): sorted
    /// by [`Candidates::sort_prefix`] up to [`SORTED_KEEP`] of them, and
    /// beyond that by one partition of the unsorted rest, left unsorted
    /// (a filter that keeps thousands needs the set, not its order).
    pub fn keep_best(&mut self, k: usize) {
        if k >= self.entries.len() {
            return;
        }
        if k <= SORTED_KEEP.max(self.n_sorted) {
            self.sort_prefix(k);
        } else {
            let n_tail = k - self.n_sorted;
            self.entries[self.n_sorted..].select_nth_unstable_by(n_tail - 1, best_first);
        }
        self.truncate(k);
    }

    /// The weights of the entries, in their order, and their sum (the
    /// value [`Candidates::total_weight`] gives): one vectorised pass for a
    /// large set whose best logit is the row's, the bits of
    /// [`Candidates::weight`] either way.
    pub fn weights(&mut self) -> (&[(TokenId, f32)], &[f32], f64) {
        let total = self.fill_weights();
        (&self.entries, &self.weights, total)
    }

    /// [`Candidates::weights`] with the candidates' logits gathered in one
    /// slice beside them.
    pub(crate) fn logits_and_weights(&mut self) -> (&[f32], &[f32], f64) {
        let total = self.fill_weights();
        (&self.logits, &self.weights, total)
    }

    /// The candidates' logits gathered in one slice (scratch, valid until
    /// the next call that computes weights).
    pub(crate) fn gathered_logits(&mut self) -> &[f32] {
        self.logits.clear();
        self.logits.extend(self.entries.iter().map(|&(_, z)| z));
        &self.logits
    }

    /// Gathers the logits, computes their weights into the scratch and
    /// returns (and keeps) their sum.
    fn fill_weights(&mut self) -> f64 {
        self.logits.clear();
        self.logits.extend(self.entries.iter().map(|&(_, z)| z));
        self.weights.clear();
        self.weights.resize(self.logits.len(), 0.0);
        let max = self.max_logit;
        let has_max = self
            .logits
            .iter()
            .fold(false, |found, &z| found | (z == max));
        let bulk = if has_max && self.temperature > 0.0 && self.entries.len() >= BULK_TOTAL {
            lm_core::softmax_weights_into(&self.logits, self.temperature, &mut self.weights).ok()
        } else {
            None
        };
        let total = bulk.unwrap_or_else(|| {
            let (temperature, logits) = (self.temperature, &self.logits);
            let mut total = 0.0;
            for (w, &z) in self.weights.iter_mut().zip(logits) {
                *w = if temperature == 0.0 {
                    f32::from(u8::from(z == max))
                } else {
                    lm_core::softmax_weight(z, max, temperature)
                };
                total += f64::from(*w);
            }
            total
        });
        self.total = Some(total);
        total
    }

    /// Makes the largest logit of the candidates the one weights are
    /// measured from, after a filter removed the best tokens, so the
    /// survivors' weights cannot underflow to 0.
    pub fn rebase(&mut self) {
        if !self.entries.is_empty() {
            self.max_logit = max_logit(&self.entries);
            self.total = None;
        }
    }

    /// Removes the first `n` entries (the best ones once sorted) and
    /// rebases the weights on the best survivor.
    pub fn drop_front(&mut self, n: usize) {
        let n = n.min(self.entries.len());
        if n > 0 {
            self.entries.drain(..n);
            self.n_sorted = self.n_sorted.saturating_sub(n);
            self.rebase();
        }
    }

    /// Adds `delta` to the logits of the first `n` entries (a mixture's
    /// reweighting) and rebases; the order is no longer known to be sorted.
    pub(crate) fn shift_front(&mut self, n: usize, delta: f32) {
        for entry in self.entries.iter_mut().take(n) {
            entry.1 += delta;
        }
        self.entries.retain(|&(_, z)| z > f32::NEG_INFINITY);
        self.n_sorted = 0;
        self.rebase();
    }

    /// Keeps the entries whose flag in `self.kept` (one per entry) is set.
    pub(crate) fn retain_kept(&mut self) {
        let mut kept = std::mem::take(&mut self.kept);
        let mut flags = kept.iter();
        self.retain(|_| flags.next().copied().unwrap_or(false));
        kept.clear();
        self.kept = kept;
    }

    /// Keeps the first `n` entries.
    pub fn truncate(&mut self, n: usize) {
        if n < self.entries.len() {
            self.entries.truncate(n);
            self.n_sorted = self.n_sorted.min(n);
            self.total = None;
        }
    }

    /// Keeps the `(id, logit)` entries for which `keep` holds, preserving
    /// order.
    pub fn retain(&mut self, mut keep: impl FnMut((TokenId, f32)) -> bool) {
        let mut n_kept = 0;
        let mut n_sorted_kept = 0;
        for index in 0..self.entries.len() {
            let entry = self.entries[index];
            if keep(entry) {
                self.entries[n_kept] = entry;
                n_kept += 1;
                if index < self.n_sorted {
                    n_sorted_kept += 1;
                }
            }
        }
        if n_kept < self.entries.len() {
            self.entries.truncate(n_kept);
            self.total = None;
        }
        self.n_sorted = n_sorted_kept;
    }
}

/// The tokens the raw-logit stage left in play (not masked to -inf).
fn count_unmasked(logits: &[f32]) -> usize {
    logits.iter().filter(|&&z| z != f32::NEG_INFINITY).count()
}

/// A candidate in the heap of the best kept so far.
type Best = WorstOnTop<(TokenId, f32)>;

impl BestFirst for (TokenId, f32) {
    fn best_first(&self, other: &Self) -> Ordering {
        best_first(self, other)
    }
}

/// Entries per test in the scans of [`Candidates::sort_prefix`].
const SCAN_CHUNK: usize = 16;

/// The sum of `term(a_i, b_i)` over two slices of equal length, in eight
/// independent f64 lanes: a serial sum over a whole vocabulary waits on
/// every addition's latency; eight lanes let the additions overlap and
/// vectorise.
pub(crate) fn sum_in_lanes(a: &[f32], b: &[f32], term: impl Fn(f32, f32) -> f64) -> f64 {
    const LANES: usize = 8;
    let mut lanes = [0.0f64; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let rest: f64 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(&x, &y)| term(x, y))
        .sum();
    for (a, b) in a_chunks.zip(b_chunks) {
        for ((lane, &x), &y) in lanes.iter_mut().zip(a).zip(b) {
            *lane += term(x, y);
        }
    }
    lanes.iter().sum::<f64>() + rest
}

/// The largest of `values` (-inf for none), in eight lanes as
/// [`sum_in_lanes`] sums.
pub(crate) fn max_in_lanes(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &z| m.max(z));
    for chunk in chunks {
        for (lane, &z) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(z);
        }
    }
    lanes.into_iter().fold(rest, f32::max)
}

/// The largest logit of `entries` (-inf for none), branch-free.
fn max_logit(entries: &[(TokenId, f32)]) -> f32 {
    entries.iter().fold(
        f32::NEG_INFINITY,
        |max, &(_, z)| if z > max { z } else { max },
    )
}

/// The `n`-th best entry (1-based, `n <= entries.len()`) by one scan with a
/// bounded heap; `scratch` is reused between calls.
fn nth_best(entries: &[(TokenId, f32)], n: usize, scratch: &mut Vec<Best>) -> (TokenId, f32) {
    scratch.clear();
    let mut heap = std::collections::BinaryHeap::from(std::mem::take(scratch));
    heap.extend(entries[..n].iter().copied().map(WorstOnTop));
    let mut worst = *heap.peek().expect("n >= 1");
    for chunk in entries[n..].chunks(SCAN_CHUNK) {
        // Most chunks stop at this vectorised test.
        if max_logit(chunk) < worst.0.1 {
            continue;
        }
        for &entry in chunk {
            if WorstOnTop(entry) < worst {
                heap.pop();
                heap.push(WorstOnTop(entry));
                worst = *heap.peek().expect("n >= 1");
            }
        }
    }
    *scratch = heap.into_vec();
    worst.0
}

/// Higher logit first, then lower id (so ties resolve like greedy).
fn best_first(a: &(TokenId, f32), b: &(TokenId, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The token a [`Sampler`] chose and the probability its policy gave it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selection {
    /// The chosen token.
    pub token: TokenId,
    /// Its probability under the policy (after penalties, temperature and
    /// filters, renormalised); 1 for greedy.
    pub policy_prob: f32,
    /// The uniform draw it was sampled with; `None` when greedy.
    pub u: Option<f64>,
}

/// A validated policy with its scratch buffers: no allocation per token once
/// it has seen one logits row.
///
/// ```
/// use lm_decode::{Sampler, SamplingConfig};
/// // Lesson 000: logits (2, 1, 0) at T = 1 give (0.665, 0.245, 0.090); the
/// // uniform draw u = 0.7 passes "red" and lands on "green".
/// let mut sampler = Sampler::new(&SamplingConfig::default()).unwrap();
/// let choice = sampler.select(&[2.0, 1.0, 0.0], &[], 0.7).unwrap();
/// assert_eq!(choice.token, 1);
/// assert_eq!(format!("{:.3}", choice.policy_prob), "0.245");
/// assert_eq!(choice.u, Some(0.7));
/// ```
pub struct Sampler {
    transforms: Vec<Box<dyn LogitTransform>>,
    temperature: Temperature,
    /// See `config::Chain::leading_temperature`.
    leading_temperature: Option<Temperature>,
    filters: Vec<Box<dyn CandidateFilter>>,
    selector: Selector,
    /// Mirostat, which truncates after the filters and steers by `mu`.
    mirostat: Option<Mirostat>,
    /// Mirostat's running bound on the surprise, in bits (this sequence's
    /// state), and the value the last policy truncated at.
    mu: f32,
    policy_mu: Option<f32>,
    /// XTC's chance of removing, when its coin is not sure (0 < p < 1):
    /// [`Sampler::policy`] mixes its two branches.
    coin: Option<f32>,
    seed: u64,
    /// See [`SamplingConfig::min_keep`].
    min_keep: usize,
    /// See [`SamplingConfig::penalty_last_n`].
    penalty_last_n: Option<usize>,
    checked_vocab_size: Option<usize>,
    counts: TokenCounts,
    adjusted: Vec<f32>,
    candidates: Candidates,
    probs: Vec<f32>,
    /// See [`Sampler::stage_counts`].
    stage_counts: StageCounts,
    /// See [`Sampler::model_log_normaliser`].
    model_log_normaliser: Option<f64>,
    /// The output constraint's mask for the next row (see
    /// [`Sampler::set_allowed`]).
    allowed: Option<TokenMask>,
}

impl Sampler {
    /// Validates `config` ([`SamplingConfig::validate`]) and builds the
    /// chain in the documented order.
    ///
    /// ```
    /// use lm_decode::{Error, Sampler, SamplingConfig};
    /// let bad = SamplingConfig { top_p: Some(1.5), ..SamplingConfig::default() };
    /// assert_eq!(Sampler::new(&bad).err(), Some(Error::InvalidTopP { value: 1.5 }));
    /// ```
    pub fn new(config: &SamplingConfig) -> Result<Self> {
        Self::from_chain(config, BreakerText::Missing)
    }

    /// [`Sampler::new`] for a model whose tokens `detokenizer` reads, in
    /// which DRY matches its sequence breakers (it decodes each of the
    /// `vocab_size` tokens once, when DRY is on).
    pub fn with_text(
        config: &SamplingConfig,
        vocab_size: usize,
        detokenizer: &dyn Detokenize,
    ) -> Result<Self> {
        Self::from_chain(config, BreakerText::Vocabulary(detokenizer, vocab_size))
    }

    fn from_chain(config: &SamplingConfig, text: BreakerText<'_>) -> Result<Self> {
        let config::Chain {
            transforms,
            temperature,
            leading_temperature,
            filters,
            mirostat,
            coin,
        } = config.chain(text).map_err(|refused| refused.error)?;
        let selector = if temperature.is_greedy() {
            Selector::Greedy
        } else {
            Selector::Sample
        };
        Ok(Self {
            transforms,
            temperature,
            leading_temperature,
            filters,
            selector,
            mu: mirostat.map_or(0.0, Mirostat::initial_mu),
            mirostat,
            policy_mu: None,
            coin,
            seed: config.seed,
            min_keep: config.min_keep.unwrap_or(0),
            penalty_last_n: config.penalty_last_n,
            checked_vocab_size: None,
            counts: TokenCounts::default(),
            adjusted: Vec::new(),
            candidates: Candidates::default(),
            probs: Vec::new(),
            stage_counts: StageCounts::default(),
            model_log_normaliser: None,
            allowed: None,
        })
    }

    /// The sampler of `config`'s raw-logit stage alone (penalties, bias,
    /// bans) at T = 1 with no filter, whose policy is the softmax of the
    /// adjusted logits: what beam search ranks by. `None` when `config` sets
    /// none of that stage. Every setting is still validated.
    pub(crate) fn raw_logit_stage(config: &SamplingConfig) -> Result<Option<Self>> {
        let chain = config
            .chain(BreakerText::Missing)
            .map_err(|refused| refused.error)?;
        if chain.transforms.is_empty() && config.penalty_last_n.is_none() {
            return Ok(None);
        }
        let mut sampler = Self::new(&SamplingConfig::default())?;
        sampler.transforms = chain.transforms;
        sampler.penalty_last_n = config.penalty_last_n;
        Ok(Some(sampler))
    }

    /// Appends a custom transform to the raw-logit stage (after the bans).
    pub fn push_transform(&mut self, transform: Box<dyn LogitTransform>) {
        self.transforms.push(transform);
        self.checked_vocab_size = None;
    }

    /// Appends a custom filter after the built-in ones.
    pub fn push_filter(&mut self, filter: Box<dyn CandidateFilter>) {
        self.filters.push(filter);
    }

    /// Restricts the next choices to the tokens of `allowed` (structured
    /// output; `None` lifts the restriction). The mask runs after the
    /// raw-logit stage and before temperature: a forbidden token's logit is
    /// -inf, so its probability is 0 and the filters renormalise over the
    /// allowed ones. The generation loop refills it at every step
    /// ([`Sampler::allowed_mut`]).
    ///
    /// ```
    /// use lm_core::TokenMask;
    /// use lm_decode::{Sampler, SamplingConfig};
    /// let mut sampler = Sampler::new(&SamplingConfig::greedy()).unwrap();
    /// let mut allowed = TokenMask::new(3);
    /// allowed.allow(1);
    /// allowed.allow(2);
    /// sampler.set_allowed(Some(allowed));
    /// // Token 0 is the argmax but forbidden: the best allowed one wins.
    /// assert_eq!(sampler.select(&[2.0, 1.0, 0.0], &[], 0.0).unwrap().token, 1);
    /// ```
    pub fn set_allowed(&mut self, allowed: Option<TokenMask>) {
        self.allowed = allowed;
    }

    /// The mask set by [`Sampler::set_allowed`], to refill in place.
    pub fn allowed_mut(&mut self) -> Option<&mut TokenMask> {
        self.allowed.as_mut()
    }

    /// True when the policy is greedy (T = 0): the choice ignores the draw.
    pub fn is_greedy(&self) -> bool {
        self.selector == Selector::Greedy
    }

    /// The seed from the config.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The temperature.
    pub fn temperature(&self) -> Temperature {
        self.temperature
    }

    /// The policy distribution over the whole vocabulary for `logits` after
    /// `history` (the tokens read so far, prompt included, which the penalties
    /// count, or their last `penalty_last_n`): non-negative, summing to 1, 0 for removed tokens.
    ///
    /// NaN or +inf logits, an empty row, or a row that the bans and biases
    /// mask entirely are errors.
    ///
    /// With no draw to take, the policy is the distribution a draw would
    /// come from: with XTC at probability p, `p` times the chain's result
    /// with its top choices removed plus `1 - p` times the result without,
    /// each branch run through the stages after XTC too (so the mixture is
    /// exact whatever follows it: the cutoffs, mirostat).
    pub fn policy(&mut self, logits: &[f32], history: &[TokenId]) -> Result<&[f32]> {
        self.compute_policy(logits, history, None)?;
        Ok(&self.probs)
    }

    /// Fills `probs` with the policy and returns the most probable token
    /// after the raw-logit stage (the greedy choice). `u`, the step's draw,
    /// keys the random filters' draws (see [`Sampler::select`]).
    fn compute_policy(
        &mut self,
        logits: &[f32],
        history: &[TokenId],
        u: Option<f64>,
    ) -> Result<TokenId> {
        self.model_log_normaliser = None;
        self.policy_mu = None;
        self.stage_counts.clear();
        let vocab_size = logits.len();
        if vocab_size == 0 {
            return Err(lm_core::Error::EmptyLogits.into());
        }
        if self.checked_vocab_size != Some(vocab_size) {
            for transform in &self.transforms {
                transform.check_vocabulary(vocab_size)?;
            }
            self.checked_vocab_size = Some(vocab_size);
        }
        // argmax checks the row (no NaN or +inf, not all -inf) on the way.
        let mut best = lm_core::argmax(logits)?;
        self.adjusted.clear();
        self.adjusted.extend_from_slice(logits);
        if !self.transforms.is_empty() {
            let window = self
                .penalty_last_n
                .map_or(history, |n| &history[history.len().saturating_sub(n)..]);
            self.counts.count(window, vocab_size)?;
            let history = History::new(history, &self.counts);
            for transform in &self.transforms {
                transform.apply(&mut self.adjusted, &history);
            }
            best = lm_core::argmax(&self.adjusted).map_err(|error| match error {
                lm_core::Error::AllMasked => Error::AllTokensFiltered,
                other => other.into(),
            })?;
        }
        self.stage_counts.push(Stage::Vocabulary, vocab_size);
        // The constraint's mask: the penalties' count first, then the
        // tokens in play are the allowed ones.
        let mut in_play = Stage::Penalties;
        if let Some(allowed) = &self.allowed {
            if allowed.vocab_size() != vocab_size {
                return Err(Error::ConstraintVocabulary {
                    constraint: allowed.vocab_size(),
                    model: vocab_size,
                });
            }
            let n_unmasked = count_unmasked(&self.adjusted);
            self.stage_counts.push(Stage::Penalties, n_unmasked);
            allowed.apply_to(&mut self.adjusted);
            best = lm_core::argmax(&self.adjusted).map_err(|error| match error {
                lm_core::Error::AllMasked => Error::ConstraintAllowsNothing,
                other => other.into(),
            })?;
            in_play = Stage::Constraint;
        }
        self.probs.clear();
        self.probs.resize(vocab_size, 0.0);
        if self.temperature.is_greedy() {
            let n_unmasked = count_unmasked(&self.adjusted);
            self.stage_counts.push(in_play, n_unmasked);
            self.stage_counts.push(Stage::Temperature, 1);
            self.probs[best as usize] = 1.0;
            return Ok(best);
        }
        let initial = self.leading_temperature.map_or(1.0, Temperature::value);
        if self.filters.is_empty() && self.mirostat.is_none() {
            let n_unmasked = count_unmasked(&self.adjusted);
            self.stage_counts.push(in_play, n_unmasked);
            if self.leading_temperature.is_some() {
                self.stage_counts.push(Stage::Temperature, n_unmasked);
            }
            // The softmax, keeping its normaliser: at T = 1 over the raw
            // logits it is the model's own (see `model_log_normaliser`).
            let t = initial;
            let sum = lm_core::softmax_weights_into(&self.adjusted, t, &mut self.probs)?;
            let inv = (1.0 / sum) as f32;
            self.probs.iter_mut().for_each(|p| *p *= inv);
            if self.transforms.is_empty() && self.allowed.is_none() && t == 1.0 {
                self.model_log_normaliser =
                    Some(f64::from(self.adjusted[best as usize]) + sum.ln());
            }
            return Ok(best);
        }
        let start = Start {
            temperature: initial,
            in_play,
            n_counted: self.stage_counts.iter().len(),
        };
        match (u, self.coin) {
            // No draw to take, and XTC's coin: the policy is the mixture of
            // its two branches, each run through the rest of the chain.
            (None, Some(p)) => {
                let p = f64::from(p);
                for (draw, share) in [(1.0, 1.0 - p), (0.0, p)] {
                    self.filter_candidates(start, Some(Draws::Fixed(draw)), share, vocab_size)?;
                }
            }
            _ => {
                let draws = u.map(|u| Draws::Stream(TokenRng::new(u.to_bits())));
                self.filter_candidates(start, draws, 1.0, vocab_size)?;
            }
        }
        Ok(best)
    }

    /// Runs the filters and mirostat over the candidates of the adjusted
    /// logits from `start`, with the random filters' `draws`, and adds
    /// `share` times the survivors' probabilities to the policy.
    fn filter_candidates(
        &mut self,
        start: Start,
        draws: Option<Draws>,
        share: f64,
        vocab_size: usize,
    ) -> Result<()> {
        self.candidates.reset(&self.adjusted, start.temperature)?;
        self.candidates.draws = draws;
        self.candidates.set_min_keep(self.min_keep);
        // The candidates are the unmasked tokens, counted on the way in.
        self.stage_counts.truncate(start.n_counted);
        self.stage_counts.push(start.in_play, self.candidates.len());
        if self.leading_temperature.is_some() {
            self.stage_counts
                .push(Stage::Temperature, self.candidates.len());
        }
        for filter in &self.filters {
            filter.apply(&mut self.candidates);
            self.stage_counts
                .push(filter.stage(), self.candidates.len());
        }
        if let Some(mirostat) = self.mirostat {
            mirostat.truncate(&mut self.candidates, self.mu, vocab_size);
            self.policy_mu = Some(self.mu);
            self.stage_counts
                .push(Stage::Mirostat, self.candidates.len());
        }
        if self.candidates.is_empty() {
            return Err(Error::AllTokensFiltered);
        }
        // The survivors' weights in one vectorised pass when they are many
        // (the same bits as `Candidates::weight`, one at a time).
        let (entries, weights, total) = self.candidates.weights();
        for (&(id, _), &weight) in entries.iter().zip(weights) {
            self.probs[id as usize] += (share * f64::from(weight) / total) as f32;
        }
        Ok(())
    }

    /// Computes the policy and chooses a token with the uniform draw `u` in
    /// [0, 1) (ignored when greedy): inverse CDF over token ids in order.
    ///
    /// A random filter (XTC) draws from ChaCha20 keyed by the bits of `u`
    /// ([`TokenRng::new`]`(u.to_bits())`): `u` comes from the sequence's
    /// stream, so a seed replays the filter's coin, and the trace's `u`
    /// alone replays the step, while the choice by inverse CDF still uses
    /// `u` itself.
    pub fn select(&mut self, logits: &[f32], history: &[TokenId], u: f64) -> Result<Selection> {
        let best = self.compute_policy(logits, history, Some(u))?;
        let (token, u) = match self.selector {
            Selector::Greedy => (best, None),
            Selector::Sample => (self.selector.choose(&self.probs, u)?, Some(u)),
        };
        self.chose(token);
        Ok(Selection {
            token,
            policy_prob: self.probs[token as usize],
            u,
        })
    }

    /// Moves this sequence's state past `token`, chosen under the last
    /// policy: mirostat's bound follows the token's surprise.
    /// [`Sampler::select`] does this itself; a caller that chooses by its
    /// own rule from [`Sampler::policy`] (speculative decoding) calls it.
    pub fn chose(&mut self, token: TokenId) {
        if let (Some(mirostat), Some(&p), false) = (
            self.mirostat,
            self.probs.get(token as usize),
            self.is_greedy(),
        ) {
            self.mu = mirostat.next_mu(self.mu, p);
        }
    }

    /// The stages after the raw logits, in the order they run: temperature
    /// (where the order puts it), each filter, and mirostat when on (a front
    /// end names them with its own words, as lm-cli's `probs` does).
    pub fn stages(&self) -> impl Iterator<Item = Stage> + '_ {
        let leading = self.leading_temperature.map(|_| Stage::Temperature);
        let mirostat = self.mirostat.map(|_| Stage::Mirostat);
        leading
            .into_iter()
            .chain(self.filters.iter().map(|filter| filter.stage()))
            .chain(mirostat)
    }

    /// The bound on the surprise (bits) mirostat truncated the last policy
    /// at; `None` without mirostat.
    pub fn mirostat_mu(&self) -> Option<f32> {
        self.policy_mu
    }

    /// `ln sum_j exp(z_j)` of the raw logits of the last call, when the
    /// policy computed it on the way (T = 1, no transform, no filter: the
    /// policy is the model's own distribution). It has the bits
    /// [`lm_core::log_sum_exp`] would return, so a caller that needs the
    /// model's probabilities (the trace) can skip that second pass.
    pub(crate) fn model_log_normaliser(&self) -> Option<f64> {
        self.model_log_normaliser
    }

    /// How many candidates each stage of the chain left in the last call
    /// (the trace's [`crate::Step::n_candidates`]).
    pub fn stage_counts(&self) -> &StageCounts {
        &self.stage_counts
    }

    /// The policy distribution of the last [`Sampler::policy`] call.
    pub fn policy_probs(&self) -> &[f32] {
        &self.probs
    }

    /// The logits after the raw-logit stage (penalties, bias, bans) of the
    /// last call, before temperature.
    pub fn adjusted_logits(&self) -> &[f32] {
        &self.adjusted
    }
}

impl fmt::Debug for Sampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Chain<'a>(&'a Sampler);
        impl fmt::Debug for Chain<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let sampler = self.0;
                f.debug_list()
                    .entries(&sampler.transforms)
                    .entries(sampler.leading_temperature)
                    .entries(&sampler.filters)
                    .finish()
            }
        }
        let mut debug = f.debug_struct("Sampler");
        debug.field("chain", &Chain(self));
        match (self.mirostat, self.selector) {
            (Some(mirostat), Selector::Sample) => debug.field("selector", &mirostat),
            _ => debug.field("selector", &self.selector),
        };
        debug.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_normaliser_comes_from_the_policy_only_when_they_are_the_same() {
        // 3000 logits spread over [-5, 5) in a scrambled order.
        let logits: Vec<f32> = (0..3000)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        let lse = lm_core::log_sum_exp(&logits).unwrap();
        let normaliser = |config: SamplingConfig| {
            let mut sampler = Sampler::new(&config).unwrap();
            sampler.select(&logits, &[7, 7], 0.3).unwrap();
            sampler.model_log_normaliser()
        };
        // T = 1 with nothing else: the same routine, the same bits.
        let plain = normaliser(SamplingConfig::default()).unwrap();
        assert_eq!(plain.to_bits(), lse.to_bits());
        // Any other policy leaves the trace to compute its own.
        for config in [
            SamplingConfig::greedy(),
            SamplingConfig {
                temperature: 0.9,
                ..SamplingConfig::default()
            },
            SamplingConfig {
                top_k: Some(50),
                ..SamplingConfig::default()
            },
            SamplingConfig {
                presence_penalty: Some(0.5),
                ..SamplingConfig::default()
            },
        ] {
            assert_eq!(normaliser(config.clone()), None, "{config:?}");
        }
    }
}
