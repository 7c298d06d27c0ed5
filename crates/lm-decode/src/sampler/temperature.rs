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
//!
//! In the default order temperature comes before every filter, so the
//! candidates start at it. An order that puts it later (llama.cpp's default
//! puts it last) makes it a [`CandidateFilter`] that sets the candidates'
//! temperature where it stands: the filters before it see T = 1. Dynamic
//! temperature ([`DynamicTemperature`]) takes its place the same way.

use super::{CandidateFilter, Candidates, DynamicTemperature};
use crate::error::{Error, Result};
use crate::trace::Stage;
use std::fmt;

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

impl CandidateFilter for Temperature {
    /// Sets the candidates' temperature (removes nothing).
    fn apply(&self, candidates: &mut Candidates) {
        candidates.set_temperature(*self);
    }

    fn stage(&self) -> Stage {
        Stage::Temperature
    }
}

/// Dynamic temperature in the temperature's place: each step sets the
/// temperature [`DynamicTemperature::temperature`] gives around the
/// configured one.
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct DynamicScale {
    temperature: Temperature,
    dynamic: DynamicTemperature,
}

impl DynamicScale {
    pub(crate) fn new(temperature: Temperature, dynamic: DynamicTemperature) -> Self {
        Self {
            temperature,
            dynamic,
        }
    }
}

impl CandidateFilter for DynamicScale {
    fn apply(&self, candidates: &mut Candidates) {
        let t = self
            .dynamic
            .temperature(self.temperature.value(), candidates);
        // The dynamic temperature is finite and at least 0 by construction.
        if let Ok(t) = Temperature::new(t) {
            candidates.set_temperature(t);
        }
    }

    fn stage(&self) -> Stage {
        Stage::Temperature
    }
}

impl fmt::Debug for DynamicScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Dynamic")
            .field(&self.temperature)
            .field(&self.dynamic)
            .finish()
    }
}
