//! The byte layouts of GGML blocks and their dequantisation to f32.
//!
//! ```text
//! Q4_0 (18 bytes)  | d: f16 | qs: 16 bytes |            x[j] = d * ((qs[j] & 15) - 8)
//!                                                       x[j + 16] = d * ((qs[j] >> 4) - 8)
//! Q4_1 (20 bytes)  | d: f16 | m: f16 | qs: 16 bytes |   x[j] = d * (qs[j] & 15) + m
//!                                                       x[j + 16] = d * (qs[j] >> 4) + m
//! Q5_0 (22 bytes)  | d: f16 | qh: u32 | qs: 16 bytes |  x[j] = d * ((qs[j] & 15 | bit j of qh << 4) - 16)
//!                                                       x[j + 16] = d * ((qs[j] >> 4 | bit j + 16 of qh << 4) - 16)
//! Q5_1 (24 bytes)  | d: f16 | m: f16 | qh: u32 | qs: 16 bytes |
//!                                                       x[j] = d * (qs[j] & 15 | bit j of qh << 4) + m
//!                                                       x[j + 16] = d * (qs[j] >> 4 | bit j + 16 of qh << 4) + m
//! Q8_0 (34 bytes)  | d: f16 | qs: 32 x i8 |             x[j] = d * qs[j]
//! IQ4_NL (18 bytes) | d: f16 | qs: 16 bytes |           x[j] = d * IQ4_NL_VALUES[qs[j] & 15]
//!                                                       x[j + 16] = d * IQ4_NL_VALUES[qs[j] >> 4]
//! F16 / BF16 / F32 | one little-endian value per element |
//! ```
//!
//! Q5's 32 fifth bits `qh` are one little-endian u32: bit `j` belongs to
//! element `j`. IQ4_NL's 4-bit codes index a fixed table of 16 signed levels,
//! denser near zero, where most weights are.
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

/// IQ4_NL's 16 levels, indexed by a weight's 4-bit code (GGML's
/// `kvalues_iq4nl`, part of the format).
pub(crate) const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 32 quantized values of one block of a 32-weight type, as the
/// integers its scale multiplies: `q - 8` (Q4_0), `q` (Q4_1), `q - 16`
/// (Q5_0), `q` (Q5_1), `q` (Q8_0) or the table level (IQ4_NL). Every value
/// fits an i8; element order is the block's (`j` then `j + 16` for the
/// nibble types).
#[inline(always)]
pub(crate) fn block_values(ty: GgmlType, block: &[u8]) -> [i8; QK] {
    let mut values = [0i8; QK];
    match ty {
        GgmlType::Q4_0 => unpack_nibbles(&block[2..18], &mut values, |q| q as i8 - 8),
        GgmlType::Q4_1 => unpack_nibbles(&block[4..20], &mut values, |q| q as i8),
        GgmlType::IQ4_NL => unpack_nibbles(&block[2..18], &mut values, |q| {
            IQ4_NL_VALUES[usize::from(q)]
        }),
        GgmlType::Q5_0 => unpack_five_bits(&block[2..22], &mut values, -16),
        GgmlType::Q5_1 => unpack_five_bits(&block[4..24], &mut values, 0),
        GgmlType::Q8_0 => {
            for (v, &q) in values.iter_mut().zip(&block[2..34]) {
                *v = q as i8;
            }
        }
        _ => unreachable!("{ty} is not a 32-weight block type"),
    }
    values
}

/// Low nibbles of `packed` (16 bytes) to elements 0..16, high nibbles to
/// 16..32, each mapped by `level`.
#[inline(always)]
fn unpack_nibbles(packed: &[u8], out: &mut [i8; QK], level: impl Fn(u8) -> i8) {
    let (low, high) = out.split_at_mut(QK / 2);
    for ((&q, lo), hi) in packed.iter().zip(low).zip(high) {
        *lo = level(q & 0x0F);
        *hi = level(q >> 4);
    }
}

/// A Q5 block's fifth bits `qh` (4 bytes) and nibbles (16 bytes) as the
/// 5-bit values plus `offset`.
#[inline(always)]
fn unpack_five_bits(qh_and_qs: &[u8], out: &mut [i8; QK], offset: i8) {
    let qh = u32::from_le_bytes([qh_and_qs[0], qh_and_qs[1], qh_and_qs[2], qh_and_qs[3]]);
    let (low, high) = out.split_at_mut(QK / 2);
    for (j, ((&q, lo), hi)) in qh_and_qs[4..].iter().zip(low).zip(high).enumerate() {
        let bit_lo = ((qh >> j) & 1) as u8;
        let bit_hi = ((qh >> (j + 16)) & 1) as u8;
        *lo = ((q & 0x0F) | (bit_lo << 4)) as i8 + offset;
        *hi = ((q >> 4) | (bit_hi << 4)) as i8 + offset;
    }
}

