//! From counts to probabilities: maximum likelihood (lesson 000's lab),
//! add-k, and interpolated modified Kneser-Ney as KenLM's `lmplz` estimates
//! it; optional count pruning with renormalised backoffs.
//!
//! # Modified Kneser-Ney, as `lmplz` does it
//!
//! 1. Adjusted counts a(x): the raw count for top-order n-grams and for
//!    n-grams that start with `<s>`; for every other lower-order n-gram the
//!    number of distinct words seen before it, N1+(• x). `a(<s>) = 0`,
//!    `a(<unk>) = 0`.
//! 2. Discounts per order from the count-of-counts n_k of adjusted counts
//!    (Chen and Goodman's equation 26): `Y = n1 / (n1 + 2 n2)`,
//!    `D(k) = k - (k + 1) Y n_{k+1} / n_k` for k = 1, 2, 3 (3 means 3+).
//! 3. For a context c with continuations w: `u(w | c) = (a(c w) - D(a(c w))) / Σ a(c ·)`
//!    and `γ(c) = (D1 N1(c ·) + D2 N2(c ·) + D3 N3+(c ·)) / Σ a(c ·)`.
//! 4. Interpolation from the bottom: `p(w) = u(w) + γ(ε) / |V|` with |V| the
//!    vocabulary without `<s>` (so `<unk>` gets `γ(ε) / |V|`), and
//!    `p(w | c) = u(w | c) + γ(c) p(w | c')`. `p(<s>) = 1` (log10 0; never
//!    predicted). The ARPA probability is `p`, the backoff of c is `γ(c)`.
//!
//! # Add-k and maximum likelihood in backoff form
//!
//! A stored n-gram `c w` gets `(count(c w) + k) / (count(c ·) + k |V|)`
//! (k = 0 for maximum likelihood; unigrams likewise with the token total).
//! Unseen words after a seen context share what is left, in proportion to
//! the lower order (Katz-style normalisation), so the model is a proper
//! distribution: `backoff(c) = (1 - Σ p(w | c)) / (1 - Σ p(w | c'))` over the
//! stored w. For maximum likelihood that leftover is 0 (log10 -99): an
//! unseen word after a seen context is impossible, as in the lab.
//!
//! # Pruning
//!
//! N-grams of order m ≥ 2 whose raw count is at most `prune[m - 1]` are
//! dropped after estimation; the backoffs of their contexts are then
//! renormalised with the formula above (SRILM-style), so every distribution
//! still sums to 1. (This differs from `lmplz --prune`, which discounts
//! before interpolating.)

use lm_core::TokenId;

use super::counts::{CountLevel, NgramCounts};
use super::error::NgramError;
use super::model::{NgramModel, RawEntry};

/// How probabilities are estimated from counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Smoothing {
    /// Relative frequencies: count(c w) / count(c ·). Unseen continuations of
    /// a seen context get probability 0.
    MaximumLikelihood,
    /// Add k to every count (k = 1 is Laplace).
    AddK {
        /// The pseudo-count added; finite and > 0.
        k: f64,
    },
    /// Interpolated modified Kneser-Ney as `lmplz` estimates it.
    ModifiedKneserNey {
        /// Discounts to use for an order whose count-of-counts cannot give
        /// them (`lmplz --discount_fallback`; `None` makes that an error).
        fallback: Option<Discount>,
    },
}

/// Modified Kneser-Ney discounts of one order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Discount {
    /// Subtracted from adjusted count 1.
    pub d1: f64,
    /// Subtracted from adjusted count 2.
    pub d2: f64,
    /// Subtracted from adjusted counts 3 and more.
    pub d3_plus: f64,
}

impl Discount {
    /// `lmplz`'s default fallback (`--discount_fallback` without values).
    pub const LMPLZ_FALLBACK: Discount = Discount {
        d1: 0.5,
        d2: 1.0,
        d3_plus: 1.5,
    };

    /// The discount for an adjusted count (0 for count 0).
    pub fn for_count(&self, adjusted: u64) -> f64 {
        match adjusted {
            0 => 0.0,
            1 => self.d1,
            2 => self.d2,
            _ => self.d3_plus,
        }
    }

