//! The trait every backend implements, and the per-sequence state it keeps.
//!
//! A model maps a token prefix to next-token logits. Weights are immutable and
//! shared (`&self`); everything that belongs to one sequence (the tokens read
//! so far, a KV cache, the position `pos`) lives in a cloneable
//! [`LanguageModel::State`]. That split is what lets one model serve many
//! sequences at once:
//!
//! ```text
//!   weights (&M, shared) ──┐
//!   state A: pos 5, cache ─┼─ forward(state, new tokens) ─> logits rows
//!   state B = A.clone() ───┘   (beam search and batch rows fork a state)
//! ```
//!
//! `forward` takes only the tokens that are new to the state and returns one
//! logits row per token ([`Rows::All`], for scoring a text in one pass) or just
//! the last one ([`Rows::Last`], for generation). Lesson 001's uncached
//! reference, which re-reads the whole prefix at every step, is [`Uncached`];
//! adapters that change less (a bound, a count) are in `adapter.rs`.

use crate::{Error, Result, TokenId};

/// Which logits rows a forward pass writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// One row: the distribution after the last token fed (generation).
    Last,
    /// One row per token fed, in order (scoring a known text).
    All,
}

/// The state of one sequence: the tokens a model has read and whatever it
/// keeps about them (a KV cache, n-gram history). Cloning forks the sequence.
pub trait SequenceState: Clone {
    /// How many tokens this state has read: the position the next token takes.
    fn pos(&self) -> usize;

    /// Forgets every token from `pos` on, so the sequence can continue from an
    /// earlier point (editing a token invalidates the cache from there).
    /// A `pos` at or beyond the current one changes nothing.
    fn truncate(&mut self, pos: usize);
}

/// A next-token model: a token prefix in, logits over the vocabulary out.
///
/// Implementations check their input and return [`Error::TokenOutOfRange`],
/// [`Error::ContextExceeded`] or [`Error::EmptyInput`] instead of panicking;
/// [`LanguageModel::check_input`] does those checks.
pub trait LanguageModel {
    /// Per-sequence state (cache and position); see [`SequenceState`].
    type State: SequenceState;

    /// Number of tokens in the vocabulary: the length of one logits row.
    fn vocab_size(&self) -> usize;

    /// The longest prefix the model can read, if it has a bound.
    fn context_length(&self) -> Option<usize>;

    /// A fresh state at position 0.
    fn new_state(&self) -> Self::State;

    /// Reads `tokens` at positions `state.pos()..` and writes logits into
    /// `logits` (resized to `vocab_size` for [`Rows::Last`], or
    /// `tokens.len() * vocab_size` row-major for [`Rows::All`]).
    fn forward(
        &self,
        state: &mut Self::State,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> Result<()>;

    /// Serves several sequences at once: `tokens[i]` is read into `states[i]`
    /// and the last logits row of row `i` written to `logits[i]`. The default
    /// runs the rows one by one; a backend may batch them, but the result of
    /// a row never depends on the other rows.
    fn forward_batch(
        &self,
        states: &mut [Self::State],
        tokens: &[&[TokenId]],
        logits: &mut [Vec<f32>],
    ) -> Result<()> {
        crate::adapter::check_batch_lengths(states.len(), tokens.len(), logits.len())?;
        for ((state, &tokens), logits) in states.iter_mut().zip(tokens).zip(logits) {
            self.forward(state, tokens, Rows::Last, logits)?;
        }
        Ok(())
    }

    /// Checks that `tokens` is non-empty, every id is in the vocabulary, and
    /// reading them at `pos` stays within the context bound.
    fn check_input(&self, pos: usize, tokens: &[TokenId]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyInput);
        }
        check_token_ids(tokens.iter().copied(), self.vocab_size())?;
        if let Some(max) = self.context_length() {
            let len = pos.saturating_add(tokens.len());
            if len > max {
                return Err(Error::ContextExceeded { len, max });
            }
        }
        Ok(())
    }
}

