//! AVX-512 (F/BW/VL) dot products of K-quant rows with [`Q8KBlock`]
//! activations (x86_64, selected at run time).
//!
//! Each super-block is unpacked once (for a group of inputs:
//! `frame::each_row_and_input`) by the AVX2 kernel's unpacking
//! (`avx2_k::unpack`: eight vectors of 32 values and their group scales),
//! whose vectors are paired into four 512-bit ones: values `64k..64k + 64`
//! with the scales of their four groups (Q4_K, Q5_K and Q6_K's values
//! straight into them). Per 64 values, `vpmaddubsw` and `vpmaddwd` (on
//! 512-bit vectors) give sixteen i32 lanes, in the loop the AVX2 kernel
//! runs on its vectors (`avx2_k::SuperBlockVectors::scaled_sums`; this
//! file supplies the operations); the two halves are added once per
//! super-block, which gives the
//! AVX2 kernel's eight lane sums exactly (integer additions in another
//! order), and from there the f32 arithmetic is the AVX2 kernel's, the same
//! function (`avx2_k::dot_super_blocks`): every result has its bits.
//!
//! Every function requires avx2, fma, f16c, avx512f, avx512bw, avx512vl and
//! avx512vnni, which callers check through a `Dispatch`.

use std::arch::x86_64::{
    __m128i, __m256i, __m512i, _mm256_add_epi32, _mm256_loadu_si256, _mm256_set1_epi8,
    _mm512_abs_epi8, _mm512_add_epi32, _mm512_and_si512, _mm512_broadcast_i32x4,
    _mm512_broadcast_i64x4, _mm512_castsi256_si512, _mm512_castsi512_si256,
    _mm512_extracti64x4_epi64, _mm512_inserti64x4, _mm512_loadu_si512, _mm512_madd_epi16,
    _mm512_maddubs_epi16, _mm512_mask_add_epi8, _mm512_mask_slli_epi16, _mm512_mask_srli_epi16,
    _mm512_mask_sub_epi8, _mm512_movepi8_mask, _mm512_or_si512, _mm512_set1_epi8,
    _mm512_setzero_si512, _mm512_shuffle_epi8, _mm512_slli_epi16, _mm512_srai_epi16,
    _mm512_srli_epi16, _mm512_test_epi8_mask,
};

use super::avx2_k::{
    SuperBlockVectors, Unpacked, dot_super_blocks, mins_k4, one_intrinsic_operations,
    scale_bytes_k4, scale_bytes_q6_k, signed_offsets, super_block_kernel, unpack,
};
use super::frame::{
    Batch, BlockKernel, Group, each_row_and_input, type_of_id, with_super_block_type,
};
use crate::quant::GgmlType;
use crate::quant::activation::Q8KBlock;

super_block_kernel!(
    __m512i,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);

/// AVX-512's vectors: a super-block as four vectors of 64 values (see the
/// module docs).
impl SuperBlockVectors for __m512i {
    type Values = [__m512i; 4];

    /// AVX-512 has no `vpsignb`: the activations of negative values are
    /// negated under a mask (those of zero values need not be zeroed: their
    /// magnitude 0 does it), and `vpabsb` gives the magnitudes.
    #[inline(always)]
    unsafe fn signed_products(self, activations: __m512i) -> __m512i {
        // SAFETY: the caller guarantees the features.
        unsafe {
            let negative = _mm512_movepi8_mask(self);
            let zero = _mm512_setzero_si512();
            let signed_activations = _mm512_mask_sub_epi8(activations, negative, zero, activations);
            _mm512_maddubs_epi16(_mm512_abs_epi8(self), signed_activations)
        }
    }

    /// Lanes `i` and `i + 8` added: AVX2's lane `i` exactly.
    #[inline(always)]
    unsafe fn eight_lanes(self) -> __m256i {
        // SAFETY: the caller guarantees the features.
        unsafe {
            _mm256_add_epi32(
                _mm512_castsi512_si256(self),
                _mm512_extracti64x4_epi64::<1>(self),
            )
        }
    }

    one_intrinsic_operations! {
        unpack: unpack_pairs, zero: _mm512_setzero_si512, load: _mm512_loadu_si512,
        products: _mm512_maddubs_epi16, pair_sums: _mm512_madd_epi16, add: _mm512_add_epi32
    }
}

