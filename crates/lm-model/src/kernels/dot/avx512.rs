//! AVX-512 (F/BW/VL) + AVX512-VNNI dot products of the 32-weight types with
//! [`Q8Block`] activations (x86_64, selected at run time).
//!
//! Two blocks share one 512-bit vector: block `2p` in the low 256 bits,
//! block `2p + 1` in the high ones, weights and activations alike. Every
//! type is unpacked to unsigned bytes `u = q + OFFSET` (nibbles for Q4_0 and
//! Q4_1, with the fifth bit added by a byte mask for Q5_0 and Q5_1, IQ4_NL's
//! table shifted by 128, Q8_0's bytes with the sign bit flipped), and
//! `vpdpbusd` sums four `u · q_x` products into each i32 lane; for a type with
//! an offset it starts from `-OFFSET · Σ q_x` over the four lanes' bytes
//! (a `vpdpbusd` of `OFFSET` with the same activations, negated, once per
//! input for every row). Each lane then holds the same integer as in the
//! AVX2 kernel (four adjacent products), the low half accumulates the even
//! blocks and the high half the odd ones as the AVX2 kernel's two
//! accumulators do, and the scales and the `m_w sum_x` terms are the same
//! f32 products added in the same order: every result has the bits of the
//! AVX2 kernel's.
//!
//! A batch's rows are taken two at a time ([`BlockKernel::dot_group_two_rows`]):
//! each input's blocks and offset sums are loaded once for both rows, in
//! the registers AVX-512 has beyond AVX2's sixteen (Q5_0 products of 128
//! inputs 18% faster, see docs/performance-log.md).
//!
//! Every function requires avx2, fma, f16c, avx512f, avx512bw, avx512vl and
//! avx512vnni, which callers check through a `Dispatch`.

use std::arch::x86_64::{
    __m128, __m512, __m512i, _mm_add_ps, _mm_blend_ps, _mm_castpd_ps, _mm_cvtph_ps,
    _mm_cvtsi64_si128, _mm_load_sd, _mm_loadh_pd, _mm_loadu_si128, _mm_mul_ps, _mm_setzero_ps,
    _mm256_add_ps, _mm256_castpd_ps, _mm256_loadu_si256, _mm512_and_si512, _mm512_broadcast_i32x4,
    _mm512_castps_pd, _mm512_castps128_ps512, _mm512_castps512_ps256, _mm512_castsi256_si512,
    _mm512_cvtepi32_ps, _mm512_dpbusd_epi32, _mm512_extractf64x4_pd, _mm512_inserti64x4,
    _mm512_mask_add_epi8, _mm512_mask_broadcast_i32x4, _mm512_mask_srli_epi16,
    _mm512_mask3_fmadd_ps, _mm512_permutexvar_ps, _mm512_set_epi64, _mm512_set1_epi8,
    _mm512_setzero_ps, _mm512_setzero_si512, _mm512_shuffle_epi8, _mm512_sub_epi32,
    _mm512_xor_si512,
};

use super::avx2::horizontal_sum;
use super::frame::{
    Batch, BlockKernel, Group, Shared, dot_group_of_widths, each_row_and_input, type_of_id,
    with_block_type,
};
use crate::quant::GgmlType;
use crate::quant::activation::Q8Block;
use crate::quant::block::IQ4_NL_VALUES;

/// `out[r * n + i] = row r · input i` over the rows of `batch` for a
/// 32-weight `ty`, input `i` being `xq[i * n_blocks..][..n_blocks]`, each
/// pair of weight blocks unpacked once for a group of up to four inputs and
/// rows taken two at a time ([`each_row_and_input`]). One input (a decode
/// step) takes the rows one at a time: several rows per activation load,
/// the transposed tiling, made one-thread decode much slower on SmolLM2
/// (the rows' interleaved streams defeat the hardware prefetch).
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and
/// avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_rows(ty: GgmlType, batch: Batch<'_>, xq: &[Q8Block], out: &mut [f32]) {
    // SAFETY: the kernel needs this function's features.
    with_block_type!(ty, |TY| unsafe {
        each_row_and_input(batch, xq, out, BlockPairKernel::<TY>)
    })
}

