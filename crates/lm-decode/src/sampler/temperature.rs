//! Temperature: divides the logits before the softmax (lesson 000,
//! "The mathematics: logits, softmax and temperature").
//!
//! ```text
//! p_i = exp(z_i / T) / sum_j exp(z_j / T)
//! ```
//!
//! T = 0 is the limit T -> 0: greedy decoding (argmax, lowest id on ties),
//! taken exactly, with no threshold below which a small T counts as zero.
//! T = +inf is the other limit: uniform over the tokens not masked.

use crate::error::{Error, Result};

/// A validated temperature: a number >= 0 (+inf allowed), never NaN.
///
/// ```
/// use lm_decode::sampler::Temperature;
/// assert!(Temperature::new(0.0).unwrap().is_greedy());
/// assert!(Temperature::new(-0.5).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Temperature(f32);

impl Temperature {
    /// Checks `value`: negative or NaN gives lm-core's
    /// [`lm_core::Error::InvalidTemperature`], the error the softmax gives.
    pub fn new(value: f32) -> Result<Self> {
        let is_valid = value >= 0.0; // false for NaN
        Error::check(value, is_valid, |value| {
            lm_core::Error::InvalidTemperature { value }.into()
        })
        .map(Self)
    }

    /// The temperature.
    pub fn value(self) -> f32 {
        self.0
    }

    /// True for T = 0: the choice is the argmax and ignores the seed.
    pub fn is_greedy(self) -> bool {
        self.0 == 0.0
    }
}
