//! Adapters: a model seen through a pointer or with one thing changed.
//!
//! A shared reference, a `Box` or an `Arc` of a model is a model: every
//! method, the default ones included, forwards to the pointee, so a backend's
//! own `forward_batch` is kept. An adapter that changes one thing (a tighter
//! context bound, a count of the positions read) is an [`Adapted`] model with
//! a [`ForwardHook`] that says what it changes; the forwarding is written
//! once, here, and `forward_batch` goes through the hook like `forward`.
//!
//! ```text
//! Adapted { inner, hook } ── forward(state, tokens) ──> hook.before_forward(pos, tokens) ─> inner.forward
//!                         ── forward_batch(rows)    ──> hook.before_batch(n_rows)
//!                                                       hook.before_forward(pos_i, tokens_i) per row
//!                                                       ─> inner.forward_batch
//! ```

use crate::{Error, LanguageModel, Result, Rows, SequenceState, TokenId};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// Implements [`LanguageModel`] for a pointer type by forwarding every
/// method, the defaults included, to the model it points to.
macro_rules! forward_through_pointer {
    ($($pointer:ty),+) => {$(
        impl<M: LanguageModel + ?Sized> LanguageModel for $pointer {
            type State = M::State;

            fn vocab_size(&self) -> usize {
                (**self).vocab_size()
            }

            fn context_length(&self) -> Option<usize> {
                (**self).context_length()
            }

            fn new_state(&self) -> M::State {
                (**self).new_state()
            }

            fn forward(
                &self,
                state: &mut M::State,
                tokens: &[TokenId],
                rows: Rows,
                logits: &mut Vec<f32>,
            ) -> Result<()> {
                (**self).forward(state, tokens, rows, logits)
            }

            fn forward_batch(
                &self,
                states: &mut [M::State],
                tokens: &[&[TokenId]],
                logits: &mut [Vec<f32>],
            ) -> Result<()> {
                (**self).forward_batch(states, tokens, logits)
            }

            fn check_input(&self, pos: usize, tokens: &[TokenId]) -> Result<()> {
                (**self).check_input(pos, tokens)
            }
        }
    )+};
}

forward_through_pointer!(&M, Box<M>, Rc<M>, Arc<M>);

/// What an [`Adapted`] model changes about its inner model. Every method has
/// a default that changes nothing, so a hook says only what it changes.
pub trait ForwardHook {
    /// The context bound the adapted model reports, given the inner one's.
    fn context_length(&self, inner: Option<usize>) -> Option<usize> {
        inner
    }

    /// Sees each sequence's new tokens (at `pos`) before the inner model
    /// reads them, for `forward` and for every row of `forward_batch`;
    /// `model` is the adapted model. An error refuses the call.
    fn before_forward<M: LanguageModel + ?Sized>(
        &self,
        model: &M,
        pos: usize,
        tokens: &[TokenId],
    ) -> Result<()> {
        let _ = (model, pos, tokens);
        Ok(())
    }

    /// Sees each `forward_batch` call (its number of rows) before its rows.
    fn before_batch(&self, n_rows: usize) {
        let _ = n_rows;
    }
}

/// A model with a [`ForwardHook`]: everything forwards to `inner`, with the
/// hook consulted first. [`Bounded`] and [`Counting`] are two of them.
#[derive(Debug, Clone)]
pub struct Adapted<M, H> {
    /// The model being adapted.
    pub inner: M,
    /// What the adapter changes.
    pub hook: H,
}

impl<M: LanguageModel, H: ForwardHook> LanguageModel for Adapted<M, H> {
    type State = M::State;

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn context_length(&self) -> Option<usize> {
        self.hook.context_length(self.inner.context_length())
    }

    fn new_state(&self) -> M::State {
        self.inner.new_state()
    }

    fn forward(
        &self,
        state: &mut M::State,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        self.hook.before_forward(self, state.pos(), tokens)?;
        self.inner.forward(state, tokens, rows, logits)
    }

    fn forward_batch(
        &self,
        states: &mut [M::State],
        tokens: &[&[TokenId]],
        logits: &mut [Vec<f32>],
    ) -> Result<()> {
        check_batch_lengths(states.len(), tokens.len(), logits.len())?;
        self.hook.before_batch(states.len());
        for (state, row_tokens) in states.iter().zip(tokens) {
            self.hook.before_forward(self, state.pos(), row_tokens)?;
        }
        self.inner.forward_batch(states, tokens, logits)
    }
}

