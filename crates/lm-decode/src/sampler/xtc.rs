//! XTC, "exclude top choices" (p-e-w, text-generation-webui pull request
//! 6335, 2024; llama.cpp's `--xtc-probability` and `--xtc-threshold`): with
//! probability p, remove every token whose probability is at least the
//! threshold except the least probable of them, so the text leaves its most
//! predictable path while a plausible token stays.
//!
//! ```text
//! A = { i : q_i >= threshold }, best first         (|A| <= 1 / threshold)
//! with probability p, when |A| >= 2: remove A minus its last token
//! ```
//!
//! As llama.cpp: probabilities are compared at f32 precision, nothing is
//! removed when fewer than `min_keep` tokens would be left, and a threshold
//! above 0.5 never removes anything (two tokens cannot both pass it).
//!
//! The coin is [`Candidates::next_draw`]: in [`crate::Sampler::select`] a
//! draw from ChaCha20 keyed by the step's `u`, so a seed replays it.
//! [`crate::Sampler::policy`] fixes the coin each way in turn and mixes the
//! two branches after the whole chain (exact whatever stage follows XTC).
//! Candidates given no draw at all (this filter used on its own) get the
//! mixture of both outcomes here:
//!
//! ```text
//! m_i = (1 - p) q_i                                  for removed i
//! m_i = (1 - p) q_i + p q_i / (1 - Q_R)              otherwise (Q_R: removed mass)
//! ```
//!
//! written as a shift of the removed tokens' logits by
//! `T ln((1 - p) / ((1 - p) + p / (1 - Q_R)))`. At T = +inf (uniform)
//! that shift is not a weight, so there the removal is shown instead.
//! Ties among the tokens above the threshold follow the chain's rule (higher
//! logit, then lower id, is removed first); llama.cpp leaves their order
//! unspecified, so the kept one may be another token of the same
//! probability.

use super::{CandidateFilter, Candidates};
use crate::error::{Error, Result};
use crate::trace::Stage;

/// The first partial selection; later rounds take four times as many.
const FIRST_ROUND: usize = 16;

/// With probability `probability`, removes the tokens at least as probable
/// as `threshold` but the least probable of them.
///
/// ```
/// use lm_decode::sampler::{CandidateFilter, Candidates, Xtc};
/// // q = (0.5, 0.3, 0.2): 0.5 and 0.3 pass 0.25; 0.5 goes, 0.3 stays.
/// let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// Xtc::new(1.0, 0.25).unwrap().apply(&mut c);
/// assert_eq!(c.ids().collect::<Vec<_>>(), vec![1, 2]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Xtc {
    probability: f32,
    threshold: f32,
}

impl Xtc {
    /// Checks both settings: a probability outside [0, 1] (or NaN) gives
    /// [`Error::InvalidXtcProbability`], a threshold outside it
    /// [`Error::InvalidXtcThreshold`].
    pub fn new(probability: f32, threshold: f32) -> Result<Self> {
        let is_valid = (0.0..=1.0).contains(&probability);
        let probability = Error::check(probability, is_valid, |value| {
            Error::InvalidXtcProbability { value }
        })?;
        let threshold = Self::check_threshold(threshold)?;
        Ok(Self {
            probability,
            threshold,
        })
    }

    /// A threshold in [0, 1], checked on its own (a threshold given
    /// without a probability is still a setting to refuse).
    pub(crate) fn check_threshold(threshold: f32) -> Result<f32> {
        let is_valid = (0.0..=1.0).contains(&threshold);
        Error::check(threshold, is_valid, |value| Error::InvalidXtcThreshold {
            value,
        })
    }

    /// The chance that the top choices are removed at a step.
    pub fn probability(self) -> f32 {
        self.probability
    }

    /// The probability a token needs to count as a top choice.
    pub fn threshold(self) -> f32 {
        self.threshold
    }

    /// How many of the best candidates pass the threshold (sorting only
    /// as many as needed).
    fn n_above(self, candidates: &mut Candidates, total: f64) -> usize {
        candidates
            .find_ranked(FIRST_ROUND, |_, weight| {
                ((weight / total) as f32) < self.threshold
            })
            .unwrap_or(candidates.len())
    }
}

impl CandidateFilter for Xtc {
    fn apply(&self, candidates: &mut Candidates) {
        let n = candidates.len();
        if n < 2 || self.probability <= 0.0 {
            return;
        }
        let fires = candidates
            .next_draw()
            .map(|u| u < f64::from(self.probability));
        let total = candidates.total_weight();
        if fires == Some(false) || total <= 0.0 {
            return;
        }
        let n_above = self.n_above(candidates, total);
        let n_removed = n_above.saturating_sub(1);
        if n_removed == 0 || n - n_removed < candidates.min_keep() {
            return;
        }
        let t = f64::from(candidates.temperature());
        let p = f64::from(self.probability);
        let removed_mass: f64 = candidates.entries()[..n_removed]
            .iter()
            .map(|&(_, z)| candidates.weight(z) / total)
            .sum();
        let kept_mass = 1.0 - removed_mass;
        if fires == Some(true) || p >= 1.0 || !t.is_finite() || kept_mass <= 0.0 {
            candidates.drop_front(n_removed);
            return;
        }
        // The mixture: the removed tokens' weights times (1 - p) / ((1 - p) + p / kept_mass).
        let factor = (1.0 - p) / ((1.0 - p) + p / kept_mass);
        candidates.shift_front(n_removed, (t * factor.ln()) as f32);
    }

    fn stage(&self) -> Stage {
        Stage::Xtc
    }
}
