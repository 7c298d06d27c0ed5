//! AVX2 + FMA + F16C dot products of K-quant rows with [`Q8KBlock`]
//! activations (x86_64, selected at run time).
//!
//! Each super-block is unpacked once (for a group of inputs:
//! `frame::each_row_and_input`) into the common form of `block_k`: eight
//! vectors of 32 values (unsigned below 64,
//! or IQ4_XS's signed table values), and per group of 16 an integer scale and
//! offset. Per 32 values, `vpmaddubsw` multiplies the values with the
//! activation bytes (pairs summed to i16: at most 2 · 63 · 127, or
//! 2 · 127 · 127 for signed values, whose signs move onto the activations
//! first; no saturation) and `vpmaddwd` multiplies
//! the pair sums by the group scales into eight i32 lanes (at most
//! 8 · 2 · 16002 · 128 in magnitude); one more `vpmaddwd` gives the offsets
//! times the activation group sums. The integer sums and the f32 operations
//! on them, in their order, are the portable path's: the same bits.
//!
//! The integer loop ([`SuperBlockVectors::scaled_sums`]) and the f32
//! arithmetic around the lane sums ([`dot_super_blocks`]) are written once,
//! generic over the vectors ([`SuperBlockVectors`]: the load, the byte
//! products and the multiply-add of each instruction set), so the AVX-512
//! kernel (`avx512_k`) runs the same operations in the same order.
//!
//! Every function requires avx2, fma and f16c, which callers check through
//! a `Dispatch`.

use std::arch::x86_64::{
    __m128i, __m256i, _mm_and_si128, _mm_cvtph_ps, _mm_cvtsi32_si128, _mm_cvtsi64_si128,
    _mm_cvtss_f32, _mm_loadu_si128, _mm_movehdup_ps, _mm_or_si128, _mm_set_epi64x, _mm_set1_epi8,
    _mm_set1_epi16, _mm_setr_epi8, _mm_setr_epi32, _mm_shuffle_epi8, _mm_shuffle_epi32,
    _mm_slli_epi16, _mm_srli_epi16, _mm_srli_epi32, _mm_srlv_epi32, _mm_sub_epi8,
    _mm_unpacklo_epi8, _mm256_add_epi32, _mm256_and_si256, _mm256_broadcastsi128_si256,
    _mm256_cmpeq_epi8, _mm256_cvtepi8_epi16, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi16,
    _mm256_fmadd_ps, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_or_si256,
    _mm256_set_m128i, _mm256_set1_epi8, _mm256_set1_epi16, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_setzero_si256, _mm256_shuffle_epi8, _mm256_sign_epi8, _mm256_slli_epi16,
    _mm256_srai_epi16, _mm256_srl_epi16, _mm256_srli_epi16, _mm256_sub_ps,
};

use super::avx2::{horizontal_sum, unpack_nibbles};
use super::frame::{
    Batch, BlockKernel, Group, each_row_and_input, type_of_id, with_super_block_type,
};
use crate::quant::GgmlType;
use crate::quant::activation::Q8KBlock;
use crate::quant::block::IQ4_NL_VALUES;
use crate::quant::block_k::{QK_K, SuperBlock};