/// The kernel of the 32-weight type with id `TY` for [`each_row_and_input`].
struct BlockPairKernel<const TY: u32>;

impl<const TY: u32> BlockKernel<Q8Block> for BlockPairKernel<TY> {
    #[inline(always)]
    unsafe fn dot<const N: usize>(&self, row: &[u8], group: Group<'_, Q8Block, N>) -> [f32; N] {
        // SAFETY: the caller guarantees the features `dot` needs.
        let [results] = unsafe { dot::<1, N, TY>([row], group.inputs) };
        results
    }

    /// Both rows in one pass: each input's blocks (and their offset sums)
    /// are loaded once for the two, in the registers AVX-512 has to spare.
    #[inline(always)]
    unsafe fn dot_group_two_rows(
        &self,
        rows: [&[u8]; 2],
        xq: &[&[Q8Block]],
        _: &[Shared],
        [out0, out1]: [&mut [f32]; 2],
    ) {
        // SAFETY: as above.
        dot_group_of_widths!(xq, |x: N| {
            let [results0, results1] = unsafe { dot::<2, _, TY>(rows, x) };
            out0.copy_from_slice(&results0);
            out1.copy_from_slice(&results1);
        }; 1 2 3 4)
    }

    #[inline(always)]
    unsafe fn dot_one(&self, row: &[u8], xq: &[Q8Block]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_one::<TY>(row, xq) }
    }
}

/// One row of the type with id `TY` · one input, out of line: inlined into
/// `dot_rows`'s loop, the one-input product ran at half speed.
///
/// # Safety
/// As [`dot_rows`].
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_one<const TY: u32>(row: &[u8], xq: &[Q8Block]) -> f32 {
    let [[result]] = dot::<1, 1, TY>([row], [xq]);
    result
}

/// `R` rows (of the type with id `TY`) · `N` rows of quantized activations:
/// each type's unpacking of two blocks into unsigned bytes, and its offset.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot<const R: usize, const N: usize, const TY: u32>(
    rows: [&[u8]; R],
    xq: [&[Q8Block]; N],
) -> [[f32; N]; R] {
    match const { type_of_id(TY) } {
        // q = nibble - 8.
        GgmlType::Q4_0 => dot_block_pairs::<18, R, N, false, 8>(rows, xq, |w| nibbles(w, 2, 18)),
        // q = nibble (the minimum is a separate term).
        GgmlType::Q4_1 => dot_block_pairs::<20, R, N, true, 0>(rows, xq, |w| nibbles(w, 4, 20)),
        // q = nibble + 16 * fifth bit - 16.
        GgmlType::Q5_0 => dot_block_pairs::<22, R, N, false, 16>(rows, xq, |w| {
            add_fifth_bits(nibbles(w, 6, 22), w, 2, 22)
        }),
        // q = nibble + 16 * fifth bit.
        GgmlType::Q5_1 => dot_block_pairs::<24, R, N, true, 0>(rows, xq, |w| {
            add_fifth_bits(nibbles(w, 8, 24), w, 4, 24)
        }),
        // q = byte as i8 = (byte ^ 0x80) - 128.
        GgmlType::Q8_0 => dot_block_pairs::<34, R, N, false, 128>(rows, xq, |w| {
            // SAFETY: `w` is two 34-byte blocks: bytes 2..34 and 36..68.
            let both = unsafe {
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(w.as_ptr().add(2).cast())),
                    _mm256_loadu_si256(w.as_ptr().add(36).cast()),
                )
            };
            _mm512_xor_si512(both, _mm512_set1_epi8(0x80u8 as i8))
        }),
        // q = IQ4_NL_VALUES[code] = (IQ4_NL_VALUES[code] + 128) - 128.
        GgmlType::IQ4_NL => {
            // SAFETY: the table is exactly 16 bytes.
            let table = unsafe { _mm_loadu_si128(IQ4_NL_SHIFTED.as_ptr().cast()) };
            let table = _mm512_broadcast_i32x4(table);
            dot_block_pairs::<18, R, N, false, 128>(rows, xq, |w| {
                _mm512_shuffle_epi8(table, nibbles(w, 2, 18))
            })
        }
        _ => unreachable!("a 32-weight block type"),
    }
}