/// Checks that a batch has one token slice and one logits buffer per state.
pub(crate) fn check_batch_lengths(n_states: usize, n_tokens: usize, n_logits: usize) -> Result<()> {
    for other in [n_tokens, n_logits] {
        if n_states != other {
            return Err(Error::LengthMismatch {
                left: n_states,
                right: other,
            });
        }
    }
    Ok(())
}

/// The hook of [`Bounded`]: an optional context bound tighter than the
/// model's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextBound {
    /// The bound; `None` changes nothing.
    pub max: Option<usize>,
}

impl ForwardHook for ContextBound {
    fn context_length(&self, inner: Option<usize>) -> Option<usize> {
        match (inner, self.max) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn before_forward<M: LanguageModel + ?Sized>(
        &self,
        model: &M,
        pos: usize,
        tokens: &[TokenId],
    ) -> Result<()> {
        match self.max {
            Some(_) => model.check_input(pos, tokens),
            None => Ok(()),
        }
    }
}

/// A model with an optional tighter context bound (the CLI's
/// `--context-length`): `context_length` reports the smaller bound and longer
/// input is refused with [`Error::ContextExceeded`], so the generation loop
/// stops at it with its context-bound reason.
///
/// ```
/// use lm_core::{Bounded, LanguageModel, Uncached};
/// # use lm_core::{Prefix, Rows, TokenId};
/// # struct Two;
/// # impl LanguageModel for Two {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 2 }
/// #     fn context_length(&self) -> Option<usize> { Some(16) }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], _r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         s.tokens.extend_from_slice(t);
/// #         *l = vec![0.0, 0.0];
/// #         Ok(())
/// #     }
/// # }
/// assert_eq!(Bounded::new(Two, Some(4)).context_length(), Some(4));
/// assert_eq!(Bounded::new(Two, None).context_length(), Some(16));
/// ```
pub type Bounded<M> = Adapted<M, ContextBound>;

impl<M: LanguageModel> Adapted<M, ContextBound> {
    /// Wraps `inner`; `max` of `None` changes nothing.
    pub fn new(inner: M, max: Option<usize>) -> Self {
        Self {
            inner,
            hook: ContextBound { max },
        }
    }
}

/// The hook of [`Counting`]: the positions each sequence read and the rows of
/// each batch, in call order.
#[derive(Debug, Clone, Default)]
pub struct ForwardCounts {
    reads: RefCell<Vec<usize>>,
    batches: RefCell<Vec<usize>>,
}

impl ForwardHook for ForwardCounts {
    fn before_forward<M: LanguageModel + ?Sized>(
        &self,
        _model: &M,
        _pos: usize,
        tokens: &[TokenId],
    ) -> Result<()> {
        self.reads.borrow_mut().push(tokens.len());
        Ok(())
    }

    fn before_batch(&self, n_rows: usize) {
        self.batches.borrow_mut().push(n_rows);
    }
}

/// A model that counts its work: how many positions each read (a `forward`
/// call, or one row of a `forward_batch`) covered, and the rows of each
/// batch. Lesson 001's "3 + 1 + 1 + 1 + 1 = 7 positions with a cache" is
/// what it measures.
///
/// ```
/// use lm_core::{Counting, LanguageModel, Rows};
/// # use lm_core::{Prefix, TokenId};
/// # struct Two;
/// # impl LanguageModel for Two {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 2 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], _r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         s.tokens.extend_from_slice(t);
/// #         *l = vec![0.0, 0.0];
/// #         Ok(())
/// #     }
/// # }
/// let model = Counting::new(Two);
/// let mut state = model.new_state();
/// let mut logits = Vec::new();
/// model.forward(&mut state, &[0, 1, 0], Rows::Last, &mut logits).unwrap();
/// model.forward(&mut state, &[1], Rows::Last, &mut logits).unwrap();
/// assert_eq!(model.calls(), vec![3, 1]);
/// assert_eq!(model.positions(), 4);
/// ```
pub type Counting<M> = Adapted<M, ForwardCounts>;

impl<M: LanguageModel> Adapted<M, ForwardCounts> {
    /// Wraps `inner` with every count at zero.
    pub fn new(inner: M) -> Self {
        Self {
            inner,
            hook: ForwardCounts::default(),
        }
    }

    /// Positions read by each read, in order (a batch counts one per row).
    pub fn calls(&self) -> Vec<usize> {
        self.hook.reads.borrow().clone()
    }

    /// Number of reads so far: the sequential steps of a run.
    pub fn n_calls(&self) -> usize {
        self.hook.reads.borrow().len()
    }

    /// Total positions read.
    pub fn positions(&self) -> usize {
        self.hook.reads.borrow().iter().sum()
    }

    /// Rows of each `forward_batch` call, in order.
    pub fn batches(&self) -> Vec<usize> {
        self.hook.batches.borrow().clone()
    }

