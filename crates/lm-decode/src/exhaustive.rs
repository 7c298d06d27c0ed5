//! Scoring every continuation of n tokens (lesson 001, "Where the greedy run
//! is overtaken": 7 candidates at each of 4 steps make 7^4 = 2,401
//! continuations, and the greedy one ranks fourth).
//!
//! The continuations form a tree; each internal node is one forward pass on a
//! clone of its parent's state, so the cost is 1 + V + ... + V^(n-1) passes of
//! one token (after the prompt), never a re-read of the prefix.

use crate::{Error, Result};
use lm_core::{LanguageModel, Rows, TokenId};
use std::cmp::Ordering;

/// One continuation and its chain-rule log-probability under the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Continuation {
    /// The n tokens.
    pub tokens: Vec<TokenId>,
    /// `sum_t ln p(x_t | prompt, x_<t)` at T = 1.
    pub logprob: f64,
}

/// Every continuation ranked, and where greedy decoding lands among them.
#[derive(Debug, Clone, PartialEq)]
pub struct Enumeration {
    /// All `V^n` continuations, most probable first (ties: lower tokens first).
    pub continuations: Vec<Continuation>,
    /// The greedy continuation (argmax at each step, lowest id on ties).
    pub greedy: Vec<TokenId>,
    /// Its rank in `continuations`, counted from 1.
    pub greedy_rank: usize,
}

/// Enumerates every continuation of `n_steps` tokens after `prompt`, refusing
/// with [`Error::TooManyContinuations`] when `vocab^n_steps` exceeds `limit`.
///
/// ```
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// # struct Fixed;
/// # impl LanguageModel for Fixed {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 2 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], _r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         s.tokens.extend_from_slice(t);
/// #         *l = vec![1.0, 0.0];
/// #         Ok(())
/// #     }
/// # }
/// let all = lm_decode::enumerate_continuations(&Fixed, &[0], 3, 1000).unwrap();
/// assert_eq!(all.continuations.len(), 8);
/// assert_eq!(all.continuations[0].tokens, vec![0, 0, 0]);
/// assert_eq!(all.greedy_rank, 1);
/// assert!(lm_decode::enumerate_continuations(&Fixed, &[0], 10, 1000).is_err());
/// ```
pub fn enumerate_continuations<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    n_steps: usize,
    limit: usize,
) -> Result<Enumeration> {
    let vocab_size = model.vocab_size();
    let too_many = Error::TooManyContinuations {
        vocab_size,
        n_steps,
        limit,
    };
    let n_total = u32::try_from(n_steps)
        .ok()
        .and_then(|n| vocab_size.checked_pow(n))
        .ok_or_else(|| too_many.clone())?;
    if n_total > limit {
        return Err(too_many);
    }
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if let Some(max) = model.context_length() {
        let len = prompt.len().saturating_add(n_steps);
        if len > max {
            return Err(lm_core::Error::ContextExceeded { len, max }.into());
        }
    }
    let mut search = Search {
        model,
        n_steps,
        continuations: Vec::with_capacity(n_total),
        greedy: Vec::with_capacity(n_steps),
        prefix: Vec::with_capacity(n_steps),
    };
    if n_steps == 0 {
        search.continuations.push(Continuation {
            tokens: Vec::new(),
            logprob: 0.0,
        });
    } else {
        let mut state = model.new_state();
        let mut logits = Vec::new();
        model.forward(&mut state, prompt, Rows::Last, &mut logits)?;
        search.visit(&state, &logits, 0.0, true)?;
    }
    let Search {
        mut continuations,
        greedy,
        ..
    } = search;
    continuations.sort_by(best_first);
    let greedy_rank = continuations
        .iter()
        .position(|c| c.tokens == greedy)
        .map_or(0, |index| index + 1);
    Ok(Enumeration {
        continuations,
        greedy,
        greedy_rank,
    })
}

/// Higher log-probability first, then the lower token sequence.
fn best_first(a: &Continuation, b: &Continuation) -> Ordering {
    b.logprob
        .total_cmp(&a.logprob)
        .then_with(|| a.tokens.cmp(&b.tokens))
}

struct Search<'m, M> {
    model: &'m M,
    n_steps: usize,
    continuations: Vec<Continuation>,
    greedy: Vec<TokenId>,
    prefix: Vec<TokenId>,
}

impl<M: LanguageModel> Search<'_, M> {
    /// Visits the node reached by `self.prefix`, whose next-token logits are
    /// `logits`; `on_greedy` says whether the prefix is the greedy one.
    fn visit(
        &mut self,
        state: &M::State,
        logits: &[f32],
        logprob: f64,
        on_greedy: bool,
    ) -> Result<()> {
        let vocab_size = self.model.vocab_size();
        if logits.len() != vocab_size {
            return Err(Error::LogitsLength {
                len: logits.len(),
                vocab_size,
            });
        }
        let logprobs = lm_core::log_softmax(logits, 1.0)?;
        if on_greedy {
            self.greedy.push(lm_core::argmax(logits)?);
        }
        let greedy_token = self.greedy.get(self.prefix.len()).copied();
        let is_leaf_level = self.prefix.len() + 1 == self.n_steps;
        let mut child_logits = Vec::new();
        for (token, &lp) in logprobs.iter().enumerate() {
            let token = token as TokenId;
            let total = logprob + f64::from(lp);
            self.prefix.push(token);
            if is_leaf_level {
                self.continuations.push(Continuation {
                    tokens: self.prefix.clone(),
                    logprob: total,
                });
            } else {
                let mut child = state.clone();
                self.model
                    .forward(&mut child, &[token], Rows::Last, &mut child_logits)?;
                let child_on_greedy = on_greedy && greedy_token == Some(token);
                self.visit(&child, &child_logits, total, child_on_greedy)?;
            }
            self.prefix.pop();
        }
        Ok(())
    }
}
