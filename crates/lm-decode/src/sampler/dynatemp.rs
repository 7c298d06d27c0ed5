//! Dynamic temperature (kalomaze's entropy-based dynamic temperature, 2023,
//! which llama.cpp's header cites with Zhu et al. 2024, "Hot or Cold?
//! Adaptive Temperature Sampling for Code Generation with Large Language
//! Models", AAAI, arXiv 2309.02772; llama.cpp's `--dynatemp-range` and
//! `--dynatemp-exp`, `llama_sampler_init_temp_ext`): the flatter the
//! distribution, the hotter the step.
//!
//! ```text
//! H     = -sum_i q_i ln q_i                 (q: the candidates at T = 1)
//! T_dyn = T_min + (T_max - T_min) (H / ln n)^exponent
//! T_min = max(0, T - range),   T_max = T + range,   n = the number of candidates
//! ```
//!
//! As llama.cpp: range 0 is the plain temperature T, and so is a single
//! candidate (its probability is 1 at any temperature). The entropy is taken
//! in f64 from the candidates' logits (llama.cpp sums f32 probabilities),
//! and `n` counts the candidates in play: llama.cpp's array also counts the
//! tokens a bias masked to -inf, which lm-decode's stages never see.

use super::{Candidates, sum_in_lanes};
use crate::error::{Error, Result};

/// A temperature that moves within `range` of the set one with the
/// candidates' normalised entropy, raised to `exponent`.
///
/// ```
/// use lm_decode::sampler::{Candidates, DynamicTemperature};
/// // q = (0.5, 0.3, 0.2): H = 1.0297 nats of ln 3 = 1.0986, 0.937 of the
/// // maximum, so T = 1 with range 0.5 becomes 0.5 + 1.0 * 0.937 = 1.437.
/// let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
/// let mut c = Candidates::from_logits(&logits, 1.0).unwrap();
/// let dynatemp = DynamicTemperature::new(0.5, 1.0).unwrap();
/// assert_eq!(format!("{:.3}", dynatemp.temperature(1.0, &mut c)), "1.437");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamicTemperature {
    range: f32,
    exponent: f32,
}

impl DynamicTemperature {
    /// Checks both settings: `range` and `exponent` must be finite and at
    /// least 0 ([`Error::InvalidDynatempRange`],
    /// [`Error::InvalidDynatempExponent`]).
    pub fn new(range: f32, exponent: f32) -> Result<Self> {
        let is_valid = |x: f32| x.is_finite() && x >= 0.0;
        let range = Error::check(range, is_valid(range), |value| {
            Error::InvalidDynatempRange { value }
        })?;
        let exponent = Error::check(exponent, is_valid(exponent), |value| {
            Error::InvalidDynatempExponent { value }
        })?;
        Ok(Self { range, exponent })
    }

    /// How far the temperature may move either way.
    pub fn range(self) -> f32 {
        self.range
    }

    /// The exponent the normalised entropy is raised to.
    pub fn exponent(self) -> f32 {
        self.exponent
    }

    /// The temperature this step's candidates get, around `temperature`,
    /// from the entropy of their distribution at the temperature they are
    /// at (1 in the chain, where dynamic temperature takes temperature's
    /// place, as llama.cpp's `temp_ext` reads the logits it is given). Stays
    /// within `[max(0, T - range), T + range]`; an infinite `temperature`
    /// stays as it is.
    pub fn temperature(self, temperature: f32, candidates: &mut Candidates) -> f32 {
        let n = candidates.len();
        if self.range <= 0.0 || n <= 1 || !temperature.is_finite() {
            return temperature;
        }
        let min_t = f64::from((temperature - self.range).max(0.0));
        let max_t = f64::from(temperature + self.range);
        let normalised = (entropy(candidates) / (n as f64).ln()).clamp(0.0, 1.0);
        let t = min_t + (max_t - min_t) * normalised.powf(f64::from(self.exponent));
        (t as f32).clamp(min_t as f32, max_t as f32)
    }
}

/// `-sum q ln q` of the candidates' distribution, in nats:
/// `ln S - sum_i w_i s_i / S` with `s_i = (z_i - z_max) / T` and
/// `w_i = exp(s_i)` from one vectorised pass ([`Candidates::weights`]).
fn entropy(candidates: &mut Candidates) -> f64 {
    let t = f64::from(candidates.temperature());
    let max = f64::from(candidates.max_logit());
    let (logits, weights, total) = candidates.logits_and_weights();
    if total <= 0.0 || t == 0.0 {
        return 0.0;
    }
    let weighted = sum_in_lanes(logits, weights, |z, w| f64::from(w) * (f64::from(z) - max)) / t;
    total.ln() - weighted / total
}
