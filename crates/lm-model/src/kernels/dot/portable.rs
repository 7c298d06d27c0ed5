//! Portable dot products: exact integer sums per block, f32 across blocks.

use half::{bf16, f16};

use super::portable_k;
use crate::quant::GgmlType;
use crate::quant::activation::{Activations, Q8Block};
use crate::quant::block::{self, read_f16};
use crate::quant::block_k::QK_K;

/// Dot product of a row stored as `ty` with activations `x` of the kind `ty`
/// multiplies with.
pub(crate) fn dot_row(ty: GgmlType, row: &[u8], x: Activations<'_>) -> f32 {
    match x {
        Activations::F32(x) => match ty {
            GgmlType::F32 => dot_f32(row, x),
            GgmlType::F16 => dot_float::<2>(row, x, |b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
            GgmlType::BF16 => {
                dot_float::<2>(row, x, |b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            }
            _ => unreachable!("{ty} does not multiply f32 activations"),
        },
        Activations::Q8(xq) => match ty {
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL => dot_blocks(ty, row, xq),
            GgmlType::MXFP4 => crate::quant::mxfp4::dot_blocks(row, xq),
            _ => unreachable!("{ty} does not multiply Q8 blocks"),
        },
        Activations::Q8K(xq) => portable_k::dot_row(ty, row, xq),
    }
}

/// Σ w·x over f32 weights.
pub(crate) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_float::<4>(row, x, |w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

/// Σ w·x over float weights of `BYTES` bytes each, decoded by `decode`:
/// weight `j` into accumulator `j % 8` by a fused multiply-add, the
/// accumulators summed by [`sum_lanes`], then the tail past the last eight
/// (the AVX2 kernel's operations, so its bits).
fn dot_float<const BYTES: usize>(row: &[u8], x: &[f32], decode: impl Fn(&[u8]) -> f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let row_chunks = row.chunks_exact(LANES * BYTES);
    let x_chunks = x.chunks_exact(LANES);
    let (row_tail, x_tail) = (row_chunks.remainder(), x_chunks.remainder());
    for (w8, x8) in row_chunks.zip(x_chunks) {
        for ((lane, w), &xv) in lanes.iter_mut().zip(w8.chunks_exact(BYTES)).zip(x8) {
            *lane = decode(w).mul_add(xv, *lane);
        }
    }
    let mut sum = sum_lanes(lanes);
    for (w, &xv) in row_tail.chunks_exact(BYTES).zip(x_tail) {
        sum += decode(w) * xv;
    }
    sum
}

/// A row of a 32-weight block type · quantized activations:
/// `Σ d_w d_x Σ q_w q_x` over the blocks, plus `m_w sum_x` for the types
/// with a minimum (Q4_1, Q5_1), where `q_w` are the block's integers
/// ([`block::block_values`]: offset, 5-bit or table levels included).
///
/// The f32 operations are the AVX2 kernel's, in its order, so both give the
/// same bits (and the conformance fixtures see the same numbers on every
/// machine): each block's products are summed exactly in eight lanes of
/// four values, each lane scaled by `d_w d_x` into its accumulator by a
/// fused multiply-add, even and odd blocks into two sets of accumulators
/// (and two sums of `m_w sum_x`), which meet at the end ([`sum_lanes`]).
pub(crate) fn dot_blocks(ty: GgmlType, row: &[u8], xq: &[Q8Block]) -> f32 {
    let min_offset = block::min_offset(ty);
    let mut acc = [[0.0f32; LANES]; 2];
    let mut offsets = [0.0f32; 2];
    for (idx, (w, a)) in row.chunks_exact(ty.block_bytes()).zip(xq).enumerate() {
        let parity = idx % 2;
        let values = block::block_values(ty, w);
        let scale = read_f16(w) * a.d;
        let fours = values.chunks_exact(4).zip(a.qs.chunks_exact(4));
        for (lane, (q, x)) in acc[parity].iter_mut().zip(fours) {
            *lane = scale.mul_add(integer_dot(q, x) as f32, *lane);
        }
        if let Some(m_offset) = min_offset {
            offsets[parity] += read_f16(&w[m_offset..]) * a.sum;
        }
    }
    let [even, odd] = acc;
    sum_lanes(std::array::from_fn(|i| even[i] + odd[i])) + (offsets[0] + offsets[1])
}

/// The f32 accumulators of the block kernels: lane `i` takes values
/// `4i..4i + 4` of each run of 32 (an AVX2 register of i32 sums).
pub(super) const LANES: usize = 8;

/// Σ q x of weight and activation integers, exact.
pub(super) fn integer_dot(q: &[i8], x: &[i8]) -> i32 {
    q.iter()
        .zip(x)
        .map(|(&q, &x)| i32::from(q) * i32::from(x))
        .sum()
}

/// The sum of the lanes in the AVX2 kernels' order (`horizontal_sum`): the
/// upper four onto the lower four, the upper two of those onto the lower
/// two, then the second onto the first.
pub(super) fn sum_lanes(v: [f32; LANES]) -> f32 {
    let quad: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    (quad[0] + quad[2]) + (quad[1] + quad[3])
}

/// Dot product of a row with f32 activations, dequantizing one block at a
/// time: the accuracy reference for the quantized-activation path.
pub(crate) fn dot_row_exact(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    if !ty.is_quantized() {
        return dot_row(ty, row, Activations::F32(x));
    }
    let block_size = ty.block_size();
    let mut buffer = [0.0f32; QK_K];
    let weights = &mut buffer[..block_size];
    let mut sum = 0.0f64;
    for (w, xs) in row
        .chunks_exact(ty.block_bytes())
        .zip(x.chunks_exact(block_size))
    {
        block::dequantize_row(ty, w, weights);
        let block_sum: f32 = weights.iter().zip(xs).map(|(a, b)| a * b).sum();
        sum += f64::from(block_sum);
    }
    sum as f32
}