/// Defines, in the file that invokes it, the K-quant kernel on the vectors
/// `$vectors` ([`SuperBlockVectors`]) compiled with the target features
/// `$features`: its entry `dot_rows` (`out[r * n + i] = row r · input i`
/// over the rows of `batch`, input `i` being `xq[i * n_blocks..][..n_blocks]`,
/// each super-block unpacked once for a group of up to four inputs:
/// [`each_row_and_input`]), the kernel that loop runs, and the two
/// target-feature functions it calls, [`dot_super_blocks`] for a group of
/// `N` inputs and, out of line, for one (inlined into `dot_rows`'s loop, the
/// one-input product ran at half speed). The AVX2 and AVX-512 kernels differ
/// only in their vectors and their features.
macro_rules! super_block_kernel {
    ($vectors:ty, $features:literal) => {
        /// The K-quant products on this file's vectors (see
        /// `avx2_k::super_block_kernel!`).
        ///
        /// # Safety
        /// The CPU must support the features this function enables.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn dot_rows(
            ty: GgmlType,
            batch: Batch<'_>,
            xq: &[Q8KBlock],
            out: &mut [f32],
        ) {
            // SAFETY: the kernel needs this function's features.
            with_super_block_type!(ty, |TY| unsafe {
                each_row_and_input(batch, xq, out, SuperBlockKernel::<TY>)
            })
        }

        /// The kernel of the super-block type with id `TY` for
        /// [`each_row_and_input`].
        struct SuperBlockKernel<const TY: u32>;

        impl<const TY: u32> BlockKernel<Q8KBlock> for SuperBlockKernel<TY> {
            #[inline(always)]
            unsafe fn dot<const N: usize>(
                &self,
                row: &[u8],
                group: Group<'_, Q8KBlock, N>,
            ) -> [f32; N] {
                // SAFETY: the caller guarantees the features.
                unsafe { dot::<N, TY>(row, group.inputs) }
            }

            #[inline(always)]
            unsafe fn dot_one(&self, row: &[u8], xq: &[Q8KBlock]) -> f32 {
                // SAFETY: as above.
                unsafe { dot_one::<TY>(row, xq) }
            }
        }

        /// The super-block products of `N` inputs on this file's vectors.
        #[inline]
        #[target_feature(enable = $features)]
        fn dot<const N: usize, const TY: u32>(row: &[u8], xq: [&[Q8KBlock]; N]) -> [f32; N] {
            // SAFETY: compiled with the features the vectors' methods need.
            unsafe { dot_super_blocks::<N, TY, $vectors>(row, xq) }
        }

        /// [`dot`] of one input, out of line.
        ///
        /// # Safety
        /// As [`dot_rows`].
        #[inline(never)]
        #[target_feature(enable = $features)]
        unsafe fn dot_one<const TY: u32>(row: &[u8], xq: &[Q8KBlock]) -> f32 {
            let [result] = dot::<1, TY>(row, [xq]);
            result
        }
    };
}
pub(super) use super_block_kernel;

super_block_kernel!(__m256i, "avx2,fma,f16c");

/// An instruction set's integer vector, in which a super-block is held and
/// multiplied with an activation block: the few operations that differ
/// between AVX2 (`__m256i`) and AVX-512 (`__m512i`). The rest is written
/// once on top of them (the integer loop [`SuperBlockVectors::scaled_sums`],
/// the f32 arithmetic [`dot_super_blocks`]), so both give the same bits.
/// The methods that are one call on either are spelled by
/// `one_intrinsic_operations!`.
///
/// # Safety
/// Every method requires a CPU with the instruction set, and is inlined
/// into a function compiled with it.
pub(super) trait SuperBlockVectors: Copy {
    /// 256 values (or the scales over them) in consecutive vectors: values
    /// `w k..w k + w` in vector `k`, for `w` the bytes of a vector.
    type Values: AsRef<[Self]>;

    /// One super-block of the type with id `TY`.
    ///
    /// # Safety
    /// See [`SuperBlockVectors`].
    unsafe fn unpack<const TY: u32>(block: &[u8]) -> Unpacked<Self::Values>;

    /// A vector of zeros.
    ///
    /// # Safety
    /// See [`SuperBlockVectors`].
    unsafe fn zero() -> Self;

    /// The activation bytes `bytes`, a vector's worth.
    ///
    /// # Safety
    /// See [`SuperBlockVectors`]; `bytes` holds the bytes of a vector.
    unsafe fn load(bytes: &[i8]) -> Self;

    /// The products of these unsigned values with the signed `activations`,
    /// adjacent pairs summed to i16 (`vpmaddubsw`; no saturation: see the
    /// module docs).
    ///
    /// # Safety
    /// See [`SuperBlockVectors`].
    unsafe fn products(self, activations: Self) -> Self;

    /// [`SuperBlockVectors::products`] of signed values: their magnitudes
    /// times the activations with the values' signs.
    ///
    /// # Safety
    /// See [`SuperBlockVectors`].
    unsafe fn signed_products(self, activations: Self) -> Self;

    /// These i32 sums plus the i16 `pairs` times the i16 `scales`, adjacent
    /// products summed into each i32 lane (`vpmaddwd`).
    ///
    /// # Safety
    /// See [`SuperBlockVectors`].
    unsafe fn add_scaled(self, pairs: Self, scales: Self) -> Self;

    /// These i32 lanes as the eight lanes of the portable path: lane `i` the
    /// sum of every lane `j` with `j mod 8 = i`.
    ///
    /// # Safety
    /// See [`SuperBlockVectors`].
    unsafe fn eight_lanes(self) -> __m256i;

