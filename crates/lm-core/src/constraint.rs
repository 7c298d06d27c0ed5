//! Structured output as one more stage of the policy: a [`Constraint`] (a
//! JSON Schema, a regular expression, a grammar, compiled for one
//! vocabulary) starts a [`ConstraintState`] per sequence, which says which
//! tokens may come next ([`TokenMask`]) and advances with the chosen one.
//!
//! ```text
//! logits ─> penalties, bias ─> constraint mask (forbidden: probability 0) ─> temperature ─> filters ─> choice
//!                                      ▲                                                              │
//!                                      └──────────────── advance(chosen token) ◄──────────────────────┘
//! ```
//!
//! The constraint knows nothing of end tokens: the generation loop allows
//! them exactly when the state is accepting (the output so far is complete),
//! and stops on its own when the state is accepting and allows nothing
//! more. lm-decode applies it; an engine (the facade's llguidance one, or a
//! hand-written set of allowed strings in a test) implements it.

use crate::{Error, Result, TokenId};
use std::fmt;

/// A set of token ids below a vocabulary size: one bit per id, 32 to a word
/// (the layout llguidance's masks use, so an engine copies words).
///
/// ```
/// use lm_core::TokenMask;
/// let mut mask = TokenMask::new(40);
/// mask.allow(3);
/// mask.allow(39);
/// assert!(mask.is_allowed(39) && !mask.is_allowed(4));
/// assert!(!mask.is_allowed(1000), "beyond the vocabulary nothing is allowed");
/// assert_eq!(mask.count(), 2);
/// assert_eq!(mask.iter().collect::<Vec<_>>(), vec![3, 39]);
/// ```
#[derive(Clone, PartialEq, Eq, Default)]
pub struct TokenMask {
    words: Vec<u32>,
    vocab_size: usize,
}

impl TokenMask {
    /// An empty set over a vocabulary of `vocab_size` ids.
    pub fn new(vocab_size: usize) -> Self {
        Self {
            words: vec![0; vocab_size.div_ceil(32)],
            vocab_size,
        }
    }

    /// The vocabulary size the mask covers.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Empties the set, keeping its vocabulary size.
    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Adds `id` (an id beyond the vocabulary is left out: never allowed).
    pub fn allow(&mut self, id: TokenId) {
        if (id as usize) < self.vocab_size {
            self.words[id as usize / 32] |= 1 << (id % 32);
        }
    }

    /// Removes `id` (nothing happens beyond the vocabulary).
    pub fn forbid(&mut self, id: TokenId) {
        if (id as usize) < self.vocab_size {
            self.words[id as usize / 32] &= !(1 << (id % 32));
        }
    }

    /// Whether `id` is in the set (never beyond the vocabulary).
    pub fn is_allowed(&self, id: TokenId) -> bool {
        (id as usize) < self.vocab_size && self.words[id as usize / 32] & (1 << (id % 32)) != 0
    }

    /// How many ids are in the set.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// True when no id is in the set.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The ids in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = TokenId> + '_ {
        (0..)
            .zip(&self.words)
            .flat_map(|(word_idx, &word): (u32, _)| {
                let mut bits = word;
                std::iter::from_fn(move || {
                    (bits != 0).then(|| {
                        let bit = bits.trailing_zeros();
                        bits &= bits - 1;
                        word_idx * 32 + bit
                    })
                })
            })
    }

    /// Replaces the set by `words`, 32 ids each (bit `i % 32` of word
    /// `i / 32` is id `i`: the layout of llguidance's masks), so an engine
    /// copies a whole mask at once. Words past the vocabulary, and bits
    /// past its size, are ignored; missing words are empty.
    pub fn copy_from_words(&mut self, words: &[u32]) {
        let n = words.len().min(self.words.len());
        self.words[..n].copy_from_slice(&words[..n]);
        self.words[n..].fill(0);
        let tail_bits = self.vocab_size % 32;
        if let (Some(last), true) = (self.words.last_mut(), tail_bits != 0) {
            *last &= (1 << tail_bits) - 1;
        }
    }

    /// Sets every logit of a forbidden token to -inf.
    pub fn apply_to(&self, logits: &mut [f32]) {
        for (word_idx, chunk) in logits.chunks_mut(32).enumerate() {
            let word = self.words.get(word_idx).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (bit, z) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *z = f32::NEG_INFINITY;
                }
            }
        }
    }
}

impl fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TokenMask({} of {} allowed)",
            self.count(),
            self.vocab_size
        )
    }
}

/// A language of allowed outputs compiled for one vocabulary: the shared,
/// immutable part (as a model's weights), from which each sequence starts
/// its own [`ConstraintState`].
pub trait Constraint: fmt::Debug + Send + Sync {
    /// The vocabulary size the constraint was compiled for (the model's).
    fn vocab_size(&self) -> usize;

    /// A fresh state at the start of the output.
    fn start(&self) -> Result<Box<dyn ConstraintState>>;
}

/// Where one sequence is in a [`Constraint`]'s language.
pub trait ConstraintState: Send {
    /// Fills `mask` (cleared first, sized to the vocabulary) with the tokens
    /// that can continue a valid output. End tokens are not the state's
    /// business: the loop allows them when [`ConstraintState::is_accepting`].
    fn fill_allowed(&mut self, mask: &mut TokenMask) -> Result<()>;

    /// Moves past `token`, which the last mask allowed; a token the state
    /// cannot take is [`Error::TokenNotAllowed`].
    fn advance(&mut self, token: TokenId) -> Result<()>;