    fn check(&self) -> Result<(), NgramError> {
        for (count, value) in [(1, self.d1), (2, self.d2), (3, self.d3_plus)] {
            if !(0.0..=count as f64).contains(&value) {
                return Err(NgramError::InvalidFallbackDiscount { count, value });
            }
        }
        Ok(())
    }
}

/// An order whose modified Kneser-Ney discounts its counts could not give,
/// estimated with the fallback discounts instead (the warning `lmplz
/// --discount_fallback` prints). [`NgramModel::discount_fallbacks`] lists
/// them, so a caller can tell the estimate is not plain Kneser-Ney.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiscountFallback {
    /// The n-gram order (1 for unigrams).
    pub order: usize,
    /// The first adjusted count (3 means "3 and more") whose discount failed:
    /// no n-gram has it, or its estimate fell outside `[0, count]`.
    pub count: u64,
    /// The discounts used instead.
    pub discount: Discount,
}

impl std::fmt::Display for DiscountFallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Discount { d1, d2, d3_plus } = self.discount;
        write!(
            f,
            "kneser-ney discounts for {}-grams cannot be estimated from this corpus (adjusted count {}); used the fallback discounts D1 = {d1}, D2 = {d2}, D3+ = {d3_plus}",
            self.order, self.count
        )
    }
}

/// Adjusted counts per level (see the module docs), indexed like the counts.
pub(crate) fn adjusted_counts(counts: &NgramCounts) -> Vec<Vec<u64>> {
    let levels = counts.levels();
    let bos = counts.vocab().bos();
    let order = levels.len();
    let starts_with_bos = bos_flags(levels, bos);
    let mut adjusted: Vec<Vec<u64>> = Vec::with_capacity(order);
    for (l, level) in levels.iter().enumerate() {
        if l + 1 == order {
            adjusted.push(level.count.clone());
            continue;
        }
        let mut continuation = vec![0u64; level.len()];
        for &suffix in &levels[l + 1].suffix {
            continuation[suffix as usize] += 1;
        }
        let values = (0..level.len())
            .map(|i| {
                if starts_with_bos[l][i] {
                    level.count[i]
                } else {
                    continuation[i]
                }
            })
            .collect();
        adjusted.push(values);
    }
    if let Some(unigram_bos) = adjusted[0].get_mut(bos as usize) {
        *unigram_bos = 0;
    }
    adjusted
}

fn bos_flags(levels: &[CountLevel], bos: TokenId) -> Vec<Vec<bool>> {
    let mut flags: Vec<Vec<bool>> = Vec::with_capacity(levels.len());
    flags.push(levels[0].word.iter().map(|&w| w == bos).collect());
    for level in &levels[1..] {
        let below = flags.last().map(Vec::as_slice).unwrap_or_default();
        let here = level.context.iter().map(|&c| below[c as usize]).collect();
        flags.push(here);
    }
    flags
}

/// Modified Kneser-Ney discounts for every order of `counts`, from the
/// count-of-counts of adjusted counts, as `lmplz` computes them.
pub fn kneser_ney_discounts(
    counts: &NgramCounts,
    fallback: Option<Discount>,
) -> Result<Vec<Discount>, NgramError> {
    Ok(discounts_of(&adjusted_counts(counts), fallback)?.0)
}

/// The discounts of every order, and the orders that took `fallback`.
fn discounts_of(
    adjusted: &[Vec<u64>],
    fallback: Option<Discount>,
) -> Result<(Vec<Discount>, Vec<DiscountFallback>), NgramError> {
    if let Some(fallback) = fallback {
        fallback.check()?;
    }
    let mut discounts = Vec::with_capacity(adjusted.len());
    let mut fallbacks = Vec::new();
    for (l, values) in adjusted.iter().enumerate() {
        let mut n = [0u64; 5];
        for &a in values {
            if let Some(slot) = n.get_mut(a as usize) {
                *slot += 1;
            }
        }
        let order = l + 1;
        let discount = match (discount_from(&n), fallback) {
            (Ok(discount), _) => discount,
            (Err(failure), None) => return Err(failure.at(order)),
            (Err(failure), Some(discount)) => {
                fallbacks.push(DiscountFallback {
                    order,
                    count: failure.count(),
                    discount,
                });
                discount
            }
        };
        discounts.push(discount);
    }
    Ok((discounts, fallbacks))
}