/// Checks that every id is in a vocabulary of `vocab_size`: the first one
/// beyond it is [`Error::TokenOutOfRange`]. One check for every place a token
/// id arrives from outside (model input, end tokens, biases, bans, histories).
///
/// ```
/// use lm_core::{Error, check_token_ids};
/// assert_eq!(check_token_ids([0, 3], 4), Ok(()));
/// assert_eq!(check_token_ids([0, 4, 5], 4), Err(Error::TokenOutOfRange { id: 4, vocab_size: 4 }));
/// ```
pub fn check_token_ids(ids: impl IntoIterator<Item = TokenId>, vocab_size: usize) -> Result<()> {
    match ids.into_iter().find(|&id| id as usize >= vocab_size) {
        Some(id) => Err(Error::TokenOutOfRange { id, vocab_size }),
        None => Ok(()),
    }
}

/// Any model without its cache: every call re-reads the whole prefix from a
/// fresh state, as lesson 001's reference implementation does. Slow on
/// purpose; it is the path the cached one is checked against, and what
/// `--no-cache` runs.
#[derive(Debug, Clone)]
pub struct Uncached<M>(pub M);

/// The state of any model that keeps just the tokens it has read: a model
/// that recomputes from the whole prefix (every [`Uncached`] model, a bigram
/// or n-gram table, a test double) needs nothing else, so it takes this
/// instead of writing its own [`SequenceState`].
///
/// ```
/// use lm_core::{Prefix, SequenceState};
/// let mut state = Prefix { tokens: vec![3, 1, 4] };
/// assert_eq!(state.pos(), 3);
/// state.truncate(1);
/// assert_eq!(state.tokens, vec![3]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefix {
    /// Every token read, in order.
    pub tokens: Vec<TokenId>,
}

impl Prefix {
    /// One `forward` of a model whose logits after a prefix are a function of
    /// that prefix alone (a bigram table, a test double): checks `tokens` with
    /// [`LanguageModel::check_input`], appends them, and writes the rows
    /// `rows` asks for into `logits`, `row(prefix, logits)` appending the row
    /// that follows `prefix`. Refused input leaves the state alone.
    ///
    /// ```
    /// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
    /// # struct Echo;
    /// # impl LanguageModel for Echo {
    /// #     type State = Prefix;
    /// #     fn vocab_size(&self) -> usize { 2 }
    /// #     fn context_length(&self) -> Option<usize> { None }
    /// #     fn new_state(&self) -> Prefix { Prefix::default() }
    /// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
    /// #         s.read(self, t, r, l, |p, l| l.extend([p.len() as f32, 0.0]))
    /// #     }
    /// # }
    /// let mut state = Prefix::default();
    /// let mut logits = Vec::new();
    /// let row_after = |prefix: &[TokenId], out: &mut Vec<f32>| out.extend([prefix.len() as f32, 0.0]);
    /// state.read(&Echo, &[1, 0], Rows::All, &mut logits, row_after).unwrap();
    /// assert_eq!(logits, [1.0, 0.0, 2.0, 0.0]);
    /// state.read(&Echo, &[1, 1], Rows::Last, &mut logits, row_after).unwrap();
    /// assert_eq!((logits, state.tokens), (vec![4.0, 0.0], vec![1, 0, 1, 1]));
    /// ```
    pub fn read<M: LanguageModel + ?Sized>(
        &mut self,
        model: &M,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
        mut row: impl FnMut(&[TokenId], &mut Vec<f32>),
    ) -> Result<()> {
        model.check_input(self.pos(), tokens)?;
        let first_row = match rows {
            Rows::All => self.tokens.len(),
            Rows::Last => self.tokens.len() + tokens.len() - 1,
        };
        self.tokens.extend_from_slice(tokens);
        logits.clear();
        for end in first_row + 1..=self.tokens.len() {
            row(&self.tokens[..end], logits);
        }
        Ok(())
    }
}

impl SequenceState for Prefix {
    fn pos(&self) -> usize {
        self.tokens.len()
    }

    fn truncate(&mut self, pos: usize) {
        self.tokens.truncate(pos);
    }
}

impl<M: LanguageModel> LanguageModel for Uncached<M> {
    type State = Prefix;

    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }

    fn context_length(&self) -> Option<usize> {
        self.0.context_length()
    }

    fn new_state(&self) -> Prefix {
        Prefix::default()
    }

    fn forward(
        &self,
        state: &mut Prefix,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        self.check_input(state.pos(), tokens)?;
        let old_len = state.tokens.len();
        state.tokens.extend_from_slice(tokens);
        let mut fresh = self.0.new_state();
        let result = self.0.forward(&mut fresh, &state.tokens, rows, logits);
        if result.is_err() {
            state.tokens.truncate(old_len);
            return result;
        }
        if rows == Rows::All {
            // Keep only the rows of the tokens that were new to this state.
            logits.drain(..old_len * self.vocab_size());
        }
        Ok(())
    }
}