    /// The eight i32 lanes of `Σ scale · value · q_x` of `w` and the
    /// activation block `a`: lane `i` sums values `4i..4i + 4` of each run of
    /// 32 (the portable path's lanes). Per vector, the values' products with
    /// the activation bytes at the same place, times their groups' scales,
    /// added to the sums: exact integer additions, so the vectors' width
    /// does not change the result.
    ///
    /// # Safety
    /// See [`SuperBlockVectors`].
    #[inline(always)]
    unsafe fn scaled_sums(w: &Unpacked<Self::Values>, a: &Q8KBlock) -> __m256i {
        let width = size_of::<Self>();
        let values = w.values.as_ref();
        debug_assert_eq!(size_of_val(values), QK_K, "one super-block of values");
        let runs = values
            .iter()
            .zip(w.scales.as_ref())
            .zip(a.qs.chunks_exact(width));
        // SAFETY: the caller guarantees the features; each chunk of `qs` is
        // a vector's bytes.
        unsafe {
            let mut sums = Self::zero();
            for ((&values, &scales), activations) in runs {
                let activations = Self::load(activations);
                let pairs = if w.signed {
                    values.signed_products(activations)
                } else {
                    values.products(activations)
                };
                sums = sums.add_scaled(pairs, scales);
            }
            sums.eight_lanes()
        }
    }
}

/// Inside an `impl SuperBlockVectors`, the methods that are one call on
/// every instruction set, given this instruction set's functions for them:
/// `unpack` (of a super-block), `zero`, `load` (unaligned), `products`
/// (`vpmaddubsw`), `pair_sums` (`vpmaddwd`) and `add` (of i32 lanes).
macro_rules! one_intrinsic_operations {
    (
        unpack: $unpack:ident, zero: $zero:ident, load: $load:ident,
        products: $products:ident, pair_sums: $pair_sums:ident, add: $add:ident
    ) => {
        #[inline(always)]
        unsafe fn unpack<const TY: u32>(block: &[u8]) -> Unpacked<Self::Values> {
            // SAFETY: the caller guarantees the features.
            unsafe { $unpack::<TY>(block) }
        }

        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY: the caller guarantees the features.
            unsafe { $zero() }
        }

        #[inline(always)]
        unsafe fn load(bytes: &[i8]) -> Self {
            debug_assert_eq!(bytes.len(), size_of::<Self>());
            // SAFETY: the caller guarantees the features and a vector's bytes.
            unsafe { $load(bytes.as_ptr().cast()) }
        }

        #[inline(always)]
        unsafe fn products(self, activations: Self) -> Self {
            // SAFETY: the caller guarantees the features.
            unsafe { $products(self, activations) }
        }

        #[inline(always)]
        unsafe fn add_scaled(self, pairs: Self, scales: Self) -> Self {
            // SAFETY: the caller guarantees the features.
            unsafe { $add(self, $pair_sums(pairs, scales)) }
        }
    };
}
pub(super) use one_intrinsic_operations;

/// AVX2's vectors: a super-block as eight vectors of 32 values.
impl SuperBlockVectors for __m256i {
    type Values = [__m256i; 8];

    /// `vpsignb` moves the values' signs onto the activations (and zeroes
    /// those of zero values) and gives the values' magnitudes.
    #[inline(always)]
    unsafe fn signed_products(self, activations: __m256i) -> __m256i {
        // SAFETY: the caller guarantees the features.
        unsafe {
            let signed_activations = _mm256_sign_epi8(activations, self);
            _mm256_maddubs_epi16(_mm256_sign_epi8(self, self), signed_activations)
        }
    }

    /// AVX2's eight lanes are the eight.
    #[inline(always)]
    unsafe fn eight_lanes(self) -> __m256i {
        self
    }

    one_intrinsic_operations! {
        unpack: unpack, zero: _mm256_setzero_si256, load: _mm256_loadu_si256,
        products: _mm256_maddubs_epi16, pair_sums: _mm256_madd_epi16, add: _mm256_add_epi32
    }
}

