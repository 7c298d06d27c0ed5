//! The last link of the chain: turning the policy distribution into one token.
//!
//! Selection takes the uniform draw `u` as an argument (llama2.c's `coin`), so
//! a test can feed lesson 000's numbers by hand and a caller owns randomness.

use crate::error::Result;
use lm_core::TokenId;

/// How a token is chosen from the policy distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Selector {
    /// The most probable token, lowest id on ties; the draw is ignored.
    Greedy,
    /// Inverse CDF: walk the tokens in id order and take the first at which
    /// the running total exceeds `u` (lesson 000).
    Sample,
}

impl Selector {
    /// Chooses from `probs` (one entry per token) with the draw `u` in [0, 1).
    pub(crate) fn choose(self, probs: &[f32], u: f64) -> Result<TokenId> {
        Ok(match self {
            Self::Greedy => lm_core::argmax(probs)?,
            Self::Sample => lm_core::sample_inverse_cdf(probs, u)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lesson_000_draw_095_lands_on_blue_and_greedy_ignores_it() {
        let p = [0.665, 0.245, 0.090];
        assert_eq!(Selector::Sample.choose(&p, 0.95).unwrap(), 2);
        assert_eq!(Selector::Greedy.choose(&p, 0.95).unwrap(), 0);
    }
}
