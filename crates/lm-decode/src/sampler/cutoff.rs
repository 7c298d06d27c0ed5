//! Epsilon and eta sampling (Hewitt, Manning and Liang 2022, "Truncation
//! Sampling as Language Model Desmoothing"; HF's `epsilon_cutoff` and
//! `eta_cutoff`, `EpsilonLogitsWarper` and `EtaLogitsWarper`): remove the
//! tokens whose probability is below a cutoff, a fixed one or one that falls
//! as the distribution's entropy rises.
//!
//! ```text
//! epsilon:  keep q_i >= epsilon
//! eta:      keep q_i >= eta,   eta = min(epsilon, sqrt(epsilon) exp(-H)),   H = -sum_j q_j ln q_j
//! both:     also keep every token whose logit is at least the min_keep-th best one
//! ```
//!
//! `q` is the candidates' distribution at their temperature, as HF's warpers
//! see the scores after its temperature warper. The weights come from one
//! vectorised pass ([`Candidates::weights`]) and the cutoff is a single
//! comparison per token: no sort. The entropy needs no logarithm per token:
//! `ln q_i = (z_i - z_max) / T - ln sum_j w_j` is exact from the logits, so
//! `H = ln sum_j w_j - sum_i q_i (z_i - z_max) / T`, summed in f64.
//!
//! As HF: a probability is compared with the cutoff at f32 precision and
//! kept when not below it; the `min_keep` guard is HF's top-k one, so every
//! token tied with the `min_keep`-th best logit stays too (never fewer than
//! `min_keep`, sometimes more, whatever the ids). HF takes H of the scores in
//! f32; here it is f64, so a probability within about 1e-6 relative of eta
//! may fall on the other side there.

use super::{CandidateFilter, Candidates};
use crate::error::{Error, Result};
use crate::trace::Stage;
use lm_core::TokenId;

/// Keeps the candidates whose probability is at least `epsilon`.
///
/// ```
/// use lm_decode::sampler::{CandidateFilter, Candidates, EpsilonCutoff};
/// // q = (0.3, 0.25, 0.2, 0.15, 0.1): only 0.1 is below 0.12.
/// let logits = [0.3f32.ln(), 0.25f32.ln(), 0.2f32.ln(), 0.15f32.ln(), 0.1f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// EpsilonCutoff::new(0.12).unwrap().apply(&mut c);
/// assert_eq!(c.ids().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpsilonCutoff(f32);

impl EpsilonCutoff {
    /// Checks `epsilon`: outside (0, 1) (or NaN) gives
    /// [`Error::InvalidEpsilonCutoff`] (HF's range).
    pub fn new(epsilon: f32) -> Result<Self> {
        let is_valid = epsilon > 0.0 && epsilon < 1.0;
        Error::check(epsilon, is_valid, |value| Error::InvalidEpsilonCutoff {
            value,
        })
        .map(Self)
    }

    /// The least probability a token needs to stay.
    pub fn epsilon(self) -> f32 {
        self.0
    }
}

impl CandidateFilter for EpsilonCutoff {
    fn apply(&self, candidates: &mut Candidates) {
        retain_probable(candidates, |_| self.0);
    }

    fn stage(&self) -> Stage {
        Stage::EpsilonCutoff
    }
}

/// Keeps the candidates whose probability is at least
/// `eta = min(epsilon, sqrt(epsilon) exp(-H))`: a flat distribution (high
/// entropy H) lowers the cutoff and keeps more of its tail.
///
/// ```
/// use lm_decode::sampler::{CandidateFilter, Candidates, EtaCutoff};
/// // q = (0.3, 0.25, 0.2, 0.15, 0.1): H = 1.5445, so at epsilon = 0.12
/// // eta = min(0.12, 0.3464 * 0.2134) = 0.0739 and even 0.1 stays (the
/// // epsilon cutoff of 0.12 would remove it).
/// let logits = [0.3f32.ln(), 0.25f32.ln(), 0.2f32.ln(), 0.15f32.ln(), 0.1f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// EtaCutoff::new(0.12).unwrap().apply(&mut c);
/// assert_eq!(c.len(), 5);
/// // q = (0.6, 0.3, 0.08, 0.02): H = 0.948, eta = min(0.2, 0.4472 * 0.3875) = 0.173.
/// let logits = [0.6f32.ln(), 0.3f32.ln(), 0.08f32.ln(), 0.02f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// EtaCutoff::new(0.2).unwrap().apply(&mut c);
/// assert_eq!(c.ids().collect::<Vec<_>>(), vec![0, 1]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EtaCutoff(f32);

