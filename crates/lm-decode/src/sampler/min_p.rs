//! Min-p: keep the tokens whose probability is at least `min_p` times that of
//! the most probable token (Nguyen et al. 2024).
//!
//! The ratio `p_i / p_max = exp((z_i - z_max) / T)` needs no normalisation
//! and no sort; it is compared in log space, `(z_i - z_max) / T >= ln min_p`,
//! at f32 precision like top-p.

use super::{CandidateFilter, Candidates};
use crate::error::{Error, Result};
use crate::trace::Stage;

/// Keeps candidates with `p_i >= min_p * p_max`; 0 keeps all, 1 keeps the
/// tokens tied with the best. When fewer than [`Candidates::min_keep`] pass,
/// the best `min_keep` stay (llama.cpp's rule).
///
/// ```
/// use lm_decode::sampler::{CandidateFilter, Candidates, MinP};
/// // Ratios to the best: 1, 0.5, 0.25.
/// let logits = [0.0, 0.5f32.ln(), 0.25f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// MinP::new(0.5).unwrap().apply(&mut c);
/// assert_eq!(c.ids().collect::<Vec<_>>(), vec![0, 1]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinP(f32);

impl MinP {
    /// Checks the ratio: outside [0, 1] (or NaN) gives [`Error::InvalidMinP`].
    pub fn new(ratio: f32) -> Result<Self> {
        let is_valid = (0.0..=1.0).contains(&ratio);
        Error::check(ratio, is_valid, |value| Error::InvalidMinP { value }).map(Self)
    }

    /// The minimum ratio to the best token's probability.
    pub fn ratio(self) -> f32 {
        self.0
    }
}

impl CandidateFilter for MinP {
    fn apply(&self, candidates: &mut Candidates) {
        // p_i / p_max >= ratio  <=>  (z_i - z_max) / T >= ln(ratio): no
        // exponential, and exact up to the final f32 comparison.
        let log_ratio = f64::from(self.0).ln() as f32;
        let max = f64::from(candidates.max_logit());
        let t = f64::from(candidates.temperature());
        let passes = |z: f32| ((f64::from(z) - max) / t) as f32 >= log_ratio;
        let min_keep = candidates.min_keep();
        if min_keep > 1 {
            let n_passing = candidates
                .entries()
                .iter()
                .filter(|&&(_, z)| passes(z))
                .count();
            if n_passing < min_keep {
                candidates.sort_prefix(min_keep);
                candidates.truncate(min_keep);
                return;
            }
        }
        candidates.retain(|(_, z)| passes(z));
    }

    fn stage(&self) -> Stage {
        Stage::MinP
    }
}