/// A super-block unpacked for the SIMD products: the common form of
/// `block_k::SuperBlock` in the vectors `V` of an instruction set.
pub(super) struct Unpacked<V> {
    /// The factor of the scaled sums.
    pub d: f32,
    /// The factor of the offsets.
    pub dmin: f32,
    /// The 256 values, in consecutive vectors ([`SuperBlockVectors::Values`]):
    /// values 32c..32c + 32 in vector `c` on AVX2.
    pub values: V,
    /// Whether values can be negative ([`SuperBlock::signed_values`]).
    pub signed: bool,
    /// The scales of the values' groups of 16, each repeated over the eight
    /// i16 pair sums of its 16 values, in the vectors of `values`.
    pub scales: V,
    /// The sixteen group offsets as i16.
    pub mins: __m256i,
}

/// For each of the `N` activation rows `xq[i]`, the K-quant row `row` (of
/// the type with id `TY`) · `xq[i]`, each super-block unpacked once for all
/// `N` (by `V`). Scaled sums and offsets go to separate accumulators,
/// subtracted at the end; the order of the f32 additions does not depend on
/// `N` or `V`, so a row's result is the same bits alone or in a batch, on
/// AVX2 or AVX-512.
///
/// # Safety
/// As [`SuperBlockVectors`]' methods.
#[inline(always)]
pub(super) unsafe fn dot_super_blocks<const N: usize, const TY: u32, V: SuperBlockVectors>(
    row: &[u8],
    xq: [&[Q8KBlock]; N],
) -> [f32; N] {
    let ty = const { type_of_id(TY) };
    let block_bytes = ty.block_bytes();
    debug_assert!(
        xq.iter().all(|x| x.len() * block_bytes == row.len()),
        "one input block per weight block"
    );
    // SAFETY: the caller guarantees the features; `bsums` is 16 i16,
    // exactly 32 bytes.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut acc_offsets = [_mm256_setzero_ps(); N];
        for (block_idx, block) in row.chunks_exact(block_bytes).enumerate() {
            let w = V::unpack::<TY>(block);
            for ((acc, acc_offsets), x) in acc.iter_mut().zip(&mut acc_offsets).zip(&xq) {
                let a = &x[block_idx];
                let sums = V::scaled_sums(&w, a);
                let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
                let offsets = _mm256_madd_epi16(w.mins, bsums);
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(a.d * w.d), _mm256_cvtepi32_ps(sums), *acc);
                *acc_offsets = _mm256_fmadd_ps(
                    _mm256_set1_ps(a.d * w.dmin),
                    _mm256_cvtepi32_ps(offsets),
                    *acc_offsets,
                );
            }
        }
        let mut out = [0.0; N];
        for ((o, &acc), &acc_offsets) in out.iter_mut().zip(&acc).zip(&acc_offsets) {
            *o = horizontal_sum(_mm256_sub_ps(acc, acc_offsets));
        }
        out
    }
}