/// IQ4_NL's levels plus 128, as unsigned bytes.
const IQ4_NL_SHIFTED: [u8; 16] = {
    let mut shifted = [0u8; 16];
    let mut k = 0;
    while k < 16 {
        shifted[k] = (IQ4_NL_VALUES[k] as i16 + 128) as u8;
        k += 1;
    }
    shifted
};

/// For each of the `R` weight rows `rows[r]` and `N` activation rows
/// `xq[i]`, sums `d_w d_x Σ (u - OFFSET) q_x + m_w sum_x` over the blocks of
/// the row (the second term only when `HAS_MIN`), where `unpack` turns two
/// consecutive weight blocks (`2 * BYTES` bytes) into their 64 unsigned
/// bytes `u`. Each pair of weight blocks is unpacked once for all `N`
/// inputs, and each pair of input blocks loaded once for all `R` rows.
///
/// The f32 arithmetic of each row and input is the AVX2 kernel's
/// (`avx2::dot_blocks`), whatever `R` and `N`: the scale of each block is
/// the same product `d_w d_x`, the low half of the accumulator is its even
/// accumulator and the high half its odd one, and the `m_w sum_x` terms go
/// to lanes 1 (even blocks) and 3 (odd blocks) of one vector. A last odd
/// block fills both halves but only the low one is accumulated, and its
/// `m_w` is zero in lane 3.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot_block_pairs<
    const BYTES: usize,
    const R: usize,
    const N: usize,
    const HAS_MIN: bool,
    const OFFSET: u8,
>(
    rows: [&[u8]; R],
    xq: [&[Q8Block]; N],
    unpack: impl Fn(&[u8]) -> __m512i,
) -> [[f32; N]; R] {
    let n_blocks = rows[0].len() / BYTES;
    debug_assert!(
        rows.iter().all(|row| row.len() == n_blocks * BYTES)
            && xq.iter().all(|x| x.len() == n_blocks),
        "one input block per weight block"
    );
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    let mut offset = [[_mm_setzero_ps(); N]; R];
    // The first row's pairs drive the loop (a decode step's one row walks
    // its blocks as a plain iterator); the others are sliced alongside.
    for (pair_idx, first) in rows[0].chunks_exact(2 * BYTES).enumerate() {
        let b = 2 * pair_idx;
        let x = Activations2::<OFFSET>::load_each(&xq, [b, b + 1]);
        for (r, (acc, offset)) in acc.iter_mut().zip(&mut offset).enumerate() {
            let w = if r == 0 {
                first
            } else {
                &rows[r][b * BYTES..][..2 * BYTES]
            };
            let weights = Weights2::<HAS_MIN>::unpack(w, BYTES, &unpack);
            weights.accumulate(&x, acc, offset, 0xFFFF);
        }
    }
    if n_blocks % 2 == 1 {
        let b = n_blocks - 1;
        let x = Activations2::<OFFSET>::load_each(&xq, [b, b]);
        for ((row, acc), offset) in rows.iter().zip(&mut acc).zip(&mut offset) {
            let mut twice = [0u8; 2 * 34];
            twice[..BYTES].copy_from_slice(&row[b * BYTES..]);
            twice[BYTES..2 * BYTES].copy_from_slice(&row[b * BYTES..]);
            let mut weights = Weights2::<HAS_MIN>::unpack(&twice[..2 * BYTES], BYTES, &unpack);
            // The second copy's scales are zero: only block b counts.
            weights.scales = _mm_blend_ps::<0b0011>(_mm_setzero_ps(), weights.scales);
            weights.accumulate(&x, acc, offset, 0x00FF);
        }
    }
    let mut out = [[0.0; N]; R];
    for ((out, acc), offset) in out.iter_mut().zip(&acc).zip(&offset) {
        for ((o, &acc), &offset) in out.iter_mut().zip(acc).zip(offset) {
            let offset = lane::<1>(offset) + lane::<3>(offset);
            let low = _mm512_castps512_ps256(acc);
            let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
            *o = horizontal_sum(_mm256_add_ps(low, high)) + offset;
        }
    }
    out
}

