//! The byte layouts of GGML's K-quant super-blocks (256 weights), their
//! bit-exact dequantisation, and their unpacking into one common form for the
//! dot kernels.
//!
//! ```text
//! Q4_K (144 bytes) | d: f16 | dmin: f16 | scales: 12 bytes | qs: 128 bytes |
//! Q5_K (176 bytes) | d: f16 | dmin: f16 | scales: 12 bytes | qh: 32 bytes | qs: 128 bytes |
//!   8 groups of 32; group g has a 6-bit scale sc[g] and a 6-bit minimum m[g]
//!   packed in `scales` (see `scales_mins_k4`). Group g = 2k (k = 0..4) takes
//!   the low nibbles of qs[32k..32k + 32], group 2k + 1 their high nibbles;
//!   Q5_K adds bit g of qh[l] as the value's fifth bit (16):
//!   x = (d * sc[g]) * q - (dmin * m[g])
//! Q6_K (210 bytes) | ql: 128 bytes | qh: 64 bytes | scales: 16 x i8 | d: f16 |
//!   two halves of 128; in half h, for l = 0..32 and A = ql[64h..], B = ql[64h + 32..],
//!   H = qh[32h..]:  x[128h + l]      from A[l] & 15 | (H[l] & 3) << 4
//!                   x[128h + l + 32] from B[l] & 15 | (H[l] >> 2 & 3) << 4
//!                   x[128h + l + 64] from A[l] >> 4 | (H[l] >> 4 & 3) << 4
//!                   x[128h + l + 96] from B[l] >> 4 | (H[l] >> 6 & 3) << 4
//!   16 groups of 16 with signed scales: x = (d * scales[j / 16]) * (q - 32)
//! Q3_K (110 bytes) | hmask: 32 bytes | qs: 64 bytes | scales: 12 bytes | d: f16 |
//!   chunk c = 4h + s (32 values, l = 0..32) takes (qs[32h + l] >> 2s) & 3 and, as
//!   bit 2, bit c of hmask[l]; 16 groups of 16 with 6-bit scales (stored + 32):
//!   x = (d * (sc - 32)) * (q - 4)  (q in 0..8)
//! Q2_K (84 bytes)  | scales: 16 bytes | qs: 64 bytes | d: f16 | dmin: f16 |
//!   chunk c = 4h + s takes (qs[32h + l] >> 2s) & 3; group j / 16 has scale
//!   scales[g] & 15 and minimum scales[g] >> 4:  x = (d * sc) * q - (dmin * m)
//! IQ4_XS (136 bytes) | d: f16 | scales_h: u16 | scales_l: 4 bytes | qs: 128 bytes |
//!   8 groups of 32; group g takes qs[16g..16g + 16], low nibbles first, as
//!   indices k into IQ4_VALUES; its scale is the nibble g % 2 of scales_l[g / 2]
//!   with bits 2g..2g + 2 of scales_h above it:
//!   x = (d * (sc - 32)) * IQ4_VALUES[k]
//! ```
//!
//! Every type is a sum over 16 groups of 16 values, so the kernels multiply
//! one common form, [`SuperBlock`]: 256 small integer values (unsigned and
//! below 64, or IQ4_XS's signed table values), an integer scale and an
//! integer offset per group of 16, and two float factors. For a block of
//! activations `a` (a [`Q8KBlock`](super::activation::Q8KBlock)):
//!
//! ```text
//! w · a = a.d * (d * Σ_g scales[g] Σ_{j in g} q[j] a.qs[j]  -  dmin * Σ_g mins[g] a.bsums[g])
//! ```
//!
//! (for Q6_K and Q3_K the offset is `d * 32 sc` and `d * 4 sc`: `dmin = d`).
//! The integer sums are exact; only the f32 scaling rounds, as in llama.cpp.
//! Dequantisation follows GGML's reference expressions exactly (f32 products
//! in its order, no fused multiply-add), so it is bit-identical to it.

use super::GgmlType;
use super::block::read_f16;

/// Number of weights in a K-quant super-block.
pub const QK_K: usize = 256;

/// Groups of 16 values in a super-block.
pub(crate) const N_GROUPS: usize = QK_K / 16;

/// A super-block in the form the dot kernels multiply (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SuperBlock {
    /// The factor of the scaled sums.
    pub d: f32,
    /// The factor of the offsets.
    pub dmin: f32,
    /// The 256 values: in `0..64`, or IQ4_XS's table values (see
    /// [`SuperBlock::signed_values`]).
    pub q: [i8; QK_K],
    /// The integer scale of each group of 16 values.
    pub scales: [i16; N_GROUPS],
    /// The integer offset of each group, multiplied by the group's activation sum.
    pub mins: [i16; N_GROUPS],
}