/// One super-block of the type with id `TY` in the vector form (see
/// [`Unpacked`]), its factors decoded in vectors ([`factors`]). Generic over the type, so each copy holds one type's code and
/// is small enough to inline into every batch width's kernel (with `ty` an
/// argument, the one-input kernel called it out of line, at half speed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn unpack<const TY: u32>(block: &[u8]) -> Unpacked<[__m256i; 8]> {
    let ty = const { type_of_id(TY) };
    let VectorFactors {
        d,
        dmin,
        scales,
        mins,
    } = factors(ty, block);
    let load = |at: usize| {
        debug_assert!(at + 32 <= block.len());
        // SAFETY: every caller below reads 32 bytes inside the block.
        unsafe { _mm256_loadu_si256(block.as_ptr().add(at).cast()) }
    };
    let low4 = _mm256_set1_epi8(0x0F);
    let mut values = [_mm256_setzero_si256(); 8];
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let qs_at = if ty == GgmlType::Q5_K { 48 } else { 16 };
            for k in 0..4 {
                let packed = load(qs_at + 32 * k);
                values[2 * k] = _mm256_and_si256(packed, low4);
                values[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
            }
            if ty == GgmlType::Q5_K {
                let qh = load(16);
                for (c, v) in values.iter_mut().enumerate() {
                    *v = _mm256_or_si256(*v, bit_as(qh, c, 16));
                }
            }
        }
        GgmlType::Q6_K => {
            let mask_high = _mm256_set1_epi8(0x30);
            for half in 0..2 {
                let (a, b, h) = (load(64 * half), load(64 * half + 32), load(128 + 32 * half));
                let high = |shifted: __m256i| _mm256_and_si256(shifted, mask_high);
                values[4 * half] =
                    _mm256_or_si256(_mm256_and_si256(a, low4), high(_mm256_slli_epi16(h, 4)));
                values[4 * half + 1] =
                    _mm256_or_si256(_mm256_and_si256(b, low4), high(_mm256_slli_epi16(h, 2)));
                values[4 * half + 2] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), high(h));
                values[4 * half + 3] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(b, 4), low4),
                    high(_mm256_srli_epi16(h, 2)),
                );
            }
        }
        GgmlType::Q3_K | GgmlType::Q2_K => {
            let (qs_at, hmask) = if ty == GgmlType::Q3_K {
                (32, Some(load(0)))
            } else {
                (16, None)
            };
            let low2 = _mm256_set1_epi8(3);
            for half in 0..2 {
                let packed = load(qs_at + 32 * half);
                for shift in 0..4 {
                    let c = 4 * half + shift;
                    let count = _mm_cvtsi32_si128(2 * shift as i32);
                    let mut v = _mm256_and_si256(_mm256_srl_epi16(packed, count), low2);
                    if let Some(hmask) = hmask {
                        v = _mm256_or_si256(v, bit_as(hmask, c, 4));
                    }
                    values[c] = v;
                }
            }
        }
        GgmlType::IQ4_XS => {
            // SAFETY: `IQ4_NL_VALUES` is 16 bytes.
            let table = unsafe { _mm_loadu_si128(IQ4_NL_VALUES.as_ptr().cast()) };
            let table = _mm256_broadcastsi128_si256(table);
            for (g, v) in values.iter_mut().enumerate() {
                debug_assert!(8 + 16 * g + 16 <= block.len());
                // SAFETY: bytes 8 + 16g..8 + 16g + 16 are inside the 136-byte block.
                let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(8 + 16 * g).cast()) };
                *v = _mm256_shuffle_epi8(table, unpack_nibbles(packed));
            }
        }
        _ => unreachable!("{ty} is not a K-quant"),
    }
    Unpacked {
        d,
        dmin,
        values,
        signed: SuperBlock::signed_values(ty),
        scales,
        mins,
    }
}

/// The float factors, scale pairs and offsets of a super-block, in the
/// vector form of [`Unpacked`].
pub(super) struct VectorFactors {
    /// The factor of the scaled sums.
    pub d: f32,
    /// The factor of the offsets.
    pub dmin: f32,
    /// As [`Unpacked::scales`].
    pub scales: [__m256i; 8],
    /// As [`Unpacked::mins`].
    pub mins: __m256i,
}

/// The factors of one super-block of `ty`, decoded in vectors (a few word
/// operations and one byte shuffle per 32 values, where the scalar
/// `block_k::factors` spends a loop per group): the same integers in the
/// same lanes as the scalar decoding (test
/// `vector_factors_equal_scalar_factors`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn factors(ty: GgmlType, block: &[u8]) -> VectorFactors {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => factors_k4(block),
        GgmlType::Q6_K => factors_q6_k(block),
        GgmlType::Q3_K => factors_q3_k(block),
        GgmlType::Q2_K => factors_q2_k(block),
        GgmlType::IQ4_XS => factors_iq4_xs(block),
        _ => unreachable!("{ty} is not a K-quant"),
    }
}

/// Q4_K and Q5_K: `d` and `dmin` from one F16C conversion; the eight 6-bit
/// scales and eight 6-bit minimums of `scales_mins_k4` rearranged by word
/// operations into 16 bytes `[sc0..sc8, m0..m8]` ([`scale_bytes_k4`]), from
/// which each pair of groups (both of them group `c` of 32 in Q4_K's own
/// terms) takes its scale by a byte shuffle and the offsets their minimums,
/// each repeated for the two groups of 16 it covers ([`mins_k4`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn factors_k4(block: &[u8]) -> VectorFactors {
    let (d, dmin, bytes) = scale_bytes_k4(block);
    let both_lanes = _mm256_broadcastsi128_si256(bytes);
    let mut scales = [_mm256_setzero_si256(); 8];
    for (c, pair) in scales.iter_mut().enumerate() {
        // Each i16 takes byte c as its low byte and zero (index 0x80) above it.
        let pick = _mm256_set1_epi16((0x8000 | c as u16) as i16);
        *pair = _mm256_shuffle_epi8(both_lanes, pick);
    }
    VectorFactors {
        d,
        dmin,
        scales,
        mins: mins_k4(bytes),
    }
}

