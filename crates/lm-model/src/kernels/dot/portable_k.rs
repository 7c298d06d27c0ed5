//! Portable dot products of K-quant rows with [`Q8KBlock`] activations:
//! each super-block unpacked to the common [`SuperBlock`] form, exact integer
//! sums in eight lanes, scaled in f32 as the AVX2 kernel scales them.

use super::portable::{LANES, integer_dot, sum_lanes};
use crate::quant::GgmlType;
use crate::quant::activation::Q8KBlock;
use crate::quant::block_k::{self, SuperBlock};

/// Dot product of a K-quant row stored as `ty` with its quantized
/// activations: per super-block (`w`, activations `a`), eight i32 lanes of
/// scaled sums (lane `i` takes values `4i..4i + 4` of each run of 32, each
/// times its group's scale) and eight of offsets (lane `i` groups `2i` and
/// `2i + 1`), each lane scaled by `a.d d` or `a.d dmin` into its
/// accumulator by a fused multiply-add; at the end the offsets are
/// subtracted lane by lane and the lanes summed. The AVX2 kernel's
/// operations in its order, so its bits.
pub(crate) fn dot_row(ty: GgmlType, row: &[u8], xq: &[Q8KBlock]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut acc_offsets = [0.0f32; LANES];
    for (w, a) in row.chunks_exact(ty.block_bytes()).zip(xq) {
        let w = block_k::unpack(ty, w);
        let (sums, offsets) = lane_sums(&w, a);
        let (scale, offset_scale) = (a.d * w.d, a.d * w.dmin);
        for lane in 0..LANES {
            acc[lane] = scale.mul_add(sums[lane] as f32, acc[lane]);
            acc_offsets[lane] = offset_scale.mul_add(offsets[lane] as f32, acc_offsets[lane]);
        }
    }
    sum_lanes(std::array::from_fn(|lane| acc[lane] - acc_offsets[lane]))
}

/// One super-block · one activation block, as the exact integer lane sums
/// of [`dot_row`]: `w · a = a.d (d Σ sums - dmin Σ offsets)`, both exact in
/// i32 (at most 16 · 16 · 63 · 127 · 128 in magnitude).
fn lane_sums(w: &SuperBlock, a: &Q8KBlock) -> ([i32; LANES], [i32; LANES]) {
    let mut sums = [0i32; LANES];
    for (run, (q, x)) in w.q.chunks_exact(32).zip(a.qs.chunks_exact(32)).enumerate() {
        let fours = q.chunks_exact(4).zip(x.chunks_exact(4));
        for (lane, (q, x)) in fours.enumerate() {
            let scale = i32::from(w.scales[2 * run + lane / 4]);
            sums[lane] += scale * integer_dot(q, x);
        }
    }
    let offsets = std::array::from_fn(|lane| {
        (2 * lane..2 * lane + 2)
            .map(|g| i32::from(w.mins[g]) * i32::from(a.bsums[g]))
            .sum()
    });
    (sums, offsets)
}