/// The float factors and per-group integer scales and offsets of a
/// super-block of `ty` (a K-quant; `block` is one block): everything of the
/// [`SuperBlock`] form but the values.
#[inline(always)]
pub(crate) fn factors(ty: GgmlType, block: &[u8]) -> (f32, f32, [i16; N_GROUPS], [i16; N_GROUPS]) {
    let mut scales = [0i16; N_GROUPS];
    let mut mins = [0i16; N_GROUPS];
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (sc, m) = scales_mins_k4(&block[4..16]);
            for g in 0..N_GROUPS {
                scales[g] = i16::from(sc[g / 2]);
                mins[g] = i16::from(m[g / 2]);
            }
            (read_f16(block), read_f16(&block[2..]), scales, mins)
        }
        GgmlType::Q6_K => {
            for (g, &s) in block[192..208].iter().enumerate() {
                scales[g] = i16::from(s as i8);
                mins[g] = 32 * scales[g];
            }
            let d = read_f16(&block[208..]);
            (d, d, scales, mins)
        }
        GgmlType::Q3_K => {
            let sc = scales_q3_k(&block[96..108]);
            for g in 0..N_GROUPS {
                scales[g] = i16::from(sc[g]);
                mins[g] = 4 * scales[g];
            }
            let d = read_f16(&block[108..]);
            (d, d, scales, mins)
        }
        GgmlType::Q2_K => {
            for (g, &s) in block[..16].iter().enumerate() {
                scales[g] = i16::from(s & 15);
                mins[g] = i16::from(s >> 4);
            }
            (read_f16(&block[80..]), read_f16(&block[82..]), scales, mins)
        }
        GgmlType::IQ4_XS => {
            for (g, scale) in scales.iter_mut().enumerate() {
                *scale = i16::from(iq4_xs_scale(block, g / 2)) - 32;
            }
            (read_f16(block), 0.0, scales, mins)
        }
        _ => unreachable!("{ty} is not a K-quant"),
    }
}

/// The 6-bit scale (still offset by 32) of group `g` (of 8) of an IQ4_XS block.
#[inline]
fn iq4_xs_scale(block: &[u8], g: usize) -> u8 {
    let high = u16::from_le_bytes([block[2], block[3]]);
    let low = (block[4 + g / 2] >> (4 * (g % 2))) & 15;
    low | ((((high >> (2 * g)) & 3) as u8) << 4)
}

