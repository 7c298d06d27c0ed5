//! Mirostat (Basu, Ramachandran, Keskar and Varshney 2021, "Mirostat: a
//! neural text decoding algorithm that directly controls perplexity", ICLR;
//! llama.cpp's `--mirostat 1|2`, `llama_sampler_init_mirostat` with m = 100
//! and `_mirostat_v2`): truncate the distribution so that the text's surprise
//! stays near a target `tau` (in bits), steering a running bound `mu` by the
//! surprise of each chosen token.
//!
//! ```text
//! v1: s   = sum_i t_i b_i / sum_i t_i^2,  t_i = ln((i+2)/(i+1)),  b_i = ln(q_i / q_(i+1))
//!           over the m = 100 most probable tokens (the Zipf exponent's estimate)
//!     eps = s - 1,   k = (eps 2^mu / (1 - N^-eps))^(1/s)         (N: the vocabulary size)
//!     keep the max(floor(k), 1) most probable tokens
//! v2: keep the tokens whose surprise -log2 q_i is at most mu (at least one)
//! both: mu <- mu - eta (-log2 p - tau),   mu_0 = 2 tau
//! ```
//!
//! `q` is the candidates' distribution at their temperature, `p` the chosen
//! token's probability renormalised over what mirostat kept. The sampler
//! keeps `mu` per sequence and draws the token itself; this stage only
//! truncates and updates.
//!
//! As llama.cpp, with these differences: v1's `b_i` is `(z_i - z_(i+1)) / T`
//! from the logits in f64 (llama.cpp takes the log of f32 probabilities,
//! infinite once one underflows) and `k` is computed in f64; where `k` does
//! not fit an `int` (a flat head, a large `mu`) llama.cpp's conversion is
//! undefined (x86 gives `INT_MIN`, so it keeps one token) and here it
//! saturates (all tokens). At least [`Candidates::min_keep`] tokens are kept
//! (llama.cpp's mirostat has no `min_keep`), the best ones; ties at v1's
//! boundary go to the lower id (llama.cpp's sort leaves them unspecified).

use super::Candidates;
use crate::error::{Error, Result};

/// How many of the most probable tokens v1 estimates the Zipf exponent from
/// (llama.cpp's common sampler passes 100, the paper's choice).
const M: usize = 100;

/// Mirostat v1 or v2 with its target surprise `tau` and learning rate `eta`.
///
/// ```
/// use lm_decode::sampler::{Candidates, Mirostat};
/// // q = (0.5, 0.3, 0.2): surprises 1, 1.74 and 2.32 bits. With tau = 1 the
/// // bound starts at 2: v2 keeps tokens 0 and 1.
/// let mirostat = Mirostat::new(2, 1.0, 0.1).unwrap().unwrap();
/// let mu = mirostat.initial_mu();
/// let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// mirostat.truncate(&mut c, mu, 3);
/// assert_eq!(c.ids().collect::<Vec<_>>(), vec![0, 1]);
/// // Token 0 chosen: p = 0.5 / 0.8 = 0.625, surprise 0.678 bits, below tau,
/// // so the bound grows: 2 - 0.1 (0.678 - 1) = 2.032.
/// assert_eq!(format!("{:.3}", mirostat.next_mu(mu, 0.625)), "2.032");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mirostat {
    version: u8,
    tau: f32,
    eta: f32,
}

impl Mirostat {
    /// Checks the settings: version 0 is off (`Ok(None)`), other versions
    /// than 1 and 2 give [`Error::InvalidMirostat`]; `tau` and `eta` must be
    /// finite and at least 0 ([`Error::InvalidMirostatTau`],
    /// [`Error::InvalidMirostatEta`]), checked even when off.
    pub fn new(version: u8, tau: f32, eta: f32) -> Result<Option<Self>> {
        let version = Error::check(version, version <= 2, |value| Error::InvalidMirostat {
            value,
        })?;
        let is_valid = |x: f32| x.is_finite() && x >= 0.0;
        let tau = Error::check(tau, is_valid(tau), |value| Error::InvalidMirostatTau {
            value,
        })?;
        let eta = Error::check(eta, is_valid(eta), |value| Error::InvalidMirostatEta {
            value,
        })?;
        Ok((version != 0).then_some(Self { version, tau, eta }))
    }