/// Two consecutive activation blocks as [`dot_block_pairs`] multiplies them.
#[derive(Clone, Copy)]
struct Activations2<const OFFSET: u8> {
    /// `[d_0, sum_0, d_1, sum_1]`.
    d_sum: __m128,
    /// Block 0's 32 bytes, then block 1's.
    qs: __m512i,
    /// `-OFFSET · Σ q_x` over each four bytes (zero when `OFFSET` is 0): the
    /// start of every row's `vpdpbusd`, which then sums `(u - OFFSET) q_x`.
    minus_offset_sums: __m512i,
}

impl<const OFFSET: u8> Activations2<OFFSET> {
    /// Blocks `b0` and `b1` of each input (a loop, not `array::from_fn`,
    /// whose closure would not inline into this target-feature code).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn load_each<const N: usize>(xq: &[&[Q8Block]; N], [b0, b1]: [usize; 2]) -> [Self; N] {
        let zero = Activations2 {
            d_sum: _mm_setzero_ps(),
            qs: _mm512_setzero_si512(),
            minus_offset_sums: _mm512_setzero_si512(),
        };
        let mut loaded = [zero; N];
        for (x, xq) in loaded.iter_mut().zip(xq) {
            *x = Activations2::load(&xq[b0], &xq[b1]);
        }
        loaded
    }

    /// Two blocks of one input.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn load(a0: &Q8Block, a1: &Q8Block) -> Self {
        // SAFETY: `qs` is exactly 32 bytes in each block.
        let qs = unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(a0.qs.as_ptr().cast())),
                _mm256_loadu_si256(a1.qs.as_ptr().cast()),
            )
        };
        let minus_offset_sums = if OFFSET == 0 {
            _mm512_setzero_si512()
        } else {
            let offset_sums =
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(OFFSET as i8), qs);
            _mm512_sub_epi32(_mm512_setzero_si512(), offset_sums)
        };
        Activations2 {
            d_sum: load_d_sum_pair(a0, a1),
            qs,
            minus_offset_sums,
        }
    }
}

/// Two consecutive weight blocks as [`dot_block_pairs`] multiplies them.
struct Weights2<const HAS_MIN: bool> {
    /// `[d_0, m_0, d_1, m_1]` (the minimums zero for a type without them).
    scales: __m128,
    /// The 64 unsigned bytes `u`.
    values: __m512i,
}

impl<const HAS_MIN: bool> Weights2<HAS_MIN> {
    /// The blocks `w` (two, the second at `bytes`) unpacked by `unpack`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn unpack(w: &[u8], bytes: usize, unpack: &impl Fn(&[u8]) -> __m512i) -> Self {
        debug_assert!(w.len() >= 2 * bytes && bytes >= 4);
        // SAFETY: the scales are the first two (or four) bytes of each block.
        let f16_at = |at: usize| {
            u64::from(u16::from_le(unsafe {
                w.as_ptr().add(at).cast::<u16>().read_unaligned()
            }))
        };
        let (m0, m1) = if HAS_MIN {
            (f16_at(2), f16_at(bytes + 2))
        } else {
            (0, 0)
        };
        let bits = f16_at(0) | m0 << 16 | f16_at(bytes) << 32 | m1 << 48;
        Weights2 {
            scales: _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)),
            values: unpack(w),
        }
    }

    /// Adds these blocks times each input `x[i]` into `acc[i]` and
    /// `offset[i]`, in the lanes `mask` keeps. The scales times
    /// `[d_x0, sum_x0, d_x1, sum_x1]` give both block scales (lanes 0 and 2,
    /// spread over the halves) and the offsets (lanes 1 and 3), as in the
    /// AVX2 kernel.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn accumulate<const N: usize, const OFFSET: u8>(
        &self,
        x: &[Activations2<OFFSET>; N],
        acc: &mut [__m512; N],
        offset: &mut [__m128; N],
        mask: u16,
    ) {
        // Lane 0 in the low half, lane 2 in the high half.
        let spread = _mm512_set_epi64(
            0x2_0000_0002,
            0x2_0000_0002,
            0x2_0000_0002,
            0x2_0000_0002,
            0,
            0,
            0,
            0,
        );
        for ((acc, offset), x) in acc.iter_mut().zip(offset.iter_mut()).zip(x) {
            let scales = _mm_mul_ps(self.scales, x.d_sum);
            let scale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales));
            let lanes = _mm512_dpbusd_epi32(x.minus_offset_sums, self.values, x.qs);
            *acc = _mm512_mask3_fmadd_ps(scale, _mm512_cvtepi32_ps(lanes), *acc, mask);
            if HAS_MIN {
                *offset = _mm_add_ps(*offset, scales);
            }
        }
    }
}