/// The sixteen values IQ4_XS's (and IQ4_NL's) 4-bit indices select, from
/// GGML's `kvalues_iq4nl`.
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Unpacks one super-block of `ty` into the common [`SuperBlock`] form.
pub(crate) fn unpack(ty: GgmlType, block: &[u8]) -> SuperBlock {
    let (d, dmin, scales, mins) = factors(ty, block);
    let mut q = [0u8; QK_K];
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let qs_at = if ty == GgmlType::Q5_K { 48 } else { 16 };
            let qs = &block[qs_at..qs_at + 128];
            for (k, chunk) in qs.chunks_exact(32).enumerate() {
                for (l, &b) in chunk.iter().enumerate() {
                    q[64 * k + l] = b & 15;
                    q[64 * k + 32 + l] = b >> 4;
                }
            }
            if ty == GgmlType::Q5_K {
                let qh = &block[16..48];
                for (c, values) in q.chunks_exact_mut(32).enumerate() {
                    for (v, &h) in values.iter_mut().zip(qh) {
                        *v |= ((h >> c) & 1) << 4;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for half in 0..2 {
                let ql = &block[64 * half..64 * half + 64];
                let qh = &block[128 + 32 * half..128 + 32 * half + 32];
                let out = &mut q[128 * half..128 * half + 128];
                for l in 0..32 {
                    let (a, b, h) = (ql[l], ql[l + 32], qh[l]);
                    out[l] = (a & 15) | ((h & 3) << 4);
                    out[l + 32] = (b & 15) | (((h >> 2) & 3) << 4);
                    out[l + 64] = (a >> 4) | (((h >> 4) & 3) << 4);
                    out[l + 96] = (b >> 4) | (((h >> 6) & 3) << 4);
                }
            }
        }
        GgmlType::Q3_K | GgmlType::Q2_K => {
            let (qs, hmask) = if ty == GgmlType::Q3_K {
                (&block[32..96], Some(&block[..32]))
            } else {
                (&block[16..80], None)
            };
            for (c, values) in q.chunks_exact_mut(32).enumerate() {
                let (half, shift) = (c / 4, 2 * (c % 4));
                for (l, v) in values.iter_mut().enumerate() {
                    *v = (qs[32 * half + l] >> shift) & 3;
                    if let Some(hmask) = hmask {
                        *v |= ((hmask[l] >> c) & 1) << 2;
                    }
                }
            }
        }
        GgmlType::IQ4_XS => {
            for (values, packed) in q.chunks_exact_mut(32).zip(block[8..].chunks_exact(16)) {
                let (low, high) = values.split_at_mut(16);
                for ((lo, hi), &b) in low.iter_mut().zip(high).zip(packed) {
                    *lo = IQ4_VALUES[usize::from(b & 15)] as u8;
                    *hi = IQ4_VALUES[usize::from(b >> 4)] as u8;
                }
            }
        }
        _ => unreachable!("{ty} is not a K-quant"),
    }
    SuperBlock {
        d,
        dmin,
        q: q.map(|v| v as i8),
        scales,
        mins,
    }
}

impl SuperBlock {
    /// Whether the values of `ty` can be negative (IQ4_XS's table values,
    /// in `-127..=113`); otherwise they are in `0..64`.
    pub fn signed_values(ty: GgmlType) -> bool {
        ty == GgmlType::IQ4_XS
    }
}

/// The eight 6-bit scales and eight 6-bit minimums of Q4_K and Q5_K, packed
/// in 12 bytes: for j < 4, the scale is the low 6 bits of byte j and the
/// minimum those of byte j + 4; for j >= 4, the low (scale) or high (minimum)
/// nibble of byte j + 4, with the top two bits of byte j - 4 (scale) or byte
/// j (minimum) above it.
#[inline]
pub(crate) fn scales_mins_k4(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..4 {
        scales[j] = packed[j] & 63;
        mins[j] = packed[j + 4] & 63;
    }
    for j in 4..8 {
        scales[j] = (packed[j + 4] & 15) | ((packed[j - 4] >> 6) << 4);
        mins[j] = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
    }
    (scales, mins)
}

/// The sixteen signed scales of Q3_K (stored as 6 bits, offset by 32), packed
/// in 12 bytes: scale j's low nibble is the low (j < 8) or high (j >= 8)
/// nibble of byte `j % 8`, and its top two bits are bits `2 * (j / 4)` and up
/// of byte `8 + j % 4` (GGML's `kmask` shuffle).
#[inline]
pub(crate) fn scales_q3_k(packed: &[u8]) -> [i8; 16] {
    let mut scales = [0i8; 16];
    for (j, s) in scales.iter_mut().enumerate() {
        let low = if j < 8 {
            packed[j] & 15
        } else {
            packed[j - 8] >> 4
        };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *s = (low | (high << 4)) as i8 - 32;
    }
    scales
}

/// Dequantises one super-block of `ty` (`block.len() == ty.block_bytes()`)
/// into `out` (256 values), with GGML's reference arithmetic.
pub(crate) fn dequantize_block(ty: GgmlType, block: &[u8], out: &mut [f32]) {
    let SuperBlock {
        d, dmin, q, scales, ..
    } = unpack(ty, block);
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (sc, m) = scales_mins_k4(&block[4..16]);
            for (g, (values, out)) in q.chunks_exact(32).zip(out.chunks_exact_mut(32)).enumerate() {
                let scale = d * f32::from(sc[g]);
                let min = dmin * f32::from(m[g]);
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = scale * f32::from(v) - min;
                }
            }
        }
        GgmlType::Q6_K | GgmlType::Q3_K | GgmlType::IQ4_XS => {
            let offset = match ty {
                GgmlType::Q6_K => 32,
                GgmlType::Q3_K => 4,
                _ => 0,
            };
            for ((values, out), &sc) in q
                .chunks_exact(16)
                .zip(out.chunks_exact_mut(16))
                .zip(&scales)
            {
                let scale = d * f32::from(sc);
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = scale * f32::from(i16::from(v) - offset);
                }
            }
        }
        GgmlType::Q2_K => {
            for (g, (values, out)) in q.chunks_exact(16).zip(out.chunks_exact_mut(16)).enumerate() {
                let sc = block[g];
                let scale = d * f32::from(sc & 15);
                let min = dmin * f32::from(sc >> 4);
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = scale * f32::from(v) - min;
                }
            }
        }
        _ => unreachable!("{ty} is not a K-quant"),
    }
}
