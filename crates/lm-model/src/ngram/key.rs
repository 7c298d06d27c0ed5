//! N-gram keys: an n-gram is stored as (index of its context, last word), and
//! that pair packs into one `u64`. Tables of any order use the same key, so no
//! n-gram is ever a heap-allocated string or slice.
//!
//! ```text
//!   "the cat sat" = (index of "the cat" among the bigrams, id of "sat")
//!   key = context_idx << 32 | word_id
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Packs a context index and a word id into one key.
pub(crate) fn pack(context_idx: u32, word: u32) -> u64 {
    (u64::from(context_idx) << 32) | u64::from(word)
}

/// A hasher for packed keys: the 64-bit finaliser of MurmurHash3, which mixes
/// every input bit into the high and low bits the hash table uses.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 ^= value;
    }
}

/// A map from packed keys to values.
pub(crate) type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;
