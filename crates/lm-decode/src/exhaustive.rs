//! Scoring every continuation of n tokens (lesson 001, "Where the greedy run
//! is overtaken": 7 candidates at each of 4 steps make 7^4 = 2,401
//! continuations, and the greedy one ranks fourth).
//!
//! The continuations form a tree; each internal node is one forward pass on a
//! clone of its parent's state, so the cost is 1 + V + ... + V^(n-1) passes of
//! one token (after the prompt), never a re-read of the prefix.
//!
//! Memory is sized by what is kept, never by `V^n` alone:
//! [`enumerate_best`] keeps the `n_best` best in a heap (the greedy rank is
//! counted, not looked up), and keeping all of them reserves with
//! `try_reserve`, so a count too large for memory is
//! [`Error::ContinuationsOutOfMemory`] rather than an abort.

use crate::error::{Error, Result};
use crate::rank::{BestFirst, WorstOnTop};
use lm_core::{LanguageModel, Rows, TokenId};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One continuation and its chain-rule log-probability under the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Continuation {
    /// The n tokens.
    pub tokens: Vec<TokenId>,
    /// `sum_t ln p(x_t | prompt, x_<t)` at T = 1.
    pub logprob: f64,
}

/// Every continuation ranked (or the best of them), and where greedy
/// decoding lands among them.
#[derive(Debug, Clone, PartialEq)]
pub struct Enumeration {
    /// The continuations kept (all `V^n`, or the `n_best` best), most
    /// probable first (ties: lower tokens first).
    pub continuations: Vec<Continuation>,
    /// How many continuations were scored: `V^n`.
    pub n_total: usize,
    /// The greedy continuation (argmax at each step, lowest id on ties).
    pub greedy: Vec<TokenId>,
    /// Its log-probability.
    pub greedy_logprob: f64,
    /// Its rank among all `n_total` continuations, counted from 1.
    pub greedy_rank: usize,
}

/// Enumerates every continuation of `n_steps` tokens after `prompt`, refusing
/// with [`Error::TooManyContinuations`] when `vocab^n_steps` exceeds `limit`,
/// and keeping them all ([`enumerate_best`] keeps the best few).
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
    enumerate_best(model, prompt, n_steps, limit, None)
}

/// [`enumerate_continuations`] keeping only the `n_best` most probable
/// continuations (`None`: all), in a heap of that size, so memory follows
/// what is shown, not `V^n`; the greedy rank and the total count cover
/// every continuation.
///
/// ```
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// # struct Fixed;
/// # impl LanguageModel for Fixed {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 3 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], _r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         s.tokens.extend_from_slice(t);
/// #         *l = vec![2.0, 1.0, 0.0];
/// #         Ok(())
/// #     }
/// # }
/// let best = lm_decode::enumerate_best(&Fixed, &[0], 2, 1000, Some(2)).unwrap();
/// assert_eq!(best.n_total, 9);
/// assert_eq!(best.continuations.len(), 2);
/// assert_eq!(best.continuations[0].tokens, vec![0, 0]);
/// assert_eq!(best.continuations[1].tokens, vec![0, 1]);
/// ```
pub fn enumerate_best<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    n_steps: usize,
    limit: usize,
    n_best: Option<usize>,
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
    let n_kept = n_best.map_or(n_total, |n| n.min(n_total));
    let mut kept = BinaryHeap::new();
    // One more than kept: a new continuation is pushed before the worst goes.
    kept.try_reserve(n_kept.saturating_add(1))
        .map_err(|_| Error::ContinuationsOutOfMemory {
            n_continuations: n_kept,
        })?;
    let mut search = Search {
        model,
        n_steps,
        kept,
        n_kept,
        greedy: Continuation {
            tokens: Vec::new(),
            logprob: 0.0,
        },
        greedy_nodes: Vec::new(),
        n_better_than_greedy: 0,
        prefix: Vec::with_capacity(n_steps),
    };
    if n_steps == 0 {
        search.keep(0.0);
    } else {
        let mut state = model.new_state();
        let mut logits = Vec::new();
        model.forward(&mut state, prompt, Rows::Last, &mut logits)?;
        (search.greedy, search.greedy_nodes) = search.greedy_path(&state, &logits)?;
        search.visit(&state, &logits, 0.0, true)?;
    }
    let Search {
        kept,
        greedy,
        n_better_than_greedy,
        ..
    } = search;
    // The heap's order is best first, so its ascending order is the ranking.
    let continuations = kept.into_sorted_vec().into_iter().map(|k| k.0).collect();
    Ok(Enumeration {
        continuations,
        n_total,
        greedy: greedy.tokens,
        greedy_logprob: greedy.logprob,
        greedy_rank: n_better_than_greedy + 1,
    })
}

/// Higher log-probability first, then the lower token sequence.
impl BestFirst for Continuation {
    fn best_first(&self, other: &Self) -> Ordering {
        best_first_parts((self.logprob, &self.tokens), (other.logprob, &other.tokens))
    }
}

/// A continuation in the heap of the best kept so far.
type Ranked = WorstOnTop<Continuation>;

