//! Portable dot products: exact integer sums per block, f32 across blocks.

use half::{bf16, f16};

use super::super::GgmlType;
use super::super::activation::{Activations, Q8Block};
use super::super::block::{self, read_f16};
use super::super::block_k::QK_K;
use super::portable_k;

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
            _ => unreachable!("{ty} does not multiply Q8 blocks"),
        },
        Activations::Q8K(xq) => portable_k::dot_row(ty, row, xq),
    }
}

/// Σ w·x over f32 weights.
pub(crate) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_float::<4>(row, x, |w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

/// Σ w·x over float weights of `BYTES` bytes each, decoded by `decode`, with
/// 8 independent accumulators so it vectorizes.
fn dot_float<const BYTES: usize>(row: &[u8], x: &[f32], decode: impl Fn(&[u8]) -> f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let row_chunks = row.chunks_exact(8 * BYTES);
    let x_chunks = x.chunks_exact(8);
    let (row_tail, x_tail) = (row_chunks.remainder(), x_chunks.remainder());
    for (w8, x8) in row_chunks.zip(x_chunks) {
        for ((lane, w), &xv) in lanes.iter_mut().zip(w8.chunks_exact(BYTES)).zip(x8) {
            *lane += decode(w) * xv;
        }
    }
    let mut sum = lanes.iter().sum::<f32>();
    for (w, &xv) in row_tail.chunks_exact(BYTES).zip(x_tail) {
        sum += decode(w) * xv;
    }
    sum
}

/// A row of a 32-weight block type · quantized activations:
/// `Σ d_w d_x Σ q_w q_x` over the blocks, plus `m_w sum_x` for the types
/// with a minimum (Q4_1, Q5_1), where `q_w` are the block's integers
/// ([`block::block_values`]: offset, 5-bit or table levels included).
pub(crate) fn dot_blocks(ty: GgmlType, row: &[u8], xq: &[Q8Block]) -> f32 {
    let min_offset = block::min_offset(ty);
    let mut sum = 0.0f32;
    for (w, a) in row.chunks_exact(ty.block_bytes()).zip(xq) {
        let values = block::block_values(ty, w);
        let isum: i32 = values
            .iter()
            .zip(&a.qs)
            .map(|(&q, &x)| i32::from(q) * i32::from(x))
            .sum();
        let mut block = read_f16(w) * a.d * isum as f32;
        if let Some(m_offset) = min_offset {
            block += read_f16(&w[m_offset..]) * a.sum;
        }
        sum += block;
    }
    sum
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
