//! llama.cpp's q8_0 blocks for an 8-bit KV cache: each run of up to
//! [`Q8_BLOCK`] values along a head's dimensions becomes that many int8s
//! and one f16 scale, about half the bytes of f16 (34 bytes per 32 values
//! against 64).
//!
//! The rounding is llama.cpp's CPU `quantize_row_q8_0` (the one its cache
//! writes and its flash attention applies to the queries): `amax` the
//! largest magnitude in the block, the stored scale `d = f16(amax / 127)`,
//! each value `round_half_even(x * 127 / amax)`; a value reads back as
//! `q * d`. The error of a value is at most `d / 2` plus `127 * |d -
//! amax / 127|` (the f16 rounding of the scale), so at most `0.57 *
//! amax / 127` while the scale is a normal f16. A block whose scale would
//! overflow f16 (magnitudes past 127 * 65,504, far beyond any key or value
//! a model writes) is scaled by the largest f16 instead, its values clamped
//! to +-127 steps of it, so a read never gives a NaN.
//!
//! Reading back (`dequantize_keys`, `dequantize_values`) widens a chunk
//! into f32 rows for attention's kernels; each value `q * d` is exact in
//! f32 (8 by 11 significant bits).

use half::f16;

use crate::kernels::dispatch::Dispatch;
#[cfg(target_arch = "x86_64")]
use crate::kernels::dispatch::Kernel;
use crate::transformer::CHUNK_LEN;

/// Values per q8_0 block (the last block of a head narrower than a multiple
/// of 32 holds the rest).
pub(crate) const Q8_BLOCK: usize = 32;