/// Q4_K and Q5_K's `d`, `dmin` and the 16 bytes `[sc0..sc8, m0..m8]` of
/// their packed 6-bit scales and minimums (see [`factors_k4`]), all from
/// one 16-byte load: `d` and `dmin` by one F16C conversion, the bytes by
/// word operations on the three words of packed scales side by side (one
/// vector operation for the four output words, where scalar code spends
/// three or four each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scale_bytes_k4(block: &[u8]) -> (f32, f32, __m128i) {
    // Bytes 0..16: d, dmin and the 12 scale bytes (a block is 144 bytes
    // for Q4_K, 176 for Q5_K); the slice is checked, so a short one panics
    // instead of reading past it.
    let head = &block[..16];
    // SAFETY: `head` is 16 bytes, the load's width (unaligned load).
    let head = unsafe { _mm_loadu_si128(head.as_ptr().cast()) };
    // The low two halves are d and dmin; the other two convert to values
    // nobody reads (F16C raises no exception on them).
    let factors = _mm_cvtph_ps(head);
    let (d, dmin) = (
        _mm_cvtss_f32(factors),
        _mm_cvtss_f32(_mm_movehdup_ps(factors)),
    );
    // Words 1, 2, 3 of `head` are `low`, `mid`, `high`: byte j of each is
    // packed byte j, j + 4 and j + 8. The four output words are
    //   scales 0..4 = low & LOW6,
    //   scales 4..8 = (high & LOW4) | ((low >> 6) & TOP2) << 4,
    //   mins 0..4   = mid & LOW6,
    //   mins 4..8   = ((high >> 4) & LOW4) | ((mid >> 6) & TOP2) << 4,
    // where ((x >> 6) & TOP2) << 4 = (x >> 2) & (TOP2 << 4).
    const LOW6: i32 = 0x3F3F_3F3F;
    const LOW4: i32 = 0x0F0F_0F0F;
    const TOP2_AT_4: i32 = 0x3030_3030;
    // [low, high, mid, high] and [low, low, mid, mid].
    let first = _mm_shuffle_epi32::<0b11_10_11_01>(head);
    let second = _mm_shuffle_epi32::<0b10_10_01_01>(head);
    let first = _mm_and_si128(
        _mm_srlv_epi32(first, _mm_setr_epi32(0, 0, 0, 4)),
        _mm_setr_epi32(LOW6, LOW4, LOW6, LOW4),
    );
    let second = _mm_and_si128(
        _mm_srli_epi32::<2>(second),
        _mm_setr_epi32(0, TOP2_AT_4, 0, TOP2_AT_4),
    );
    (d, dmin, _mm_or_si128(first, second))
}

/// The sixteen group offsets of Q4_K and Q5_K as i16: minimum `k` (byte
/// `8 + k` of `bytes`, see [`scale_bytes_k4`]) for groups `2k` and `2k + 1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mins_k4(bytes: __m128i) -> __m256i {
    let min_per_group = _mm_shuffle_epi8(
        bytes,
        _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15),
    );
    _mm256_cvtepu8_epi16(min_per_group)
}

/// Q6_K: the sixteen signed 8-bit group scales; the offsets are
/// `32 * scale`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn factors_q6_k(block: &[u8]) -> VectorFactors {
    let (d, packed) = scale_bytes_q6_k(block);
    scales_and_offsets::<5>(d, packed)
}

/// Q6_K's `d` and its sixteen signed 8-bit group scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scale_bytes_q6_k(block: &[u8]) -> (f32, __m128i) {
    debug_assert!(block.len() >= 210);
    // SAFETY: bytes 192..208 are inside the 210-byte block.
    let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(192).cast()) };
    let d = read_f16_f16c(u16::from_le_bytes([block[208], block[209]]));
    (d, packed)
}

