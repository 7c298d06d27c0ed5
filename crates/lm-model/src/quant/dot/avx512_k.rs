//! AVX-512 (F/BW/VL) dot products of K-quant rows with [`Q8KBlock`]
//! activations (x86_64, selected at run time).
//!
//! Each super-block is unpacked once (for up to [`BATCH`] inputs) by the
//! AVX2 kernel's unpacking (`avx2_k::unpack`: eight vectors of 32 values and
//! their group scales), whose vectors are paired into four 512-bit ones:
//! values `64k..64k + 64` with the scales of their four groups. Per 64
//! values, `vpmaddubsw` and `vpmaddwd` (on 512-bit vectors) give sixteen i32
//! lanes; the two halves are added once per super-block, which gives the
//! AVX2 kernel's eight lane sums exactly (integer additions in another
//! order), and from there the f32 arithmetic is the AVX2 kernel's: every
//! result has its bits.
//!
//! Every function requires avx2, fma, f16c, avx512f, avx512bw, avx512vl and
//! avx512vnni, which callers check through [`super::Dispatch`].

use std::arch::x86_64::{
    __m256i, __m512i, _mm256_add_epi32, _mm256_cvtepi32_ps, _mm256_fmadd_ps, _mm256_loadu_si256,
    _mm256_madd_epi16, _mm256_set1_ps, _mm256_setzero_ps, _mm256_sub_ps, _mm512_abs_epi8,
    _mm512_add_epi32, _mm512_castsi256_si512, _mm512_castsi512_si256, _mm512_extracti64x4_epi64,
    _mm512_inserti64x4, _mm512_loadu_si512, _mm512_madd_epi16, _mm512_maddubs_epi16,
    _mm512_mask_sub_epi8, _mm512_movepi8_mask, _mm512_setzero_si512,
};

use super::super::GgmlType;
use super::super::activation::Q8KBlock;
use super::BATCH;
use super::avx2::{BlockKernel, each_row_and_input, horizontal_sum};
use super::avx2_k::{super_block_type, unpack};

/// `out[r * n + i] = row r · input i` over the rows of `rows` (each
/// `row_bytes` long) for a K-quant `ty`, input `i` being
/// `xq[i * n_blocks..][..n_blocks]`, each super-block unpacked once for up
/// to [`BATCH`] inputs.
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and
/// avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_rows(
    ty: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    xq: &[Q8KBlock],
    n_blocks: usize,
    n: usize,
    out: &mut [f32],
) {
    macro_rules! each_row_of {
        ($ty:ident) => {
            each_row_and_input(
                rows,
                row_bytes,
                xq,
                n_blocks,
                n,
                out,
                SuperBlockKernel::<{ GgmlType::$ty as u32 }>,
            )
        };
    }
    match ty {
        GgmlType::Q2_K => each_row_of!(Q2_K),
        GgmlType::Q3_K => each_row_of!(Q3_K),
        GgmlType::Q4_K => each_row_of!(Q4_K),
        GgmlType::Q5_K => each_row_of!(Q5_K),
        GgmlType::Q6_K => each_row_of!(Q6_K),
        GgmlType::IQ4_XS => each_row_of!(IQ4_XS),
        _ => unreachable!("{ty} does not multiply Q8_K blocks"),
    }
}

/// One K-quant row · its quantized activations.
///
/// # Safety
/// As [`dot_rows`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_row(ty: GgmlType, row: &[u8], xq: &[Q8KBlock]) -> f32 {
    let [result] = match ty {
        GgmlType::Q2_K => dot_super_blocks::<1, { GgmlType::Q2_K as u32 }>(row, [xq]),
        GgmlType::Q3_K => dot_super_blocks::<1, { GgmlType::Q3_K as u32 }>(row, [xq]),
        GgmlType::Q4_K => dot_super_blocks::<1, { GgmlType::Q4_K as u32 }>(row, [xq]),
        GgmlType::Q5_K => dot_super_blocks::<1, { GgmlType::Q5_K as u32 }>(row, [xq]),
        GgmlType::Q6_K => dot_super_blocks::<1, { GgmlType::Q6_K as u32 }>(row, [xq]),
        GgmlType::IQ4_XS => dot_super_blocks::<1, { GgmlType::IQ4_XS as u32 }>(row, [xq]),
        _ => unreachable!("{ty} does not multiply Q8_K blocks"),
    };
    result
}

