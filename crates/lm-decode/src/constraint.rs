//! Structured output in the loop: the [`OutputConstraint`] a
//! [`crate::GenerationConfig`] carries, and what a row does with it each
//! turn.
//!
//! ```text
//! after each appended token:  state.advance(token)
//!                             mask = state.fill_allowed() + end tokens if state.is_accepting()
//!                             mask empty of all but end tokens and accepting? -> stop: ConstraintComplete
//! next turn:                  the sampler masks the logits (after penalties, before temperature)
//! ```
//!
//! The mask is ready before the model's next row arrives, so it costs the
//! same whichever policy chooses (greedy, sampling with filters, a drafted
//! token checked by speculative decoding: a forbidden draft has policy
//! probability 0 and is rejected).

use crate::error::{Error, Result};
use crate::sampler::Sampler;
use lm_core::{Constraint, ConstraintState, TokenId, TokenMask};
use std::fmt;
use std::sync::Arc;

/// A compiled constraint, shared by every row that uses it; equal to
/// another only when it is the same one.
#[derive(Clone)]
pub struct OutputConstraint(Arc<dyn Constraint>);

impl OutputConstraint {
    /// Shares `constraint` with every row.
    pub fn new(constraint: impl Constraint + 'static) -> Self {
        Self(Arc::new(constraint))
    }

    /// The constraint.
    pub fn get(&self) -> &dyn Constraint {
        &*self.0
    }
}

impl From<Arc<dyn Constraint>> for OutputConstraint {
    fn from(constraint: Arc<dyn Constraint>) -> Self {
        Self(constraint)
    }
}

impl PartialEq for OutputConstraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for OutputConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One row's place in the constraint's language.
pub(crate) struct ConstraintRow {
    state: Box<dyn ConstraintState>,
}

impl ConstraintRow {
    /// Starts the constraint for a row of a model with `vocab_size` tokens
    /// and installs its empty mask in the sampler.
    pub(crate) fn start(
        constraint: &OutputConstraint,
        vocab_size: usize,
        sampler: &mut Sampler,
    ) -> Result<Self> {
        let row = Self::begin(constraint, vocab_size)?;
        sampler.set_allowed(Some(TokenMask::new(vocab_size)));
        Ok(row)
    }

    /// Starts the constraint for a model with `vocab_size` tokens.
    pub(crate) fn begin(constraint: &OutputConstraint, vocab_size: usize) -> Result<Self> {
        let n = constraint.get().vocab_size();
        if n != vocab_size {
            return Err(Error::ConstraintVocabulary {
                constraint: n,
                model: vocab_size,
            });
        }
        Ok(Self {
            state: constraint.get().start()?,
        })
    }

    /// An independent copy (a beam's child).
    pub(crate) fn fork(&self) -> Self {
        Self {
            state: self.state.fork(),
        }
    }

    /// Moves past a chosen token that is not an end token.
    pub(crate) fn advance(&mut self, token: TokenId) -> Result<()> {
        Ok(self.state.advance(token)?)
    }

    /// Fills the mask for the next turn (the sampler's): the tokens the
    /// state allows, plus the end tokens when it is accepting. True when the
    /// output is complete: accepting, and nothing but an end could follow.
    pub(crate) fn prepare(&mut self, mask: &mut TokenMask, end_tokens: &[TokenId]) -> Result<bool> {
        mask.clear();
        self.state.fill_allowed(mask)?;
        let accepting = self.state.is_accepting()?;
        if accepting {
            if mask.is_empty() {
                return Ok(true);
            }
            end_tokens.iter().for_each(|&id| mask.allow(id));
        } else if mask.is_empty() {
            return Err(Error::ConstraintAllowsNothing);
        }
        Ok(false)
    }
}