impl EtaCutoff {
    /// Checks the `eta_cutoff` setting (the paper's epsilon): outside
    /// (0, 1) (or NaN) gives [`Error::InvalidEtaCutoff`] (HF's range).
    pub fn new(eta: f32) -> Result<Self> {
        let is_valid = eta > 0.0 && eta < 1.0;
        Error::check(eta, is_valid, |value| Error::InvalidEtaCutoff { value }).map(Self)
    }

    /// The setting: the largest the cutoff can be, reached at low entropy.
    pub fn epsilon(self) -> f32 {
        self.0
    }

    /// The cutoff for a distribution of entropy `entropy` (in nats).
    pub fn cutoff(self, entropy: f64) -> f64 {
        let epsilon = f64::from(self.0);
        epsilon.min(epsilon.sqrt() * (-entropy).exp())
    }
}

impl CandidateFilter for EtaCutoff {
    fn apply(&self, candidates: &mut Candidates) {
        retain_probable(candidates, |row| {
            let entropy = row.entropy();
            self.cutoff(entropy) as f32
        });
    }

    fn stage(&self) -> Stage {
        Stage::EtaCutoff
    }
}

/// Running sums in [`Row::entropy`].
const LANES: usize = 8;

/// The candidates' weights, as [`Candidates::weights`] gives them, with what
/// turns them into log-probabilities.
struct Row<'a> {
    entries: &'a [(TokenId, f32)],
    weights: &'a [f32],
    total: f64,
    max_logit: f64,
    temperature: f64,
}

impl Row<'_> {
    /// `H = -sum_i q_i ln q_i = ln total - sum_i q_i (z_i - z_max) / T`, in
    /// f64, exact from the logits (q_i = 0 adds nothing).
    fn entropy(&self) -> f64 {
        // Eight running sums, so the compiler can vectorise the f64 sum.
        let mut lanes = [0.0f64; LANES];
        let entries = self.entries.chunks_exact(LANES);
        let weights = self.weights.chunks_exact(LANES);
        let (entries_tail, weights_tail) = (entries.remainder(), weights.remainder());
        for (entries, weights) in entries.zip(weights) {
            for ((lane, &(_, z)), &w) in lanes.iter_mut().zip(entries).zip(weights) {
                *lane += f64::from(w) * (f64::from(z) - self.max_logit);
            }
        }
        let weighted: f64 = lanes.iter().sum::<f64>()
            + entries_tail
                .iter()
                .zip(weights_tail)
                .map(|(&(_, z), &w)| f64::from(w) * (f64::from(z) - self.max_logit))
                .sum::<f64>();
        // At T = 0 only the best logits weigh, each with z = z_max.
        let mean_scaled = if weighted == 0.0 {
            0.0
        } else {
            weighted / (self.total * self.temperature)
        };
        self.total.ln() - mean_scaled
    }
}

/// Keeps the candidates whose probability (compared at f32) is at least the
/// cutoff `cutoff` computes from the row, and, as HF's guard, every one whose
/// logit is at least the `min_keep`-th best.
fn retain_probable(candidates: &mut Candidates, cutoff: impl FnOnce(&Row<'_>) -> f32) {
    let n = candidates.len();
    let min_keep = candidates.min_keep();
    if n <= min_keep {
        return;
    }
    // The guard's logit: a scan with a bounded heap, cheap for a small
    // min_keep.
    candidates.sort_prefix(min_keep);
    let guard = candidates.entries()[min_keep - 1].1;
    let max_logit = f64::from(candidates.max_logit());
    let temperature = f64::from(candidates.temperature());
    let mut kept = std::mem::take(&mut candidates.kept);
    let (entries, weights, total) = candidates.weights();
    if total.is_nan() || total <= 0.0 {
        candidates.kept = kept;
        return;
    }
    let row = Row {
        entries,
        weights,
        total,
        max_logit,
        temperature,
    };
    let cut = cutoff(&row);
    let inv_total = 1.0 / total;
    kept.clear();
    kept.extend(
        entries
            .iter()
            .zip(weights)
            .map(|(&(_, z), &w)| z >= guard || (f64::from(w) * inv_total) as f32 >= cut),
    );
    candidates.kept = kept;
    candidates.retain_kept();
}
