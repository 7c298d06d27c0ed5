//! Top-k: keep the k most probable tokens (lesson 002, "Sampling strategies").
//!
//! Partial selection ([`Candidates::keep_best`]) finds the k best in one
//! linear scan and sorts only those k (or, for a large k, partitions the
//! row once and sorts nothing); the vocabulary is never sorted whole.

use super::{CandidateFilter, Candidates};
use crate::error::{Error, Result};
use crate::trace::Stage;

/// Keeps the `k` highest-logit candidates (ties: the lower id first), or
/// [`Candidates::min_keep`] when that is more (HF's rule).
///
/// ```
/// use lm_decode::sampler::{CandidateFilter, Candidates, TopK};
/// let mut c = Candidates::from_logits(&[0.0, 3.0, 1.0, 2.0], 1.0).unwrap();
/// TopK::new(2).unwrap().apply(&mut c);
/// assert_eq!(c.ids().collect::<Vec<_>>(), vec![1, 3]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopK(usize);

impl TopK {
    /// Checks `k`: 0 gives [`Error::InvalidTopK`].
    pub fn new(k: usize) -> Result<Self> {
        Error::check(k, k >= 1, |value| Error::InvalidTopK { value }).map(Self)
    }

    /// The number of tokens kept.
    pub fn k(self) -> usize {
        self.0
    }
}

impl CandidateFilter for TopK {
    fn apply(&self, candidates: &mut Candidates) {
        candidates.keep_best(self.0.max(candidates.min_keep()));
    }

    fn stage(&self) -> Stage {
        Stage::TopK
    }
}