/// Why the count-of-counts of an order cannot give its discounts.
enum Unestimable {
    /// No n-gram has adjusted count `count`.
    Undefined { count: u64 },
    /// The discount of adjusted count `count` fell outside `[0, count]`.
    OutOfRange { count: u64, value: f64 },
}

impl Unestimable {
    fn count(&self) -> u64 {
        match *self {
            Self::Undefined { count } | Self::OutOfRange { count, .. } => count,
        }
    }

    /// The error for `order`, when there is no fallback.
    fn at(self, order: usize) -> NgramError {
        match self {
            Self::Undefined { count } => NgramError::DiscountUndefined { order, count },
            Self::OutOfRange { count, value } => NgramError::DiscountOutOfRange {
                order,
                count,
                value,
            },
        }
    }
}

/// Chen and Goodman's discounts from the count-of-counts `n` (`n[k]`: how
/// many n-grams have adjusted count k).
fn discount_from(n: &[u64; 5]) -> Result<Discount, Unestimable> {
    if let Some(count) = (1..4u64).find(|&count| n[count as usize] == 0) {
        return Err(Unestimable::Undefined { count });
    }
    let y = n[1] as f64 / (n[1] as f64 + 2.0 * n[2] as f64);
    let discount_of = |count: u64| -> Result<f64, Unestimable> {
        let (here, next) = (n[count as usize] as f64, n[count as usize + 1] as f64);
        let value = count as f64 - (count + 1) as f64 * y * next / here;
        if (0.0..=count as f64).contains(&value) {
            Ok(value)
        } else {
            Err(Unestimable::OutOfRange { count, value })
        }
    };
    Ok(Discount {
        d1: discount_of(1)?,
        d2: discount_of(2)?,
        d3_plus: discount_of(3)?,
    })
}

impl NgramModel {
    /// Estimates a model from `counts` with `smoothing`, dropping n-grams of
    /// order m ≥ 2 whose count is at most `prune[m - 1]` (missing entries
    /// mean 0: keep all). See the module docs for the formulas.
    pub fn estimate(
        counts: &NgramCounts,
        smoothing: &Smoothing,
        prune: &[u64],
    ) -> Result<Self, NgramError> {
        if counts.n_sentences() == 0 {
            return Err(NgramError::EmptyCorpus);
        }
        if let Smoothing::AddK { k } = *smoothing
            && !(k.is_finite() && k > 0.0)
        {
            return Err(NgramError::InvalidAddK { k });
        }
        let levels = counts.levels();
        let prune = Pruning(prune);
        prune.check(levels.len())?;

        // Linear probabilities per level, and γ per context (KN only).
        let mut fallbacks = Vec::new();
        let (probs, gammas) = match *smoothing {
            Smoothing::MaximumLikelihood => (additive_probs(counts, 0.0), None),
            Smoothing::AddK { k } => (additive_probs(counts, k), None),
            Smoothing::ModifiedKneserNey { fallback } => {
                let adjusted = adjusted_counts(counts);
                let (discounts, taken) = discounts_of(&adjusted, fallback)?;
                fallbacks = taken;
                let (probs, gammas) = kneser_ney_probs(counts, &adjusted, &discounts);
                (probs, Some(gammas))
            }
        };
        let keep = prune.kept(levels);
        let backoffs = backoffs(levels, &probs, &keep, prune, gammas.as_deref());

        // Into the model, renumbering kept entries.
        let log10 = |p: f64| {
            if p > 0.0 {
                p.log10().min(0.0) as f32
            } else {
                -99.0
            }
        };
        let log10_backoff = |b: f64| if b > 0.0 { b.log10() as f32 } else { -99.0 };
        let unigrams = (0..levels[0].len())
            .map(|w| {
                let backoff = backoffs.first().map_or(0.0, |b| log10_backoff(b[w]));
                (log10(probs[0][w]), backoff)
            })
            .collect();
        let mut higher = Vec::with_capacity(levels.len() - 1);
        let mut new_index: Vec<u32> = (0..levels[0].len() as u32).collect();
        for (l, level) in levels.iter().enumerate().skip(1) {
            let mut entries = Vec::new();
            let mut renumbered = vec![u32::MAX; level.len()];
            for i in 0..level.len() {
                if !keep[l][i] {
                    continue;
                }
                renumbered[i] = entries.len() as u32;
                entries.push(RawEntry {
                    context: new_index[level.context[i] as usize],
                    word: level.word[i],
                    prob: log10(probs[l][i]),
                    backoff: backoffs.get(l).map_or(0.0, |b| log10_backoff(b[i])),
                });
            }
            higher.push(entries);
            new_index = renumbered;
        }
        let mut model = NgramModel::from_built_levels(counts.vocab().clone(), unigrams, higher)?;
        model.discount_fallbacks = fallbacks;
        Ok(model)
    }
}

