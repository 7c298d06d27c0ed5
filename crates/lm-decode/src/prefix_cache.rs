//! The prefix cache: model states kept between generations, each with the
//! tokens it has read, so a prompt that starts with a kept sequence reads
//! only the rest. A chat renders the whole conversation every turn, and the
//! state that read the last turn has read most of it:
//!
//! ```text
//! kept:    [system, user 1, reply 1 (its last token never fed)]
//! prompt:  [system, user 1, reply 1, user 2, assistant opening]
//!           └──── longest common prefix: kept ────┘└─ read now ─┘
//! ```
//!
//! Where the prompt differs (an edited or dropped turn), the state is
//! truncated to the common prefix ([`lm_core::SequenceState::truncate`]) and
//! read from there. One mechanism serves two users under two limits
//! ([`CacheLimit`]): lm-cli's chat keeps one state of any size, taken out for
//! each turn ([`generate_cached`]); lm-serve keeps many under a byte budget,
//! the least recently used dropped first, and starts each request from a
//! copy ([`PrefixCache::longest_prefix`]; lm-model's KV cache shares its
//! chunks between copies until one writes, so a copy costs little).

use lm_core::{Detokenize, LanguageModel, SequenceState, TokenId};

use crate::generate::generate_from_state;
use crate::hook::GenerationHook;
use crate::stop::StopReason;
use crate::trace::Generation;

/// How much a [`PrefixCache`] keeps. A state that would break a limit on its
/// own is not kept; otherwise the least recently used states are dropped
/// until both hold. A limit of 0 keeps nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimit {
    /// The most states kept.
    pub max_entries: usize,
    /// The most bytes kept, as the cache's size function counts them.
    pub max_bytes: usize,
}

impl CacheLimit {
    /// Any number of states within `max_bytes` (lm-serve's `--cache-mb`).
    pub fn bytes(max_bytes: usize) -> Self {
        Self {
            max_entries: usize::MAX,
            max_bytes,
        }
    }

    /// One state of any size (a chat's: each turn replaces the last).
    pub fn one_state() -> Self {
        Self {
            max_entries: 1,
            max_bytes: usize::MAX,
        }
    }
}

/// Model states, each with the tokens it has read, under a [`CacheLimit`];
/// the least recently used are dropped first.
///
/// ```
/// use lm_core::{Prefix, TokenId};
/// use lm_decode::{CacheLimit, PrefixCache};
///
/// fn state(tokens: &[TokenId]) -> Prefix { Prefix { tokens: tokens.to_vec() } }
/// // A `Prefix` state holds its tokens: 4 bytes each.
/// let mut cache = PrefixCache::new(CacheLimit::bytes(1000), |s: &Prefix| 4 * s.tokens.len());
/// cache.insert(vec![1, 2, 3], state(&[1, 2, 3]));
/// cache.insert(vec![1, 5], state(&[1, 5]));
/// // [1, 2, 3] shares two tokens with the prompt: a copy, cut to them.
/// let (copy, n_shared) = cache.longest_prefix(&[1, 2, 9]).unwrap();
/// assert_eq!((copy.tokens, n_shared), (vec![1, 2], 2));
/// assert!(cache.longest_prefix(&[7]).is_none());
/// assert_eq!((cache.len(), cache.used_bytes()), (2, 20));
/// ```
#[derive(Debug, Clone)]
pub struct PrefixCache<S> {
    entries: Vec<Entry<S>>,
    limit: CacheLimit,
    size_of: fn(&S) -> usize,
    used_bytes: usize,
    /// Counts lookups and inserts: an entry's `last_used` orders the LRU.
    clock: u64,
}

#[derive(Debug, Clone)]
struct Entry<S> {
    tokens: Vec<TokenId>,
    state: S,
    bytes: usize,
    last_used: u64,
}