/// Reads the little-endian f16 at `bytes[0..2]` as f32 (0 if fewer bytes).
#[inline(always)]
pub(crate) fn read_f16(bytes: &[u8]) -> f32 {
    match bytes {
        [lo, hi, ..] => f16::from_le_bytes([*lo, *hi]).to_f32(),
        _ => 0.0,
    }
}

/// Dequantises one block of a 32-weight type into `out` (32 values): the
/// block's integers times the f16 scale `d` in f32, plus the f16 minimum `m`
/// for Q4_1 and Q5_1 (a separate f32 add, as GGML rounds it).
#[inline]
pub(crate) fn dequantize_block(ty: GgmlType, block: &[u8], out: &mut [f32]) {
    let d = read_f16(block);
    let values = block_values(ty, block);
    if let Some(m_offset) = min_offset(ty) {
        let m = read_f16(&block[m_offset..]);
        for (o, &q) in out.iter_mut().zip(&values) {
            *o = f32::from(q) * d + m;
        }
    } else {
        for (o, &q) in out.iter_mut().zip(&values) {
            *o = f32::from(q) * d;
        }
    }
}

/// Where a 32-weight type keeps its f16 minimum `m` (Q4_1 and Q5_1, after
/// the scale), or `None`.
#[inline(always)]
pub(crate) fn min_offset(ty: GgmlType) -> Option<usize> {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1).then_some(2)
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
        GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q8_0
        | GgmlType::IQ4_NL => {
            for (b, o) in row
                .chunks_exact(ty.block_bytes())
                .zip(out.chunks_exact_mut(QK))
            {
                dequantize_block(ty, b, o);
            }
        }
        GgmlType::MXFP4 => {
            for (b, o) in row
                .chunks_exact(ty.block_bytes())
                .zip(out.chunks_exact_mut(QK))
            {
                super::mxfp4::dequantize_block(b, o);
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

/// The f16 fields of a block that must be finite, with their byte offsets:
/// the scale `d` and, for Q4_1, Q5_1, Q2_K, Q4_K and Q5_K, the minimum (what GGML's
/// `ggml_validate_row_data` checks). Float types have none: their values are
/// checked one by one.
pub(crate) fn f16_fields(ty: GgmlType) -> &'static [(&'static str, usize)] {
    match ty {
        // MXFP4's E8M0 exponent is a power of two for every byte.
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::MXFP4 => &[],
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => &[("scale d", 0)],
        GgmlType::Q4_1 | GgmlType::Q5_1 => &[("scale d", 0), ("minimum m", 2)],
        // The K-quants' super-block scales, at their offsets in the `block_k` diagrams.
        GgmlType::Q4_K | GgmlType::Q5_K => &[("scale d", 0), ("minimum dmin", 2)],
        GgmlType::Q2_K => &[("scale d", 80), ("minimum dmin", 82)],
        GgmlType::Q3_K => &[("scale d", 108)],
        GgmlType::Q6_K => &[("scale d", 208)],
        GgmlType::IQ4_XS => &[("scale d", 0)],
    }
}

/// The first value of `block` (one block of `ty`) that is NaN or infinite,
/// with the name of its field: an f16 scale or minimum of a quantized
/// block, or the value of a float "block" of one element.
#[inline]
pub(crate) fn non_finite_field(ty: GgmlType, block: &[u8]) -> Option<(&'static str, f32)> {
    let value = match ty {
        GgmlType::F32 => f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
        // Exponent all ones: infinite or NaN (cheaper than widening).
        GgmlType::F16 if u16::from_le_bytes([block[0], block[1]]) & 0x7C00 != 0x7C00 => {
            return None;
        }
        GgmlType::F16 => read_f16(block),
        GgmlType::BF16 => bf16::from_le_bytes([block[0], block[1]]).to_f32(),
        _ => {
            return f16_fields(ty).iter().find_map(|&(what, offset)| {
                let value = read_f16(&block[offset..]);
                (!value.is_finite()).then_some((what, value))
            });
        }
    };
    (!value.is_finite()).then_some(("value", value))
}