    /// 1 or 2.
    pub fn version(self) -> u8 {
        self.version
    }

    /// The target surprise, in bits.
    pub fn tau(self) -> f32 {
        self.tau
    }

    /// The learning rate of the bound.
    pub fn eta(self) -> f32 {
        self.eta
    }

    /// The running bound's first value: 2 tau.
    pub fn initial_mu(self) -> f32 {
        2.0 * self.tau
    }

    /// Removes the candidates mirostat would not sample at bound `mu` (the
    /// candidates are at their temperature already; `vocab_size` is the
    /// model's, which v1's formula uses). Keeps at least one, and at least
    /// [`Candidates::min_keep`]: the most probable.
    pub fn truncate(self, candidates: &mut Candidates, mu: f32, vocab_size: usize) {
        let min_keep = candidates.min_keep();
        if candidates.len() <= min_keep {
            return;
        }
        if candidates.temperature() == 0.0 {
            // The greedy limit: only the best tokens have any probability.
            candidates.sort_prefix(min_keep);
            candidates.truncate(min_keep);
            return;
        }
        if self.version == 1 {
            let k = v1_count(candidates, mu, vocab_size).max(min_keep);
            candidates.keep_best(k);
        } else {
            v2_truncate(candidates, mu, min_keep);
        }
    }

    /// The bound after a step that chose a token of probability `p` under
    /// the truncated, renormalised policy: `mu - eta (-log2 p - tau)`.
    pub fn next_mu(self, mu: f32, p: f32) -> f32 {
        if self.eta == 0.0 {
            return mu;
        }
        let surprise = -f64::from(p).log2();
        (f64::from(mu) - f64::from(self.eta) * (surprise - f64::from(self.tau))) as f32
    }
}

/// v1's number of tokens to keep: `floor(k)`, at least 1, from the Zipf
/// exponent estimated on the `M` best candidates (sorted on the way).
fn v1_count(candidates: &mut Candidates, mu: f32, vocab_size: usize) -> usize {
    candidates.sort_prefix(M);
    let t = f64::from(candidates.temperature());
    let top = &candidates.entries()[..M.min(candidates.len())];
    let (mut sum_tb, mut sum_tt) = (0.0f64, 0.0f64);
    for (i, pair) in top.windows(2).enumerate() {
        let t_i = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b_i = (f64::from(pair[0].1) - f64::from(pair[1].1)) / t;
        sum_tb += t_i * b_i;
        sum_tt += t_i * t_i;
    }
    // One candidate: 0 / 0, NaN, so one token (as llama.cpp).
    let s_hat = sum_tb / sum_tt;
    let eps = s_hat - 1.0;
    let n = vocab_size as f64;
    let k = (eps * f64::from(mu).exp2() / (1.0 - n.powf(-eps))).powf(1.0 / s_hat);
    // `as` truncates toward 0 and saturates (NaN is 0).
    (k as usize).max(1)
}

/// v2: keeps the candidates whose surprise `-log2 q` is at most `mu`, or the
/// `min_keep` best when fewer pass.
fn v2_truncate(candidates: &mut Candidates, mu: f32, min_keep: usize) {
    let mut kept = std::mem::take(&mut candidates.kept);
    let (_, weights, total) = candidates.weights();
    // -log2(w / total) <= mu  <=>  w >= total 2^-mu; a weight of 0 has
    // infinite surprise, whatever the bound.
    let threshold = total * (-f64::from(mu)).exp2();
    kept.clear();
    kept.extend(
        weights
            .iter()
            .map(|&w| w > 0.0 && f64::from(w) >= threshold),
    );
    let n_kept = kept.iter().filter(|&&keep| keep).count();
    candidates.kept = kept;
    if n_kept >= min_keep {
        candidates.retain_kept();
    } else {
        candidates.kept.clear();
        candidates.sort_prefix(min_keep);
        candidates.truncate(min_keep);
    }
}