    /// Sets every count back to zero.
    pub fn reset_counts(&self) {
        self.hook.reads.borrow_mut().clear();
        self.hook.batches.borrow_mut().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::Probe;
    use std::sync::atomic::Ordering::Relaxed;

    /// Runs a two-row batch (one and three tokens) through `model`.
    fn two_rows<M: LanguageModel>(model: &M) -> Result<Vec<Vec<f32>>> {
        let mut states = vec![model.new_state(), model.new_state()];
        let mut logits = vec![Vec::new(), Vec::new()];
        model.forward_batch(&mut states, &[&[1], &[0, 1, 0]], &mut logits)?;
        Ok(logits)
    }

    #[test]
    fn pointers_forward_the_backends_own_batch() {
        let batched = vec![vec![1.0, 9.0], vec![3.0, 9.0]];
        let model = Probe::default();
        assert_eq!(two_rows(&&model), Ok(batched.clone()));
        assert_eq!(two_rows(&Box::new(Probe::default())), Ok(batched.clone()));
        assert_eq!(two_rows(&Rc::new(Probe::default())), Ok(batched.clone()));
        let shared = Arc::new(Probe::default());
        assert_eq!(two_rows(&shared), Ok(batched));
        assert_eq!(shared.n_batches.load(Relaxed), 1);
        let boxed: Box<Probe> = Box::default();
        assert_eq!(
            <Box<Probe> as LanguageModel>::check_input(&boxed, 4, &[0]),
            Err(Error::ContextExceeded { len: 5, max: 4 })
        );
    }

    #[test]
    fn bounded_reports_the_smaller_bound_and_refuses_beyond_it() {
        let bounded = Bounded::new(Probe::default(), Some(3));
        assert_eq!(bounded.context_length(), Some(3));
        let mut state = bounded.new_state();
        let mut logits = Vec::new();
        assert_eq!(
            bounded.forward(&mut state, &[0; 4], Rows::Last, &mut logits),
            Err(Error::ContextExceeded { len: 4, max: 3 })
        );
        assert_eq!(state.pos(), 0, "a refused read leaves the state alone");
        assert!(
            bounded
                .forward(&mut state, &[0, 1, 0], Rows::Last, &mut logits)
                .is_ok()
        );
        assert_eq!(
            Bounded::new(Probe::default(), None).context_length(),
            Some(4)
        );
        assert_eq!(
            Bounded::new(Probe::default(), Some(20)).context_length(),
            Some(4)
        );
    }

    #[test]
    fn bounded_batches_reach_the_backend_and_respect_the_bound() {
        let bounded = Bounded::new(Probe::default(), Some(2));
        assert_eq!(
            two_rows(&bounded),
            Err(Error::ContextExceeded { len: 3, max: 2 }),
            "the three-token row is beyond the bound of 2"
        );
        assert_eq!(bounded.inner.n_batches.load(Relaxed), 0);
        let roomy = Bounded::new(Probe::default(), Some(3));
        assert_eq!(two_rows(&roomy), Ok(vec![vec![1.0, 9.0], vec![3.0, 9.0]]));
        assert_eq!(roomy.inner.n_batches.load(Relaxed), 1);
    }

    #[test]
    fn counting_counts_reads_and_batch_rows() {
        let model = Counting::new(Probe::default());
        let mut state = model.new_state();
        let mut logits = Vec::new();
        model
            .forward(&mut state, &[1, 1], Rows::Last, &mut logits)
            .unwrap();
        assert_eq!(
            two_rows(&model),
            Ok(vec![vec![1.0, 9.0], vec![3.0, 9.0]]),
            "the batch goes through the adapter to the backend's own batch"
        );
        assert_eq!(model.calls(), vec![2, 1, 3]);
        assert_eq!(model.n_calls(), 3);
        assert_eq!(model.positions(), 6);
        assert_eq!(model.batches(), vec![2]);
        assert_eq!(model.inner.n_batches.load(Relaxed), 1);
        model.reset_counts();
        assert_eq!((model.calls(), model.batches()), (vec![], vec![]));
    }

    #[test]
    fn a_batch_of_mismatched_lengths_is_refused_before_any_count() {
        let model = Counting::new(Probe::default());
        let mut states = vec![model.new_state()];
        let mut logits = vec![Vec::new(), Vec::new()];
        assert_eq!(
            model.forward_batch(&mut states, &[&[1]], &mut logits),
            Err(Error::LengthMismatch { left: 1, right: 2 })
        );
        assert_eq!((model.calls(), model.batches()), (vec![], vec![]));
    }
}
