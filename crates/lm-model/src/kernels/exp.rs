//! `exp` of a slice of f32 values, vectorised, giving the bits of the
//! standard library's `f32::exp` (the platform libm's `expf`) for every
//! input: attention's softmax calls it for every score of a prompt
//! (2.3 billion calls for a 4,096-token SmolLM2 prompt), and the conformance
//! fixtures were measured with libm's values, so a faster `exp` may not
//! change a single bit.
//!
//! The AVX2 path computes `exp(x)` in f64 far more precisely than an f32
//! needs and rounds it to f32, which gives the correctly rounded value
//! unless the exact result lies very close to a rounding boundary (the
//! midpoint of two neighbouring f32 values). libm's `expf` (glibc and musl
//! share one design) computes its result in f64 with a relative error below
//! 2^-33 (the polynomial's 1.69 * 2^-34, the table's and the last
//! products' roundings) and rounds it once, so it, too, returns the
//! correctly rounded value away from the midpoints. The vector path
//! therefore keeps its result only where its f64 value is more than 2^-7 of
//! an f32 ulp from every midpoint, four times the two errors together:
//!
//! ```text
//!   f32 grid       a                 mid                 b
//!                  |--------------|xxxxxxx|--------------|
//!                                 <- 2^-7 ulp ->  a lane whose f64 value
//!                                 falls in xxx asks libm instead
//! ```
//!
//! About one lane in 64 asks libm (and every lane outside the range where
//! the result is a normal f32: NaN, overflow, subnormal results); a lane of
//! `x <= -104` is `+0`, as in libm (`exp(-104)` is below half the smallest
//! subnormal). The tests compare the two over a dense sweep of every
//! binade, every edge case, and the whole softmax range on request.
//!
//! The f64 computation: `x = k ln 2 + r` with `k = round(x / ln 2)` and
//! `|r| <= ln 2 / 2` (ln 2 split in two parts, fused multiply-adds), `e^r`
//! by its Taylor polynomial of degree 10 (truncation error below 2^-41
//! relative) evaluated by Estrin's scheme, then `2^k` by building the
//! exponent bits. The AVX-512 path computes eight f64 lanes per vector and
//! shortens the chain: `x = k ln 2 / 16 + r`, `2^(k mod 16 / 16)` from a
//! table of sixteen held in two registers, `e^r` (`|r| <= ln 2 / 32`) by a
//! polynomial of degree 5 (2^-42 relative), with the same midpoint test;
//! two vectors side by side, so the core overlaps their chains (an `exp`
//! 1.7 times as fast as the AVX2 path's on the AVX-512 EPYC).

use crate::kernels::dispatch::Dispatch;
#[cfg(target_arch = "x86_64")]
use crate::kernels::dispatch::Kernel;

/// Inputs at or below this have `+0` as their exponential in f32 (and in
/// libm): `exp(-104)` is below `2^-150`, half the smallest subnormal.
#[cfg(target_arch = "x86_64")]
const ZERO_BELOW: f32 = -104.0;

/// The inputs the vector path computes itself: their exponentials are
/// normal f32 values (`exp(-87) > 2^-126`, `exp(88) < f32::MAX`).
#[cfg(target_arch = "x86_64")]
const VECTOR_RANGE: (f32, f32) = (-87.0, 88.0);

/// Replaces every value of `values` by its exponential, with the bits of
/// `f32::exp`, eight values at a time when `dispatch` allows AVX2 or
/// AVX-512.
pub(crate) fn exp_in_place(dispatch: Dispatch, values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match dispatch.kernel() {
        // SAFETY: a `Dispatch` holds only detected features: the AVX-512
        // kernel's include AVX-512 F and VL, and every x86 SIMD kernel's
        // include AVX2 and FMA.
        Kernel::Avx512 => return unsafe { exp_in_place_avx512(values) },
        Kernel::Avx2 | Kernel::AvxVnni => return unsafe { exp_in_place_avx2(values) },
        Kernel::Portable => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = dispatch;
    for value in values {
        *value = value.exp();
    }
}

/// [`exp_in_place`] with AVX2 and FMA: whole vectors of eight, then the
/// remainder one by one through libm.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_in_place_avx2(values: &mut [f32]) {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_storeu_ps};
    let (vectors, rest) = values.as_chunks_mut::<8>();
    for vector in vectors {
        // SAFETY: `vector` is eight f32 in bounds; unaligned access is allowed.
        let x = unsafe { _mm256_loadu_ps(vector.as_ptr()) };
        let (y, ask) = exp8(x);
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(vector.as_mut_ptr(), y) };
        ask_libm(vector, x, ask);
    }
    for value in rest {
        *value = value.exp();
    }
}

