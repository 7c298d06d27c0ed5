//! Conversions between f16 and f32 slices: widening an f16 cache's rows to
//! f32 (exact: every f16 is an f32), and rounding f32 values to the nearest
//! f16 in place (attention at f16 precision), each with F16C where the
//! [`Dispatch`] (or the caller's `#[target_feature]`) allows it and with
//! `half`'s slice conversions otherwise.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::kernels::dispatch::Dispatch;

/// Widens f16 values to f32 (exact: every f16 is an f32) into the front of
/// `dst`, which is at least as long. When `dispatch` has F16C this converts
/// eight values per instruction in one loop; `half`'s slice conversion (the
/// fallback) detects F16C too but calls an out-of-line function per eight
/// values, which measured 0.22-0.31 ns a value against 0.09 for this loop
/// (the speed of a plain f32 copy).
pub(crate) fn widen_f16(dispatch: Dispatch, src: &[f16], dst: &mut [f32]) {
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if dispatch.has_f16c() {
        // SAFETY: the CPU has AVX and F16C, the features `widen_f16_f16c`
        // is compiled for (a `Dispatch` only allows detected features).
        unsafe { widen_f16_f16c(src, dst) };
        return;
    }
    src.convert_to_f32_slice(dst);
}

/// [`widen_f16`] with F16C; `src` and `dst` have the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn widen_f16_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{_mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
    let mut src_chunks = src.chunks_exact(8);
    let mut dst_chunks = dst.chunks_exact_mut(8);
    for (halves, floats) in (&mut src_chunks).zip(&mut dst_chunks) {
        // SAFETY: `halves` is 8 f16 (16 bytes) and `floats` 8 f32 (32 bytes),
        // both in bounds; both intrinsics accept unaligned addresses.
        unsafe {
            let packed = _mm_loadu_si128(halves.as_ptr().cast());
            _mm256_storeu_ps(floats.as_mut_ptr(), _mm256_cvtph_ps(packed));
        }
    }
    src_chunks
        .remainder()
        .convert_to_f32_slice(dst_chunks.into_remainder());
}

/// Rounds every value to the nearest f16 (ties to even) in place, as
/// `f16::from_f32` does one value at a time: through `narrowed` (grown if
/// needed) with `half`'s slice conversions, widened back by [`widen_f16`].
/// The portable attention's rounding; the SIMD builds call
/// [`round_to_f16_f16c`].
pub(crate) fn round_to_f16_via_half(
    dispatch: Dispatch,
    values: &mut [f32],
    narrowed: &mut Vec<f16>,
) {
    if narrowed.len() < values.len() {
        narrowed.resize(values.len(), f16::ZERO);
    }
    let narrowed = &mut narrowed[..values.len()];
    narrowed.convert_from_f32_slice(values);
    widen_f16(dispatch, narrowed, values);
}

/// [`round_to_f16_via_half`] with F16C: `vcvtps2ph` rounding to nearest
/// even (as `half` does, subnormals and overflow included), then back,
/// eight values at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn round_to_f16_f16c(values: &mut [f32]) {
    use std::arch::x86_64::*;
    let (vectors, rest) = values.as_chunks_mut::<8>();
    for vector in vectors {
        // SAFETY: eight f32 in bounds; unaligned access is allowed.
        unsafe {
            let x = _mm256_loadu_ps(vector.as_ptr());
            let halves = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm256_storeu_ps(vector.as_mut_ptr(), _mm256_cvtph_ps(halves));
        }
    }
    for value in rest {
        *value = f16::from_f32(*value).to_f32();
    }
}

/// `value` rounded to the nearest f16 (ties to even), back in f32: the
/// one-value definition the tests check the slice rounding against.
#[cfg(test)]
pub(crate) fn round_to_f16(value: f32) -> f32 {
    f16::from_f32(value).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::kernels::dispatch::Kernel;

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn widening_matches_the_scalar_conversion_for_every_f16() {
        // Both paths: F16C where the CPU has it, and the portable one.
        for dispatch in [Dispatch::detect(), Dispatch::PORTABLE] {
            let every: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            let mut widened = vec![0.0; every.len()];
            widen_f16(dispatch, &every, &mut widened);
            for (h, &w) in every.iter().zip(&widened) {
                assert!(same(w, h.to_f32()), "{:#06x}: {w}", h.to_bits());
            }
            // Lengths that are not a multiple of eight take the remainder path;
            // a longer destination keeps its tail.
            for len in 0..=17 {
                let src = &every[0x3c00..0x3c00 + len];
                let mut dst = vec![-1.0; len + 3];
                widen_f16(dispatch, src, &mut dst);
                let expected: Vec<f32> = src.iter().map(|h| h.to_f32()).collect();
                assert_eq!(dst[..len], expected, "{len}");
                assert_eq!(dst[len..], [-1.0; 3], "{len}");
            }
        }
    }

    #[test]
    fn f16_rounding_keeps_eleven_significant_bits() {
        // f16 has a 10-bit fraction: 1 + 2^-10 survives, 1 + 2^-12 rounds to 1.
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-10)), 1.0 + 2f32.powi(-10));
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-12)), 1.0);
        assert_eq!(round_to_f16(0.1), 0.099_975_586);
    }

    #[test]
    fn rounding_a_slice_matches_rounding_each_value() {
        // Ties (1 + 2^-11 and 1 + 3 * 2^-11 go to the even neighbour),
        // subnormals, overflow, and a spread of ordinary values; 45 values so
        // the eight-wide loop leaves a remainder.
        let mut values = vec![
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            3.0 * 2f32.powi(-25),
            2f32.powi(-26),
            65519.0,
            65520.0,
            -0.1,
        ];
        values.extend((0..38).map(|i| (i as f32 * 0.731 - 9.0).powi(3) / 7.0));
        let expected: Vec<u32> = values.iter().map(|&v| round_to_f16(v).to_bits()).collect();
        assert_eq!(
            expected[..6],
            [
                1f32.to_bits(),
                (1.0 + 2f32.powi(-9)).to_bits(),
                2f32.powi(-23).to_bits(),
                0f32.to_bits(),
                65504f32.to_bits(),
                f32::INFINITY.to_bits()
            ]
        );
        let dispatch = Dispatch::detect();
        let mut portable = values.clone();
        round_to_f16_via_half(dispatch, &mut portable, &mut Vec::new());
        assert_eq!(bits(&portable), expected);
        #[cfg(target_arch = "x86_64")]
        if dispatch.kernel() != Kernel::Portable && dispatch.has_f16c() {
            // SAFETY: the CPU has AVX2 and F16C, the F16C path's features.
            unsafe { round_to_f16_f16c(&mut values) };
            assert_eq!(bits(&values), expected, "F16C");
        }
    }
}
