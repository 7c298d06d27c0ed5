//! No repeated n-grams (HF's `no_repeat_ngram_size`,
//! `NoRepeatNGramLogitsProcessor`, after fairseq's beam search): a token that
//! would complete an n-gram already present in the history is banned.
//!
//! ```text
//! h = h_0 .. h_{L-1}, the history (prompt included);  s = h_{L-n+1} .. h_{L-1}
//! ban h_{i+n-1}  for every i <= L - n  with  h_i .. h_{i+n-2} = s
//! ```
//!
//! n = 1 bans every token of the history; a history shorter than n bans
//! nothing. As HF for decoder-only models the whole history counts, the
//! prompt included. Instead of HF's table of every n-gram, one scan compares
//! each position's (n - 1)-token prefix with the history's last n - 1 tokens:
//! no allocation, and most positions end at their first token.

use super::{History, LogitTransform};
use crate::error::{Error, Result};
use lm_core::TokenId;

/// Bans the tokens that would repeat an n-gram of the history.
///
/// ```
/// use lm_decode::sampler::{History, LogitTransform, NoRepeatNgram, TokenCounts};
/// // The history ends in (5, 6), which 7 followed before: 7 would repeat
/// // the trigram (5, 6, 7).
/// let tokens = [5, 6, 7, 1, 5, 6];
/// let counts = TokenCounts::default();
/// let mut logits = [0.5f32; 8];
/// NoRepeatNgram::new(3).unwrap().apply(&mut logits, &History::new(&tokens, &counts));
/// assert_eq!(logits[7], f32::NEG_INFINITY);
/// assert_eq!(logits.iter().filter(|z| z.is_finite()).count(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NoRepeatNgram(usize);

impl NoRepeatNgram {
    /// Checks the size: 0 gives [`Error::InvalidNoRepeatNgramSize`].
    pub fn new(n: usize) -> Result<Self> {
        Error::check(n, n >= 1, |value| Error::InvalidNoRepeatNgramSize { value }).map(Self)
    }

    /// The length of the n-grams that may occur only once.
    pub fn n(self) -> usize {
        self.0
    }

    /// Calls `ban` with each token that would complete an n-gram already in
    /// `tokens`, once per earlier occurrence (so a token may come more than
    /// once), oldest first.
    pub fn for_each_banned(self, tokens: &[TokenId], mut ban: impl FnMut(TokenId)) {
        let n = self.0;
        let Some(n_starts) = tokens.len().checked_sub(n).map(|last| last + 1) else {
            return;
        };
        let suffix = &tokens[tokens.len() - (n - 1)..];
        for start in 0..n_starts {
            let (prefix, next) = (&tokens[start..start + n - 1], tokens[start + n - 1]);
            if prefix == suffix {
                ban(next);
            }
        }
    }
}

impl LogitTransform for NoRepeatNgram {
    fn apply(&self, logits: &mut [f32], history: &History<'_>) {
        // An id beyond the row names no logit (the sampler checks histories).
        self.for_each_banned(history.tokens, |id| {
            if let Some(z) = logits.get_mut(id as usize) {
                *z = f32::NEG_INFINITY;
            }
        });
    }
}