/// How many leading tokens `a` and `b` share.
fn shared_len(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<S: SequenceState> PrefixCache<S> {
    /// An empty cache under `limit`, counting a state's bytes with
    /// `size_of` (lm-serve's `StateSize` for lm-model's states).
    pub fn new(limit: CacheLimit, size_of: fn(&S) -> usize) -> Self {
        Self {
            entries: Vec::new(),
            limit,
            size_of,
            used_bytes: 0,
            clock: 0,
        }
    }

    /// An empty cache of one state of any size: a chat's, whose every turn
    /// extends the last ([`CacheLimit::one_state`]).
    pub fn one_state() -> Self {
        Self::new(CacheLimit::one_state(), |_| 0)
    }

    /// A copy of the kept state sharing the longest prefix with `prompt`,
    /// truncated to that prefix, and its length; `None` when no state
    /// shares a token. The state stays kept, and counts as just used.
    /// Between equally long prefixes the most recently used wins.
    pub fn longest_prefix(&mut self, prompt: &[TokenId]) -> Option<(S, usize)> {
        let (entry_idx, n_shared) = self.find(prompt)?;
        let mut state = self.entries[entry_idx].state.clone();
        state.truncate(n_shared);
        Some((state, n_shared))
    }

    /// As [`PrefixCache::longest_prefix`], but the state is taken out of
    /// the cache instead of copied: a caller that runs one sequence at a
    /// time puts the state back afterwards ([`PrefixCache::insert`]), and
    /// nothing is copied.
    pub fn take_longest_prefix(&mut self, prompt: &[TokenId]) -> Option<(S, usize)> {
        let (entry_idx, n_shared) = self.find(prompt)?;
        let entry = self.entries.swap_remove(entry_idx);
        self.used_bytes -= entry.bytes;
        let mut state = entry.state;
        state.truncate(n_shared);
        Some((state, n_shared))
    }

    /// Keeps `state`, which has read `tokens` (when it claims more, only the
    /// first `tokens.len()`; when fewer, only the first `state.pos()` tokens
    /// are recorded). Drops the kept states it extends (it serves every
    /// prompt they serve), then the least recently used until the limit
    /// holds. An empty sequence, or a state that breaks the limit alone, is
    /// not kept.
    pub fn insert(&mut self, mut tokens: Vec<TokenId>, mut state: S) {
        let n_read = state.pos().min(tokens.len());
        tokens.truncate(n_read);
        state.truncate(n_read);
        let bytes = (self.size_of)(&state);
        let fits =
            self.limit.max_entries > 0 && self.limit.max_bytes > 0 && bytes <= self.limit.max_bytes;
        if tokens.is_empty() || !fits {
            return;
        }
        self.clock += 1;
        let mut entry_idx = 0;
        while entry_idx < self.entries.len() {
            if tokens.starts_with(&self.entries[entry_idx].tokens) {
                let removed = self.entries.swap_remove(entry_idx);
                self.used_bytes -= removed.bytes;
            } else {
                entry_idx += 1;
            }
        }
        self.used_bytes += bytes;
        self.entries.push(Entry {
            tokens,
            state,
            bytes,
            last_used: self.clock,
        });
        while self.used_bytes > self.limit.max_bytes || self.entries.len() > self.limit.max_entries
        {
            let (oldest_idx, _) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, entry)| entry.last_used)
                .expect("over the limit means something is kept");
            let removed = self.entries.swap_remove(oldest_idx);
            self.used_bytes -= removed.bytes;
        }
    }

    /// Keeps the state a run ended with ([`generate_from_state`]'s): it has
    /// read the run's prompt and its generated tokens but the last.
    pub fn insert_run(&mut self, generation: &Generation, state: S) {
        let tokens = [generation.prompt.as_slice(), &generation.tokens].concat();
        self.insert(tokens, state);
    }

    /// Forgets every state.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.used_bytes = 0;
    }

    /// The token sequences kept, the most recently used first.
    pub fn kept(&self) -> Vec<&[TokenId]> {
        let mut entries: Vec<&Entry<S>> = self.entries.iter().collect();
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.last_used));
        entries
            .iter()
            .map(|entry| entry.tokens.as_slice())
            .collect()
    }

    /// How many states are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no state is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes the kept states hold, as the size function counts them.
    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    /// The entry sharing the longest prefix with `prompt` (the most
    /// recently used of equals), marked as used, and the prefix's length.
    fn find(&mut self, prompt: &[TokenId]) -> Option<(usize, usize)> {
        self.clock += 1;
        let (entry_idx, n_shared) = self
            .entries
            .iter()
            .enumerate()
            .map(|(idx, entry)| (idx, shared_len(&entry.tokens, prompt)))
            .max_by_key(|&(idx, n_shared)| (n_shared, self.entries[idx].last_used))?;
        if n_shared == 0 {
            return None;
        }
        self.entries[entry_idx].last_used = self.clock;
        Some((entry_idx, n_shared))
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

/// How many prompt tokens a run ([`generate_from_state`]'s) from a state
/// that shared `n_shared` tokens with its prompt took from that state
/// instead of reading them: never the last prompt token (its logits choose
/// the first token), and none when the prompt was shortened (it is read
/// whole) or the run ended before reading (no step, and not cancelled
/// during the prefill).
pub fn tokens_reused(generation: &Generation, n_shared: usize) -> usize {
    let read_nothing =
        generation.steps.is_empty() && generation.stop_reason != StopReason::Cancelled;
    if generation.n_prompt_dropped > 0 || read_nothing {
        0
    } else {
        n_shared.min(generation.prompt.len().saturating_sub(1))
    }
}

/// [`generate_from_state`] from a copy of the kept state sharing the
/// longest prefix with `prompt`; the run's state then goes in having read
/// the prompt and the generated tokens the model read (all but the last),
/// replacing the kept one it extends. The prompt tokens the state shares
/// are not read again (the last one always is: its logits choose the first
/// token; a prompt the truncation policy shortened is read whole). The run
/// is the one a fresh state gives (same tokens, same trace). After an error
/// (a bad prompt, or the hook's) the cache is as it was.
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
/// let mut cache = PrefixCache::one_state();
/// let first = generate_cached(&model, &mut cache, &[0, 1], &config, None, hook).unwrap();
/// assert_eq!(first.generation.tokens, vec![2, 3]);
/// assert_eq!(cache.kept(), [&[0, 1, 2]]);
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
    hook: H,
) -> Result<CachedGeneration, H::Error> {
    // A copy (a state shares what it has read with its copies), so a run
    // that fails, on a bad prompt or by its hook, leaves the cache as it
    // was; the run's own state replaces the kept one when it extends it.
    let (state, n_shared) = cache
        .longest_prefix(prompt)
        .unwrap_or_else(|| (model.new_state(), 0));
    let (generation, state) = generate_from_state(model, state, prompt, config, detokenizer, hook)?;
    let n_reused = tokens_reused(&generation, n_shared);
    cache.insert_run(&generation, state);
    Ok(CachedGeneration {
        generation,
        n_reused,
    })
}
