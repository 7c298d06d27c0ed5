//! A fixed attention workload for the crate's criterion benches
//! (`benches/attention.rs`): one SmolLM2-shaped layer (9 query heads over 3
//! key/value heads of 64, scale 1/8) over a filled cache, run through each
//! kernel path. Hidden from the docs: a bench's handle, not part of the API.

use super::attention::{AttentionScratch, AttentionShape, attend};
use super::config::KvPrecision;
use super::kv_cache::{KvCache, KvShape};
use crate::kernels::dispatch::{Dispatch, Kernel};

/// One layer's queries, cache and buffers (module docs).
#[doc(hidden)]
#[derive(Debug)]
pub struct AttentionWorkload {
    shape: AttentionShape,
    cache: KvCache,
    queries: Vec<f32>,
    scratch: AttentionScratch,
    out: Vec<f32>,
}

impl AttentionWorkload {
    /// `n_positions` keys, values and queries drawn from a fixed generator
    /// (values in [-1, 1), queries in [-3, 3)), in a cache of `precision`
    /// read by `kernel`; `None` if the CPU lacks the kernel.
    pub fn new(kernel: Kernel, precision: KvPrecision, n_positions: usize) -> Option<Self> {
        let (n_head, n_kv_head, head_dim) = (9, 3, 64);
        let shape = AttentionShape {
            n_head,
            n_kv_head,
            head_dim,
            precision,
            scale: 0.125,
            window: None,
            softcap: None,
        };
        let kv_shape = KvShape {
            n_layer: 1,
            n_kv_head,
            head_dim,
            capacity: n_positions,
        };
        let kv_dim = n_kv_head * head_dim;
        let dispatch = Dispatch::new(kernel)?;
        let mut cache = KvCache::with_windows(kv_shape, precision, dispatch, &[None]);
        let (keys, values) = (
            uniform(1, n_positions * kv_dim),
            uniform(2, n_positions * kv_dim),
        );
        for (pos, (key, value)) in keys
            .chunks_exact(kv_dim)
            .zip(values.chunks_exact(kv_dim))
            .enumerate()
        {
            cache.write(0, pos, key, value);
        }
        cache.commit(n_positions);
        let queries: Vec<f32> = uniform(3, n_positions * n_head * head_dim)
            .into_iter()
            .map(|v| 3.0 * v)
            .collect();
        let out = vec![0.0; queries.len()];
        Some(AttentionWorkload {
            shape,
            cache,
            queries,
            scratch: AttentionScratch::default(),
            out,
        })
    }

    /// Attention of every position's query in one call, as a prompt's
    /// prefill runs it (over rayon's pool); returns the first output.
    pub fn prefill(&mut self) -> f32 {
        attend(
            self.shape,
            None,
            &self.cache,
            0,
            0,
            &self.queries,
            &mut self.scratch,
            &mut self.out,
        );
        self.out[0]
    }

    /// Attention of the last position's query alone, as a decode step at
    /// the cache's length runs it; returns its first output.
    pub fn decode_step(&mut self) -> f32 {
        let q_dim = self.shape.n_head * self.shape.head_dim;
        let last = self.queries.len() / q_dim - 1;
        attend(
            self.shape,
            None,
            &self.cache,
            0,
            last,
            &self.queries[last * q_dim..],
            &mut self.scratch,
            &mut self.out[..q_dim],
        );
        self.out[0]
    }
}

/// `n` values uniform in [-1, 1) from an xorshift generator seeded by `seed`.
fn uniform(seed: u32, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}
