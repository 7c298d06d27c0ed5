//! The key/value cache: the keys and values of every position a sequence
//! has read, for every layer, so a new token attends to them without
//! recomputing the prefix (lesson 001, "Recognize what an inference cache
//! changes": 7 positions computed instead of 25).
//!
//! Storage is a list of chunks of [`CHUNK_LEN`] positions, each chunk holding
//! every layer's keys and values for its positions:
//!
//! ```text
//! chunk c covers positions c*CHUNK_LEN .. (c+1)*CHUNK_LEN
//! chunk data: [n_layer][K | V][n_kv_head][CHUNK_LEN][head_dim]   (f32)
//!
//!              layer 0                      layer 1
//!           ┌───────────────────────────┬───────────────────────────┐
//! chunk 0   │ K: head 0 rows 0..32 │ ...│ K ... │ V ...             │
//!           │ V: head 0 rows 0..32 │ ...│                           │
//!           └───────────────────────────┴───────────────────────────┘
//! ```
//!
//! Within a chunk the rows of one key/value head are contiguous, so
//! attention reads them as one slice. Chunks are `Arc`-shared: cloning a
//! cache (forking a sequence for beam search or batch rows) copies only the
//! list of pointers, and a write into a chunk another fork still holds
//! copies that one chunk first (copy on write). So forks share the prefix
//! they had in common and pay only for the chunk they diverge in.
//!
//! Chunks are allocated when a position first needs one (once per
//! [`CHUNK_LEN`] tokens, not per token) or up front with
//! [`KvCache::reserve`]; [`KvCache::truncate`] and [`KvCache::reset`] keep
//! them for reuse. A whole-context preallocation is avoided on purpose: for
//! SmolLM2 (30 layers, 3 key/value heads of 64, context 8192) it would be
//! 377 MB per sequence.

use std::sync::Arc;

/// Positions per chunk.
pub const CHUNK_LEN: usize = 32;

/// The dimensions of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Number of layers.
    pub n_layer: usize,
    /// Key/value heads per layer.
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// The most positions the cache holds (the model's context length).
    pub capacity: usize,
}

impl KvShape {
    /// f32 values of one layer's keys (or values) in one chunk.
    fn half_layer_len(&self) -> usize {
        self.n_kv_head * CHUNK_LEN * self.head_dim
    }

    /// f32 values in one chunk.
    fn chunk_len(&self) -> usize {
        self.n_layer * 2 * self.half_layer_len()
    }
}

/// The keys and values of one sequence; see the module docs for the layout.
#[derive(Debug, Clone)]
pub struct KvCache {
    shape: KvShape,
    /// Positions holding valid keys and values: the sequence position `pos`.
    pos: usize,
    chunks: Vec<Arc<Vec<f32>>>,
}

impl KvCache {
    /// An empty cache of the given shape; nothing is allocated yet.
    pub fn new(shape: KvShape) -> Self {
        Self {
            shape,
            pos: 0,
            chunks: Vec::new(),
        }
    }

    /// The cache's dimensions.
    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// How many positions hold valid keys and values.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Allocates the chunks for the first `n_positions` positions (capped
    /// at the capacity) now, so later tokens allocate nothing.
    pub fn reserve(&mut self, n_positions: usize) {
        let n_chunks = n_positions.min(self.shape.capacity).div_ceil(CHUNK_LEN);
        while self.chunks.len() < n_chunks {
            self.chunks
                .push(Arc::new(vec![0.0; self.shape.chunk_len()]));
        }
    }