/// [`exp_in_place`] with AVX-512 F and VL: sixteen values a pass, as two
/// vectors of eight whose f64 computations ([`exp_avx512`]) are
/// independent, so the core overlaps them; then a last vector of eight, then
/// the remainder one by one through libm.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
fn exp_in_place_avx512(values: &mut [f32]) {
    let rest = exp_vectors_avx512::<AVX512_PASS>(values);
    let rest = exp_vectors_avx512::<1>(rest);
    for value in rest {
        *value = value.exp();
    }
}

/// Vectors of eight values [`exp_in_place_avx512`] computes side by side.
#[cfg(target_arch = "x86_64")]
const AVX512_PASS: usize = 2;

/// The exponentials of the first `8 N` values of `values` and of every
/// further `8 N`, in place, by [`exp_avx512`]; returns the values left.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn exp_vectors_avx512<const N: usize>(values: &mut [f32]) -> &mut [f32] {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_storeu_ps};
    let (passes, rest) = values.split_at_mut(values.len() / (8 * N) * (8 * N));
    for pass in passes.chunks_exact_mut(8 * N) {
        // SAFETY: `pass` holds N vectors of eight f32; unaligned access is
        // allowed.
        let x = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(pass.as_ptr().add(8 * i)) });
        let (y, ask) = exp_avx512::<N>(x);
        for (i, y) in y.into_iter().enumerate() {
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(pass.as_mut_ptr().add(8 * i), y) };
        }
        if ask.iter().any(|&lanes| lanes != 0) {
            for ((vector, x), ask) in pass.chunks_exact_mut(8).zip(x).zip(ask) {
                ask_libm(vector, x, ask);
            }
        }
    }
    rest
}

/// Replaces the lanes of `vector` set in `ask` by libm's `exp` of the same
/// lanes of `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn ask_libm(vector: &mut [f32], x: std::arch::x86_64::__m256, ask: u32) {
    if ask != 0 {
        for (lane, value) in vector.iter_mut().enumerate() {
            if ask & (1 << lane) != 0 {
                *value = lane_of(x, lane).exp();
            }
        }
    }
}