/// One super-block of the type with id `TY` unpacked in pairs: Q4_K, Q5_K and Q6_K's values
/// straight into 512-bit vectors (one 64-byte or broadcast 32-byte load and
/// a few shifts and masks per 64 values), the other types by the AVX2
/// unpacking, paired. Their scales too: from the AVX2 kernel's scale bytes
/// straight into 512-bit vectors ([`picked_scales`]), the others' paired.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn unpack_pairs<const TY: u32>(block: &[u8]) -> Unpacked<[__m512i; 4]> {
    let ty = const { type_of_id(TY) };
    let values = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => values_k4(ty, block),
        GgmlType::Q6_K => values_q6_k(block),
        _ => {
            let w = unpack::<TY>(block);
            return Unpacked {
                d: w.d,
                dmin: w.dmin,
                values: pairs(&w.values),
                signed: w.signed,
                scales: pairs(&w.scales),
                mins: w.mins,
            };
        }
    };
    let (d, dmin, scales, mins) = if ty == GgmlType::Q6_K {
        let (d, bytes) = scale_bytes_q6_k(block);
        (
            d,
            d,
            picked_scales::<true>(bytes),
            signed_offsets::<5>(bytes),
        )
    } else {
        let (d, dmin, bytes) = scale_bytes_k4(block);
        (d, dmin, picked_scales::<false>(bytes), mins_k4(bytes))
    };
    Unpacked {
        d,
        dmin,
        values,
        signed: false,
        scales,
        mins,
    }
}

/// The i16 scales of a super-block's four vectors of 64 values, each
/// 128-bit lane (16 values) the scale of its group, picked from the 16
/// scale bytes `bytes` by one byte shuffle per vector: Q6_K's signed
/// scales, one per group of 16 (`SIGNED`: the byte doubled into the word,
/// then shifted down arithmetically), or Q4_K and Q5_K's unsigned ones, one
/// per group of 32 (bytes 0..8 of [`scale_bytes_k4`], zero above them).
/// The same integers in the same lanes as the AVX2 decoding paired
/// (test `picked_scales_equal_paired_factors`), with a quarter of its
/// shuffles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn picked_scales<const SIGNED: bool>(bytes: __m128i) -> [__m512i; 4] {
    let all_lanes = _mm512_broadcast_i32x4(bytes);
    std::array::from_fn(|k| {
        let picks = if SIGNED { &Q6_K_PICKS[k] } else { &K4_PICKS[k] };
        // SAFETY: a pick row is 32 u16, exactly 64 bytes.
        let pick = unsafe { _mm512_loadu_si512(picks.as_ptr().cast()) };
        let picked = _mm512_shuffle_epi8(all_lanes, pick);
        if SIGNED {
            _mm512_srai_epi16::<8>(picked)
        } else {
            picked
        }
    })
}

/// Per vector `k` of 64 values, the byte shuffle that puts group `4k + j`'s
/// signed scale byte (byte `4k + j`) in both bytes of every word of lane `j`.
static Q6_K_PICKS: [[u16; 32]; 4] = picks(true);

/// Per vector `k` of 64 values, the byte shuffle that puts scale byte
/// `2k + h` (the group of 32 of half `h`) in the low byte of every word of
/// half `h`, zero (index 0x80) above it.
static K4_PICKS: [[u16; 32]; 4] = picks(false);

/// The shuffles of [`Q6_K_PICKS`] (`signed`) or [`K4_PICKS`]: word `w` of
/// vector `k`.
const fn picks(signed: bool) -> [[u16; 32]; 4] {
    let mut picks = [[0; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut w = 0;
        while w < 32 {
            picks[k][w] = if signed {
                let byte = (4 * k + w / 8) as u16;
                byte | byte << 8
            } else {
                0x8000 | (2 * k + w / 16) as u16
            };
            w += 1;
        }
        k += 1;
    }
    picks
}

/// Q4_K and Q5_K values (see `block_k`'s diagram): the 32 packed bytes `k`
/// hold values `64k..64k + 32` in their low nibbles and `64k + 32..64k + 64`
/// in their high ones, so pair `k` is those bytes in both halves, the high
/// half shifted down by 4; Q5_K adds 16 where bit `2k` (low half) or
/// `2k + 1` (high half) of the `qh` byte of the same position is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn values_k4(ty: GgmlType, block: &[u8]) -> [__m512i; 4] {
    let qs_at = if ty == GgmlType::Q5_K { 48 } else { 16 };
    debug_assert!(qs_at + 128 <= block.len());
    let low4 = _mm512_set1_epi8(0x0F);
    // SAFETY: bytes 16..48 (qh) and qs_at..qs_at + 128 are inside the block.
    let load_twice = |at: usize| unsafe {
        _mm512_broadcast_i64x4(_mm256_loadu_si256(block.as_ptr().add(at).cast()))
    };
    let qh = (ty == GgmlType::Q5_K).then(|| load_twice(16));
    std::array::from_fn(|k| {
        let packed = load_twice(qs_at + 32 * k);
        let shifted = _mm512_mask_srli_epi16::<4>(packed, 0xFFFF_0000, packed);
        let values = _mm512_and_si512(shifted, low4);
        match qh {
            Some(qh) => {
                // Bit 2k in the low half, bit 2k + 1 in the high half.
                let bits = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_set1_epi8((1u8 << (2 * k)) as i8)),
                    _mm256_set1_epi8((1u8 << (2 * k + 1)) as i8),
                );
                let set = _mm512_test_epi8_mask(qh, bits);
                _mm512_mask_add_epi8(values, set, values, _mm512_set1_epi8(16))
            }
            None => values,
        }
    })
}

