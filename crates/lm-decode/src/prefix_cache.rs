//! A model state kept between generations, so a prompt that starts with what
//! the state has already read reads only the rest. A chat renders the whole
//! conversation every turn; the state that read the last turn has read most
//! of it:
//!
//! ```text
//! cache:   [system, user 1, reply 1 (its last token never fed)]
//! prompt:  [system, user 1, reply 1, user 2, assistant opening]
//!           └──── longest common prefix: kept ────┘└─ read now ─┘
//! ```
//!
//! Where the prompt differs (an edited or dropped turn), the state is
//! truncated to the common prefix ([`lm_core::SequenceState::truncate`]) and
//! read from there. At least the prompt's last token is always read, since its
//! logits choose the first new token.

use lm_core::{Detokenize, LanguageModel, SequenceState, TokenId};

use crate::generate::{Row, continue_row, prepare};
use crate::hook::{GenerationHook, finish, prefill, settle};
use crate::{Generation, StopReason};

/// A model state and the tokens it has read.
#[derive(Debug, Clone)]
pub struct PrefixCache<S> {
    state: S,
    tokens: Vec<TokenId>,
}

impl<S: SequenceState> PrefixCache<S> {
    /// An empty cache: a fresh state of `model`.
    pub fn new<M: LanguageModel<State = S> + ?Sized>(model: &M) -> Self {
        Self {
            state: model.new_state(),
            tokens: Vec::new(),
        }
    }

    /// The tokens the state has read, in order.
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// Forgets everything read.
    pub fn clear(&mut self) {
        self.state.truncate(0);
        self.tokens.clear();
    }

    /// Truncates to the longest common prefix with `prompt`, leaving at
    /// least its last token unread; returns how many tokens are kept.
    fn rewind(&mut self, prompt: &[TokenId]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let kept = common.min(prompt.len().saturating_sub(1));
        self.state.truncate(kept);
        self.tokens.truncate(kept);
        kept
    }

    /// Records what the state has read: the first `state.pos()` tokens of
    /// `history`.
    fn sync(&mut self, history: &[TokenId]) {
        let n_read = self.state.pos().min(history.len());
        self.tokens.clear();
        self.tokens.extend_from_slice(&history[..n_read]);
    }
}

/// What [`generate_cached`] returns: the run, and how many prompt tokens it
/// took from the cache instead of reading them.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedGeneration {
    /// The run, as [`crate::generate`] returns it.
    pub generation: Generation,
    /// Prompt tokens the cache had already read.
    pub n_reused: usize,
}

/// [`crate::generate_with_hook`] from `cache`'s state: the prompt tokens the
/// cache shares with its start are not read again. The run is the one a
/// fresh state gives (same tokens, same trace); afterwards the cache holds
/// the prompt and the generated tokens the model read (all but the last).
/// After an error the cache is empty.
///
/// ```
/// use lm_core::{Counting, LanguageModel, Prefix, Rows, TokenId};
/// use std::ops::ControlFlow;
/// use lm_decode::{GenerationConfig, PrefixCache, SamplingConfig, Step, generate_cached};
/// # struct Next;
/// # impl LanguageModel for Next {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 4 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], _r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         s.tokens.extend_from_slice(t);
/// #         let next = (s.tokens[s.tokens.len() - 1] as usize + 1) % 4;
/// #         *l = (0..4).map(|i| if i == next { 1.0 } else { 0.0 }).collect();
/// #         Ok(())
/// #     }
/// # }
/// let model = Counting::new(Next);
/// let config = GenerationConfig { max_new_tokens: 2, sampling: SamplingConfig::greedy(), ..GenerationConfig::default() };
/// let hook = |_: &Step| Ok::<_, lm_decode::Error>(ControlFlow::Continue(()));
/// let mut cache = PrefixCache::new(&model);
/// let first = generate_cached(&model, &mut cache, &[0, 1], &config, None, hook).unwrap();
/// assert_eq!(first.generation.tokens, vec![2, 3]);
/// assert_eq!(cache.tokens(), &[0, 1, 2]);
/// // The next prompt extends the first run: only its new tokens are read.
/// let second = generate_cached(&model, &mut cache, &[0, 1, 2, 3, 1], &config, None, hook).unwrap();
/// assert_eq!(second.n_reused, 3);
/// assert_eq!(model.calls(), vec![2, 1, 2, 1]);
/// ```
pub fn generate_cached<M: LanguageModel, H: GenerationHook>(
    model: &M,
    cache: &mut PrefixCache<M::State>,
    prompt: &[TokenId],
    config: &crate::GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    mut hook: H,
) -> Result<CachedGeneration, H::Error> {
    let mut hook_error = None;
    let result = (|| {
        let fitted = prepare(model, prompt, config, detokenizer)?;
        let mut row = Row::new(model, fitted, config, detokenizer, config.rng_stream)?;
        if row.stop_reason.is_some() {
            return Ok((row.into_generation(), 0));
        }
        let n_reused = cache.rewind(&row.history);
        let mut logits = Vec::new();
        let read = prefill(
            model,
            &mut cache.state,
            &row.history[n_reused..],
            config.prefill_chunk_len,
            &mut logits,
            |n, total| settle(hook.after_prefill_chunk(n, total), &mut hook_error),
        );
        let read = match read {
            Ok(read) => read,
            Err(error) => {
                cache.clear();
                return Err(error);
            }
        };
        if read.is_break() {
            row.stop_reason = Some(StopReason::Cancelled);
        } else {
            let ran = continue_row(
                model,
                &mut cache.state,
                &mut logits,
                &mut row,
                &mut |step| settle(hook.on_step(step), &mut hook_error),
            );
            if let Err(error) = ran {
                cache.clear();
                return Err(error);
            }
        }
        cache.sync(&row.history);
        Ok((row.into_generation(), n_reused))
    })();
    let (generation, n_reused) = finish(result, hook_error)?;
    Ok(CachedGeneration {
        generation,
        n_reused,
    })
}
