//! Top-nσ (Tang, Li, Zhang and Zhang 2024, "Top-nσ: Not All Logits Are You
//! Need"; llama.cpp's `--top-nsigma`): keep the tokens whose logit is within
//! n standard deviations of the largest.
//!
//! ```text
//! mu    = mean_i z_i,   sigma = sqrt(mean_i (z_i - mu)^2)   (over the candidates)
//! keep z_i >= z_max - n sigma
//! ```
//!
//! The rule reads the logits, not the probabilities, so it is the same at
//! every temperature (dividing by T scales both sides); the paper's point is
//! that the kept set does not grow as T does. The mean and the population
//! standard deviation are taken in f64 over the candidates in play (masked
//! tokens are not candidates, as llama.cpp skips -inf). At least `min_keep`
//! tokens are kept, the best ones (llama.cpp's stage has no `min_keep`).
//! llama.cpp sums in f32, so a logit within about 1e-4 of the threshold may
//! fall on the other side there.

use super::{CandidateFilter, Candidates, max_in_lanes, sum_in_lanes};
use crate::error::{Error, Result};
use crate::trace::Stage;

/// Keeps candidates with `z >= z_max - n * sigma`.
///
/// ```
/// use lm_decode::sampler::{CandidateFilter, Candidates, TopNSigma};
/// // Mean 1, sigma = sqrt(2) = 1.41: one sigma below the best is 1.59.
/// let logits = [3.0, 2.0, 1.0, 0.0, -1.0];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// TopNSigma::new(1.0).unwrap().apply(&mut c);
/// assert_eq!(c.ids().collect::<Vec<_>>(), vec![0, 1]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopNSigma(f32);

impl TopNSigma {
    /// Checks `n`: 0 or less, NaN or infinite gives
    /// [`Error::InvalidTopNSigma`] (llama.cpp reads n <= 0 as off, and so
    /// do lm-cli and lm-serve before building the stage).
    pub fn new(n: f32) -> Result<Self> {
        let is_valid = n > 0.0 && n.is_finite();
        Error::check(n, is_valid, |value| Error::InvalidTopNSigma { value }).map(Self)
    }

    /// The number of standard deviations kept below the best logit.
    pub fn n(self) -> f32 {
        self.0
    }
}

impl CandidateFilter for TopNSigma {
    fn apply(&self, candidates: &mut Candidates) {
        let len = candidates.len();
        if len <= 1 {
            return;
        }
        let logits = candidates.gathered_logits();
        let max = f64::from(max_in_lanes(logits));
        let count = len as f64;
        let mean = sum_in_lanes(logits, logits, |z, _| f64::from(z)) / count;
        let variance = sum_in_lanes(logits, logits, |z, _| (f64::from(z) - mean).powi(2)) / count;
        let threshold = max - f64::from(self.0) * variance.sqrt();
        let n_above = logits
            .iter()
            .filter(|&&z| f64::from(z) >= threshold)
            .count();
        let min_keep = candidates.min_keep();
        if n_above >= min_keep {
            candidates.retain(|(_, z)| f64::from(z) >= threshold);
        } else {
            candidates.sort_prefix(min_keep);
            candidates.truncate(min_keep);
        }
    }

    fn stage(&self) -> Stage {
        Stage::TopNSigma
    }
}
