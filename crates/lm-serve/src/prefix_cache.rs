//! The prefix cache: the states of finished sequences, kept under a byte
//! budget with the least recently used dropped first, so a request whose
//! prompt starts with a kept sequence (the next turn of a chat, a shared
//! system prompt) reads only what is new.
//!
//! ```text
//! turn 1:  [system user1]  -> reply1            kept: system user1 reply1
//! turn 2:  [system user1 reply1 user2]          reads: user2 (and the template's seams)
//! ```
//!
//! A kept state is cloned on use: lm-model's KV cache shares its chunks
//! between clones (copy on write), so the clone costs little and the kept
//! state stays as it was.

use lm::lm_model::{DecoderState, NgramState};
use lm_core::{Prefix, SequenceState, TokenId};

/// The memory a sequence state holds, for the cache's budget.
pub trait StateSize {
    /// Bytes held (an estimate; shared storage may be counted twice).
    fn size_bytes(&self) -> usize;
}

impl StateSize for DecoderState {
    fn size_bytes(&self) -> usize {
        self.cache().allocated_bytes()
    }
}

impl StateSize for NgramState {
    fn size_bytes(&self) -> usize {
        std::mem::size_of_val(self.tokens())
    }
}

impl StateSize for Prefix {
    fn size_bytes(&self) -> usize {
        std::mem::size_of_val(self.tokens.as_slice())
    }
}

/// Kept states, each with the tokens it has read.
#[derive(Debug)]
pub(crate) struct PrefixCache<S> {
    entries: Vec<Entry<S>>,
    budget_bytes: usize,
    used_bytes: usize,
    clock: u64,
}

#[derive(Debug)]
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

impl<S: Clone + SequenceState + StateSize> PrefixCache<S> {
    /// An empty cache holding at most `budget_bytes` (0: keeps nothing).
    pub(crate) fn new(budget_bytes: usize) -> Self {
        Self {
            entries: Vec::new(),
            budget_bytes,
            used_bytes: 0,
            clock: 0,
        }
    }

    /// A copy of the kept state sharing the longest prefix with `prompt`,
    /// truncated to that prefix, and its length; `None` when no state
    /// shares a token.
    pub(crate) fn longest_prefix(&mut self, prompt: &[TokenId]) -> Option<(S, usize)> {
        self.clock += 1;
        let (idx, shared) = self
            .entries
            .iter()
            .enumerate()
            .map(|(idx, entry)| (idx, shared_len(&entry.tokens, prompt)))
            .max_by_key(|&(idx, shared)| (shared, std::cmp::Reverse(idx)))?;
        if shared == 0 {
            return None;
        }
        let entry = &mut self.entries[idx];
        entry.last_used = self.clock;
        let mut state = entry.state.clone();
        state.truncate(shared);
        Some((state, shared))
    }

    /// Keeps `state`, which has read `tokens`; drops the kept states it
    /// extends, then the least recently used until the budget holds.
    pub(crate) fn insert(&mut self, tokens: Vec<TokenId>, state: S) {
        debug_assert_eq!(
            state.pos(),
            tokens.len(),
            "a state keeps the tokens it read"
        );
        let bytes = state.size_bytes();
        if tokens.is_empty() || bytes > self.budget_bytes {
            return;
        }
        self.clock += 1;
        let mut idx = 0;
        while idx < self.entries.len() {
            if tokens.starts_with(&self.entries[idx].tokens) {
                let removed = self.entries.swap_remove(idx);
                self.used_bytes -= removed.bytes;
            } else {
                idx += 1;
            }
        }
        self.used_bytes += bytes;
        self.entries.push(Entry {
            tokens,
            state,
            bytes,
            last_used: self.clock,
        });
        while self.used_bytes > self.budget_bytes {
            let (oldest, _) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, entry)| entry.last_used)
                .expect("over budget means something is kept");
            let removed = self.entries.swap_remove(oldest);
            self.used_bytes -= removed.bytes;
        }
    }

    /// States kept and the bytes they hold.
    pub(crate) fn usage(&self) -> (usize, usize) {
        (self.entries.len(), self.used_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(tokens: &[TokenId]) -> Prefix {
        Prefix {
            tokens: tokens.to_vec(),
        }
    }

    #[test]
    fn the_longest_shared_prefix_is_found_and_truncated_to() {
        let mut cache = PrefixCache::new(1000);
        cache.insert(vec![1, 2, 3], prefix(&[1, 2, 3]));
        cache.insert(vec![1, 5], prefix(&[1, 5]));
        let (state, shared) = cache.longest_prefix(&[1, 2, 9]).unwrap();
        assert_eq!((state.tokens, shared), (vec![1, 2], 2));
        assert!(cache.longest_prefix(&[7]).is_none());
        assert_eq!(cache.usage(), (2, 20));
    }

    #[test]
    fn a_state_replaces_the_ones_it_extends_and_the_budget_drops_the_least_recently_used() {
        let mut cache = PrefixCache::new(38);
        cache.insert(vec![1, 2], prefix(&[1, 2]));
        cache.insert(vec![1, 2, 3], prefix(&[1, 2, 3]));
        assert_eq!(cache.usage(), (1, 12));
        cache.insert(vec![4, 4, 4], prefix(&[4, 4, 4]));
        cache.insert(vec![5, 5, 5], prefix(&[5, 5, 5]));
        assert_eq!(cache.usage(), (3, 36));
        // Touch [1, 2, 3]; then a fourth entry evicts [4, 4, 4], the oldest.
        cache.longest_prefix(&[1, 2, 3]).unwrap();
        cache.insert(vec![6], prefix(&[6]));
        assert_eq!(cache.usage(), (3, 28));
        assert!(cache.longest_prefix(&[4]).is_none());
        assert!(cache.longest_prefix(&[1]).is_some());
        // Bigger than the whole budget: not kept.
        cache.insert(vec![7; 11], prefix(&[7; 11]));
        assert!(cache.longest_prefix(&[7]).is_none());
    }
}
