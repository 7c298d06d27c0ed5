//! Top-p (nucleus): keep the smallest set of most probable tokens whose
//! probability reaches p (Holtzman et al. 2020; lesson 002).
//!
//! The set is found without sorting the whole vocabulary: the best 64
//! candidates are selected ([`Candidates::sort_prefix`]) and sorted; if their
//! mass falls short of p the next candidates are selected from the rest, four
//! times as many each round. A confident distribution costs one small sort.
//!
//! The cumulative probability is summed in f64 and compared with p at f32
//! precision, the precision p is given in: probabilities (0.5, 0.3, 0.2) with
//! p = 0.8 keep two tokens, with p = 0.81 three.

use super::{CandidateFilter, Candidates};
use crate::error::{Error, Result};
use crate::trace::Stage;

/// The first partial selection; later rounds take four times as many.
const FIRST_ROUND: usize = 64;

/// Keeps the smallest prefix (by probability) whose mass reaches `p` and
/// holds at least [`Candidates::min_keep`] tokens (llama.cpp's rule); never
/// empty, since the most probable token is always kept.
///
/// ```
/// use lm_decode::sampler::{CandidateFilter, Candidates, TopP};
/// let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// TopP::new(0.8).unwrap().apply(&mut c);
/// assert_eq!(c.ids().collect::<Vec<_>>(), vec![0, 1]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopP(f32);

impl TopP {
    /// Checks `p`: outside (0, 1] (or NaN) gives [`Error::InvalidTopP`].
    pub fn new(p: f32) -> Result<Self> {
        Error::check(p, p > 0.0 && p <= 1.0, |value| Error::InvalidTopP { value }).map(Self)
    }

    /// The probability mass kept.
    pub fn p(self) -> f32 {
        self.0
    }
}

impl CandidateFilter for TopP {
    fn apply(&self, candidates: &mut Candidates) {
        let n = candidates.len();
        let min_keep = candidates.min_keep();
        let total = candidates.total_weight();
        if n <= min_keep || self.0 >= 1.0 || total <= 0.0 {
            return;
        }
        let mut cumulative = 0.0f64;
        let last = candidates.find_ranked(FIRST_ROUND, |rank, weight| {
            cumulative += weight;
            (cumulative / total) as f32 >= self.0 && rank + 1 >= min_keep
        });
        if let Some(last) = last {
            candidates.truncate(last + 1);
        }
    }

    fn stage(&self) -> Stage {
        Stage::TopP
    }
}