/// Lane `lane` of `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lane_of(x: std::arch::x86_64::__m256, lane: usize) -> f32 {
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` is eight f32.
    unsafe { std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), x) };
    lanes[lane]
}

/// The exponentials of eight values, and a bit mask of the lanes whose
/// result must come from libm instead (module docs); the other lanes hold
/// libm's bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp8(x: std::arch::x86_64::__m256) -> (std::arch::x86_64::__m256, u32) {
    use std::arch::x86_64::*;
    let (low, high) = VECTOR_RANGE;
    let in_range = _mm256_and_ps(
        _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(low)),
        _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_set1_ps(high)),
    );
    let zero = _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_set1_ps(ZERO_BELOW));
    // Clamped so that out-of-range lanes (NaN included: `max_ps` returns
    // its second operand then) compute something harmless.
    let clamped = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(low)), _mm256_set1_ps(high));
    let (y_low, near_low) = exp4(_mm256_castps256_ps128(clamped));
    let (y_high, near_high) = exp4(_mm256_extractf128_ps::<1>(clamped));
    let y = _mm256_set_m128(y_high, y_low);
    let y = _mm256_andnot_ps(zero, y);
    let near_midpoint = (near_high << 4) | near_low;
    let out_of_range = !(_mm256_movemask_ps(in_range) | _mm256_movemask_ps(zero)) as u32 & 0xff;
    (y, near_midpoint | out_of_range)
}

/// `exp` of four values in `[-87, 88]` computed in f64 and rounded to f32,
/// and a 4-bit mask of the lanes whose f64 value lies within 2^-7 f32 ulp
/// of a rounding midpoint.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp4(x: std::arch::x86_64::__m128) -> (std::arch::x86_64::__m128, u32) {
    use std::arch::x86_64::*;
    // 1.5 * 2^52: added to a value below 2^51 in magnitude, it leaves the
    // value rounded to an integer in the low bits of the mantissa.
    const SHIFTER: f64 = 6_755_399_441_055_744.0;
    // ln 2 in two parts: the f64 nearest, and the f64 nearest the rest.
    const LN2_HI: f64 = std::f64::consts::LN_2;
    const LN2_LO: f64 = 2.319_046_813_846_299_6e-17;
    let x = _mm256_cvtps_pd(x);
    let shifted = _mm256_fmadd_pd(
        x,
        _mm256_set1_pd(std::f64::consts::LOG2_E),
        _mm256_set1_pd(SHIFTER),
    );
    let k = _mm256_sub_pd(shifted, _mm256_set1_pd(SHIFTER));
    let r = _mm256_fnmadd_pd(k, _mm256_set1_pd(LN2_HI), x);
    let r = _mm256_fnmadd_pd(k, _mm256_set1_pd(LN2_LO), r);
    let p = taylor_estrin(r);
    // 2^k: k sits in the low bits of `shifted`; shifting it up to the
    // exponent field drops the shifter's bit 51.
    let two_to_k = _mm256_add_epi64(
        _mm256_slli_epi64::<52>(_mm256_castpd_si256(shifted)),
        _mm256_set1_epi64x(1023 << 52),
    );
    let y = _mm256_mul_pd(p, _mm256_castsi256_pd(two_to_k));
    // The low 29 mantissa bits say where `y` lies between two f32 values:
    // 2^28 is the midpoint. Near it means within MARGIN of it.
    const MARGIN: i64 = 1 << 22;
    let low_bits = _mm256_and_si256(
        _mm256_sub_epi64(
            _mm256_castpd_si256(y),
            _mm256_set1_epi64x((1 << 28) - MARGIN),
        ),
        _mm256_set1_epi64x((1 << 29) - 1),
    );
    let near = _mm256_cmpgt_epi64(_mm256_set1_epi64x(2 * MARGIN + 1), low_bits);
    let near = _mm256_movemask_pd(_mm256_castsi256_pd(near)) as u32;
    (_mm256_cvtpd_ps(y), near)
}

/// [`exp8`] with AVX-512 for `N` vectors of eight side by side, and a
/// shorter computation: eight f64 lanes in one vector, and
/// `x = k ln 2 / 16 + r` with `|r| <= ln 2 / 32`, so that
/// `e^x = 2^(k / 16) e^r` takes `2^(j / 16)` for `j = k mod 16` from a
/// table held in two registers (one `vpermt2pd`), `e^r` from its Taylor
/// polynomial of degree 5 (truncation error below `(ln 2 / 32)^6 / 6!`,
/// 2^-42 relative, still far inside the midpoint margin of the module
/// docs), and the power `2^floor(k / 16)` by adding to the exponent bits.
/// The same lanes ask libm, and the others hold libm's bits. Each step runs
/// on all `N` vectors before the next, so their independent chains of
/// operations sit side by side where the core schedules them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn exp_avx512<const N: usize>(
    x: [std::arch::x86_64::__m256; N],
) -> ([std::arch::x86_64::__m256; N], [u32; N]) {
    use std::arch::x86_64::*;
    use std::array::from_fn;
    // 1.5 * 2^52, as in `exp4`: `k` ends in the low mantissa bits.
    const SHIFTER: f64 = 6_755_399_441_055_744.0;
    // ln 2 / 16 in two parts (ln 2's two parts of `exp4`, divided exactly).
    const STEP_HI: f64 = std::f64::consts::LN_2 / 16.0;
    const STEP_LO: f64 = 2.319_046_813_846_299_6e-17 / 16.0;
    // The midpoint margin of `exp4`.
    const MARGIN: i64 = 1 << 22;
    let (low, high) = VECTOR_RANGE;
    let in_range: [__mmask8; N] = from_fn(|i| {
        _mm256_cmp_ps_mask::<_CMP_GE_OQ>(x[i], _mm256_set1_ps(low))
            & _mm256_cmp_ps_mask::<_CMP_LE_OQ>(x[i], _mm256_set1_ps(high))
    });
    let zero: [__mmask8; N] =
        from_fn(|i| _mm256_cmp_ps_mask::<_CMP_LE_OQ>(x[i], _mm256_set1_ps(ZERO_BELOW)));
    // Clamped as in `exp8`, so out-of-range lanes compute something harmless.
    let x: [__m512d; N] = from_fn(|i| {
        let clamped = _mm256_max_ps(x[i], _mm256_set1_ps(low));
        _mm512_cvtps_pd(_mm256_min_ps(clamped, _mm256_set1_ps(high)))
    });
    let shifted: [__m512d; N] = from_fn(|i| {
        let log2_e = _mm512_set1_pd(16.0 * std::f64::consts::LOG2_E);
        _mm512_fmadd_pd(x[i], log2_e, _mm512_set1_pd(SHIFTER))
    });
    let k: [__m512d; N] = from_fn(|i| _mm512_sub_pd(shifted[i], _mm512_set1_pd(SHIFTER)));
    let r: [__m512d; N] = from_fn(|i| _mm512_fnmadd_pd(k[i], _mm512_set1_pd(STEP_HI), x[i]));
    let r: [__m512d; N] = from_fn(|i| _mm512_fnmadd_pd(k[i], _mm512_set1_pd(STEP_LO), r[i]));
    // e^r = (1 + r) + r^2 (1/2 + r/6) + r^4 (1/24 + r/120), by Estrin's scheme.
    let r2: [__m512d; N] = from_fn(|i| _mm512_mul_pd(r[i], r[i]));
    let terms_0_1: [__m512d; N] = from_fn(|i| _mm512_add_pd(r[i], _mm512_set1_pd(1.0)));
    let terms_2_3: [__m512d; N] =
        from_fn(|i| _mm512_fmadd_pd(r[i], _mm512_set1_pd(1.0 / 6.0), _mm512_set1_pd(0.5)));
    let terms_4_5: [__m512d; N] = from_fn(|i| {
        _mm512_fmadd_pd(
            r[i],
            _mm512_set1_pd(1.0 / 120.0),
            _mm512_set1_pd(1.0 / 24.0),
        )
    });
    let r4: [__m512d; N] = from_fn(|i| _mm512_mul_pd(r2[i], r2[i]));
    let terms_0_3: [__m512d; N] = from_fn(|i| _mm512_fmadd_pd(r2[i], terms_2_3[i], terms_0_1[i]));
    let p: [__m512d; N] = from_fn(|i| _mm512_fmadd_pd(r4[i], terms_4_5[i], terms_0_3[i]));
    // The low four bits of `k` pick the table entry (vpermt2pd reads the
    // index's low four bits only); the others, `floor(k / 16)`, shifted
    // into the exponent field, scale the product by a power of two.
    let [t_low, t_high] = TWO_TO_SIXTEENTHS;
    // SAFETY: each half of the table is eight f64; unaligned loads.
    let (t_low, t_high) = unsafe {
        (
            _mm512_loadu_pd(t_low.as_ptr()),
            _mm512_loadu_pd(t_high.as_ptr()),
        )
    };
    let k_bits: [__m512i; N] = from_fn(|i| _mm512_castpd_si512(shifted[i]));
    let table: [__m512d; N] = from_fn(|i| _mm512_permutex2var_pd(t_low, k_bits[i], t_high));
    let y: [__m512i; N] = from_fn(|i| {
        let power = _mm512_slli_epi64::<48>(_mm512_andnot_si512(_mm512_set1_epi64(15), k_bits[i]));
        _mm512_add_epi64(_mm512_castpd_si512(_mm512_mul_pd(table[i], p[i])), power)
    });
    // The midpoint test of `exp4`, on eight lanes.
    let near: [__mmask8; N] = from_fn(|i| {
        let low_bits = _mm512_and_si512(
            _mm512_sub_epi64(y[i], _mm512_set1_epi64((1 << 28) - MARGIN)),
            _mm512_set1_epi64((1 << 29) - 1),
        );
        _mm512_cmplt_epi64_mask(low_bits, _mm512_set1_epi64(2 * MARGIN + 1))
    });
    let y = from_fn(|i| _mm256_maskz_mov_ps(!zero[i], _mm512_cvtpd_ps(_mm512_castsi512_pd(y[i]))));
    let ask = from_fn(|i| u32::from((near[i] & in_range[i]) | !(in_range[i] | zero[i])));
    (y, ask)
}

/// `2^(j / 16)` for `j` in `0..16`, each the f64 nearest the exact value
/// (computed to 60 digits), as the two registers of [`exp_avx512`]'s table.
#[cfg(target_arch = "x86_64")]
const TWO_TO_SIXTEENTHS: [[f64; 8]; 2] = [
    [
        1.0,
        1.044_273_782_427_413_8,
        1.090_507_732_665_257_7,
        1.138_788_634_756_691_6,
        1.189_207_115_002_721,
        1.241_857_812_073_484,
        1.296_839_554_651_009_6,
        1.354_255_546_936_892_7,
    ],
    [
        std::f64::consts::SQRT_2,
        1.476_826_145_939_499_3,
        1.542_210_825_407_940_7,
        1.610_490_331_949_254_3,
        1.681_792_830_507_429,
        1.756_252_160_373_299_5,
        1.834_008_086_409_342_4,
        1.915_206_561_397_147_4,
    ],
];

/// The Taylor polynomial `sum r^i / i!` ([`TAYLOR`]) at four values, by
/// Estrin's scheme: pairs of terms, then pairs of pairs with `r^2`, `r^4`
/// and `r^8`, four multiply-adds deep where Horner's rule is ten, so the
/// core overlaps more of a softmax row's vectors (an `exp` 18% faster on
/// the AVX2 EPYC). Its f64 result differs from Horner's in the last bits
/// at most, far inside the midpoint margin (module docs): the results keep
/// libm's bits, as the exhaustive test over the softmax range checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn taylor_estrin(r: std::arch::x86_64::__m256d) -> std::arch::x86_64::__m256d {
    use std::arch::x86_64::*;
    let c = |i: usize| _mm256_set1_pd(TAYLOR[i]);
    let r2 = _mm256_mul_pd(r, r);
    let r4 = _mm256_mul_pd(r2, r2);
    let r8 = _mm256_mul_pd(r4, r4);
    let pair = |i: usize| _mm256_fmadd_pd(c(i + 1), r, c(i));
    let terms_0_3 = _mm256_fmadd_pd(pair(2), r2, pair(0));
    let terms_4_7 = _mm256_fmadd_pd(pair(6), r2, pair(4));
    let terms_8_10 = _mm256_fmadd_pd(c(10), r2, pair(8));
    let terms_0_7 = _mm256_fmadd_pd(terms_4_7, r4, terms_0_3);
    _mm256_fmadd_pd(terms_8_10, r8, terms_0_7)
}

/// `1 / i!` for `i` in `0..=10`: the Taylor polynomial of `e^r`, whose
/// truncation error for `|r| <= ln 2 / 2` is below `0.35^11 / 11! * e^0.35`,
/// about 2^-41 relative.
#[cfg(target_arch = "x86_64")]
const TAYLOR: [f64; 11] = [
    1.0,
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5_040.0,
    1.0 / 40_320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp_in_place` of `inputs` with `dispatch`.
    fn exps(dispatch: Dispatch, inputs: &[f32]) -> Vec<f32> {
        let mut values = inputs.to_vec();
        exp_in_place(dispatch, &mut values);
        values
    }

    /// Asserts that every result has `f32::exp`'s bits (NaN for NaN), on
    /// every path.
    fn check_against_libm(inputs: &[f32]) {
        for dispatch in Dispatch::every_available() {
            for (&x, &y) in inputs.iter().zip(&exps(dispatch, inputs)) {
                let expected = x.exp();
                assert!(
                    y.to_bits() == expected.to_bits() || (y.is_nan() && expected.is_nan()),
                    "{:?}: exp({x:e}) = {y:e}, libm says {expected:e}",
                    dispatch.kernel()
                );
            }
        }
    }

    #[test]
    fn edge_cases_match_libm() {
        let inputs = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-30,
            -1e-30,
            -87.0,
            -87.000_01,
            -87.336_55,
            -100.0,
            -103.972_08,
            -103.972_09,
            -104.0,
            -104.000_01,
            -150.0,
            f32::MIN,
            88.0,
            88.000_01,
            88.722_83,
            88.722_84,
            89.0,
            f32::MAX,
            std::f32::consts::LN_2,
            -std::f32::consts::LN_2,
            0.5 * std::f32::consts::LN_2,
            -0.5 * std::f32::consts::LN_2,
        ];
        check_against_libm(&inputs);
        // The special values, one by one (and so on the remainder path too).
        for dispatch in Dispatch::every_available() {
            let values = exps(dispatch, &inputs);
            assert_eq!(values[0].to_bits(), 1f32.to_bits(), "exp(0) = 1");
            assert_eq!(values[1].to_bits(), 1f32.to_bits(), "exp(-0) = 1");
            assert_eq!(values[4].to_bits(), 0f32.to_bits(), "exp(-inf) = +0");
            assert_eq!(values[5], f32::INFINITY, "exp(inf) = inf");
            assert!(values[6].is_nan() && values[7].is_nan(), "NaN stays NaN");
            assert_eq!(values[18].to_bits(), 0f32.to_bits(), "exp(-104) = +0");
        }
    }

    #[test]
    fn a_dense_sweep_of_every_binade_matches_libm_and_f64_exp() {
        // Every 1,021st f32 bit pattern (a prime stride, so the low bits
        // vary) from -200 to 100: 2.2 million values, about 1.1 million of
        // them in the softmax range [-104, 0].
        let inputs: Vec<f32> = (0..=u32::MAX)
            .step_by(1_021)
            .map(f32::from_bits)
            .filter(|x| (-200.0..100.0).contains(x))
            .collect();
        assert!(inputs.len() > 2_000_000, "{}", inputs.len());
        check_against_libm(&inputs);
        // The independent check: within glibc's documented 0.502 ulp of exp
        // computed in f64 (correctly rounded but near midpoints, where the
        // lanes take libm's value, which may be the other neighbour).
        for dispatch in Dispatch::every_available() {
            for (&x, &y) in inputs.iter().zip(&exps(dispatch, &inputs)) {
                let exact = f64::from(x).exp();
                if !(f64::from(f32::MIN_POSITIVE)..f64::from(f32::MAX)).contains(&exact) {
                    continue;
                }
                let ulp = f64::from(f32::from_bits(y.to_bits() + 1) - y);
                assert!(
                    (f64::from(y) - exact).abs() <= 0.502 * ulp,
                    "{:?}: exp({x:e}) = {y:e}, f64 says {exact:e}",
                    dispatch.kernel()
                );
            }
        }
    }

    #[test]
    fn lanes_that_ask_libm_do_not_disturb_their_neighbours() {
        // Vectors mixing NaN, -inf, subnormal results, zeros and ordinary
        // values in every lane position.
        let pool = [
            -1.5,
            f32::NAN,
            -90.0,
            f32::NEG_INFINITY,
            -0.25,
            -200.0,
            3.0,
            -103.99,
            -0.0,
        ];
        let inputs: Vec<f32> = (0..8 * 9 + 5).map(|i| pool[(i * 7 + i / 9) % 9]).collect();
        check_against_libm(&inputs);
    }

    #[test]
    #[ignore = "exhaustive over the softmax range [-104, 0]: 1.1 billion values, about 20 s a path"]
    fn every_f32_of_the_softmax_range_matches_libm() {
        let first = (-0.0f32).to_bits();
        let last = (-104.0f32).to_bits();
        let mut values = vec![0.0f32; 1 << 16];
        for dispatch in Dispatch::every_available() {
            let mut bits = first;
            while bits <= last {
                let n = (values.len() as u32).min(last - bits + 1);
                for (i, v) in values[..n as usize].iter_mut().enumerate() {
                    *v = f32::from_bits(bits + i as u32);
                }
                let inputs = values[..n as usize].to_vec();
                exp_in_place(dispatch, &mut values[..n as usize]);
                for (&x, &y) in inputs.iter().zip(&values) {
                    let kernel = dispatch.kernel();
                    assert_eq!(y.to_bits(), x.exp().to_bits(), "{kernel:?}: exp({x:e})");
                }
                bits += n;
            }
        }
    }

    #[test]
    fn the_table_holds_the_sixteenths_of_an_octave() {
        // Each entry within an f64 ulp of libm's `exp2(j / 16)` (itself
        // within an ulp of the exact value), and its 16th power within
        // 16 ulp of 2^j.
        for (j, &entry) in TWO_TO_SIXTEENTHS.iter().flatten().enumerate() {
            let ulp = f64::from_bits(entry.to_bits() + 1) - entry;
            let libm = (j as f64 / 16.0).exp2();
            assert!(
                (entry - libm).abs() <= ulp,
                "2^({j}/16): {entry}, libm {libm}"
            );
            let octave = entry.powi(16) / 2f64.powi(j as i32);
            assert!(
                (octave - 1.0).abs() <= 16.0 * f64::EPSILON,
                "2^({j}/16)^16 / 2^{j}"
            );
        }
    }
}