/// The kernel of the super-block type with id `TY` for [`each_row_and_input`].
struct SuperBlockKernel<const TY: u32>;

impl<const TY: u32> BlockKernel<Q8KBlock> for SuperBlockKernel<TY> {
    #[inline(always)]
    fn batch(&self, row: &[u8], xq: [&[Q8KBlock]; BATCH]) -> [f32; BATCH] {
        // SAFETY: only called from `dot_rows`, which requires the features
        // `dot_super_blocks` needs.
        unsafe { dot_super_blocks::<BATCH, TY>(row, xq) }
    }

    #[inline(always)]
    fn single(&self, row: &[u8], xq: &[Q8KBlock]) -> f32 {
        // SAFETY: as above.
        let [result] = unsafe { dot_super_blocks::<1, TY>(row, [xq]) };
        result
    }
}

/// For each of the `N` activation rows `xq[i]`, the K-quant row `row` (of
/// the type with id `TY`) · `xq[i]`, each super-block unpacked once for all
/// `N`, with the AVX2 kernel's f32 arithmetic (see the module docs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot_super_blocks<const N: usize, const TY: u32>(row: &[u8], xq: [&[Q8KBlock]; N]) -> [f32; N] {
    let ty = const { super_block_type(TY) };
    let block_bytes = ty.block_bytes();
    debug_assert!(
        xq.iter().all(|x| x.len() * block_bytes == row.len()),
        "one input block per weight block"
    );
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_offsets = [_mm256_setzero_ps(); N];
    for (block_idx, block) in row.chunks_exact(block_bytes).enumerate() {
        let w = unpack(ty, block);
        let (values, scales) = (pairs(&w.values), pairs(&w.scales));
        for ((acc, acc_offsets), x) in acc.iter_mut().zip(&mut acc_offsets).zip(&xq) {
            let a = &x[block_idx];
            let mut sums = _mm512_setzero_si512();
            for (k, (&values, &scales)) in values.iter().zip(&scales).enumerate() {
                // SAFETY: `qs` holds 256 bytes, so bytes 64k..64k + 64 are in bounds.
                let activations = unsafe { _mm512_loadu_si512(a.qs.as_ptr().add(64 * k).cast()) };
                let pairs = if w.signed {
                    // |values| times the activations with the values' signs.
                    let negative = _mm512_movepi8_mask(values);
                    let signed_activations = _mm512_mask_sub_epi8(
                        activations,
                        negative,
                        _mm512_setzero_si512(),
                        activations,
                    );
                    _mm512_maddubs_epi16(_mm512_abs_epi8(values), signed_activations)
                } else {
                    _mm512_maddubs_epi16(values, activations)
                };
                sums = _mm512_add_epi32(sums, _mm512_madd_epi16(pairs, scales));
            }
            let sums = _mm256_add_epi32(
                _mm512_castsi512_si256(sums),
                _mm512_extracti64x4_epi64::<1>(sums),
            );
            // SAFETY: `bsums` is 16 i16, exactly 32 bytes.
            let bsums = unsafe { _mm256_loadu_si256(a.bsums.as_ptr().cast()) };
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

/// Eight 256-bit vectors as four 512-bit ones: vector `2k` in the low half
/// of `k`, vector `2k + 1` in its high half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pairs(v: &[__m256i; 8]) -> [__m512i; 4] {
    std::array::from_fn(|k| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v[2 * k]), v[2 * k + 1]))
}