    /// Forgets every position from `pos` on (editing a token invalidates the
    /// cache from that position). A `pos` at or beyond the current one
    /// changes nothing. Storage is kept for reuse.
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }

    /// Forgets every position; storage is kept for reuse.
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// How many of the valid positions of `self` use the same storage as
    /// `other` (both forks of one sequence): the prefix forking did not copy.
    pub fn shared_positions(&self, other: &KvCache) -> usize {
        let valid = self.pos.min(other.pos);
        let shared_chunks = self
            .chunks
            .iter()
            .zip(&other.chunks)
            .take_while(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        valid.min(shared_chunks * CHUNK_LEN)
    }

    /// Stores the key and value rows (`n_kv_head * head_dim` each, heads end
    /// to end) of `layer` at position `pos`. Does not advance the cache:
    /// [`KvCache::commit`] does, once every layer is written. Writes at or
    /// beyond the capacity or to a layer that does not exist are ignored;
    /// callers check the context bound first.
    pub(crate) fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        let shape = self.shape;
        if pos >= shape.capacity || layer >= shape.n_layer {
            return;
        }
        self.reserve(pos + 1);
        let Some(chunk) = self.chunks.get_mut(pos / CHUNK_LEN) else {
            return;
        };
        let data = Arc::make_mut(chunk);
        let row = pos % CHUNK_LEN;
        let half = shape.half_layer_len();
        for (half_idx, source) in [key, value].into_iter().enumerate() {
            let base = (layer * 2 + half_idx) * half;
            for (head_idx, head) in source.chunks_exact(shape.head_dim).enumerate() {
                let start = base + (head_idx * CHUNK_LEN + row) * shape.head_dim;
                if let Some(dest) = data.get_mut(start..start + shape.head_dim) {
                    dest.copy_from_slice(head);
                }
            }
        }
    }

    /// Marks `n` more positions as valid after they were written for every
    /// layer.
    pub(crate) fn commit(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.shape.capacity);
    }

    /// The keys and values of `kv_head` in `layer` for positions
    /// `0..n_positions`, as `(keys, values)` slices of whole rows, one pair
    /// per chunk in position order (the last pair may be shorter).
    pub(crate) fn rows(
        &self,
        layer: usize,
        kv_head: usize,
        n_positions: usize,
    ) -> impl Iterator<Item = (&[f32], &[f32])> {
        let shape = self.shape;
        let half = shape.half_layer_len();
        let head_dim = shape.head_dim;
        self.chunks
            .iter()
            .enumerate()
            .take_while(move |(chunk_idx, _)| chunk_idx * CHUNK_LEN < n_positions)
            .filter_map(move |(chunk_idx, chunk)| {
                let n_rows = (n_positions - chunk_idx * CHUNK_LEN).min(CHUNK_LEN);
                let key_start = layer * 2 * half + kv_head * CHUNK_LEN * head_dim;
                let value_start = key_start + half;
                let keys = chunk.get(key_start..key_start + n_rows * head_dim)?;
                let values = chunk.get(value_start..value_start + n_rows * head_dim)?;
                Some((keys, values))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> KvShape {
        KvShape {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 3,
            capacity: 100,
        }
    }

    /// The key row of (layer, pos, head) is filled with `layer*1000 + pos*10 + head`;
    /// the value row is its negation.
    fn fill(cache: &mut KvCache, range: std::ops::Range<usize>) {
        for pos in range.clone() {
            for layer in 0..2 {
                let key: Vec<f32> = (0..2)
                    .flat_map(|head| [(layer * 1000 + pos * 10 + head) as f32; 3])
                    .collect();
                let value: Vec<f32> = key.iter().map(|k| -k).collect();
                cache.write(layer, pos, &key, &value);
            }
        }
        cache.commit(range.len());
    }

    fn read(cache: &KvCache, layer: usize, head: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let mut keys = Vec::new();
        let mut values = Vec::new();
        for (k, v) in cache.rows(layer, head, n) {
            keys.extend_from_slice(k);
            values.extend_from_slice(v);
        }
        (keys, values)
    }

    #[test]
    fn rows_come_back_in_position_order_across_chunks() {
        let mut cache = KvCache::new(shape());
        fill(&mut cache, 0..70);
        assert_eq!(cache.pos(), 70);
        let (keys, values) = read(&cache, 1, 1, 70);
        let expected: Vec<f32> = (0..70)
            .flat_map(|pos| [(1000 + pos * 10 + 1) as f32; 3])
            .collect();
        assert_eq!(keys, expected);
        assert_eq!(values, expected.iter().map(|k| -k).collect::<Vec<_>>());
    }

    #[test]
    fn a_fork_shares_its_prefix_and_copies_on_write() {
        let mut cache = KvCache::new(shape());
        fill(&mut cache, 0..40);
        let mut fork = cache.clone();
        assert_eq!(fork.shared_positions(&cache), 40);
        // Overwrite position 35 in the fork: only the second chunk is copied.
        fork.truncate(35);
        fork.write(0, 35, &[9.0; 6], &[9.0; 6]);
        fork.commit(1);
        assert_eq!(fork.shared_positions(&cache), CHUNK_LEN);
        assert_eq!(
            read(&cache, 0, 0, 40).0[35 * 3],
            350.0,
            "the original is untouched"
        );
        assert_eq!(read(&fork, 0, 0, 36).0[35 * 3], 9.0);
        assert_eq!(
            read(&fork, 0, 0, 36).0[34 * 3],
            340.0,
            "the fork kept its prefix"
        );
        fork.truncate(0);
        fork.write(1, 0, &[7.0; 6], &[7.0; 6]);
        fork.commit(1);
        assert_eq!(read(&cache, 1, 0, 1).0, vec![1000.0; 3]);
        assert_eq!(fork.shared_positions(&cache), 0);
    }

    #[test]
    fn truncate_and_reset_only_move_the_position() {
        let mut cache = KvCache::new(shape());
        fill(&mut cache, 0..10);
        cache.truncate(20);
        assert_eq!(cache.pos(), 10);
        cache.truncate(4);
        assert_eq!(cache.pos(), 4);
        cache.reset();
        assert_eq!(cache.pos(), 0);
    }
}
