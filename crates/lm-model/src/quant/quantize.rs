//! Quantization of f32 rows into GGML blocks, bit for bit as ggml's
//! reference quantizers write them (`quantize_row_q8_0_ref`,
//! `quantize_row_q4_0_ref`, `_q4_1_ref`, `_q5_0_ref`, `_q5_1_ref`,
//! `_q2_K_ref`, `_q3_K_ref`, `_q4_K_ref`, `_q5_K_ref` and `_q6_K_ref` in
//! ggml/src/ggml-quants.c; IQ4_NL and IQ4_XS as `quantize_iq4_nl` and
//! `quantize_iq4_xs` write them, in `quantize/iq4.rs`), which is what
//! `llama-quantize` runs for these types when no importance matrix is
//! given. The K-quants' searches
//! (ggml's `make_qkx2_quants`, `make_qx_quants` and `make_q3_quants`) are
//! described at [`make_qkx2_quants`], [`make_qx_quants`] and
//! `search::make_q3_quants`.
//!
//! Per block of 32 values `x` (layouts in the `block` module):
//!
//! ```text
//! Q8_0  d = max|x| / 127                 q = round(x / d)             (half away from zero)
//! Q4_0  d = m / -8, m the x of largest |x|  q = min(15, trunc(x / d + 8.5))
//! Q5_0  d = m / -16                      q = min(31, trunc(x / d + 16.5))
//! Q4_1  d = (max - min) / 15, m = min    q = min(15, trunc((x - min) / d + 0.5))
//! Q5_1  d = (max - min) / 31, m = min    q = trunc((x - min) / d + 0.5), its low 5 bits
//! ```
//!
//! "x / d" is `x * (1 / d)` in f32 (0 when `d` is 0), `d` and `m` are stored
//! as f16 rounded to nearest even, and the quantized values are computed from
//! the unrounded f32 `d`: each step is ggml's, in its order, so the bytes
//! match. The float types are plain conversions (F16 and BF16 rounded to
//! nearest even, as ggml's row converters). Inputs must be finite: ggml's
//! results for NaN or infinity depend on undefined float-to-int casts.

mod iq4;
mod search;

use half::{bf16, f16};

use super::block::QK;
use super::block_k::{QK_K, scales_mins_k4, scales_q3_k};
use super::{GgmlType, NonFinite, QuantError, SUPPORTED_TYPES};

/// Why [`GgmlType::quantize_row`] refused its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantizeError {
    /// A type this crate can read but not (yet) write.
    #[error("cannot quantize to {ty}; quantizable types: {}", quantizable_names())]
    Unsupported {
        /// The requested type.
        ty: GgmlType,
    },
    /// A row that is not a whole number of blocks, or an output buffer of
    /// the wrong size.
    #[error(transparent)]
    Shape(#[from] QuantError),
    /// A NaN or infinite input value.
    #[error("value {index} of the row is {value}: only finite values can be quantized")]
    NonFinite {
        /// Its index in the row.
        index: usize,
        /// What it is.
        value: NonFinite,
    },
}

