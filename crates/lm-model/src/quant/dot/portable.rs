//! Portable dot products: exact integer sums per block, f32 across blocks.

use half::{bf16, f16};

use super::super::GgmlType;
use super::super::activation::{Activations, Q8Block};
use super::super::block::{self, QK, read_f16};
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
            GgmlType::Q4_0 => dot_q4_0(row, xq),
            GgmlType::Q4_1 => dot_q4_1(row, xq),
            GgmlType::Q8_0 => dot_q8_0(row, xq),
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

/// Q4_0 row · quantized activations: `Σ d_w d_x Σ (q_w - 8) q_x`.
pub(crate) fn dot_q4_0(row: &[u8], xq: &[Q8Block]) -> f32 {
    dot_q4::<18, false>(row, xq)
}

/// Q4_1 row · quantized activations: `Σ d_w d_x Σ q_w q_x + m_w sum_x`.
pub(crate) fn dot_q4_1(row: &[u8], xq: &[Q8Block]) -> f32 {
    dot_q4::<20, true>(row, xq)
}

/// A row of 4-bit blocks (`BYTES` long: the f16 scale, with `HAS_MIN` the
/// f16 minimum, then 16 bytes of nibbles) · quantized activations. Without
/// a minimum the nibbles are offset by 8.
fn dot_q4<const BYTES: usize, const HAS_MIN: bool>(row: &[u8], xq: &[Q8Block]) -> f32 {
    let (offset, first_quant) = if HAS_MIN { (0, 4) } else { (8, 2) };
    let mut sum = 0.0f32;
    for (w, a) in row.chunks_exact(BYTES).zip(xq) {
        let (low, high) = a.qs.split_at(QK / 2);
        let mut isum = 0i32;
        for ((&q, &lo), &hi) in w[first_quant..].iter().zip(low).zip(high) {
            isum += (i32::from(q & 0x0F) - offset) * i32::from(lo);
            isum += (i32::from(q >> 4) - offset) * i32::from(hi);
        }
        let mut block = read_f16(w) * a.d * isum as f32;
        if HAS_MIN {
            block += read_f16(&w[2..]) * a.sum;
        }
        sum += block;
    }
    sum
}

/// Q8_0 row · quantized activations.
pub(crate) fn dot_q8_0(row: &[u8], xq: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in row.chunks_exact(34).zip(xq) {
        let isum: i32 = w[2..]
            .iter()
            .zip(&a.qs)
            .map(|(&q, &xv)| i32::from(q as i8) * i32::from(xv))
            .sum();
        sum += read_f16(w) * a.d * isum as f32;
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
