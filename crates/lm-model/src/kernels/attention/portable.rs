//! Attention's kernels in plain Rust, for every target: the reference the
//! SIMD builds match bit for bit, with the same partial sums and the same
//! order of additions.

use half::f16;

use super::{CHUNK_LEN, ChunkRows, PARTIALS, TileKernels, WeightedRows};
use crate::kernels::dispatch::Dispatch;
use crate::kernels::f16::round_to_f16_via_half;

/// The portable kernels; `dispatch` widens f16 values (with F16C when the
/// CPU has it, even when the kernel is the portable one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable {
    dispatch: Dispatch,
}

impl Portable {
    /// The portable kernels, widening with `dispatch`.
    pub(super) fn new(dispatch: Dispatch) -> Self {
        Portable { dispatch }
    }
}

impl TileKernels for Portable {
    const SIMD: bool = false;

    #[inline(always)]
    fn round_to_f16(self, values: &mut [f32], narrowed: &mut Vec<f16>) {
        round_to_f16_via_half(self.dispatch, values, narrowed);
    }

    #[inline(always)]
    fn prefetch<T>(self, _block: &[T]) {}

    #[inline(always)]
    fn chunk_scores(self, queries: &[f32], keys: ChunkRows<'_>, scale: f32, products: &mut [f32]) {
        let keys = keys.f32();
        let head_dim = keys.len() / CHUNK_LEN;
        debug_assert_eq!(queries.len() / head_dim, products.len() / CHUNK_LEN);
        for (query, row) in queries
            .chunks_exact(head_dim)
            .zip(products.chunks_exact_mut(CHUNK_LEN))
        {
            for (p, product) in row.iter_mut().zip(key_scores(query, keys)) {
                *p = product * scale;
            }
        }
    }

    #[inline(always)]
    fn add_weighted_rows<O, W>(self, out: &mut [f32], sums: WeightedRows<'_, O, W>)
    where
        O: Fn(usize) -> usize,
        W: Fn(usize) -> usize,
    {
        let head_dim = sums.head_dim;
        let value_rows = sums.value_rows.f32();
        let n = value_rows.len() / head_dim;
        for r in sums.rows {
            add_weighted_row(
                &mut out[(sums.out_row)(r)..][..head_dim],
                &sums.weights[(sums.weights_at)(r)..][..n],
                value_rows,
            );
        }
    }
}

/// The products of `query` with the [`CHUNK_LEN`] keys of a chunk's key
/// block (`[head_dim][CHUNK_LEN]`, a key per column), eight keys at a time
/// in the vector lanes. Each product is summed as a plain dot product of
/// eight partial sums would be (dimension `d` into partial `d % 8`, the
/// partials then added in order, then the products past the last whole
/// eight): eight independent chains of additions per pass, and the bits of
/// the one-query-at-a-time computation this replaced.
#[inline(always)]
fn key_scores(query: &[f32], keys: &[f32]) -> [f32; CHUNK_LEN] {
    let (columns, _) = keys.as_chunks::<CHUNK_LEN>();
    debug_assert_eq!(columns.len(), query.len(), "key block width");
    let whole = query.len() / PARTIALS * PARTIALS;
    let mut out = [0.0f32; CHUNK_LEN];
    for (pass, pass_out) in out.as_chunks_mut::<PARTIALS>().0.iter_mut().enumerate() {
        let lanes = pass * PARTIALS..(pass + 1) * PARTIALS;
        let mut partial = [[0.0f32; PARTIALS]; PARTIALS];
        for (q8, columns8) in query[..whole]
            .as_chunks::<PARTIALS>()
            .0
            .iter()
            .zip(columns[..whole].as_chunks::<PARTIALS>().0)
        {
            for ((lane_partial, &q), column) in partial.iter_mut().zip(q8).zip(columns8) {
                for (p, &k) in lane_partial.iter_mut().zip(&column[lanes.clone()]) {
                    *p += q * k;
                }
            }
        }
        let mut sum = [-0.0f32; PARTIALS];
        for lane_partial in &partial {
            for (s, &p) in sum.iter_mut().zip(lane_partial) {
                *s += p;
            }
        }
        let mut tail = [-0.0f32; PARTIALS];
        for (&q, column) in query[whole..].iter().zip(&columns[whole..]) {
            for (t, &k) in tail.iter_mut().zip(&column[lanes.clone()]) {
                *t += q * k;
            }
        }
        for ((o, &s), &t) in pass_out.iter_mut().zip(&sum).zip(&tail) {
            *o = s + t;
        }
    }
    out
}

/// Adds `sum_k weights[k] * rows[k]` to `out` (rows of `out.len()` values),
/// each output value in row order; 32 outputs at a time stay in registers
/// across the rows.
#[inline(always)]
fn add_weighted_row(out: &mut [f32], weights: &[f32], rows: &[f32]) {
    const BLOCK: usize = 32;
    let width = out.len();
    debug_assert_eq!(rows.len(), weights.len() * width, "one row per weight");
    let (blocks, tail) = out.as_chunks_mut::<BLOCK>();
    for (block_idx, block) in blocks.iter_mut().enumerate() {
        let mut acc = *block;
        for (&w, row) in weights.iter().zip(rows.chunks_exact(width)) {
            let (part, _) = row[block_idx * BLOCK..].as_chunks::<BLOCK>();
            for (a, &v) in acc.iter_mut().zip(&part[0]) {
                *a += w * v;
            }
        }
        *block = acc;
    }
    let tail_start = width - tail.len();
    for (&w, row) in weights.iter().zip(rows.chunks_exact(width)) {
        for (a, &v) in tail.iter_mut().zip(&row[tail_start..]) {
            *a += w * v;
        }
    }
}
