//! Activations quantized to 8-bit blocks (`quant/activation.rs` says what
//! a block holds) with the vector units: a block's largest magnitude by
//! vector maxima, its values scaled, rounded and narrowed to bytes a vector
//! at a time, their sums in registers, and a Q8_0 block's scale and sum
//! rounded through f16 by F16C. Every step gives the bits of the scalar
//! [`Q8Block::quantize`] and [`Q8KBlock::quantize`] (NaN skipped by the
//! maximum and quantized to 0, the first value of the largest magnitude
//! setting a Q8_K block's sign), written once over [`Vector`] for AVX2 and
//! AVX-512.
//!
//! A decode pass quantizes every product's input on one thread while the
//! others wait, so this is serial time: the scalar loop took 0.4 ms of a
//! 1B model's 26 ms two-thread pass (docs/performance.md, "What limits
//! decode today"). For 8,192 values on the Xeon of that measure, these
//! loops take 3.2 microseconds into Q8_0 blocks with their sums on
//! AVX-512 and 4.0 on AVX2, against 13-15 for the scalar loop and its
//! sums; into Q8_K blocks 2.8 and 4.1, against 8-9.

use super::dispatch::Dispatch;
#[cfg(target_arch = "x86_64")]
use super::dispatch::Kernel;
use crate::quant::activation::{Q8Block, Q8KBlock};
use crate::quant::block::QK;
use crate::quant::block_k::QK_K;

/// The blocks an input is quantized into, of either kind.
pub(crate) enum Blocks<'a> {
    /// 32-value blocks, and each block's `Σ qs` (the panel kernels' start).
    Q8 {
        blocks: &'a mut [Q8Block],
        sums: &'a mut [i32],
    },
    /// 256-value blocks (Q8_K).
    Q8K(&'a mut [Q8KBlock]),
}