struct Search<'m, M: LanguageModel> {
    model: &'m M,
    n_steps: usize,
    /// The best continuations so far, at most `n_kept`, worst on top.
    kept: BinaryHeap<Ranked>,
    n_kept: usize,
    /// The greedy continuation, found before the enumeration.
    greedy: Continuation,
    /// The internal nodes of the greedy path not yet visited, shallowest
    /// first.
    greedy_nodes: Vec<Node<M>>,
    /// Continuations ranked before the greedy one.
    n_better_than_greedy: usize,
    prefix: Vec<TokenId>,
}

impl<M: LanguageModel> Search<'_, M> {
    /// The greedy continuation from the node whose logits are `logits`:
    /// argmax at each step, lowest id on ties, summed as [`Self::visit`]
    /// sums. The internal nodes it passes are returned (state and logits,
    /// depth 1 first) for `visit` to reuse, so the tree still costs one
    /// forward pass per internal node.
    fn greedy_path(
        &self,
        state: &M::State,
        logits: &[f32],
    ) -> Result<(Continuation, Vec<Node<M>>)> {
        let mut tokens = Vec::with_capacity(self.n_steps);
        let mut nodes: Vec<Node<M>> = Vec::with_capacity(self.n_steps.saturating_sub(1));
        let mut logprob = 0.0;
        loop {
            let (parent_state, parent_logits) = match nodes.last() {
                Some(node) => (&node.state, node.logits.as_slice()),
                None => (state, logits),
            };
            let logprobs = self.log_softmax(parent_logits)?;
            let token = lm_core::argmax(parent_logits)?;
            logprob += f64::from(logprobs[token as usize]);
            tokens.push(token);
            if tokens.len() == self.n_steps {
                return Ok((Continuation { tokens, logprob }, nodes));
            }
            let mut child = Node {
                state: parent_state.clone(),
                logits: Vec::new(),
            };
            self.model
                .forward(&mut child.state, &[token], Rows::Last, &mut child.logits)?;
            nodes.push(child);
        }
    }

    /// The log-probabilities of one node, after checking its length.
    fn log_softmax(&self, logits: &[f32]) -> Result<Vec<f32>> {
        let vocab_size = self.model.vocab_size();
        if logits.len() != vocab_size {
            return Err(Error::LogitsLength {
                len: logits.len(),
                vocab_size,
            });
        }
        Ok(lm_core::log_softmax(logits, 1.0)?)
    }

    /// Scores the leaf `self.prefix` (log-probability `logprob`): counts it
    /// when it ranks before greedy, and keeps it when it is among the best.
    fn keep(&mut self, logprob: f64) {
        let better_than_worst = |kept: &BinaryHeap<Ranked>, n_kept: usize| match kept.peek() {
            _ if kept.len() < n_kept => true,
            None => false,
            Some(worst) => {
                let leaf = (logprob, self.prefix.as_slice());
                best_first_parts(leaf, (worst.0.logprob, &worst.0.tokens)) == Ordering::Less
            }
        };
        let leaf = (logprob, self.prefix.as_slice());
        if best_first_parts(leaf, (self.greedy.logprob, &self.greedy.tokens)) == Ordering::Less {
            self.n_better_than_greedy += 1;
        }
        if better_than_worst(&self.kept, self.n_kept) {
            // Within the reserved capacity: never reallocates.
            self.kept.push(WorstOnTop(Continuation {
                tokens: self.prefix.clone(),
                logprob,
            }));
            if self.kept.len() > self.n_kept {
                self.kept.pop();
            }
        }
    }

    /// Visits the node reached by `self.prefix`, whose next-token logits are
    /// `logits`; `on_greedy` says whether the prefix is the greedy one.
    fn visit(
        &mut self,
        state: &M::State,
        logits: &[f32],
        logprob: f64,
        on_greedy: bool,
    ) -> Result<()> {
        let logprobs = self.log_softmax(logits)?;
        let depth = self.prefix.len();
        let is_leaf_level = depth + 1 == self.n_steps;
        let greedy_token = self.greedy.tokens.get(depth).copied();
        let mut child_logits = Vec::new();
        for (token, &lp) in logprobs.iter().enumerate() {
            let token = token as TokenId;
            let total = logprob + f64::from(lp);
            self.prefix.push(token);
            if is_leaf_level {
                self.keep(total);
            } else if on_greedy && greedy_token == Some(token) {
                // Read by the greedy descent already.
                let node = self.greedy_nodes.remove(0);
                self.visit(&node.state, &node.logits, total, true)?;
            } else {
                let mut child = state.clone();
                self.model
                    .forward(&mut child, &[token], Rows::Last, &mut child_logits)?;
                self.visit(&child, &child_logits, total, false)?;
            }
            self.prefix.pop();
        }
        Ok(())
    }
}

/// An internal node of the tree: the state after its prefix and the logits
/// of the next token.
struct Node<M: LanguageModel> {
    state: M::State,
    logits: Vec<f32>,
}

/// [`BestFirst`] on a log-probability and tokens, without building a
/// [`Continuation`] (a leaf is compared before it is kept).
fn best_first_parts(a: (f64, &[TokenId]), b: (f64, &[TokenId])) -> Ordering {
    b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1))
}