/// Quantizes `values` (at most [`Q8_BLOCK`]) into `quants` (same length),
/// returning the block's scale (module docs).
pub(crate) fn quantize_block(values: &[f32], quants: &mut [i8]) -> f16 {
    debug_assert!(values.len() <= Q8_BLOCK && values.len() == quants.len());
    let amax = values.iter().fold(0.0f32, |max, v| max.max(v.abs()));
    let mut scale = f16::from_f32(amax / 127.0);
    let mut inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    if scale.is_infinite() {
        scale = f16::MAX;
        inverse = 1.0 / f32::from(f16::MAX);
    }
    for (q, &v) in quants.iter_mut().zip(values) {
        // In range but for the clamp of an overflowing block; a NaN is 0.
        *q = (v * inverse).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// Replaces each value by its q8_0 reading, block by block of `row`: what
/// llama.cpp's flash attention does to a query row before its products
/// with a q8_0 key (it multiplies the int8s and scales the sums, the same
/// values).
pub(crate) fn round_row_through_q8_0(row: &mut [f32]) {
    let mut quants = [0i8; Q8_BLOCK];
    for block in row.chunks_mut(Q8_BLOCK) {
        let quants = &mut quants[..block.len()];
        let scale = f32::from(quantize_block(block, quants));
        for (v, &q) in block.iter_mut().zip(quants.iter()) {
            *v = f32::from(q) * scale;
        }
    }
}

/// Widens a q8_0 key block (`quants` `[head_dim][CHUNK_LEN]`, a key per
/// column; `scales` `[n_blocks][CHUNK_LEN]`, the scale of dimension block
/// `b` of key `r` at `b * CHUNK_LEN + r`) into `out`, the f32 block of the
/// same layout; compiled for AVX-512 when `dispatch` runs it (the same
/// bits: each value is exact).
pub(crate) fn dequantize_keys(dispatch: Dispatch, quants: &[i8], scales: &[f16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if dispatch.kernel() == Kernel::Avx512 {
        // SAFETY: a `Dispatch` holds only detected features; the AVX-512
        // kernel's include AVX-512 F and BW.
        return unsafe { dequantize_keys_avx512(quants, scales, out) };
    }
    dequantize_keys_in(quants, scales, out);
}

/// [`dequantize_keys`] compiled for AVX-512 (the loops vectorised by the
/// compiler: sign-extend, convert and scale 16 values an instruction).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn dequantize_keys_avx512(quants: &[i8], scales: &[f16], out: &mut [f32]) {
    dequantize_keys_in(quants, scales, out);
}

/// [`dequantize_values`] compiled for AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn dequantize_values_avx512(quants: &[i8], scales: &[f16], out: &mut [f32]) {
    dequantize_values_in(quants, scales, out);
}

/// The loops of [`dequantize_keys`], inlined into each build.
#[inline(always)]
fn dequantize_keys_in(quants: &[i8], scales: &[f16], out: &mut [f32]) {
    debug_assert_eq!(quants.len(), out.len());
    let mut block_scales = [0.0f32; CHUNK_LEN];
    for ((quants, out), scales) in quants
        .chunks(Q8_BLOCK * CHUNK_LEN)
        .zip(out.chunks_mut(Q8_BLOCK * CHUNK_LEN))
        .zip(scales.chunks_exact(CHUNK_LEN))
    {
        for (s, &scale) in block_scales.iter_mut().zip(scales) {
            *s = f32::from(scale);
        }
        for (quants, out) in quants
            .chunks_exact(CHUNK_LEN)
            .zip(out.chunks_exact_mut(CHUNK_LEN))
        {
            for ((o, &q), &s) in out.iter_mut().zip(quants).zip(&block_scales) {
                *o = f32::from(q) * s;
            }
        }
    }
}

/// Widens a q8_0 value block (`quants` `[CHUNK_LEN][head_dim]`, a value
/// per row; `scales` `[CHUNK_LEN][n_blocks]`) into `out`, the f32 block of
/// the same layout, as [`dequantize_keys`] does.
pub(crate) fn dequantize_values(
    dispatch: Dispatch,
    quants: &[i8],
    scales: &[f16],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if dispatch.kernel() == Kernel::Avx512 {
        // SAFETY: as in `dequantize_keys`.
        return unsafe { dequantize_values_avx512(quants, scales, out) };
    }
    dequantize_values_in(quants, scales, out);
}

/// The loops of [`dequantize_values`], inlined into each build.
#[inline(always)]
fn dequantize_values_in(quants: &[i8], scales: &[f16], out: &mut [f32]) {
    debug_assert_eq!(quants.len(), out.len());
    let head_dim = quants.len() / CHUNK_LEN;
    let n_blocks = head_dim.div_ceil(Q8_BLOCK);
    for ((quants, out), scales) in quants
        .chunks_exact(head_dim)
        .zip(out.chunks_exact_mut(head_dim))
        .zip(scales.chunks_exact(n_blocks))
    {
        for ((quants, out), &scale) in quants
            .chunks(Q8_BLOCK)
            .zip(out.chunks_mut(Q8_BLOCK))
            .zip(scales)
        {
            let scale = f32::from(scale);
            for (o, &q) in out.iter_mut().zip(quants) {
                *o = f32::from(q) * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pseudo-random values in [-1, 1) (an LCG).
    fn pseudo_random(seed: u32, n: usize) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn a_block_is_scaled_by_its_largest_magnitude_and_rounded_half_to_even() {
        // amax 127: scale 1, so the quants are the values rounded half to
        // even (2.5 -> 2, 3.5 -> 4, -0.5 -> 0).
        let values = [127.0, 2.5, 3.5, -0.5, -126.6, 0.0];
        let mut quants = [0i8; 6];
        let scale = quantize_block(&values, &mut quants);
        assert_eq!(scale, f16::ONE);
        assert_eq!(quants, [127, 2, 4, 0, -127, 0]);
        // amax 1: the scale is f16(1/127) = 0.007873535 (not 1/127), yet
        // the quants use 127/amax exactly, as llama.cpp does.
        let values = [1.0, -1.0, 0.5, 0.25];
        let scale = quantize_block(&values, &mut quants[..4]);
        assert_eq!(scale.to_bits(), f16::from_f32(1.0 / 127.0).to_bits());
        assert_eq!(f32::from(scale), 0.007_873_535);
        assert_eq!(quants[..4], [127, -127, 64, 32], "63.5 rounds to 64");
        // All zeros: scale 0, quants 0, read back as 0 (no NaN).
        let scale = quantize_block(&[0.0; 3], &mut quants[..3]);
        assert_eq!((scale, &quants[..3]), (f16::ZERO, &[0i8; 3][..]));
        // A block past f16's range is clamped, never infinite.
        let scale = quantize_block(&[1e10, -5.0], &mut quants[..2]);
        assert_eq!((scale, quants[0], quants[1]), (f16::MAX, 127, 0));
    }

    #[test]
    fn a_round_trip_stays_within_the_error_bound() {
        // Over many blocks of magnitudes 0.1 to 10^4 (normal f16 scales):
        // |x - q * d| <= d / 2 + 127 * |d - amax / 127|, at most 0.57 *
        // amax / 127 (up to the f32 rounding of x * 127 / amax).
        let values = pseudo_random(3, 4096);
        for (block_idx, block) in values.chunks(Q8_BLOCK).enumerate() {
            let magnitude = 10f32.powi(block_idx as i32 % 6 - 1);
            let block: Vec<f32> = block.iter().map(|v| v * magnitude).collect();
            let mut row = block.clone();
            round_row_through_q8_0(&mut row);
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let exact_scale = f64::from(amax) / 127.0;
            let scale = f64::from(f16::from_f32(amax / 127.0));
            let bound = scale / 2.0 + 127.0 * (scale - exact_scale).abs();
            assert!(bound <= 0.57 * exact_scale, "block {block_idx}: {bound}");
            for (&x, &y) in block.iter().zip(&row) {
                let error = (f64::from(x) - f64::from(y)).abs();
                assert!(
                    error <= bound * (1.0 + 1e-4),
                    "block {block_idx}: {x} read back as {y}, error {error} > {bound}"
                );
            }
        }
    }

    #[test]
    fn keys_and_values_read_back_as_quant_times_scale_in_their_layouts() {
        // head_dim 40: a whole block and a block of 8.
        let head_dim = 40;
        let n_blocks = 2;
        let quants: Vec<i8> = (0..CHUNK_LEN * head_dim).map(|i| (i % 255) as i8).collect();
        let scales: Vec<f16> = (0..CHUNK_LEN * n_blocks)
            .map(|i| f16::from_f32(0.5 + i as f32 / 64.0))
            .collect();
        for dispatch in Dispatch::every_available() {
            let mut keys = vec![f32::NAN; quants.len()];
            dequantize_keys(dispatch, &quants, &scales, &mut keys);
            let mut values = vec![f32::NAN; quants.len()];
            dequantize_values(dispatch, &quants, &scales, &mut values);
            check_layouts(&quants, &scales, &keys, &values);
        }
    }

    /// Each key and value read back is its int8 times its scale.
    fn check_layouts(quants: &[i8], scales: &[f16], keys: &[f32], values: &[f32]) {
        let head_dim = quants.len() / CHUNK_LEN;
        let n_blocks = head_dim.div_ceil(Q8_BLOCK);
        for d in 0..head_dim {
            for r in 0..CHUNK_LEN {
                let key_scale = f32::from(scales[d / Q8_BLOCK * CHUNK_LEN + r]);
                let key = f32::from(quants[d * CHUNK_LEN + r]) * key_scale;
                assert_eq!(keys[d * CHUNK_LEN + r], key, "key {r}, dimension {d}");
                let value_scale = f32::from(scales[r * n_blocks + d / Q8_BLOCK]);
                let value = f32::from(quants[r * head_dim + d]) * value_scale;
                assert_eq!(values[r * head_dim + d], value, "value {r}, dimension {d}");
            }
        }
    }
}