    /// True when the output so far is complete (an end token may follow).
    fn is_accepting(&mut self) -> Result<bool>;

    /// An independent copy (beam search forks a sequence).
    fn fork(&self) -> Box<dyn ConstraintState>;
}

/// A constraint that allows exactly one of a fixed list of token sequences:
/// the independent, brute-force twin of a grammar engine for tests (and a
/// working example of the trait).
///
/// ```
/// use lm_core::{Constraint, SequenceChoice, TokenMask};
/// let choice = SequenceChoice::new(10, vec![vec![1, 2], vec![1, 3, 4]]).unwrap();
/// let mut state = choice.start().unwrap();
/// let mut mask = TokenMask::new(10);
/// state.fill_allowed(&mut mask).unwrap();
/// assert_eq!(mask.iter().collect::<Vec<_>>(), vec![1]);
/// state.advance(1).unwrap();
/// state.fill_allowed(&mut mask).unwrap();
/// assert_eq!(mask.iter().collect::<Vec<_>>(), vec![2, 3]);
/// state.advance(2).unwrap();
/// assert!(state.is_accepting().unwrap());
/// ```
#[derive(Debug, Clone)]
pub struct SequenceChoice {
    vocab_size: usize,
    sequences: std::sync::Arc<[Vec<TokenId>]>,
}

impl SequenceChoice {
    /// The constraint "one of `sequences`" over `vocab_size` ids.
    pub fn new(vocab_size: usize, sequences: Vec<Vec<TokenId>>) -> Result<Self> {
        crate::check_token_ids(sequences.iter().flatten().copied(), vocab_size)?;
        Ok(Self {
            vocab_size,
            sequences: sequences.into(),
        })
    }
}

impl Constraint for SequenceChoice {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn start(&self) -> Result<Box<dyn ConstraintState>> {
        Ok(Box::new(SequenceChoiceState {
            choice: self.clone(),
            read: Vec::new(),
        }))
    }
}

/// The tokens read so far against a [`SequenceChoice`].
#[derive(Debug, Clone)]
struct SequenceChoiceState {
    choice: SequenceChoice,
    read: Vec<TokenId>,
}

impl ConstraintState for SequenceChoiceState {
    fn fill_allowed(&mut self, mask: &mut TokenMask) -> Result<()> {
        mask.clear();
        for sequence in self.choice.sequences.iter() {
            if sequence.len() > self.read.len() && sequence.starts_with(&self.read) {
                mask.allow(sequence[self.read.len()]);
            }
        }
        Ok(())
    }

    fn advance(&mut self, token: TokenId) -> Result<()> {
        self.read.push(token);
        if self
            .choice
            .sequences
            .iter()
            .any(|sequence| sequence.starts_with(&self.read))
        {
            return Ok(());
        }
        self.read.pop();
        Err(Error::TokenNotAllowed { id: token })
    }

    fn is_accepting(&mut self) -> Result<bool> {
        Ok(self.choice.sequences.contains(&self.read))
    }

    fn fork(&self) -> Box<dyn ConstraintState> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_applies_minus_infinity_to_exactly_the_forbidden_ids() {
        // 70 ids: three words, the last partial; brute force per id.
        let allowed = [0u32, 5, 31, 32, 63, 64, 69];
        let mut mask = TokenMask::new(70);
        allowed.iter().for_each(|&id| mask.allow(id));
        let mut logits: Vec<f32> = (0..70).map(|i| i as f32).collect();
        mask.apply_to(&mut logits);
        for (id, &z) in logits.iter().enumerate() {
            let expected = if allowed.contains(&(id as u32)) {
                id as f32
            } else {
                f32::NEG_INFINITY
            };
            assert_eq!(z, expected, "id {id}");
        }
        assert_eq!(mask.count(), allowed.len());
        assert_eq!(mask.iter().collect::<Vec<_>>(), allowed);
        mask.forbid(32);
        assert!(!mask.is_allowed(32));
        // Bits past the vocabulary are dropped, missing words are empty.
        mask.copy_from_words(&[u32::MAX, 1, u32::MAX]);
        assert_eq!(
            mask.iter().collect::<Vec<_>>(),
            [(0..32).collect(), vec![32], (64..70).collect()].concat()
        );
        mask.copy_from_words(&[2]);
        assert_eq!(mask.iter().collect::<Vec<_>>(), vec![1]);
        mask.clear();
        assert!(mask.is_empty());
    }

    #[test]
    fn a_full_word_leaves_its_logits_alone() {
        let mut mask = TokenMask::new(64);
        (0..64).for_each(|id| mask.allow(id));
        let mut logits = vec![1.5; 64];
        mask.apply_to(&mut logits);
        assert!(logits.iter().all(|&z| z == 1.5));
    }

    #[test]
    fn a_sequence_choice_refuses_a_token_off_every_sequence() {
        let choice = SequenceChoice::new(5, vec![vec![1, 2]]).unwrap();
        let mut state = choice.start().unwrap();
        assert_eq!(state.advance(3), Err(Error::TokenNotAllowed { id: 3 }));
        state.advance(1).unwrap();
        assert!(!state.is_accepting().unwrap());
        let mut fork = state.fork();
        fork.advance(2).unwrap();
        assert!(fork.is_accepting().unwrap());
        assert!(!state.is_accepting().unwrap(), "the fork is independent");
        assert_eq!(
            SequenceChoice::new(5, vec![vec![9]]).err(),
            Some(Error::TokenOutOfRange {
                id: 9,
                vocab_size: 5
            })
        );
    }
}
