//! Portable dot products of K-quant rows with [`Q8KBlock`] activations:
//! each super-block unpacked to the common [`SuperBlock`] form, exact integer
//! sums per group of 16, scaled in f32 once per super-block.

use super::super::GgmlType;
use super::super::activation::Q8KBlock;
use super::super::block_k::{self, SuperBlock};

/// Dot product of a K-quant row stored as `ty` with its quantized activations.
pub(crate) fn dot_row(ty: GgmlType, row: &[u8], xq: &[Q8KBlock]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in row.chunks_exact(ty.block_bytes()).zip(xq) {
        sum += dot_block(&block_k::unpack(ty, w), a);
    }
    sum
}

/// One super-block · one activation block:
/// `a.d * (d Σ_g scales[g] Σ_j q[j] a.qs[j] - dmin Σ_g mins[g] a.bsums[g])`,
/// both sums exact in i32 (at most 16 · 16 · 63 · 127 · 128 in magnitude).
pub(crate) fn dot_block(w: &SuperBlock, a: &Q8KBlock) -> f32 {
    let mut scaled = 0i32;
    for ((q, x), &scale) in
        w.q.chunks_exact(16)
            .zip(a.qs.chunks_exact(16))
            .zip(&w.scales)
    {
        let group: i32 = q
            .iter()
            .zip(x)
            .map(|(&q, &x)| i32::from(q) * i32::from(x))
            .sum();
        scaled += i32::from(scale) * group;
    }
    let offsets: i32 = w
        .mins
        .iter()
        .zip(&a.bsums)
        .map(|(&m, &s)| i32::from(m) * i32::from(s))
        .sum();
    (a.d * w.d) * scaled as f32 - (a.d * w.dmin) * offsets as f32
}
