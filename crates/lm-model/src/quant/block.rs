//! The byte layouts of GGML blocks and their dequantisation to f32.
//!
//! ```text
//! Q4_0 (18 bytes)  | d: f16 | qs: 16 bytes |            x[j] = d * ((qs[j] & 15) - 8)
//!                                                       x[j + 16] = d * ((qs[j] >> 4) - 8)
//! Q4_1 (20 bytes)  | d: f16 | m: f16 | qs: 16 bytes |   x[j] = d * (qs[j] & 15) + m
//!                                                       x[j + 16] = d * (qs[j] >> 4) + m
//! Q8_0 (34 bytes)  | d: f16 | qs: 32 x i8 |             x[j] = d * qs[j]
//! F16 / BF16 / F32 | one little-endian value per element |
//! ```
//!
//! The K-quants' super-blocks of 256 are drawn in the `block_k` module.
//!
//! All multi-byte values are little-endian. The arithmetic follows GGML's
//! reference dequantisation exactly (an f32 multiply, then an f32 add for Q4_1;
//! no fused multiply-add), so results are bit-identical to it.

use half::{bf16, f16};

use super::GgmlType;
use super::block_k::{self, QK_K};

/// Number of weights in a quantized block.
pub const QK: usize = 32;

/// Reads the little-endian f16 at `bytes[0..2]` as f32 (0 if fewer bytes).
#[inline(always)]
pub(crate) fn read_f16(bytes: &[u8]) -> f32 {
    match bytes {
        [lo, hi, ..] => f16::from_le_bytes([*lo, *hi]).to_f32(),
        _ => 0.0,
    }
}

/// Dequantises one block of Q4_0 (`block.len() == 18`) into `out` (32 values).
#[inline]
pub(crate) fn dequantize_block_q4_0(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block);
    let (low, high) = out.split_at_mut(QK / 2);
    for ((&q, lo), hi) in block[2..].iter().zip(low).zip(high) {
        *lo = (i32::from(q & 0x0F) - 8) as f32 * d;
        *hi = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// Dequantises one block of Q4_1 (`block.len() == 20`) into `out` (32 values).
#[inline]
pub(crate) fn dequantize_block_q4_1(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block);
    let m = read_f16(&block[2..]);
    let (low, high) = out.split_at_mut(QK / 2);
    for ((&q, lo), hi) in block[4..].iter().zip(low).zip(high) {
        *lo = f32::from(q & 0x0F) * d + m;
        *hi = f32::from(q >> 4) * d + m;
    }
}

/// Dequantises one block of Q8_0 (`block.len() == 34`) into `out` (32 values).
#[inline]
pub(crate) fn dequantize_block_q8_0(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block);
    for (&q, o) in block[2..].iter().zip(out) {
        *o = f32::from(q as i8) * d;
    }
}

/// Dequantises a row stored as `ty` into `out`.
///
/// The caller guarantees `row.len() == ty.row_bytes(out.len())`; extra bytes or
/// values are left alone (never a panic).
pub(crate) fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (b, o) in row.chunks_exact(4).zip(out) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (b, o) in row.chunks_exact(2).zip(out) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (b, o) in row.chunks_exact(2).zip(out) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (b, o) in row.chunks_exact(18).zip(out.chunks_exact_mut(QK)) {
                dequantize_block_q4_0(b, o);
            }
        }
        GgmlType::Q4_1 => {
            for (b, o) in row.chunks_exact(20).zip(out.chunks_exact_mut(QK)) {
                dequantize_block_q4_1(b, o);
            }
        }
        GgmlType::Q8_0 => {
            for (b, o) in row.chunks_exact(34).zip(out.chunks_exact_mut(QK)) {
                dequantize_block_q8_0(b, o);
            }
        }
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_XS => {
            let blocks = row.chunks_exact(ty.block_bytes());
            for (b, o) in blocks.zip(out.chunks_exact_mut(QK_K)) {
                block_k::dequantize_block(ty, b, o);
            }
        }
    }
}
