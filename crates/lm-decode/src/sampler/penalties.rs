//! Penalties on tokens already present in the history (prompt and generated
//! tokens), applied to the raw logits before temperature:
//!
//! ```text
//! repetition (Keskar et al. 2019, as in HF transformers), for c_i > 0:
//!     z_i > 0  ->  z_i / penalty        z_i <= 0  ->  z_i * penalty
//! presence  (OpenAI):  z_i -= presence   once, if c_i > 0
//! frequency (OpenAI):  z_i -= c_i * frequency
//! ```
//!
//! where `c_i` counts token i in the history. A penalty above 1 (repetition)
//! or above 0 (presence, frequency) discourages repeats; below encourages.

use super::{History, LogitTransform};
use crate::error::{Error, Result};
use lm_core::TokenId;

/// How often each token occurs in a history, reusable without allocation.
///
/// ```
/// use lm_decode::sampler::TokenCounts;
/// let mut counts = TokenCounts::default();
/// counts.count(&[2, 0, 2], 4).unwrap();
/// assert_eq!(counts.get(2), 2);
/// assert_eq!(counts.present(), &[2, 0]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct TokenCounts {
    counts: Vec<u32>,
    present: Vec<TokenId>,
}

impl TokenCounts {
    /// No history.
    pub(crate) const EMPTY: Self = Self {
        counts: Vec::new(),
        present: Vec::new(),
    };

    /// Counts `history` over a vocabulary of `vocab_size`, forgetting the
    /// previous history; an id beyond the vocabulary is an error.
    pub fn count(&mut self, history: &[TokenId], vocab_size: usize) -> Result<()> {
        for &id in &self.present {
            if let Some(c) = self.counts.get_mut(id as usize) {
                *c = 0;
            }
        }
        self.present.clear();
        if self.counts.len() != vocab_size {
            self.counts.clear();
            self.counts.resize(vocab_size, 0);
        }
        for &id in history {
            let count = self
                .counts
                .get_mut(id as usize)
                .ok_or(lm_core::Error::TokenOutOfRange { id, vocab_size })?;
            if *count == 0 {
                self.present.push(id);
            }
            *count = count.saturating_add(1);
        }
        Ok(())
    }

    /// How often `id` occurs (0 for an id beyond the vocabulary).
    pub fn get(&self, id: TokenId) -> u32 {
        self.counts.get(id as usize).copied().unwrap_or(0)
    }

    /// The distinct tokens of the history, in order of first occurrence.
    pub fn present(&self) -> &[TokenId] {
        &self.present
    }

    /// Applies `edit` to the logit of every token present in the history,
    /// with its count: the one loop of the history-aware transforms.
    pub fn edit_present(&self, logits: &mut [f32], mut edit: impl FnMut(u32, &mut f32)) {
        for &id in &self.present {
            if let Some(z) = logits.get_mut(id as usize) {
                edit(self.get(id), z);
            }
        }
    }
}

/// HF's repetition penalty: divides positive logits and multiplies negative
/// ones of tokens present in the history.
///
/// ```
/// use lm_decode::sampler::{History, LogitTransform, RepetitionPenalty, TokenCounts};
/// let mut counts = TokenCounts::default();
/// let history = [0, 1];
/// counts.count(&history, 3).unwrap();
/// let mut logits = [2.0, -1.0, 4.0];
/// RepetitionPenalty::new(2.0).unwrap().apply(&mut logits, &History::new(&history, &counts));
/// assert_eq!(logits, [1.0, -2.0, 4.0]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepetitionPenalty(f32);

impl RepetitionPenalty {
    /// Checks the penalty: not positive and finite gives
    /// [`Error::InvalidRepetitionPenalty`] (1 changes nothing).
    pub fn new(penalty: f32) -> Result<Self> {
        let is_valid = penalty > 0.0 && penalty.is_finite();
        Error::check(penalty, is_valid, |value| Error::InvalidRepetitionPenalty {
            value,
        })
        .map(Self)
    }
}

impl LogitTransform for RepetitionPenalty {
    fn apply(&self, logits: &mut [f32], history: &History<'_>) {
        history.counts.edit_present(logits, |_, z| {
            *z = if *z > 0.0 { *z / self.0 } else { *z * self.0 }
        });
    }
}

/// OpenAI's presence penalty: subtracts a constant once from every token
/// present in the history.
///
/// ```
/// use lm_decode::sampler::{History, LogitTransform, PresencePenalty, TokenCounts};
/// let mut counts = TokenCounts::default();
/// let history = [1, 1];
/// counts.count(&history, 2).unwrap();
/// let mut logits = [1.0, 1.0];
/// PresencePenalty::new(0.5).unwrap().apply(&mut logits, &History::new(&history, &counts));
/// assert_eq!(logits, [1.0, 0.5]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PresencePenalty(f32);

impl PresencePenalty {
    /// Checks the penalty: NaN or infinite gives [`Error::InvalidPresencePenalty`].
    pub fn new(penalty: f32) -> Result<Self> {
        finite(penalty, |value| Error::InvalidPresencePenalty { value }).map(Self)
    }
}

impl LogitTransform for PresencePenalty {
    fn apply(&self, logits: &mut [f32], history: &History<'_>) {
        history.counts.edit_present(logits, |_, z| *z -= self.0);
    }
}

/// OpenAI's frequency penalty: subtracts `count * penalty` from every token.
///
/// ```
/// use lm_decode::sampler::{FrequencyPenalty, History, LogitTransform, TokenCounts};
/// let mut counts = TokenCounts::default();
/// let history = [1, 1, 0];
/// counts.count(&history, 2).unwrap();
/// let mut logits = [1.0, 1.0];
/// FrequencyPenalty::new(0.25).unwrap().apply(&mut logits, &History::new(&history, &counts));
/// assert_eq!(logits, [0.75, 0.5]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrequencyPenalty(f32);

impl FrequencyPenalty {
    /// Checks the penalty: NaN or infinite gives [`Error::InvalidFrequencyPenalty`].
    pub fn new(penalty: f32) -> Result<Self> {
        finite(penalty, |value| Error::InvalidFrequencyPenalty { value }).map(Self)
    }
}

impl LogitTransform for FrequencyPenalty {
    fn apply(&self, logits: &mut [f32], history: &History<'_>) {
        history
            .counts
            .edit_present(logits, |count, z| *z -= count as f32 * self.0);
    }
}

/// `penalty` if it is finite, else the error `invalid` makes of it.
fn finite(penalty: f32, invalid: impl FnOnce(f32) -> Error) -> Result<f32> {
    Error::check(penalty, penalty.is_finite(), invalid)
}