/// Q3_K: the sixteen 6-bit scales (offset by 32) of its twelve scale bytes,
/// low four bits from the nibbles of bytes 0..8 (low nibbles for groups
/// 0..8, high ones for 8..16), high two bits from bytes 8..12 (group `j`
/// from byte `j % 4`, bits `2 (j / 4)`), put together by word operations;
/// the offsets are `4 * scale`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn factors_q3_k(block: &[u8]) -> VectorFactors {
    debug_assert!(block.len() >= 110);
    let low = u64::from_le_bytes(block[96..104].try_into().expect("8 bytes"));
    let high = u32::from_le_bytes(block[104..108].try_into().expect("4 bytes"));
    const LOW4: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    const TWO: u32 = 0x0303_0303;
    let nibbles = _mm_set_epi64x(((low >> 4) & LOW4) as i64, (low & LOW4) as i64);
    // Bytes 4k..4k + 4 take bits 2k..2k + 2 of each byte of `high`.
    let top_bits = _mm_setr_epi32(
        (high & TWO) as i32,
        ((high >> 2) & TWO) as i32,
        ((high >> 4) & TWO) as i32,
        ((high >> 6) & TWO) as i32,
    );
    let scales = _mm_sub_epi8(
        _mm_or_si128(nibbles, _mm_slli_epi16(top_bits, 4)),
        _mm_set1_epi8(32),
    );
    let d = read_f16_f16c(u16::from_le_bytes([block[108], block[109]]));
    scales_and_offsets::<2>(d, scales)
}

/// The factors of Q6_K and Q3_K: one factor `d` for the scaled sums and
/// the offsets, the sixteen signed group scales `scales`
/// ([`pairs_of_signed_bytes`]), and offsets `2^SHIFT` times them
/// ([`signed_offsets`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_and_offsets<const SHIFT: i32>(d: f32, scales: __m128i) -> VectorFactors {
    VectorFactors {
        d,
        dmin: d,
        scales: pairs_of_signed_bytes(scales),
        mins: signed_offsets::<SHIFT>(scales),
    }
}

/// Sixteen signed group scales times `2^SHIFT`, as i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn signed_offsets<const SHIFT: i32>(scales: __m128i) -> __m256i {
    _mm256_slli_epi16::<SHIFT>(_mm256_cvtepi8_epi16(scales))
}

/// Q2_K: sixteen bytes, each a group's scale (low nibble) and minimum
/// (high nibble); `d` and `dmin` from one F16C conversion.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn factors_q2_k(block: &[u8]) -> VectorFactors {
    debug_assert!(block.len() >= 84);
    // SAFETY: bytes 0..16 are inside the 84-byte block.
    let packed = unsafe { _mm_loadu_si128(block.as_ptr().cast()) };
    let low4 = _mm_set1_epi8(0x0F);
    let scales = _mm_and_si128(packed, low4);
    let mins = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
    let (d, dmin) = f16_pair(u32::from_le_bytes([
        block[80], block[81], block[82], block[83],
    ]));
    VectorFactors {
        d,
        dmin,
        scales: pairs_of_signed_bytes(scales),
        mins: _mm256_cvtepu8_epi16(mins),
    }
}

/// IQ4_XS: the eight 6-bit scales (offset by 32) of groups of 32, low four
/// bits from the nibbles of bytes 4..8 (scale `c` from nibble `c`), high two
/// bits from the u16 at byte 2 (bits `2c`, spread to one per byte by three
/// mask-and-shift steps); each scale serves both groups of 16 of its 32
/// values. No offsets.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn factors_iq4_xs(block: &[u8]) -> VectorFactors {
    debug_assert!(block.len() >= 8);
    let d = read_f16_f16c(u16::from_le_bytes([block[0], block[1]]));
    let packed = _mm_cvtsi32_si128(i32::from_le_bytes([block[4], block[5], block[6], block[7]]));
    let low4 = _mm_set1_epi8(0x0F);
    // Byte c: nibble c (the low nibble of byte c / 2 for even c, else its high one).
    let nibbles = _mm_unpacklo_epi8(
        _mm_and_si128(packed, low4),
        _mm_and_si128(_mm_srli_epi16(packed, 4), low4),
    );
    // Two-bit field c of `high` to byte c: bytes to 32-bit halves, nibbles
    // to 16-bit quarters, fields to bytes.
    let mut top = u64::from(u16::from_le_bytes([block[2], block[3]]));
    top = (top | top << 24) & 0x0000_00FF_0000_00FF;
    top = (top | top << 12) & 0x000F_000F_000F_000F;
    top = (top | top << 6) & 0x0303_0303_0303_0303;
    let scales = _mm_sub_epi8(
        _mm_or_si128(nibbles, _mm_cvtsi64_si128((top << 4) as i64)),
        _mm_set1_epi8(32),
    );
    VectorFactors {
        d,
        dmin: 0.0,
        // Bytes 2c and 2c + 1 (groups 2c and 2c + 1 of 16) both scale c.
        scales: pairs_of_signed_bytes(_mm_unpacklo_epi8(scales, scales)),
        mins: _mm256_setzero_si256(),
    }
}

