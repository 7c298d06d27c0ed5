//! Fixed per-token adjustments of the raw logits: an additive logit bias
//! (OpenAI's `logit_bias`) and banned tokens (logit set to -inf, so the
//! token has probability 0 under every later transform).

use super::{History, LogitTransform};
use crate::error::{Error, Result};
use lm_core::TokenId;

/// Adds a finite bias to the logits of chosen tokens.
///
/// ```
/// use lm_decode::sampler::{History, LogitBias, LogitTransform};
/// let bias = LogitBias::new(vec![(1, -2.0), (0, 0.5)]).unwrap();
/// let mut logits = [1.0, 1.0, 1.0];
/// bias.apply(&mut logits, &History::default());
/// assert_eq!(logits, [1.5, -1.0, 1.0]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LogitBias(Vec<(TokenId, f32)>);

impl LogitBias {
    /// Checks every bias: NaN or infinite gives [`Error::InvalidLogitBias`].
    /// Ids are checked against the vocabulary when the sampler first sees
    /// logits ([`lm_core::Error::TokenOutOfRange`]).
    pub fn new(biases: Vec<(TokenId, f32)>) -> Result<Self> {
        if let Some(&(token, value)) = biases.iter().find(|(_, b)| !b.is_finite()) {
            return Err(Error::InvalidLogitBias { token, value });
        }
        Ok(Self(biases))
    }

    /// The `(token, bias)` pairs.
    pub fn biases(&self) -> &[(TokenId, f32)] {
        &self.0
    }
}

impl LogitTransform for LogitBias {
    fn apply(&self, logits: &mut [f32], _history: &History<'_>) {
        for &(id, bias) in &self.0 {
            if let Some(z) = logits.get_mut(id as usize) {
                *z += bias;
            }
        }
    }

    fn check_vocabulary(&self, vocab_size: usize) -> Result<()> {
        Ok(lm_core::check_token_ids(
            self.0.iter().map(|&(id, _)| id),
            vocab_size,
        )?)
    }
}

/// Tokens that may never be chosen: their logits become -inf.
///
/// ```
/// use lm_decode::sampler::{BannedTokens, History, LogitTransform};
/// let mut logits = [1.0, 2.0];
/// BannedTokens::new(vec![1]).apply(&mut logits, &History::default());
/// assert_eq!(logits, [1.0, f32::NEG_INFINITY]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BannedTokens(Vec<TokenId>);

impl BannedTokens {
    /// Bans `tokens`; ids are checked against the vocabulary when the sampler
    /// first sees logits.
    pub fn new(tokens: Vec<TokenId>) -> Self {
        Self(tokens)
    }
}

impl LogitTransform for BannedTokens {
    fn apply(&self, logits: &mut [f32], _history: &History<'_>) {
        for &id in &self.0 {
            if let Some(z) = logits.get_mut(id as usize) {
                *z = f32::NEG_INFINITY;
            }
        }
    }

    fn check_vocabulary(&self, vocab_size: usize) -> Result<()> {
        Ok(lm_core::check_token_ids(
            self.0.iter().copied(),
            vocab_size,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_bias_is_rejected_with_its_token() {
        assert_eq!(
            LogitBias::new(vec![(0, 1.0), (3, f32::NAN)])
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err("logit bias for token 3 must be finite, got NaN".to_owned())
        );
        assert!(matches!(
            LogitBias::new(vec![(2, f32::INFINITY)]),
            Err(Error::InvalidLogitBias { token: 2, .. })
        ));
    }
}