/// Q6_K values (see `block_k`'s diagram): in half `h`, the 64 bytes of
/// `ql[64h..]` give values `128h..128h + 64` by their low nibbles (pair
/// `2h`) and `128h + 64..128h + 128` by their high ones (pair `2h + 1`), and
/// the 32 bytes `H = qh[32h..]` their two high bits: `H`, `H >> 2`, `H >> 4`
/// and `H >> 6` for the four runs of 32, placed at bits 4 and 5.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn values_q6_k(block: &[u8]) -> [__m512i; 4] {
    debug_assert!(block.len() >= 192);
    let low4 = _mm512_set1_epi8(0x0F);
    let high2 = _mm512_set1_epi8(0x30);
    let mut values = [_mm512_setzero_si512(); 4];
    for half in 0..2 {
        // SAFETY: bytes 64h..64h + 64 (ql) and 128 + 32h..160 + 32h (qh) are
        // inside the 210-byte block.
        let (ql, qh) = unsafe {
            (
                _mm512_loadu_si512(block.as_ptr().add(64 * half).cast()),
                _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    block.as_ptr().add(128 + 32 * half).cast(),
                )),
            )
        };
        // Runs 0 and 1 take H << 4 and H << 2; runs 2 and 3 take H and H >> 2.
        let low_runs = _mm512_mask_slli_epi16::<2>(_mm512_slli_epi16::<4>(qh), 0xFFFF_0000, qh);
        let high_runs = _mm512_mask_srli_epi16::<2>(qh, 0xFFFF_0000, qh);
        values[2 * half] = _mm512_or_si512(
            _mm512_and_si512(ql, low4),
            _mm512_and_si512(low_runs, high2),
        );
        values[2 * half + 1] = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
            _mm512_and_si512(high_runs, high2),
        );
    }
    values
}

/// Eight 256-bit vectors as four 512-bit ones: vector `2k` in the low half
/// of `k`, vector `2k + 1` in its high half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pairs(v: &[__m256i; 8]) -> [__m512i; 4] {
    std::array::from_fn(|k| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v[2 * k]), v[2 * k + 1]))
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::kernels::dispatch::Kernel;
    use crate::kernels::dot::avx2_k::factors;

    /// The scales and offsets `unpack_pairs` decodes straight into 512-bit
    /// vectors for Q4_K, Q5_K and Q6_K are, lane for lane, the AVX2
    /// decoding's (itself checked against the scalar `block_k::factors`)
    /// paired into 512-bit vectors, for random blocks (every bit pattern of
    /// the scale bytes occurs).
    #[test]
    fn picked_scales_equal_paired_factors() {
        assert!(
            Kernel::Avx512.is_available(),
            "this test runs where the AVX-512 kernel does (avx512f/bw/vl/vnni)"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(512);
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            for _ in 0..500 {
                let block: Vec<u8> = (0..ty.block_bytes()).map(|_| rng.random()).collect();
                // SAFETY: the CPU runs the AVX-512 kernel (asserted above),
                // whose features include AVX2's.
                let (expected, actual) = unsafe {
                    let f = factors(ty, &block);
                    let unpacked = match ty {
                        GgmlType::Q4_K => unpack_pairs::<{ GgmlType::Q4_K as u32 }>(&block),
                        GgmlType::Q5_K => unpack_pairs::<{ GgmlType::Q5_K as u32 }>(&block),
                        _ => unpack_pairs::<{ GgmlType::Q6_K as u32 }>(&block),
                    };
                    ((f.d, f.dmin, pairs(&f.scales), f.mins), unpacked)
                };
                let bits = |x: f32| x.to_bits();
                assert_eq!(
                    (bits(actual.d), bits(actual.dmin)),
                    (bits(expected.0), bits(expected.1)),
                    "{ty}"
                );
                for k in 0..4 {
                    assert_eq!(
                        words(actual.scales[k]),
                        words(expected.2[k]),
                        "{ty} scales of values {}..{}",
                        64 * k,
                        64 * k + 64
                    );
                }
                assert_eq!(lanes(actual.mins), lanes(expected.3), "{ty} offsets");
            }
        }
    }

    fn words(v: __m512i) -> [i16; 32] {
        // SAFETY: both are 64 bytes of plain integers.
        unsafe { std::mem::transmute(v) }
    }

    fn lanes(v: __m256i) -> [i16; 16] {
        // SAFETY: both are 32 bytes of plain integers.
        unsafe { std::mem::transmute(v) }
    }
}