/// Quantizes `x` into `out`, which holds exactly `x`'s blocks.
pub(crate) fn quantize(dispatch: Dispatch, x: &[f32], out: Blocks<'_>) {
    match &out {
        Blocks::Q8 { blocks, sums } => {
            assert_eq!(x.len(), blocks.len() * QK, "32 values a block");
            assert_eq!(sums.len(), blocks.len(), "a sum a block");
        }
        Blocks::Q8K(blocks) => assert_eq!(x.len(), blocks.len() * QK_K, "256 values a block"),
    }
    #[cfg(target_arch = "x86_64")]
    match dispatch.kernel() {
        // SAFETY: a `Dispatch` holds only kernels the CPU runs; AVX-512's
        // has AVX-512 F, BW and VL and F16C, AVX2's AVX2, FMA and F16C.
        Kernel::Avx512 => return unsafe { x86::quantize_avx512(x, out) },
        Kernel::Avx2 | Kernel::AvxVnni => return unsafe { x86::quantize_avx2(x, out) },
        Kernel::Portable => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = dispatch;
    match out {
        Blocks::Q8 { blocks, sums } => {
            for ((block, sum), x) in blocks.iter_mut().zip(sums).zip(x.chunks_exact(QK)) {
                *block = Q8Block::quantize(x);
                *sum = block.qs.iter().map(|&q| i32::from(q)).sum();
            }
        }
        Blocks::Q8K(blocks) => {
            for (block, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
                *block = Q8KBlock::quantize(x);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Blocks, Q8Block, Q8KBlock, QK, QK_K};

    /// 1.5 * 2^23: added to a value of magnitude below 2^22, it leaves no
    /// fraction bits, so the addition rounds to an integer (ties to even)
    /// and the sum's low bits are that integer plus the constant's.
    const ROUNDING_SHIFT: f32 = 12_582_912.0;

    /// The operations the quantizers need on one build's f32 vector and
    /// the i32 vector of the same lanes.
    ///
    /// # Safety
    /// Every method needs the build's instructions (`__m256`: AVX2, FMA and
    /// F16C; `__m512`: AVX-512 F, BW and VL): it is called only inside that
    /// build's `#[target_feature]` functions, into which it is inlined.
    /// Pointers are the caller's to keep in bounds.
    pub(super) trait Vector: Copy {
        /// f32 lanes in a vector.
        const WIDTH: usize;
        /// The i32 vector of as many lanes.
        type Int: Copy;

        /// `WIDTH` f32 from `at` (unaligned).
        unsafe fn load(at: *const f32) -> Self;
        /// Every lane `value`.
        unsafe fn splat(value: f32) -> Self;
        /// `self * other`, lane by lane.
        unsafe fn mul(self, other: Self) -> Self;
        /// `max(|self|, m)` lane by lane as `a > m ? a : m` with `a =
        /// |self|`, so a NaN lane keeps `m`.
        unsafe fn larger_magnitude(self, m: Self) -> Self;
        /// The largest lane (none is NaN).
        unsafe fn max_lane(self) -> f32;
        /// The first lane whose magnitude is `amax`, if any.
        unsafe fn first_of_magnitude(self, amax: f32) -> Option<usize>;
        /// Each lane rounded to an integer, ties to even, by
        /// [`ROUNDING_SHIFT`], and the result's low byte sign-extended (as
        /// the scalar `round_to_i8` takes it); NaN lanes 0.
        unsafe fn round_to_bytes(self) -> Self::Int;
        /// Every i32 lane 0.
        unsafe fn int_zero() -> Self::Int;
        /// `a + b`, i32 lane by lane.
        unsafe fn int_add(a: Self::Int, b: Self::Int) -> Self::Int;
        /// The sum of the i32 lanes.
        unsafe fn int_sum(a: Self::Int) -> i32;
        /// The lanes (each in `-128..=127`) as `WIDTH` bytes to `at`.
        unsafe fn store_bytes(a: Self::Int, at: *mut i8);
    }

    /// The largest magnitude of `x`'s values that are not NaN, 0 when none.
    ///
    /// # Safety
    /// `V`'s instructions; `x.len()` a multiple of `V::WIDTH`.
    #[inline(always)]
    unsafe fn largest_magnitude<V: Vector>(x: &[f32]) -> f32 {
        // SAFETY: each load is `V::WIDTH` values within `x`.
        unsafe {
            let mut m = V::splat(0.0);
            for at in (0..x.len()).step_by(V::WIDTH) {
                m = V::load(x.as_ptr().add(at)).larger_magnitude(m);
            }
            m.max_lane()
        }
    }

    /// `x * scale` quantized to bytes into `qs` (as long as `x`), and the
    /// bytes' sum over each `V::WIDTH` values into `sum`, in order.
    ///
    /// # Safety
    /// `V`'s instructions; `x.len() == qs.len()`, a multiple of `V::WIDTH`.
    #[inline(always)]
    unsafe fn scale_to_bytes<V: Vector>(
        x: &[f32],
        scale: f32,
        qs: &mut [i8],
        mut sum: impl FnMut(V::Int),
    ) {
        // SAFETY: each load and store is `V::WIDTH` values within `x` and
        // `qs`, which are as long.
        unsafe {
            let scale = V::splat(scale);
            for at in (0..x.len()).step_by(V::WIDTH) {
                let q = V::load(x.as_ptr().add(at)).mul(scale).round_to_bytes();
                V::store_bytes(q, qs.as_mut_ptr().add(at));
                sum(q);
            }
        }
    }

    /// [`Q8Block::quantize`] of each block of `x`, and its `Σ qs`.
    ///
    /// # Safety
    /// `V`'s instructions and F16C; `x.len() == 32 * blocks.len()`,
    /// `sums.len() == blocks.len()`.
    #[inline(always)]
    unsafe fn q8_blocks<V: Vector>(x: &[f32], blocks: &mut [Q8Block], sums: &mut [i32]) {
        for ((block, sum), x) in blocks.iter_mut().zip(sums).zip(x.chunks_exact(QK)) {
            // SAFETY: the caller's instructions; 32 values and 32 bytes.
            unsafe {
                let amax = largest_magnitude::<V>(x);
                let inv_d = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                let mut isum = V::int_zero();
                scale_to_bytes::<V>(x, inv_d, &mut block.qs, |q| isum = V::int_add(isum, q));
                *sum = V::int_sum(isum);
                let d = amax / 127.0;
                [block.d, block.sum] = through_f16([d, d * *sum as f32]);
            }
        }
    }

    /// [`Q8KBlock::quantize`] of each block of `x`.
    ///
    /// # Safety
    /// `V`'s instructions; `x.len() == 256 * blocks.len()`.
    #[inline(always)]
    unsafe fn q8_k_blocks<V: Vector>(x: &[f32], blocks: &mut [Q8KBlock]) {
        for (block, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
            // SAFETY: the caller's instructions; 256 values and 256 bytes.
            unsafe {
                let amax = largest_magnitude::<V>(x);
                if amax == 0.0 {
                    *block = Q8KBlock::ZERO;
                    continue;
                }
                let max = (0..QK_K)
                    .step_by(V::WIDTH)
                    .find_map(|at| {
                        let lane = V::load(x.as_ptr().add(at)).first_of_magnitude(amax);
                        lane.map(|lane| x[at + lane])
                    })
                    .unwrap_or(amax);
                let iscale = -127.0 / max;
                // Groups of 16 values: one or two vectors each.
                let per_group = 16 / V::WIDTH;
                let (mut group, mut n) = (V::int_zero(), 0);
                let mut bsums = block.bsums.iter_mut();
                scale_to_bytes::<V>(x, iscale, &mut block.qs, |q| {
                    group = V::int_add(group, q);
                    n += 1;
                    if n == per_group {
                        *bsums.next().expect("16 groups") = V::int_sum(group) as i16;
                        (group, n) = (V::int_zero(), 0);
                    }
                });
                block.d = 1.0 / iscale;
            }
        }
    }

    /// `values` rounded to f16 (ties to even) and back, as
    /// `half::f16::from_f32(v).to_f32()` gives them.
    #[inline]
    #[target_feature(enable = "avx,f16c")]
    fn through_f16(values: [f32; 2]) -> [f32; 2] {
        let v = _mm_setr_ps(values[0], values[1], 0.0, 0.0);
        let back = _mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        [_mm_cvtss_f32(back), _mm_cvtss_f32(_mm_movehdup_ps(back))]
    }

    /// [`super::quantize`] in `V`'s build.
    ///
    /// # Safety
    /// `V`'s instructions and F16C; the lengths [`super::quantize`] asserts.
    #[inline(always)]
    unsafe fn quantize<V: Vector>(x: &[f32], out: Blocks<'_>) {
        // SAFETY: the caller's instructions and lengths.
        unsafe {
            match out {
                Blocks::Q8 { blocks, sums } => q8_blocks::<V>(x, blocks, sums),
                Blocks::Q8K(blocks) => q8_k_blocks::<V>(x, blocks),
            }
        }
    }

    /// See [`super::quantize`].
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VL and F16C.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_avx512(x: &[f32], out: Blocks<'_>) {
        // SAFETY: this function's instructions; the lengths the caller asserted.
        unsafe { quantize::<__m512>(x, out) }
    }

    /// See [`super::quantize`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_avx2(x: &[f32], out: Blocks<'_>) {
        // SAFETY: as above.
        unsafe { quantize::<__m256>(x, out) }
    }

    /// The [`Vector`] methods that are one intrinsic each, named per build.
    macro_rules! one_intrinsic_each {
        (
            load $load:ident, splat $splat:ident, mul $mul:ident,
            int_zero $int_zero:ident, int_add $int_add:ident
        ) => {
            #[inline(always)]
            unsafe fn load(at: *const f32) -> Self {
                // SAFETY: the build's instructions and bounds (the trait's contract).
                unsafe { $load(at) }
            }
            #[inline(always)]
            unsafe fn splat(value: f32) -> Self {
                // SAFETY: the build's instructions (the trait's contract).
                unsafe { $splat(value) }
            }
            #[inline(always)]
            unsafe fn mul(self, other: Self) -> Self {
                // SAFETY: as above.
                unsafe { $mul(self, other) }
            }
            #[inline(always)]
            unsafe fn int_zero() -> Self::Int {
                // SAFETY: as above.
                unsafe { $int_zero() }
            }
            #[inline(always)]
            unsafe fn int_add(a: Self::Int, b: Self::Int) -> Self::Int {
                // SAFETY: as above.
                unsafe { $int_add(a, b) }
            }
        };
    }

    impl Vector for __m512 {
        const WIDTH: usize = 16;
        type Int = __m512i;

        one_intrinsic_each! {
            load _mm512_loadu_ps, splat _mm512_set1_ps, mul _mm512_mul_ps,
            int_zero _mm512_setzero_si512, int_add _mm512_add_epi32
        }

        #[inline(always)]
        unsafe fn larger_magnitude(self, m: Self) -> Self {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                // `vmaxps` returns its second operand when either is NaN.
                _mm512_max_ps(_mm512_abs_ps(self), m)
            }
        }
        #[inline(always)]
        unsafe fn max_lane(self) -> f32 {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                // Halves, then the AVX2 build's reduction (`_mm512_reduce_max_ps`
                // keeps NaN's rules at every step, which lanes free of NaN do
                // not need).
                let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self)));
                _mm256_max_ps(_mm512_castps512_ps256(self), high).max_lane()
            }
        }
        #[inline(always)]
        unsafe fn first_of_magnitude(self, amax: f32) -> Option<usize> {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                let equal =
                    _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(self), _mm512_set1_ps(amax));
                (equal != 0).then(|| equal.trailing_zeros() as usize)
            }
        }
        #[inline(always)]
        unsafe fn round_to_bytes(self) -> Self::Int {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                let shift = _mm512_set1_ps(ROUNDING_SHIFT);
                let bits = _mm512_sub_epi32(
                    _mm512_castps_si512(_mm512_add_ps(self, shift)),
                    _mm512_castps_si512(shift),
                );
                let byte = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(bits));
                _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(self, self), byte)
            }
        }
        #[inline(always)]
        unsafe fn int_sum(a: Self::Int) -> i32 {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe { _mm512_reduce_add_epi32(a) }
        }
        #[inline(always)]
        unsafe fn store_bytes(a: Self::Int, at: *mut i8) {
            // SAFETY: the build's instructions and bounds (the trait's contract).
            unsafe { _mm_storeu_si128(at.cast(), _mm512_cvtepi32_epi8(a)) }
        }
    }

    impl Vector for __m256 {
        const WIDTH: usize = 8;
        type Int = __m256i;

        one_intrinsic_each! {
            load _mm256_loadu_ps, splat _mm256_set1_ps, mul _mm256_mul_ps,
            int_zero _mm256_setzero_si256, int_add _mm256_add_epi32
        }

        #[inline(always)]
        unsafe fn larger_magnitude(self, m: Self) -> Self {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), self);
                // `vmaxps` returns its second operand when either is NaN.
                _mm256_max_ps(abs, m)
            }
        }
        #[inline(always)]
        unsafe fn max_lane(self) -> f32 {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                let m = _mm_max_ps(
                    _mm256_castps256_ps128(self),
                    _mm256_extractf128_ps::<1>(self),
                );
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
            }
        }
        #[inline(always)]
        unsafe fn first_of_magnitude(self, amax: f32) -> Option<usize> {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), self);
                let equal =
                    _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs, _mm256_set1_ps(amax)));
                (equal != 0).then(|| equal.trailing_zeros() as usize)
            }
        }
        #[inline(always)]
        unsafe fn round_to_bytes(self) -> Self::Int {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                let shift = _mm256_set1_ps(ROUNDING_SHIFT);
                let bits = _mm256_sub_epi32(
                    _mm256_castps_si256(_mm256_add_ps(self, shift)),
                    _mm256_castps_si256(shift),
                );
                let byte = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(bits));
                let ordered = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(self, self));
                _mm256_and_si256(byte, ordered)
            }
        }
        #[inline(always)]
        unsafe fn int_sum(a: Self::Int) -> i32 {
            // SAFETY: the build's instructions (the trait's contract).
            unsafe {
                let s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
                let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)))
            }
        }
        #[inline(always)]
        unsafe fn store_bytes(a: Self::Int, at: *mut i8) {
            // SAFETY: the build's instructions and bounds (the trait's contract).
            unsafe {
                // Byte 0 of each i32 to the front of its 128-bit half, then the
                // halves' four bytes side by side.
                let front = _mm256_setr_epi8(
                    0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
                    0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                );
                let bytes = _mm256_permutevar8x32_epi32(
                    _mm256_shuffle_epi8(a, front),
                    _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0),
                );
                _mm_storel_epi64(at.cast(), _mm256_castsi256_si128(bytes))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// Values that exercise every step: ties of the rounding, NaNs, both
    /// infinities, subnormals, zeros of both signs, repeated largest
    /// magnitudes of either sign, and plain seeded values of many scales.
    fn hostile_values(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let scale = [1e-3f32, 1.0, 37.0, 1e30][rng.random_range(0..4)];
                match rng.random_range(0..32) {
                    // NaN of either sign with a payload in the low byte,
                    // which the rounding's arithmetic would carry through.
                    0 => f32::from_bits(0x7fc0_0000 | rng.random::<u32>() & 0x8000_00ff),
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => f32::from_bits(rng.random_range(1..65)),
                    4 => -0.0,
                    5 => 2.5,
                    6 => -2.5,
                    _ => rng.random_range(-0.5..0.5) * scale,
                }
            })
            .collect()
    }

    /// Blocks whose values are few distinct ones, one hostile kind at a time
    /// (all zero, all NaN, one infinity, one subnormal, ties at the
    /// largest), and seeded mixes.
    fn cases(block: usize) -> Vec<Vec<f32>> {
        let mut cases = vec![
            vec![0.0; block],
            vec![f32::NAN; block],
            vec![f32::from_bits(1); block],
            (0..block).map(|i| i as f32 - 40.5).collect(),
            (0..block).map(|i| [2.0, -2.0, 1.0][i % 3]).collect(),
            (0..block).map(|i| (i as f32 * 0.37).sin() * 3.0).collect(),
        ];
        let mut one_inf = vec![0.5; block];
        one_inf[block / 2] = f32::NEG_INFINITY;
        cases.push(one_inf);
        for seed in 0..64 {
            cases.push(hostile_values(block, seed));
            // Mostly ordinary values, with a few hostile ones.
            let mut mostly = hostile_values(block, seed + 1000);
            for v in &mut mostly {
                if !v.is_finite() || v.abs() > 1e6 {
                    *v = 0.75;
                }
            }
            cases.push(mostly);
        }
        cases
    }

    fn same_bits(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn q8_blocks_match_the_scalar_quantizer_on_every_path() {
        let x: Vec<f32> = cases(QK).concat();
        let n = x.len() / QK;
        let expected: Vec<Q8Block> = x.chunks_exact(QK).map(Q8Block::quantize).collect();
        for dispatch in Dispatch::every_available() {
            let (mut blocks, mut sums) = (vec![Q8Block::quantize(&[1.0; QK]); n], vec![7; n]);
            quantize(
                dispatch,
                &x,
                Blocks::Q8 {
                    blocks: &mut blocks,
                    sums: &mut sums,
                },
            );
            for (i, ((got, want), sum)) in blocks.iter().zip(&expected).zip(&sums).enumerate() {
                let at = format!("{:?}, block {i}", dispatch.kernel());
                assert_eq!(got.qs, want.qs, "{at}");
                assert!(same_bits(got.d, want.d), "{at}: d {} {}", got.d, want.d);
                assert!(same_bits(got.sum, want.sum), "{at}: sum");
                let isum: i32 = want.qs.iter().map(|&q| i32::from(q)).sum();
                assert_eq!(*sum, isum, "{at}: Σ qs");
            }
        }
    }

    #[test]
    fn q8_k_blocks_match_the_scalar_quantizer_on_every_path() {
        let x: Vec<f32> = cases(QK_K).concat();
        let n = x.len() / QK_K;
        let expected: Vec<Q8KBlock> = x.chunks_exact(QK_K).map(Q8KBlock::quantize).collect();
        for dispatch in Dispatch::every_available() {
            let mut blocks = vec![Q8KBlock::quantize(&[1.0; QK_K]); n];
            quantize(dispatch, &x, Blocks::Q8K(&mut blocks));
            for (i, (got, want)) in blocks.iter().zip(&expected).enumerate() {
                let at = format!("{:?}, block {i}", dispatch.kernel());
                assert_eq!(got.qs, want.qs, "{at}");
                assert_eq!(got.bsums, want.bsums, "{at}");
                assert!(same_bits(got.d, want.d), "{at}: d {} {}", got.d, want.d);
            }
        }
    }

    /// The cases hold what they claim: every block kind quantizes to
    /// something other than all zeros somewhere, and NaN and ties occur.
    #[test]
    fn the_cases_reach_the_hostile_values() {
        let x: Vec<f32> = cases(QK).concat();
        assert!(x.iter().any(|v| v.is_nan()));
        assert!(x.iter().any(|v| v.is_infinite()));
        assert!(x.iter().any(|v| v.is_subnormal()));
        let blocks: Vec<Q8Block> = x.chunks_exact(QK).map(Q8Block::quantize).collect();
        assert!(
            blocks
                .iter()
                .any(|b| b.qs.contains(&127) || b.qs.contains(&-127))
        );
        assert!(blocks.iter().any(|b| b.d.is_infinite() || b.sum.is_nan()));
    }
}