/// Sixteen signed bytes, one per group of 16, as the eight scale pairs of
/// [`VectorFactors::scales`]: pair `c` takes byte `2c` (low lane) and
/// `2c + 1` (high lane) by a byte shuffle that doubles the byte, then an
/// arithmetic shift that sign-extends it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pairs_of_signed_bytes(bytes: __m128i) -> [__m256i; 8] {
    let both_lanes = _mm256_broadcastsi128_si256(bytes);
    let mut scales = [_mm256_setzero_si256(); 8];
    for (c, pair) in scales.iter_mut().enumerate() {
        let (even, odd) = ((2 * c) as u16, (2 * c + 1) as u16);
        let pick = _mm256_set_m128i(
            _mm_set1_epi16((odd | odd << 8) as i16),
            _mm_set1_epi16((even | even << 8) as i16),
        );
        *pair = _mm256_srai_epi16(_mm256_shuffle_epi8(both_lanes, pick), 8);
    }
    scales
}

/// Two little-endian f16 (the low and high half of `bits`) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_pair(bits: u32) -> (f32, f32) {
    let both = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(both), _mm_cvtss_f32(_mm_movehdup_ps(both)))
}

/// One f16 (its bits) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn read_f16_f16c(bits: u16) -> f32 {
    f16_pair(u32::from(bits)).0
}

/// `value` in every byte of `bytes` whose bit `bit` is set, 0 elsewhere.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit_as(bytes: __m256i, bit: usize, value: u8) -> __m256i {
    let mask = _mm256_set1_epi8((1u8 << bit) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(value as i8))
}

const _: () = assert!(QK_K == 8 * 32, "eight vectors of 32 values per super-block");

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::kernels::dot::avx2::tests::assert_avx2_runs;
    use crate::quant::block_k::{self, N_GROUPS};

    /// The vector decoding of the factors gives, lane for lane, what the
    /// scalar `block_k::factors` gives, for random blocks (every bit pattern
    /// of the scale bytes occurs; the f16 fields are kept finite).
    #[test]
    fn vector_factors_equal_scalar_factors() {
        assert_avx2_runs();
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
            GgmlType::Q2_K,
            GgmlType::IQ4_XS,
        ] {
            let f16_at: &[usize] = match ty {
                GgmlType::Q6_K => &[208],
                GgmlType::Q3_K => &[108],
                GgmlType::Q2_K => &[80, 82],
                GgmlType::IQ4_XS => &[0],
                _ => &[0, 2],
            };
            for _ in 0..500 {
                let mut block: Vec<u8> = (0..ty.block_bytes()).map(|_| rng.random()).collect();
                for &at in f16_at {
                    let value = half::f16::from_f32(rng.random_range(-1.0..1.0));
                    block[at..at + 2].copy_from_slice(&value.to_le_bytes());
                }
                let (d, dmin, scales, mins) = block_k::factors(ty, &block);
                // SAFETY: the CPU has avx2, fma and f16c (asserted above).
                let expected = unsafe { (scale_pairs(&scales), i16s(&mins)) };
                let actual = unsafe { factors(ty, &block) };
                assert_eq!((actual.d, actual.dmin), (d, dmin), "{ty}");
                for c in 0..8 {
                    assert_eq!(
                        lanes(actual.scales[c]),
                        lanes(expected.0[c]),
                        "{ty} scales of values {}..{}",
                        32 * c,
                        32 * c + 32
                    );
                }
                assert_eq!(lanes(actual.mins), lanes(expected.1), "{ty} offsets");
            }
        }
    }

    /// For each 32 values, the scales of its two groups, each over eight i16 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scale_pairs(scales: &[i16; N_GROUPS]) -> [__m256i; 8] {
        let mut pairs = [_mm256_setzero_si256(); 8];
        for (pair, s) in pairs.iter_mut().zip(scales.chunks_exact(2)) {
            *pair = _mm256_set_m128i(_mm_set1_epi16(s[1]), _mm_set1_epi16(s[0]));
        }
        pairs
    }

    /// Sixteen i16 as one vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn i16s(v: &[i16; N_GROUPS]) -> __m256i {
        // SAFETY: 16 i16 are exactly 32 bytes.
        unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
    }

    fn lanes(v: __m256i) -> [i16; 16] {
        // SAFETY: both are 32 bytes of plain integers.
        unsafe { std::mem::transmute(v) }
    }
}