/// The types [`GgmlType::quantize_row`] writes, in id order (as the
/// unsupported-type error lists the types it reads).
fn quantizable_names() -> String {
    SUPPORTED_TYPES
        .iter()
        .filter(|ty| ty.can_quantize())
        .map(|ty| ty.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl GgmlType {
    /// Whether [`GgmlType::quantize_row`] can write this type: every type
    /// this crate reads but MXFP4, which it does not write yet (an
    /// exhaustive match, so a new type must be decided here).
    pub fn can_quantize(self) -> bool {
        match self {
            GgmlType::MXFP4 => false,
            GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS => true,
        }
    }

    /// Quantizes the f32 row `src` into `dst`, which must be exactly
    /// `self.row_bytes(src.len())` bytes, with ggml's reference algorithm
    /// (see the `quantize` module docs): the blocks equal `llama-quantize`'s
    /// byte for byte.
    ///
    /// ```
    /// use lm_model::GgmlType;
    /// let row: Vec<f32> = (0..32).map(|i| i as f32 - 8.0).collect();
    /// let mut block = vec![0u8; 34];
    /// GgmlType::Q8_0.quantize_row(&row, &mut block).unwrap();
    /// // d = 23 / 127 as f16; the largest value maps to 127.
    /// assert_eq!(block[33] as i8, 127);
    /// assert_eq!(block[2] as i8, -44); // round(-8 * 127 / 23)
    /// ```
    pub fn quantize_row(self, src: &[f32], dst: &mut [u8]) -> Result<(), QuantizeError> {
        if !self.can_quantize() {
            return Err(QuantizeError::Unsupported { ty: self });
        }
        let expected = self.row_bytes(src.len())?;
        if dst.len() != expected {
            return Err(QuantError::DataLength {
                ty: self,
                n_rows: 1,
                n_cols: src.len(),
                expected,
                actual: dst.len(),
            }
            .into());
        }
        if let Some(index) = src.iter().position(|v| !v.is_finite()) {
            return Err(QuantizeError::NonFinite {
                index,
                value: NonFinite::of(src[index]),
            });
        }
        match self {
            GgmlType::F32 => {
                for (v, out) in src.iter().zip(dst.chunks_exact_mut(4)) {
                    out.copy_from_slice(&v.to_le_bytes());
                }
            }
            GgmlType::F16 => {
                for (&v, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
                    out.copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
            GgmlType::BF16 => {
                for (&v, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
                    out.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
                }
            }
            // Eight blocks at a time (their searches side by side).
            GgmlType::IQ4_NL => iq4::quantize_row_iq4_nl(src, dst),
            GgmlType::IQ4_XS => self.quantize_blocks(src, dst, iq4::quantize_iq4_xs),
            GgmlType::Q2_K => self.quantize_blocks(src, dst, quantize_q2_k),
            GgmlType::Q3_K => self.quantize_blocks(src, dst, quantize_q3_k),
            GgmlType::Q4_K => self.quantize_blocks(src, dst, quantize_q4_k),
            GgmlType::Q5_K => self.quantize_blocks(src, dst, quantize_q5_k),
            GgmlType::Q6_K => self.quantize_blocks(src, dst, quantize_q6_k),
            GgmlType::Q8_0 => self.quantize_blocks(src, dst, quantize_q8_0),
            GgmlType::Q4_0 => self.quantize_blocks(src, dst, quantize_q4_0),
            GgmlType::Q4_1 => self.quantize_blocks(src, dst, quantize_q4_1),
            GgmlType::Q5_0 => self.quantize_blocks(src, dst, quantize_q5_0),
            GgmlType::Q5_1 => self.quantize_blocks(src, dst, quantize_q5_1),
            // Refused by `can_quantize` above.
            GgmlType::MXFP4 => return Err(QuantizeError::Unsupported { ty: self }),
        }
        Ok(())
    }

    /// Quantizes `src`, a whole number of `B`-value blocks, into `dst`
    /// (as many blocks of this type), one block at a time.
    fn quantize_blocks<const B: usize>(
        self,
        src: &[f32],
        dst: &mut [u8],
        quantize_block: fn(&[f32; B], &mut [u8]),
    ) {
        let (blocks, _) = src.as_chunks::<B>();
        for (x, block) in blocks.iter().zip(dst.chunks_exact_mut(self.block_bytes())) {
            quantize_block(x, block);
        }
    }
}

/// Writes `v` as a little-endian f16 (rounded to nearest even) at `out[0..2]`.
#[inline(always)]
fn put_f16(out: &mut [u8], v: f32) {
    out[..2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// `1 / d`, or 0 when `d` is 0 (ggml's `d ? 1.0f/d : 0.0f`).
#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// The value of largest magnitude, the first of equals (ggml's `max` beside
/// `amax`, updated only on a strictly larger `|x|`; 0 for no values): a
/// block's values, or a super-block's group scales.
#[inline(always)]
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// The smallest and largest value, from ggml's starting points `FLT_MAX`
/// and `-FLT_MAX`.
#[inline(always)]
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// C's float-to-`int8_t` conversion (truncation toward zero) for values in
/// range, which is all ggml's expressions produce for finite input.
#[inline(always)]
fn trunc_i8(v: f32) -> i8 {
    v as i8
}

/// Writes a block's scale `d` as f16 and returns the factor that scales
/// its values to levels, `1 / d` from the f32 `d` (ggml's `id`).
#[inline(always)]
fn put_scale(block: &mut [u8], d: f32) -> f32 {
    put_f16(block, d);
    inverse(d)
}

/// [`put_scale`] for the types with a minimum (`| d: f16 | m: f16 | ...`)
/// and `levels + 1` levels from `x`'s minimum to its maximum: returns the
/// minimum and `1 / d`.
#[inline(always)]
fn put_scale_min(block: &mut [u8], x: &[f32; QK], levels: f32) -> (f32, f32) {
    let (min, max) = min_max(x);
    put_f16(&mut block[2..], min);
    (min, put_scale(block, (max - min) / levels))
}

/// Q8_0: `| d: f16 | 32 x i8 |`.
fn quantize_q8_0(x: &[f32; QK], block: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
    let id = put_scale(block, amax / 127.0);
    for (q, &v) in block[2..2 + QK].iter_mut().zip(x) {
        *q = ((v * id).round() as i8) as u8;
    }
}

/// Q4_0: `| d: f16 | 16 bytes of nibbles |`, element `j` low, `j + 16` high.
fn quantize_q4_0(x: &[f32; QK], block: &mut [u8]) {
    let id = put_scale(block, signed_absmax(x) / -8.0);
    let level = |v: f32| trunc_i8(v * id + 8.5).min(15) as u8;
    for j in 0..QK / 2 {
        block[2 + j] = level(x[j]) | (level(x[j + QK / 2]) << 4);
    }
}

/// Q4_1: `| d: f16 | m: f16 | 16 bytes of nibbles |`.
fn quantize_q4_1(x: &[f32; QK], block: &mut [u8]) {
    let (min, id) = put_scale_min(block, x, 15.0);
    let level = |v: f32| trunc_i8((v - min) * id + 0.5).min(15) as u8;
    for j in 0..QK / 2 {
        block[4 + j] = level(x[j]) | (level(x[j + QK / 2]) << 4);
    }
}

/// Q5_0: `| d: f16 | qh: u32 | 16 bytes of low nibbles |`.
fn quantize_q5_0(x: &[f32; QK], block: &mut [u8]) {
    let id = put_scale(block, signed_absmax(x) / -16.0);
    pack_five_bits(x, &mut block[2..22], |v| {
        trunc_i8(v * id + 16.5).min(31) as u8
    });
}

/// Q5_1: `| d: f16 | m: f16 | qh: u32 | 16 bytes of low nibbles |`. ggml
/// casts to `uint8_t` without a bound here: a value that rounds to 32 keeps
/// its low five bits (0), as there.
fn quantize_q5_1(x: &[f32; QK], block: &mut [u8]) {
    let (min, id) = put_scale_min(block, x, 31.0);
    pack_five_bits(x, &mut block[4..24], |v| ((v - min) * id + 0.5) as u8);
}

/// Packs the 5-bit levels of `x` as Q5's `qh` (bit `j` is element `j`'s
/// fifth bit) followed by 16 bytes of low nibbles.
#[inline(always)]
fn pack_five_bits(x: &[f32; QK], out: &mut [u8], level: impl Fn(f32) -> u8) {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (lo, hi) = (level(x[j]), level(x[j + QK / 2]));
        out[4 + j] = (lo & 0x0F) | ((hi & 0x0F) << 4);
        qh |= u32::from((lo & 0x10) >> 4) << j;
        qh |= u32::from((hi & 0x10) >> 4) << (j + QK / 2);
    }
    out[..4].copy_from_slice(&qh.to_le_bytes());
}

/// ggml's `nearest_int`: `v` rounded to the nearest integer, ties to even,
/// by adding 1.5 * 2^23 so that the f32 addition does the rounding (exact
/// for |v| < 2^22, which every caller's values are).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007F_FFFF) - 0x0040_0000
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights,
/// one group at a time as ggml runs it (the quantizer runs all 16 groups
/// of a super-block at once, `search::make_qx_quants`; this is the tests'
/// yardstick for it), for Q6_K's groups of 16 (`nmax` 32): levels `L` in `0..64` (the signed
/// level plus 32) and the group's scale, chosen among 19 candidate scales
/// around `max / -32` by the weighted (`x²`) least-squares fit of each.
#[cfg(test)]
fn make_qx_quants(x: &[f32; 16], levels: &mut [u8; 16]) -> f32 {
    const NMAX: i32 = 32;
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        *levels = [0; 16];
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-NMAX, NMAX - 1);
    // Σ w x l and Σ w l² with w = x², in ggml's order of operations.
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let set_levels = |iscale: f32, levels: &mut [u8; 16]| {
        for (out, &v) in levels.iter_mut().zip(x) {
            *out = (NMAX + level(iscale, v)) as u8;
        }
    };
    let iscale = -(NMAX as f32) / max;
    set_levels(iscale, levels);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(NMAX as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            set_levels(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_qkx2_quants`, one group at a time as ggml runs it (the
/// quantizers run the groups of a super-block at once,
/// `search::make_qkx2_quants`; this is the tests' yardstick for it):
/// levels `0..=nmax` and a scale and minimum for one group (16 values for
/// Q2_K, 32 for Q4_K and Q5_K), `x ≈ scale * L - min`. It starts from the
/// group's range (`min` at most 0) and tries `nstep + 1` scales
/// `(rmin + rdelta * is + nmax) / (max - min)`, each refitted by weighted
/// least squares (scale and offset; offset clamped to 0 when it would be
/// positive), keeping the one of least weighted squared error (absolute
/// error for Q2_K, ggml's `use_mad`). Returns `(scale, -min)`.
#[cfg(test)]
fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    search: search::Qkx2,
) -> (f32, f32) {
    let search::Qkx2 {
        nmax,
        rmin,
        rdelta,
        nstep,
        mad,
    } = search;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let level = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax);
    let error = |scale: f32, min: f32, levels: &[u8]| {
        let mut error = 0.0f32;
        for ((&v, &w), &l) in x.iter().zip(weights).zip(levels) {
            let diff = scale * f32::from(l) + min - v;
            error += w * if mad { diff.abs() } else { diff * diff };
        }
        error
    };
    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    for (out, &v) in levels.iter_mut().zip(x) {
        *out = level(iscale, v, min) as u8;
    }
    let mut best_error = error(scale, min, levels);
    let mut candidate = vec![0u8; x.len()];
    for is in 0..=nstep {
        let iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((out, &v), &w) in candidate.iter_mut().zip(x).zip(weights) {
            let l = level(iscale, v, min);
            *out = l as u8;
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let this_error = error(this_scale, this_min, &candidate);
            if this_error < best_error {
                levels.copy_from_slice(&candidate);
                best_error = this_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The shared first half of Q4_K and Q5_K (`quantize_row_q4_K_ref`,
/// `_q5_K_ref`): eight groups of 32 fitted by [`make_qkx2_quants`] with
/// weights `rms + |x|`, their scales and minimums quantized to 6 bits
/// against the largest of each (`d = max_scale / 63`, `dmin = max_min /
/// 63`) into `block[0..16]`, then every value requantized with its group's
/// rounded scale and minimum (a group whose rounded scale is 0 keeps its
/// fitted levels). Returns the 256 levels, `0..=nmax`.
fn quantize_k_scales(x: &[f32], block: &mut [u8], search: search::Qkx2) -> [u8; QK_K] {
    // The eight groups side by side: xt[i][j] is value i of group j.
    let mut xt = [[0f32; 8]; 32];
    for (j, group) in x.chunks_exact(32).enumerate() {
        for (i, &v) in group.iter().enumerate() {
            xt[i][j] = v;
        }
    }
    let mut sum_x2 = [0f32; 8];
    for xi in &xt {
        for j in 0..8 {
            sum_x2[j] += xi[j] * xi[j];
        }
    }
    let av_x = sum_x2.map(|s| (s / 32.0).sqrt());
    let mut weights = [[0f32; 8]; 32];
    for (wi, xi) in weights.iter_mut().zip(&xt) {
        for j in 0..8 {
            wi[j] = av_x[j] + xi[j].abs();
        }
    }
    let mut lt = [[0u8; 8]; 32];
    let (scales, mins) = search::make_qkx2_quants(&xt, &weights, &mut lt, search);
    let mut levels = [0u8; QK_K];
    for (i, li) in lt.iter().enumerate() {
        for j in 0..8 {
            levels[32 * j + i] = li[j];
        }
    }
    let (max_scale, max_min) = (largest(&scales), largest(&mins));
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut block[4..16];
    packed.fill(0);
    for j in 0..8 {
        // ggml keeps the low byte of the rounded value, then bounds it by 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(block, max_scale / 63.0);
    put_f16(&mut block[2..], max_min / 63.0);
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    let dmin = f16::from_le_bytes([block[2], block[3]]).to_f32();
    let (sc, m) = scales_mins_k4(&block[4..16]);
    for j in 0..8 {
        let group_d = d * f32::from(sc[j]);
        if group_d == 0.0 {
            continue;
        }
        let group_m = dmin * f32::from(m[j]);
        for (out, &v) in levels[32 * j..32 * j + 32].iter_mut().zip(&x[32 * j..]) {
            *out = nearest_int((v + group_m) / group_d).clamp(0, search.nmax) as u8;
        }
    }
    levels
}

/// The largest of `values`, or +0 when none is positive: ggml's `if
/// (scales[j] > max_scale)` from `max_scale = 0`, a strict comparison, so
/// a minimum of -0 (a group whose minimum is 0) leaves +0 (`f32::max` may
/// return either zero).
fn largest(values: &[f32]) -> f32 {
    values
        .iter()
        .fold(0.0f32, |acc, &v| if v > acc { v } else { acc })
}

/// The 256 values of a super-block as 16 groups of 16 side by side:
/// `xt[i][j]` is value `i` of group `j`.
fn groups_of_16(x: &[f32]) -> [[f32; 16]; 16] {
    let mut xt = [[0f32; 16]; 16];
    for (j, group) in x.chunks_exact(16).enumerate() {
        for (i, &v) in group.iter().enumerate() {
            xt[i][j] = v;
        }
    }
    xt
}

/// A search over 16 groups of 16 side by side (`search::make_q3_quants`,
/// `search::make_qx_quants`): the values, the levels it writes and the
/// `eps` below which a group is zero, to the group scales.
type GroupSearch = fn(&[[f32; 16]; 16], &mut [[u8; 16]; 16], f32) -> [f32; 16];

/// Q3_K's and Q6_K's first step: a super-block's 16 groups of 16 fitted
/// side by side by `search`, as the group scales and the levels in value
/// order.
fn fit_groups_of_16(x: &[f32; QK_K], search: GroupSearch) -> ([f32; 16], [u8; QK_K]) {
    let mut lt = [[0u8; 16]; 16];
    let scales = search(&groups_of_16(x), &mut lt, GROUP_MAX_EPS);
    (scales, levels_of_groups(&lt))
}

/// The inverse of [`groups_of_16`] for levels: `lt[i][j]` to value `16j + i`.
fn levels_of_groups(lt: &[[u8; 16]; 16]) -> [u8; QK_K] {
    let mut levels = [0u8; QK_K];
    for (i, li) in lt.iter().enumerate() {
        for j in 0..16 {
            levels[16 * j + i] = li[j];
        }
    }
    levels
}

/// Packs 256 2-bit values as Q2_K's and Q3_K's `qs` (64 bytes): in each
/// half of 128, byte `l` holds values `l`, `l + 32`, `l + 64` and `l + 96`
/// from its low bits up.
fn pack_two_bits(levels: &[u8; QK_K], qs: &mut [u8]) {
    for (half, out) in levels.chunks_exact(128).zip(qs.chunks_exact_mut(32)) {
        for l in 0..32 {
            out[l] = half[l] | (half[l + 32] << 2) | (half[l + 64] << 4) | (half[l + 96] << 6);
        }
    }
}

/// Q2_K (`quantize_row_q2_K_ref`): `| scales: 16 | qs: 64 | d | dmin |`.
/// Sixteen groups of 16 fitted by [`make_qkx2_quants`] (levels `0..=3`,
/// weights `|x|`, 16 candidate scales from `3 - 0.5`, absolute error);
/// each group's scale and minimum quantized to 4 bits against the largest
/// of each (`d = max_scale / 15`, `dmin = max_min / 15`; scale in the low
/// nibble of `scales[j]`, minimum in the high), then every value
/// requantized with its group's rounded scale and minimum (a group whose
/// rounded scale is 0 keeps its fitted levels).
fn quantize_q2_k(x: &[f32; QK_K], block: &mut [u8]) {
    let xt = groups_of_16(x);
    let weights = xt.map(|xi| xi.map(f32::abs));
    let mut lt = [[0u8; 16]; 16];
    let (scales, mins) = search::make_qkx2_quants(&xt, &weights, &mut lt, search::Qkx2::Q2_K);
    let mut levels = levels_of_groups(&lt);
    let (max_scale, max_min) = (largest(&scales), largest(&mins));
    // ggml stores the rounded values' low bytes (`uint8_t` from `int`).
    let (sc, rest) = block.split_at_mut(16);
    sc.fill(0);
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (out, &scale) in sc.iter_mut().zip(&scales) {
            *out = nearest_int(iscale * scale) as u8;
        }
    }
    put_f16(
        &mut rest[64..],
        if max_scale > 0.0 {
            max_scale / 15.0
        } else {
            0.0
        },
    );
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (out, &min) in sc.iter_mut().zip(&mins) {
            *out |= (nearest_int(iscale * min) << 4) as u8;
        }
    }
    put_f16(
        &mut rest[66..],
        if max_min > 0.0 { max_min / 15.0 } else { 0.0 },
    );
    let d = f16::from_le_bytes([rest[64], rest[65]]).to_f32();
    let dmin = f16::from_le_bytes([rest[66], rest[67]]).to_f32();
    for (j, &s) in sc.iter().enumerate() {
        let group_d = d * f32::from(s & 0xF);
        if group_d == 0.0 {
            continue;
        }
        let group_m = dmin * f32::from(s >> 4);
        for (out, &v) in levels[16 * j..16 * j + 16].iter_mut().zip(&x[16 * j..]) {
            *out = nearest_int((v + group_m) / group_d).clamp(0, 3) as u8;
        }
    }
    pack_two_bits(&levels, &mut rest[..64]);
}

/// Q3_K (`quantize_row_q3_K_ref`): `| hmask: 32 | qs: 64 | scales: 12 | d |`.
/// Sixteen groups of 16 fitted by `search::make_q3_quants` (levels
/// `-4..=3`), the 16 group scales quantized to 6 signed bits against the
/// largest in magnitude (`d = max / -32`, stored plus 32 in the packing
/// `block_k::scales_q3_k` reads), then every value requantized with its
/// group's rounded scale `d * sc` (a group whose rounded scale is 0 keeps
/// its fitted levels). The levels plus 4 are split into a high bit
/// (`hmask`, bit `j / 32` of byte `j % 32`) and two low bits (`qs`).
fn quantize_q3_k(x: &[f32; QK_K], block: &mut [u8]) {
    let (scales, mut levels) = fit_groups_of_16(x, search::make_q3_quants);
    let max_scale = signed_absmax(&scales);
    block.fill(0);
    let (hmask, rest) = block.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (packed, d_bytes) = rest.split_at_mut(12);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &scale) in scales.iter().enumerate() {
            // ggml keeps the rounded value as an `int8_t`, then bounds it.
            let l = ((nearest_int(iscale * scale) as i8).clamp(-32, 31) + 32) as u8;
            packed[j % 8] |= (l & 0xF) << (4 * (j / 8));
            packed[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        put_f16(d_bytes, 1.0 / iscale);
    }
    let d = f16::from_le_bytes([d_bytes[0], d_bytes[1]]).to_f32();
    for (j, &sc) in scales_q3_k(packed).iter().enumerate() {
        let group_d = d * f32::from(sc);
        if group_d == 0.0 {
            continue;
        }
        for (out, &v) in levels[16 * j..16 * j + 16].iter_mut().zip(&x[16 * j..]) {
            *out = (nearest_int(v / group_d).clamp(-4, 3) + 4) as u8;
        }
    }
    for (j, level) in levels.iter_mut().enumerate() {
        if *level > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *level -= 4;
        }
    }
    pack_two_bits(&levels, qs);
}

/// Q4_K: `| d | dmin | scales: 12 | qs: 128 |`, 4-bit levels in groups of
/// 32 (20 candidate scales from `15 - 1`).
fn quantize_q4_k(x: &[f32; QK_K], block: &mut [u8]) {
    let levels = quantize_k_scales(x, block, search::Qkx2::Q4_K);
    // Each 64 values: the first 32 in the low nibbles, the next 32 high.
    for (chunk, qs) in levels
        .chunks_exact(64)
        .zip(block[16..144].chunks_exact_mut(32))
    {
        for l in 0..32 {
            qs[l] = chunk[l] | (chunk[l + 32] << 4);
        }
    }
}

/// Q5_K: `| d | dmin | scales: 12 | qh: 32 | qs: 128 |`, 5-bit levels in
/// groups of 32 (16 candidate scales from `31 - 0.5`); the fifth bit of
/// value `64c + l` is bit `2c` of `qh[l]`, of `64c + 32 + l` bit `2c + 1`.
fn quantize_q5_k(x: &[f32; QK_K], block: &mut [u8]) {
    let levels = quantize_k_scales(x, block, search::Qkx2::Q5_K);
    let (qh, qs) = block[16..176].split_at_mut(32);
    qh.fill(0);
    for (c, (chunk, ql)) in levels
        .chunks_exact(64)
        .zip(qs.chunks_exact_mut(32))
        .enumerate()
    {
        for l in 0..32 {
            let (lo, hi) = (chunk[l], chunk[l + 32]);
            qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            ql[l] = (lo & 0xF) | ((hi & 0xF) << 4);
        }
    }
}

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Q6_K (`quantize_row_q6_K_ref`): each group of 16 fitted alone
/// ([`make_qx_quants`]), the 16 group scales quantized to i8 against the
/// largest in magnitude (`d = max / -128`), then every value requantized
/// with its group's rounded scale `d * sc` (a group whose rounded scale is
/// 0 keeps its fitted levels). Layout in the `block_k` module.
fn quantize_q6_k(x: &[f32; QK_K], block: &mut [u8]) {
    let (scales, mut levels) = fit_groups_of_16(x, search::make_qx_quants);
    let max_scale = signed_absmax(&scales);
    block.fill(0);
    if max_scale.abs() < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(&mut block[208..], 1.0 / iscale);
    let d = f16::from_le_bytes([block[208], block[209]]).to_f32();
    for (j, &scale) in scales.iter().enumerate() {
        let sc = nearest_int(iscale * scale).min(127) as i8;
        block[192 + j] = sc as u8;
        let group_d = d * f32::from(sc);
        if group_d == 0.0 {
            continue;
        }
        for (out, &v) in levels[16 * j..16 * j + 16].iter_mut().zip(&x[16 * j..]) {
            *out = (nearest_int(v / group_d).clamp(-32, 31) + 32) as u8;
        }
    }
    // Two halves of 128: ql holds the low nibbles (elements l and l + 64 in
    // one byte, l + 32 and l + 96 in another), qh the two high bits of all four.
    for half in 0..2 {
        let l6 = &levels[128 * half..128 * half + 128];
        let (ql, qh) = (64 * half, 128 + 32 * half);
        for l in 0..32 {
            block[ql + l] = (l6[l] & 0xF) | ((l6[l + 64] & 0xF) << 4);
            block[ql + l + 32] = (l6[l + 32] & 0xF) | ((l6[l + 96] & 0xF) << 4);
            block[qh + l] = (l6[l] >> 4)
                | ((l6[l + 32] >> 4) << 2)
                | ((l6[l + 64] >> 4) << 4)
                | ((l6[l + 96] >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::block::{dequantize_row, min_offset, read_f16};

    /// A row with outliers, deterministic.
    fn row(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let v = (state % 20_001) as f32 / 10_000.0 - 1.0;
                if i % 37 == 5 { v * 40.0 } else { v }
            })
            .collect()
    }

    /// Every quantized type dequantizes back within a step of each block (the
    /// step is the block's `d`; half a step but where Q4_0 and Q5_0 clamp
    /// the value opposite the largest, one level short).
    #[test]
    fn round_trip_within_a_step() {
        let x = row(32 * 64, 7);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
        ] {
            let mut bytes = vec![0u8; ty.row_bytes(x.len()).unwrap()];
            ty.quantize_row(&x, &mut bytes).unwrap();
            let mut back = vec![0f32; x.len()];
            dequantize_row(ty, &bytes, &mut back);
            for (b, (xs, ys)) in bytes
                .chunks_exact(ty.block_bytes())
                .zip(x.chunks_exact(QK).zip(back.chunks_exact(QK)))
            {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32().abs();
                let m = min_offset(ty).map_or(0.0, |offset| read_f16(&b[offset..]));
                // Half a step, plus the f16 rounding of d (times up to 31
                // levels) and of m; a whole step where Q4_0 and Q5_0 clamp.
                let half_step = 0.52 * d + m.abs() / 1024.0;
                let bound = match ty {
                    GgmlType::Q4_0 | GgmlType::Q5_0 => 2.0 * half_step,
                    _ => half_step,
                };
                for (&a, &y) in xs.iter().zip(ys) {
                    assert!((a - y).abs() <= bound, "{ty}: {a} -> {y} (d {d}, m {m})");
                }
            }
        }
    }

    #[test]
    fn k_quant_round_trips() {
        let x = row(QK_K * 8, 11);
        // The error is Q6_K's: a group's scale is an i8 step of the
        // super-block's largest, coarse for small groups beside outliers, so
        // the check is on the whole row: between Q8_0's
        // and Q5_0's (measured by the same dequantizer).
        let rmse = |ty: GgmlType| {
            let mut bytes = vec![0u8; ty.row_bytes(x.len()).unwrap()];
            ty.quantize_row(&x, &mut bytes).unwrap();
            let mut back = vec![0f32; x.len()];
            dequantize_row(ty, &bytes, &mut back);
            let sum: f64 = x
                .iter()
                .zip(&back)
                .map(|(&a, &b)| f64::from(a - b).powi(2))
                .sum();
            (sum / x.len() as f64).sqrt()
        };
        let (q8, q6, q5) = (
            rmse(GgmlType::Q8_0),
            rmse(GgmlType::Q6_K),
            rmse(GgmlType::Q5_0),
        );
        assert!(q8 < q6 && q6 < q5, "rmse q8_0 {q8}, q6_K {q6}, q5_0 {q5}");
        // An all-zero super-block is all zero bytes, as ggml writes it.
        let mut zero = vec![0xAAu8; 210];
        GgmlType::Q6_K
            .quantize_row(&[0.0; QK_K], &mut zero)
            .unwrap();
        assert!(zero.iter().all(|&b| b == 0));
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-3.5), -4);
        assert_eq!(nearest_int(0.49999997), 0);
    }

    /// Groups that take every path of the searches: random with outliers,
    /// all positive (the minimum clamped to 0), constant, all zero, one
    /// value alone, tiny.
    fn search_groups(len: usize) -> Vec<Vec<f32>> {
        let mut groups = Vec::new();
        for seed in 0..40 {
            let x = row(len, 100 + seed);
            groups.push(x.clone());
            groups.push(x.iter().map(|v| v.abs() + 0.25).collect());
            groups.push(x.iter().map(|v| v * 1e-20).collect());
            let mut one = vec![0.0; len];
            one[seed as usize % len] = x[0];
            groups.push(one);
        }
        groups.push(vec![0.0; len]);
        groups.push(vec![-0.75; len]);
        groups.push(vec![3.0; len]);
        groups
    }

    /// The searches on a super-block's groups side by side give, bit for
    /// bit, what ggml's one-group loops give for each group.
    #[test]
    fn side_by_side_searches_equal_ggml_loops() {
        let groups = search_groups(32);
        for search in [search::Qkx2::Q4_K, search::Qkx2::Q5_K] {
            // Q4_K's and Q5_K's weights: the group's rms plus |x|.
            let weights = |group: &[f32]| {
                let av_x = (group.iter().fold(0.0f32, |a, &v| a + v * v) / 32.0).sqrt();
                group.iter().map(|v| av_x + v.abs()).collect()
            };
            check_qkx2::<8, 32>(&groups, search, weights);
        }
        // Q2_K's: |x|.
        let groups = search_groups(16);
        check_qkx2::<16, 16>(&groups, search::Qkx2::Q2_K, |group| {
            group.iter().map(|v| v.abs()).collect()
        });
        for batch in groups.chunks(16).filter(|b| b.len() == 16) {
            let mut xt = [[0f32; 16]; 16];
            for (k, group) in batch.iter().enumerate() {
                for (i, &v) in group.iter().enumerate() {
                    xt[i][k] = v;
                }
            }
            let mut lt = [[0u8; 16]; 16];
            let scales = search::make_qx_quants(&xt, &mut lt, GROUP_MAX_EPS);
            for (k, group) in batch.iter().enumerate() {
                let mut levels = [0u8; 16];
                let scale = make_qx_quants(group.as_slice().try_into().unwrap(), &mut levels);
                assert_eq!(scales[k].to_bits(), scale.to_bits(), "q6 group {k}");
                assert!((0..16).all(|i| lt[i][k] == levels[i]), "q6 group {k}");
            }
        }
    }

    /// [`side_by_side_searches_equal_ggml_loops`] for `make_qkx2_quants`
    /// on `N` groups of `G` values with the weights `weights` gives.
    fn check_qkx2<const N: usize, const G: usize>(
        groups: &[Vec<f32>],
        search: search::Qkx2,
        weights: impl Fn(&[f32]) -> Vec<f32>,
    ) {
        for batch in groups.chunks(N).filter(|b| b.len() == N) {
            let (mut xt, mut wt) = ([[0f32; N]; G], [[0f32; N]; G]);
            let mut expected = Vec::new();
            for (k, group) in batch.iter().enumerate() {
                let w = weights(group);
                for i in 0..G {
                    (xt[i][k], wt[i][k]) = (group[i], w[i]);
                }
                let mut levels = vec![0u8; G];
                let (scale, min) = make_qkx2_quants(group, &w, &mut levels, search);
                expected.push((scale.to_bits(), min.to_bits(), levels));
            }
            let mut lt = [[0u8; N]; G];
            let (scales, mins) = search::make_qkx2_quants(&xt, &wt, &mut lt, search);
            for (k, (scale, min, levels)) in expected.into_iter().enumerate() {
                assert_eq!(
                    (scales[k].to_bits(), mins[k].to_bits()),
                    (scale, min),
                    "{search:?} group {k}"
                );
                assert!(
                    (0..G).all(|i| lt[i][k] == levels[i]),
                    "{search:?} group {k}"
                );
            }
        }
    }

    #[test]
    fn zero_block_and_errors() {
        let zeros = [0.0f32; 32];
        let mut block = [0xAAu8; 18];
        GgmlType::Q4_0.quantize_row(&zeros, &mut block).unwrap();
        assert_eq!(block[..2], [0, 0x80]); // d = 0 / -8 = -0.0, as in ggml
        assert!(block[2..].iter().all(|&b| b == 0x88));
        let error = GgmlType::MXFP4.quantize_row(&[0.0; 32], &mut [0u8; 17]);
        assert_eq!(
            error,
            Err(QuantizeError::Unsupported {
                ty: GgmlType::MXFP4
            })
        );
        assert_eq!(
            error.unwrap_err().to_string(),
            "cannot quantize to mxfp4; quantizable types: f32, f16, q4_0, q4_1, q5_0, q5_1, \
             q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, bf16"
        );
        let error = GgmlType::Q4_0
            .quantize_row(&zeros, &mut [0u8; 17])
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "a 1 x 32 q4_0 matrix takes 18 bytes, got 17"
        );
        let error = GgmlType::Q4_0
            .quantize_row(&zeros[..31], &mut block)
            .unwrap_err();
        assert!(error.to_string().contains("multiple of 32"), "{error}");
        let mut bad = zeros;
        bad[3] = f32::NAN;
        let error = GgmlType::Q8_0
            .quantize_row(&bad, &mut [0u8; 34])
            .unwrap_err();
        assert_eq!(
            error,
            QuantizeError::NonFinite {
                index: 3,
                value: NonFinite::NaN
            }
        );
    }
}