/// `[d_0, sum_0, d_1, sum_1]` of two activation blocks, by two 8-byte loads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn load_d_sum_pair(a0: &Q8Block, a1: &Q8Block) -> __m128 {
    // SAFETY: `Q8Block` is `repr(C)` with `d` and `sum` (two f32) as its
    // first 8 bytes; the pointers come from references to whole blocks.
    unsafe {
        let low = _mm_load_sd(std::ptr::from_ref(a0).cast());
        _mm_castpd_ps(_mm_loadh_pd(low, std::ptr::from_ref(a1).cast()))
    }
}

/// The 16 packed bytes at `at` of two blocks (`w`, the second starting at
/// `bytes`) as 64 nibbles in element order: block 0's low nibbles (elements
/// 0..16), its high nibbles (16..32), then block 1's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn nibbles(w: &[u8], at: usize, bytes: usize) -> __m512i {
    debug_assert!(bytes + at + 16 <= w.len());
    // 128-bit lanes [p0, p0, p1, p1] straight from the loads (broadcasts
    // from memory, no permute), then the high nibbles down in lanes 1 and 3.
    // SAFETY: both 16-byte runs are inside `w` (checked above in debug builds;
    // every caller passes two whole blocks).
    let doubled = unsafe {
        _mm512_mask_broadcast_i32x4(
            _mm512_broadcast_i32x4(_mm_loadu_si128(w.as_ptr().add(at).cast())),
            0xFF00,
            _mm_loadu_si128(w.as_ptr().add(bytes + at).cast()),
        )
    };
    let shifted = _mm512_mask_srli_epi16::<4>(doubled, 0xFF00_FF00, doubled);
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F))
}

/// `values` plus 16 where the fifth bit is set: the bits are the
/// little-endian u32 at `at` of each block (`w`, the second at `bytes`), bit
/// `j` for element `j`, which is byte `j` of each half of `values`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn add_fifth_bits(values: __m512i, w: &[u8], at: usize, bytes: usize) -> __m512i {
    debug_assert!(bytes + at + 4 <= w.len());
    // SAFETY: both 4-byte runs are inside `w` (two whole blocks).
    let bits = |at: usize| {
        u64::from(u32::from_le(unsafe {
            w.as_ptr().add(at).cast::<u32>().read_unaligned()
        }))
    };
    let set = bits(at) | bits(bytes + at) << 32;
    _mm512_mask_add_epi8(values, set, values, _mm512_set1_epi8(16))
}

/// Lane `LANE` of `v`.
#[inline(always)]
fn lane<const LANE: usize>(v: __m128) -> f32 {
    // SAFETY: an `__m128` is four f32.
    let lanes: [f32; 4] = unsafe { std::mem::transmute(v) };
    lanes[LANE]
}

const _: () = assert!(
    std::mem::offset_of!(Q8Block, d) == 0 && std::mem::offset_of!(Q8Block, sum) == 4,
    "d and sum are the first 8 bytes"
);