/// The pruning thresholds: n-grams of order m ≥ 2 with a count at most
/// `self.0[m - 1]` are dropped (a missing entry is 0: keep all).
#[derive(Clone, Copy)]
struct Pruning<'a>(&'a [u64]);

impl Pruning<'_> {
    /// The threshold of order `m` (0 for unigrams, which are never pruned).
    fn threshold(self, m: usize) -> u64 {
        if m < 2 {
            0
        } else {
            self.0.get(m - 1).copied().unwrap_or(0)
        }
    }

    /// Checks that the thresholds never fall from one order to the next.
    fn check(self, order: usize) -> Result<(), NgramError> {
        let mut lower = 0;
        for m in 2..=order {
            if self.threshold(m) < lower {
                return Err(NgramError::PruneNotMonotone {
                    order: m,
                    threshold: self.threshold(m),
                    lower,
                });
            }
            lower = self.threshold(m);
        }
        Ok(())
    }

    /// Which n-grams stay: counts above the threshold, and every context of
    /// a kept n-gram.
    fn kept(self, levels: &[CountLevel]) -> Vec<Vec<bool>> {
        let mut keep: Vec<Vec<bool>> = levels
            .iter()
            .enumerate()
            .map(|(l, level)| {
                level
                    .count
                    .iter()
                    .map(|&c| l == 0 || c > self.threshold(l + 1))
                    .collect()
            })
            .collect();
        for l in (1..levels.len()).rev() {
            let (below, here) = keep.split_at_mut(l);
            for (i, &kept) in here[0].iter().enumerate() {
                if kept {
                    below[l - 1][levels[l].context[i] as usize] = true;
                }
            }
        }
        keep
    }
}

/// Add-k probabilities per level (k = 0: maximum likelihood), `<s>`
/// certain.
fn additive_probs(counts: &NgramCounts, k: f64) -> Vec<Vec<f64>> {
    let levels = counts.levels();
    let bos = counts.vocab().bos() as usize;
    let n_vocab_without_bos = (counts.vocab().len() - 1) as f64;
    let mut probs: Vec<Vec<f64>> = Vec::with_capacity(levels.len());
    let unigrams = &levels[0];
    let total: f64 = unigrams
        .count
        .iter()
        .enumerate()
        .filter(|&(w, _)| w != bos)
        .map(|(_, &c)| c as f64)
        .sum();
    let denominator = total + k * n_vocab_without_bos;
    let mut unigram_probs: Vec<f64> = unigrams
        .count
        .iter()
        .map(|&c| (c as f64 + k) / denominator)
        .collect();
    unigram_probs[bos] = 1.0;
    probs.push(unigram_probs);
    for l in 1..levels.len() {
        let level = &levels[l];
        let mut totals = vec![0.0f64; levels[l - 1].len()];
        for (&context, &count) in level.context.iter().zip(&level.count) {
            totals[context as usize] += count as f64;
        }
        let level_probs = level
            .context
            .iter()
            .zip(&level.count)
            .map(|(&c, &count)| (count as f64 + k) / (totals[c as usize] + k * n_vocab_without_bos))
            .collect();
        probs.push(level_probs);
    }
    probs
}

