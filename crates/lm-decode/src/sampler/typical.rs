//! Locally typical sampling (Meister, Pimentel, Wiher and Cotterell 2023,
//! "Locally Typical Sampling", TACL; HF's `typical_p`, llama.cpp's
//! `--typical`): keep the tokens whose surprise is closest to the
//! distribution's entropy.
//!
//! ```text
//! H   = -sum_i q_i ln q_i                    (entropy of the candidates)
//! s_i = | -ln q_i - H |                      (how atypical token i is)
//! keep the fewest tokens in order of s_i whose mass exceeds p
//! ```
//!
//! `ln q_i = (z_i - z_max) / T - ln sum_j w_j` is exact from the logits, so
//! the scores need no logarithm; the weights come from one vectorised pass.
//! The ranking by `s_i` is found by partial selection, in rounds of growing
//! size (as top-p's), never by sorting the whole vocabulary.
//!
//! As llama.cpp: the mass must exceed p strictly (`>`, at f32 precision), at
//! least `min_keep` tokens are kept, and p = 1 keeps everything. Ties in
//! `s_i` (tokens of equal logit) rank as the chain's tie rule does, higher
//! logit then lower id; llama.cpp's `std::sort` leaves their order
//! unspecified, so at a tie on the boundary the two may keep different
//! tokens of the same probability.

use super::{CandidateFilter, Candidates};
use crate::error::{Error, Result};
use crate::trace::Stage;
use std::cmp::Ordering;

/// The first partial selection; later rounds take four times as many.
const FIRST_ROUND: usize = 64;

/// Keeps the most typical tokens whose probability mass exceeds `p`.
///
/// ```
/// use lm_decode::sampler::{CandidateFilter, Candidates, Typical};
/// // q = (0.5, 0.3, 0.2): H = 1.0297; the surprises are 0.693, 1.204 and
/// // 1.609, so token 1 is the most typical, then 0, then 2.
/// let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// Typical::new(0.5).unwrap().apply(&mut c);
/// let mut kept: Vec<u32> = c.ids().collect();
/// kept.sort_unstable();
/// assert_eq!(kept, vec![0, 1]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Typical(f32);

impl Typical {
    /// Checks `p`: outside (0, 1] (or NaN) gives [`Error::InvalidTypicalP`].
    pub fn new(p: f32) -> Result<Self> {
        let is_valid = p > 0.0 && p <= 1.0;
        Error::check(p, is_valid, |value| Error::InvalidTypicalP { value }).map(Self)
    }

    /// The probability mass kept.
    pub fn p(self) -> f32 {
        self.0
    }
}

impl CandidateFilter for Typical {
    fn apply(&self, candidates: &mut Candidates) {
        let n = candidates.len();
        let min_keep = candidates.min_keep();
        if self.0 >= 1.0 || n <= min_keep {
            return;
        }
        let t = f64::from(candidates.temperature());
        let max = f64::from(candidates.max_logit());
        let mut ranked = std::mem::take(&mut candidates.ranked);
        let mut kept = std::mem::take(&mut candidates.kept);
        let (entries, weights, total) = candidates.weights();
        if total <= 0.0 {
            (candidates.ranked, candidates.kept) = (ranked, kept);
            return;
        }
        let ln_total = total.ln();
        // ln q_i, and H = -sum q_i ln q_i.
        let log_q = |z: f32| (f64::from(z) - max) / t - ln_total;
        let entropy = -entries
            .iter()
            .zip(weights)
            .map(|(&(_, z), &w)| f64::from(w) / total * log_q(z))
            .filter(|term| term.is_finite())
            .sum::<f64>();
        ranked.clear();
        ranked.extend(
            entries
                .iter()
                .map(|&(_, z)| (-log_q(z) - entropy).abs())
                .zip(0..),
        );
        // Most typical first; ties as the chain breaks them.
        let order = |a: &(f64, u32), b: &(f64, u32)| {
            a.0.total_cmp(&b.0)
                .then_with(|| super::best_first(&entries[a.1 as usize], &entries[b.1 as usize]))
        };
        let n_kept = typical_prefix(&mut ranked, weights, total, self.0, min_keep, order);
        kept.clear();
        kept.resize(n, false);
        for &(_, index) in &ranked[..n_kept] {
            kept[index as usize] = true;
        }
        candidates.ranked = ranked;
        candidates.kept = kept;
        candidates.retain_kept();
        candidates.rebase();
    }

    fn stage(&self) -> Stage {
        Stage::Typical
    }
}

/// How many of the most typical tokens to keep: ranks `ranked` by `order`
/// in rounds (partial selection, then a sort of the new part) until the
/// mass of the ranked prefix exceeds `p` with at least `min_keep` tokens.
fn typical_prefix(
    ranked: &mut [(f64, u32)],
    weights: &[f32],
    total: f64,
    p: f32,
    min_keep: usize,
    order: impl Fn(&(f64, u32), &(f64, u32)) -> Ordering,
) -> usize {
    let n = ranked.len();
    let mut cumulative = 0.0f64;
    let mut n_ranked = 0;
    let mut n_walked = 0;
    while n_ranked < n {
        let n_next = if n_ranked == 0 {
            FIRST_ROUND.min(n)
        } else {
            n_ranked.saturating_mul(4).min(n)
        };
        let tail = &mut ranked[n_ranked..];
        let n_tail = n_next - n_ranked;
        if n_tail < tail.len() {
            tail.select_nth_unstable_by(n_tail - 1, &order);
        }
        tail[..n_tail].sort_unstable_by(&order);
        n_ranked = n_next;
        while n_walked < n_ranked {
            let (_, index) = ranked[n_walked];
            cumulative += f64::from(weights[index as usize]) / total;
            n_walked += 1;
            if (cumulative as f32) > p && n_walked >= min_keep {
                return n_walked;
            }
        }
    }
    n
}