/// Turns token ids back into text; used for stop strings and traces, so a
/// decoding crate needs no tokenizer of its own.
pub trait Detokenize {
    /// The text of `ids` read as one span (invalid UTF-8 replaced).
    fn decode(&self, ids: &[TokenId]) -> String;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A two-token model whose logits encode the position and the last token
    /// read, so adapters can be checked row by row. Its own `forward_batch`
    /// marks each row's second logit with 9 and counts the batches, so a test
    /// can tell whether a batch reached it.
    #[derive(Default)]
    pub(crate) struct Probe {
        pub(crate) n_batches: AtomicUsize,
    }

    impl LanguageModel for Probe {
        type State = Prefix;
        fn vocab_size(&self) -> usize {
            2
        }
        fn context_length(&self) -> Option<usize> {
            Some(4)
        }
        fn new_state(&self) -> Prefix {
            Prefix::default()
        }
        fn forward(
            &self,
            state: &mut Prefix,
            tokens: &[TokenId],
            rows: Rows,
            logits: &mut Vec<f32>,
        ) -> Result<()> {
            state.read(self, tokens, rows, logits, |prefix, row| {
                let last = prefix.last().copied().unwrap_or_default();
                row.extend([prefix.len() as f32, last as f32]);
            })
        }
        fn forward_batch(
            &self,
            states: &mut [Prefix],
            tokens: &[&[TokenId]],
            logits: &mut [Vec<f32>],
        ) -> Result<()> {
            self.n_batches.fetch_add(1, Ordering::Relaxed);
            for ((state, &tokens), logits) in states.iter_mut().zip(tokens).zip(logits) {
                self.forward(state, tokens, Rows::Last, logits)?;
                logits[1] = 9.0;
            }
            Ok(())
        }
    }

    #[test]
    fn uncached_rows_are_those_of_the_new_tokens() {
        let model = Uncached(Probe::default());
        let mut state = model.new_state();
        let mut logits = Vec::new();
        model
            .forward(&mut state, &[1, 0], Rows::All, &mut logits)
            .unwrap();
        assert_eq!(logits, vec![1.0, 1.0, 2.0, 0.0]);
        model
            .forward(&mut state, &[1], Rows::All, &mut logits)
            .unwrap();
        assert_eq!(logits, vec![3.0, 1.0]);
        model
            .forward(&mut state, &[0], Rows::Last, &mut logits)
            .unwrap();
        assert_eq!(logits, vec![4.0, 0.0]);
        assert_eq!(state.tokens, vec![1, 0, 1, 0]);
    }

    #[test]
    fn input_checks_name_the_problem() {
        let model = Uncached(Probe::default());
        let mut state = model.new_state();
        let mut logits = Vec::new();
        assert_eq!(
            model.forward(&mut state, &[], Rows::Last, &mut logits),
            Err(Error::EmptyInput)
        );
        assert_eq!(
            model.forward(&mut state, &[2], Rows::Last, &mut logits),
            Err(Error::TokenOutOfRange {
                id: 2,
                vocab_size: 2
            })
        );
        assert_eq!(
            model.forward(&mut state, &[0; 5], Rows::Last, &mut logits),
            Err(Error::ContextExceeded { len: 5, max: 4 })
        );
        assert_eq!(state.pos(), 0, "a failed call leaves the state as it was");
    }

    #[test]
    fn batch_rows_equal_single_rows() {
        // Uncached keeps the default `forward_batch`: row by row.
        let model = Uncached(Probe::default());
        let mut states = vec![model.new_state(), model.new_state()];
        let mut logits = vec![Vec::new(), Vec::new()];
        model
            .forward_batch(&mut states, &[&[1, 1], &[0]], &mut logits)
            .unwrap();
        assert_eq!(logits, vec![vec![2.0, 1.0], vec![1.0, 0.0]]);
        assert!(
            model
                .forward_batch(&mut states, &[&[1]], &mut logits)
                .is_err()
        );
    }
}