/// Interpolated modified Kneser-Ney probabilities per level from the
/// `adjusted` counts and `discounts`, and γ of every context of order ≥ 1
/// (`gammas[l]` for the contexts of level `l + 1`), `<s>` certain.
fn kneser_ney_probs(
    counts: &NgramCounts,
    adjusted: &[Vec<u64>],
    discounts: &[Discount],
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let levels = counts.levels();
    let n_vocab_without_bos = (counts.vocab().len() - 1) as f64;
    let mut probs: Vec<Vec<f64>> = Vec::with_capacity(levels.len());
    let mut gammas: Vec<Vec<f64>> = Vec::with_capacity(levels.len());
    for (l, level) in levels.iter().enumerate() {
        let discount = discounts[l];
        let n_contexts = if l == 0 { 1 } else { levels[l - 1].len() };
        let context_of = |i: usize| if l == 0 { 0 } else { level.context[i] as usize };
        let mut totals = vec![0.0f64; n_contexts];
        let mut discounted = vec![0.0f64; n_contexts];
        for (i, &a) in adjusted[l].iter().enumerate() {
            totals[context_of(i)] += a as f64;
            discounted[context_of(i)] += discount.for_count(a);
        }
        let gamma: Vec<f64> = discounted
            .iter()
            .zip(&totals)
            .map(|(&d, &t)| if t > 0.0 { d / t } else { 0.0 })
            .collect();
        let level_probs: Vec<f64> = adjusted[l]
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let c = context_of(i);
                let total = totals[c];
                let own = if total > 0.0 {
                    (a as f64 - discount.for_count(a)) / total
                } else {
                    0.0
                };
                let lower = if l == 0 {
                    1.0 / n_vocab_without_bos
                } else {
                    probs[l - 1][level.suffix[i] as usize]
                };
                own + gamma[c] * lower
            })
            .collect();
        probs.push(level_probs);
        if l > 0 {
            gammas.push(gamma);
        }
    }
    probs[0][counts.vocab().bos() as usize] = 1.0;
    (probs, gammas)
}

/// Backoffs of every n-gram below the top order: 1 without kept
/// continuations, Kneser-Ney's γ where nothing above was pruned (`gammas`
/// given), else what renormalises the kept probabilities.
fn backoffs(
    levels: &[CountLevel],
    probs: &[Vec<f64>],
    keep: &[Vec<bool>],
    prune: Pruning<'_>,
    gammas: Option<&[Vec<f64>]>,
) -> Vec<Vec<f64>> {
    let mut backoffs: Vec<Vec<f64>> = Vec::with_capacity(levels.len());
    for l in 0..levels.len().saturating_sub(1) {
        let above = &levels[l + 1];
        let n_here = levels[l].len();
        let mut has_children = vec![false; n_here];
        let mut sum_here = vec![0.0f64; n_here];
        let mut sum_lower = vec![0.0f64; n_here];
        for i in 0..above.len() {
            if !keep[l + 1][i] {
                continue;
            }
            let c = above.context[i] as usize;
            has_children[c] = true;
            sum_here[c] += probs[l + 1][i];
            sum_lower[c] += probs[l][above.suffix[i] as usize];
        }
        let unpruned = prune.threshold(l + 2) == 0;
        let values = (0..n_here)
            .map(|c| match gammas {
                _ if !has_children[c] => 1.0,
                Some(gammas) if unpruned => gammas[l][c],
                _ => {
                    let numerator = 1.0 - sum_here[c];
                    let denominator = 1.0 - sum_lower[c];
                    if numerator <= 1e-12 || denominator <= 1e-12 {
                        0.0
                    } else {
                        numerator / denominator
                    }
                }
            })
            .collect();
        backoffs.push(values);
    }
    backoffs
}
