//! AVX2 + FMA + F16C dot products (x86_64, selected at run time).
//!
//! Per block of 32: the weight bytes are widened to signed or unsigned bytes
//! (nibbles, Q5's fifth bits spread from a u32, IQ4_NL's codes looked up by a
//! byte shuffle), multiplied with the activation bytes by `vpmaddubsw` (pairs
//! summed to i16, which cannot saturate: |q_w| <= 128 and |q_x| <= 127),
//! summed to eight i32 lanes by `vpmaddwd`, converted to f32 and accumulated
//! with the block scale by one FMA. Signed weights reach the unsigned-by-signed
//! `vpmaddubsw` through two sign operations, except Q5_0's, which are taken
//! as `q + 16`, with each lane's `16 Σ q_x` taken away by one more byte
//! product ([`PLUS_16`]). The integer sums and the f32 operations on them, in
//! their order, are the portable path's: the same bits.
//!
//! The same kernels, with the two byte-product instructions replaced by one
//! 256-bit `vpdpbusd` (AVX-VNNI, [`BytePairs`]), are the `Kernel::AvxVnni`
//! path (`dot_rows_vnni`): the same lane sums, the same bits.
//!
//! Every function requires avx2, fma and f16c (and `dot_rows_vnni`
//! avxvnni), which callers check through a `Dispatch`.

use std::arch::x86_64::{
    __m128, __m128i, __m256, __m256i, _mm_add_ps, _mm_add_ss, _mm_castpd_ps, _mm_cvtph_ps,
    _mm_cvtsi32_si128, _mm_cvtss_f32, _mm_extract_ps, _mm_loaddup_pd, _mm_loadu_ps,
    _mm_loadu_si128, _mm_movehl_ps, _mm_mul_ps, _mm_permute_ps, _mm_setzero_ps, _mm_shuffle_ps,
    _mm_shufflelo_epi16, _mm_storeu_ps, _mm256_add_ps, _mm256_and_si256, _mm256_broadcast_ss,
    _mm256_broadcastsi128_si256, _mm256_broadcastss_ps, _mm256_castps256_ps128,
    _mm256_castsi256_ps, _mm256_cvtepi32_ps, _mm256_cvtepu16_epi32, _mm256_cvtph_ps,
    _mm256_cvtss_f32, _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_loadu_si256,
    _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_mul_ps, _mm256_or_si256, _mm256_set_m128i,
    _mm256_set1_epi8, _mm256_set1_epi16, _mm256_set1_epi32, _mm256_set1_epi64x, _mm256_setr_epi8,
    _mm256_setr_epi32, _mm256_setzero_ps, _mm256_shuffle_epi8, _mm256_sign_epi8, _mm256_slli_epi32,
    _mm256_srlv_epi32, _mm256_sub_epi8, _mm256_sub_epi16,
};

use super::frame::{
    Batch, BlockKernel, Group, MAX_BATCH, Shared, each_row_and_input, type_of_id, with_block_type,
};
use crate::quant::GgmlType;
use crate::quant::activation::Q8Block;
use crate::quant::block::IQ4_NL_VALUES;

/// `out[r * n + i] = row r · input i` over the rows of `batch` for a
/// quantized `ty`, input `i` being `xq[i * n_blocks..][..n_blocks]`: the
/// loop of [`Dispatch::dot_rows`] inside one target-feature function, so
/// each row costs no call and no dispatch, and each weight block is
/// unpacked once for a group of up to four inputs ([`each_row_and_input`]).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
///
/// [`Dispatch::dot_rows`]: crate::kernels::dispatch::Dispatch::dot_rows
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows(ty: GgmlType, batch: Batch<'_>, xq: &[Q8Block], out: &mut [f32]) {
    // SAFETY: the features `Maddubs` needs are this function's.
    unsafe { dot_rows_with(Maddubs, ty, batch, xq, out) }
}

/// [`dot_rows`] with the byte products of AVX-VNNI (`vpdpbusd`).
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn dot_rows_vnni(
    ty: GgmlType,
    batch: Batch<'_>,
    xq: &[Q8Block],
    out: &mut [f32],
) {
    // SAFETY: the features `Vnni` needs are this function's.
    unsafe { dot_rows_with(Vnni, ty, batch, xq, out) }
}

/// The body of [`dot_rows`] for the byte products `P`, inlined into each
/// entry so that it is compiled with the entry's target features.
///
/// # Safety
/// The CPU must support avx2, fma, f16c and what `P` needs.
#[inline(always)]
unsafe fn dot_rows_with<P: BytePairs>(
    products: P,
    ty: GgmlType,
    batch: Batch<'_>,
    xq: &[Q8Block],
    out: &mut [f32],
) {
    with_block_type!(ty, |TY| {
        let kernel = Block32Kernel::<TY, P>(products);
        // SAFETY: the caller's contract.
        unsafe { each_row_and_input(batch, xq, out, kernel) }
    })
}

/// The kernel of the 32-weight type with id `TY` and the byte products `P`
/// for [`each_row_and_input`].
struct Block32Kernel<const TY: u32, P>(P);

impl<const TY: u32, P: BytePairs> BlockKernel<Q8Block> for Block32Kernel<TY, P> {
    #[inline(always)]
    unsafe fn dot<const N: usize>(&self, row: &[u8], group: Group<'_, Q8Block, N>) -> [f32; N] {
        // SAFETY: the caller guarantees the features `dot` and `P` need.
        unsafe { dot::<N, TY, P>(row, group) }
    }

    /// For the types with a minimum, each block's `sum_x` of the group's
    /// inputs side by side (zero past the group), so that one multiply and
    /// one add give every input's `m_w sum_x` term ([`dot_blocks_batched`]).
    #[inline(always)]
    unsafe fn prepare_group(&self, xq: &[&[Q8Block]], shared: &mut Vec<Shared>) {
        if !matches!(const { type_of_id(TY) }, GgmlType::Q4_1 | GgmlType::Q5_1) {
            return;
        }
        let n_blocks = xq.first().map_or(0, |x| x.len());
        shared.clear();
        shared.extend((0..n_blocks).map(|b| {
            let mut sums = [0.0; MAX_BATCH];
            for (sum, x) in sums.iter_mut().zip(xq) {
                *sum = x[b].sum;
            }
            sums
        }));
    }
}

/// Row (of the type with id `TY`) · `N` rows of quantized activations (each
/// as long as the row): each type's unpacking of a block into bytes.
///
/// This and the functions under it that `P` reaches are always inlined,
/// without target features of their own: they are compiled inside the
/// target-feature entry (`dot_rows` or `dot_rows_vnni`), with
/// its features, so `P`'s instruction is inlined too.
///
/// # Safety
/// The CPU must support avx2, fma and f16c, and what `P` needs.
#[inline(always)]
unsafe fn dot<const N: usize, const TY: u32, P: BytePairs>(
    row: &[u8],
    xq: Group<'_, Q8Block, N>,
) -> [f32; N] {
    // SAFETY (the intrinsics and the loads): the caller guarantees the
    // features; each unpacking reads inside its block (`w` is one block).
    unsafe {
        match const { type_of_id(TY) } {
            // q = nibble - 8.
            GgmlType::Q4_0 => dot_blocks::<18, N, SIGNED, P>(row, xq, |w| {
                let packed = _mm_loadu_si128(w.as_ptr().add(2).cast());
                _mm256_sub_epi8(unpack_nibbles(packed), _mm256_set1_epi8(8))
            }),
            // q = nibble, and the minimum m.
            GgmlType::Q4_1 => dot_blocks::<20, N, WITH_MIN, P>(row, xq, |w| {
                let packed = _mm_loadu_si128(w.as_ptr().add(4).cast());
                unpack_nibbles(packed)
            }),
            // q + 16 = nibble + 16 * fifth bit, unsigned; a byte product of
            // 16 with the activations takes the 16 away again.
            GgmlType::Q5_0 => dot_blocks::<22, N, PLUS_16, P>(row, xq, |w| unpack_q5_0(w)),
            // q = nibble + 16 * fifth bit (unsigned, below 32), and the minimum m.
            GgmlType::Q5_1 => dot_blocks::<24, N, WITH_MIN, P>(row, xq, |w| {
                let packed = _mm_loadu_si128(w.as_ptr().add(8).cast());
                let fifth = sixteen_where_bit_set([w[4], w[5], w[6], w[7]]);
                _mm256_or_si256(unpack_nibbles(packed), fifth)
            }),
            // q = the byte.
            GgmlType::Q8_0 => dot_blocks::<34, N, SIGNED, P>(row, xq, |w| {
                _mm256_loadu_si256(w.as_ptr().add(2).cast())
            }),
            // q = the 4-bit code's level in the 16-level table (-127..=113),
            // looked up by one byte shuffle.
            GgmlType::IQ4_NL => {
                let levels = _mm_loadu_si128(IQ4_NL_VALUES.as_ptr().cast());
                let table = _mm256_set_m128i(levels, levels);
                dot_blocks::<18, N, SIGNED, P>(row, xq, |w| {
                    let packed = _mm_loadu_si128(w.as_ptr().add(2).cast());
                    _mm256_shuffle_epi8(table, unpack_nibbles(packed))
                })
            }
            _ => unreachable!("a 32-weight block type"),
        }
    }
}

/// A Q5_0 block (`w`, 22 bytes) as its 32 weights plus 16 (nibble + 16 *
/// fifth bit, 0..32), in the form [`PLUS_16`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q5_0(w: &[u8]) -> __m256i {
    debug_assert_eq!(w.len(), 22, "one Q5_0 block");
    // SAFETY: bytes 6..22 are inside the block.
    let packed = unsafe { _mm_loadu_si128(w.as_ptr().add(6).cast()) };
    let fifth = sixteen_where_bit_set([w[2], w[3], w[4], w[5]]);
    _mm256_or_si256(unpack_nibbles(packed), fifth)
}

/// Signed weight bytes `q` (|q| <= 128), multiplied as `|q|` times the
/// activation with `q`'s sign (`vpsignb` twice).
const SIGNED: u8 = 0;
/// Unsigned weight bytes `q` (below 128) and a minimum `m` (f16 at byte 2 of
/// the block): `m sum_x` is added per block.
const WITH_MIN: u8 = 1;
/// Unsigned weight bytes `q + 16` (below 32) for weights `q` in -16..16:
/// each i32 lane of four products has `16 Σ q_x` over those four bytes
/// taken away ([`BytePairs::dot_u8_less_16_i8`]), so it ends at exactly
/// `Σ q q_x`, the [`SIGNED`] form's lane, without the sign operations.
const PLUS_16: u8 = 2;

/// For each of the `N` activation rows `xq[i]`, sums
/// `d_w d_x Σ q_w q_x + m_w sum_x` over the blocks of `row` (the second term
/// only for the form [`WITH_MIN`]), where `unpack` turns one weight block
/// (`BYTES` long) into its weight bytes in the form `FORM` ([`SIGNED`],
/// [`WITH_MIN`] or [`PLUS_16`]). Every 32-weight block starts with its f16
/// scale `d_w`, followed by the f16 minimum `m_w` in the types with one.
/// Each weight block is unpacked once for all `N` rows (the batched product
/// of prefill), and `d_w d_x` and `m_w sum_x` come from one multiply (see
/// [`accumulate`]).
///
/// Even and odd blocks go to two accumulators per row, and so do the
/// `m_w sum_x` terms (lanes 1 and 3 of one vector), so consecutive FMAs do
/// not wait on each other. The order of the f32 additions does not depend on
/// `N`, so a row's result is the same bits whether it is computed alone or in
/// a batch, and it is the order the conformance fixtures were checked with
/// (other orders move single logits of the real model by up to 0.5).
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn dot_blocks<const BYTES: usize, const N: usize, const FORM: u8, P: BytePairs>(
    row: &[u8],
    xq: Group<'_, Q8Block, N>,
    unpack: impl Fn(&[u8]) -> __m256i,
) -> [f32; N] {
    let n_blocks = row.len() / BYTES;
    debug_assert!(
        xq.inputs.iter().all(|x| x.len() == n_blocks),
        "one input block per weight block"
    );
    if N > 1 {
        // SAFETY: as this function.
        return unsafe { dot_blocks_batched::<BYTES, N, FORM, P>(row, xq, unpack) };
    }
    // One input from here on. The row as whole blocks and the input as the
    // same number of blocks, both in pairs (even and odd), so the loop
    // walks them without an index or a bounds check per block.
    let (blocks, _) = row.as_chunks::<BYTES>();
    let x = &xq.inputs[0][..blocks.len()];
    let (pairs, last) = blocks.as_chunks::<2>();
    let (x_pairs, x_last) = x.as_chunks::<2>();
    // SAFETY: the caller guarantees the features.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut offset = _mm_setzero_ps();
        for ([w0, w1], [a0, a1]) in pairs.iter().zip(x_pairs) {
            accumulate::<0, BYTES, FORM, P>(w0, unpack(w0), a0, &mut acc, &mut offset);
            accumulate::<1, BYTES, FORM, P>(w1, unpack(w1), a1, &mut acc, &mut offset);
        }
        if let ([w], [a]) = (last, x_last) {
            accumulate::<0, BYTES, FORM, P>(w, unpack(w), a, &mut acc, &mut offset);
        }
        let mut out = [0.0; N];
        out[0] =
            horizontal_sum(_mm256_add_ps(acc[0], acc[1])) + (lane::<1>(offset) + lane::<3>(offset));
        out
    }
}

/// [`dot_blocks`] for `N >= 2` inputs, with the same f32 operations in the
/// same order per input (so the same bits as each input alone), and fewer of
/// them per input:
///
/// - the block scale `d_w d_x` is `d_w` broadcast once per block times
///   `d_x` broadcast straight from memory (a load, no shuffle), instead of a
///   multiply of `[d_w, m_w, ..]` by `[d_x, sum_x, ..]` per input and a
///   broadcast of its lane 0;
/// - the `m_w sum_x` terms of all `N` inputs are one multiply of `m_w`
///   broadcast by the group's sums side by side (`xq.shared`, see
///   [`BlockKernel::prepare_group`]), added into one even and one odd
///   vector (lane `i` for input `i`), instead of an add per input.
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn dot_blocks_batched<const BYTES: usize, const N: usize, const FORM: u8, P: BytePairs>(
    row: &[u8],
    xq: Group<'_, Q8Block, N>,
    unpack: impl Fn(&[u8]) -> __m256i,
) -> [f32; N] {
    let n_blocks = row.len() / BYTES;
    let with_min = FORM == WITH_MIN;
    debug_assert!(
        !with_min || xq.shared.len() == n_blocks,
        "one sum per block"
    );
    let inputs = xq.inputs.map(|x| &x[..n_blocks]);
    let sums = if with_min {
        &xq.shared[..n_blocks]
    } else {
        &[]
    };
    // SAFETY: the caller guarantees the features; every block index is
    // below `n_blocks`, the length of `inputs`' slices and of `sums`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        let mut offsets = [_mm_setzero_ps(); 2];
        let (blocks, _) = row.as_chunks::<BYTES>();
        let (pairs, last) = blocks.as_chunks::<2>();
        for (pair_idx, [w0, w1]) in pairs.iter().enumerate() {
            let b = 2 * pair_idx;
            let (acc, offsets) = (&mut acc, &mut offsets);
            add_block::<0, BYTES, N, FORM, P>(w0, unpack(w0), b, &inputs, sums, acc, offsets);
            add_block::<1, BYTES, N, FORM, P>(w1, unpack(w1), b + 1, &inputs, sums, acc, offsets);
        }
        if let [w] = last {
            let b = n_blocks - 1;
            let (acc, offsets) = (&mut acc, &mut offsets);
            add_block::<0, BYTES, N, FORM, P>(w, unpack(w), b, &inputs, sums, acc, offsets);
        }
        // Even plus odd offsets, per input: the one-input kernel's
        // `lane 1 + lane 3`.
        let mut offset = [0.0; MAX_BATCH];
        _mm_storeu_ps(offset.as_mut_ptr(), _mm_add_ps(offsets[0], offsets[1]));
        let mut out = [0.0; N];
        for ((o, acc), &offset) in out.iter_mut().zip(&acc).zip(&offset) {
            *o = horizontal_sum(_mm256_add_ps(acc[0], acc[1])) + offset;
        }
        out
    }
}

/// Adds block `block_idx` (the bytes `w`, unpacked as `weights`) into
/// accumulator `PARITY` of every input of [`dot_blocks_batched`], and its
/// `m_w sum_x` terms into `offsets[PARITY]` (lane `i` for input `i`).
///
/// # Safety
/// As [`dot`], and `block_idx` below the length of every input and of
/// `sums` (for the form [`WITH_MIN`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the state of a block product
unsafe fn add_block<
    const PARITY: usize,
    const BYTES: usize,
    const N: usize,
    const FORM: u8,
    P: BytePairs,
>(
    w: &[u8; BYTES],
    weights: __m256i,
    block_idx: usize,
    inputs: &[&[Q8Block]; N],
    sums: &[Shared],
    acc: &mut [[__m256; 2]; N],
    offsets: &mut [__m128; 2],
) {
    const { assert!(BYTES >= 4, "a block starts with two f16 values") };
    // SAFETY: the caller guarantees the features and the index; `w` is a
    // whole block. Its first four bytes are `[d_w, m_w]` (f16) in the types
    // with a minimum; in the others lane 1 is weight bytes and unused.
    unsafe {
        let first = i32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        let scales_w = _mm_cvtph_ps(_mm_cvtsi32_si128(first));
        let d_w = _mm256_broadcastss_ps(scales_w);
        for (acc, x) in acc.iter_mut().zip(inputs) {
            let a = x.get_unchecked(block_idx);
            let scale = _mm256_mul_ps(d_w, _mm256_broadcast_ss(&a.d));
            let products = block_products::<FORM, P>(weights, a);
            acc[PARITY] = _mm256_fmadd_ps(scale, products, acc[PARITY]);
        }
        if FORM == WITH_MIN {
            let m_w = _mm_permute_ps::<0b01_01_01_01>(scales_w);
            let sums_x = _mm_loadu_ps(sums.get_unchecked(block_idx).as_ptr());
            offsets[PARITY] = _mm_add_ps(offsets[PARITY], _mm_mul_ps(m_w, sums_x));
        }
    }
}

/// Adds one block (the bytes `w`, unpacked as `weights`, times the input
/// block `a`) into accumulator `PARITY`. The weight scales are converted as
/// `[d_w, m_w, 0, 0]` for even blocks and `[d_w, 0, 0, m_w]` for odd ones
/// (for a type without a minimum: `d_w` and the block's next three f16
/// values, of which only `d_w` is used, by one conversion from memory) and
/// multiplied by `[d_x, sum_x, d_x, sum_x]`: lane 0 is the block's scale and
/// lane 1 or 3 its `m_w sum_x`, which adds into the offset sum.
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn accumulate<const PARITY: usize, const BYTES: usize, const FORM: u8, P: BytePairs>(
    w: &[u8; BYTES],
    weights: __m256i,
    a: &Q8Block,
    acc: &mut [__m256; 2],
    offset: &mut __m128,
) {
    const { assert!(BYTES >= 4, "a block starts with two f16 values") };
    // SAFETY: the caller guarantees the features; `w` is a whole block.
    unsafe {
        // The f16 scales come in by a scalar load and a move, never by
        // `vcvtph2ps` from memory: on Zen 3 that form (an 8-byte load at the
        // block's start) ran Q4_0, Q5_0 and IQ4_NL decode products at half
        // speed (docs/performance-log.md, "Scales by a scalar load").
        let scales_w = if FORM == WITH_MIN {
            // `[d_w, m_w]` by one 4-byte load; for an odd block, f16 lanes
            // `[0, 2, 2, 1]` of it (lane 2 is zero) put `m_w` in lane 3.
            let d_m = _mm_cvtsi32_si128(i32::from_le_bytes([w[0], w[1], w[2], w[3]]));
            let halves = if PARITY == 0 {
                d_m
            } else {
                _mm_shufflelo_epi16::<0b01_10_10_00>(d_m)
            };
            _mm_cvtph_ps(halves)
        } else {
            // `[d_w, 0, 0, 0]`.
            _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16::from_le_bytes([
                w[0], w[1],
            ]))))
        };
        let scales = _mm_mul_ps(scales_w, load_d_sum_twice(a));
        let scale = _mm256_broadcastss_ps(scales);
        let products = block_products::<FORM, P>(weights, a);
        acc[PARITY] = _mm256_fmadd_ps(scale, products, acc[PARITY]);
        if FORM == WITH_MIN {
            *offset = _mm_add_ps(*offset, scales);
        }
    }
}

/// The eight i32 lane sums (as f32) of a block's weight bytes in the form
/// `FORM` times the activation block `a`'s bytes: four products a lane.
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn block_products<const FORM: u8, P: BytePairs>(weights: __m256i, a: &Q8Block) -> __m256 {
    // SAFETY: the caller guarantees the features.
    unsafe {
        match FORM {
            SIGNED => mul_sum_i8::<P>(weights, load_qs(a)),
            WITH_MIN => mul_sum_u8_i8::<P>(weights, load_qs(a)),
            _ => mul_sum_plus_16::<P>(weights, a),
        }
    }
}

/// `[d, sum, d, sum]` of an activation block, by one 8-byte load.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_d_sum_twice(a: &Q8Block) -> __m128 {
    // SAFETY: `Q8Block` is `repr(C)` with `d` and `sum` (two f32) as its
    // first 8 bytes; the pointer comes from a reference to the whole block.
    _mm_castpd_ps(unsafe { _mm_loaddup_pd(std::ptr::from_ref(a).cast()) })
}

/// Lane `LANE` of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane<const LANE: i32>(v: __m128) -> f32 {
    f32::from_bits(_mm_extract_ps::<LANE>(v) as u32)
}

/// 16 bytes of packed 4-bit values as 32 bytes: low nibbles (elements 0..16)
/// in the low lane, high nibbles (elements 16..32) in the high lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn unpack_nibbles(packed: __m128i) -> __m256i {
    // The 16 bytes in both lanes (one broadcast load when `packed` comes
    // from memory); the high lane's i32s shift right by 4, so each byte's
    // low nibble is then its high one (the bits shifted in from the next
    // byte are masked off). One operation fewer than shifting and inserting
    // a lane.
    let both = _mm256_broadcastsi128_si256(packed);
    let high_lane_by_4 = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    _mm256_and_si256(high_lane_by_4, _mm256_set1_epi8(0x0F))
}

/// F32 row · f32 activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let row_chunks = row.chunks_exact(32);
    let x_chunks = x.chunks_exact(8);
    let (row_tail, x_tail) = (row_chunks.remainder(), x_chunks.remainder());
    for (w8, x8) in row_chunks.zip(x_chunks) {
        // SAFETY: `w8` is 32 bytes and `x8` 8 floats; unaligned loads.
        let (w, xv) = unsafe {
            (
                _mm256_loadu_ps(w8.as_ptr().cast()),
                _mm256_loadu_ps(x8.as_ptr()),
            )
        };
        acc = _mm256_fmadd_ps(w, xv, acc);
    }
    let mut sum = horizontal_sum(acc);
    for (w, &xv) in row_tail.chunks_exact(4).zip(x_tail) {
        sum += f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * xv;
    }
    sum
}

/// F16 row · f32 activations (F16C converts eight weights at a time).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_half_floats(row, x, |w8| {
        // SAFETY: `w8` is 16 bytes; unaligned load.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w8.as_ptr().cast()) })
    })
}

/// BF16 row · f32 activations (a bf16 is the top half of an f32).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_half_floats(row, x, |w8| {
        // SAFETY: `w8` is 16 bytes; unaligned load.
        let halves = _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(w8.as_ptr().cast()) });
        _mm256_castsi256_ps(_mm256_slli_epi32(halves, 16))
    })
}

/// Σ w·x over 2-byte float weights, eight at a time through `widen`, with
/// the tail decoded by the portable path.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_half_floats(row: &[u8], x: &[f32], widen: impl Fn(&[u8]) -> __m256) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let row_chunks = row.chunks_exact(16);
    let x_chunks = x.chunks_exact(8);
    let (row_tail, x_tail) = (row_chunks.remainder(), x_chunks.remainder());
    for (w8, x8) in row_chunks.zip(x_chunks) {
        // SAFETY: `x8` is 8 floats; unaligned load.
        let xv = unsafe { _mm256_loadu_ps(x8.as_ptr()) };
        acc = _mm256_fmadd_ps(widen(w8), xv, acc);
    }
    let mut sum = horizontal_sum(acc);
    for (w, &xv) in row_tail.chunks_exact(2).zip(x_tail) {
        sum += widen_scalar(w, &widen) * xv;
    }
    sum
}

/// One 2-byte float through the eight-wide `widen`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen_scalar(w: &[u8], widen: &impl Fn(&[u8]) -> __m256) -> f32 {
    let mut padded = [0u8; 16];
    padded[..2].copy_from_slice(&w[..2]);
    _mm256_cvtss_f32(widen(&padded))
}

/// The 32 quantized activations of a block as one vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_qs(a: &Q8Block) -> __m256i {
    // SAFETY: `qs` is exactly 32 bytes.
    unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) }
}

/// Σ of unsigned byte (`x`, below 128) times signed byte products, as eight
/// f32 lanes (each an exact integer).
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn mul_sum_u8_i8<P: BytePairs>(x: __m256i, y: __m256i) -> __m256 {
    // SAFETY: the caller guarantees the features.
    unsafe { _mm256_cvtepi32_ps(P::dot_u8_i8(x, y)) }
}

/// Σ of the [`PLUS_16`] weight bytes `u = q + 16` times the activation
/// block's bytes, less 16 times their sum, per lane of four: the lanes of
/// `Σ q q_x`, as eight f32 (each an exact integer).
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn mul_sum_plus_16<P: BytePairs>(u: __m256i, a: &Q8Block) -> __m256 {
    // SAFETY: the caller guarantees the features.
    unsafe { _mm256_cvtepi32_ps(P::dot_u8_less_16_i8(u, load_qs(a))) }
}

/// How eight i32 lanes each get the sum of four adjacent products of an
/// unsigned byte and a signed byte (no product pair may exceed the i16
/// range: every caller's unsigned bytes are at most 128 and its signed ones
/// at most 127 in magnitude). Both implementations give the same integers,
/// so the kernels built on either give the same bits.
pub(super) trait BytePairs: Copy {
    /// The lane sums of `u · s` (unsigned `u`, signed `s`).
    ///
    /// # Safety
    /// The CPU must support the implementation's instructions, and the call
    /// must be inlined into a function compiled with them.
    unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i;

    /// The lane sums of `(u - 16) · s` for unsigned `u` below 32 (the
    /// [`PLUS_16`] form): `Σ u s - 16 Σ s` per lane of four, the second sum
    /// computed here from `s` for every product rather than stored with the
    /// activation block (32 bytes more per block, which a decode step
    /// streams once per weight row: Q4_0 decode at 1B scale ran at 21.3
    /// tok/s with them, 24.1 without).
    ///
    /// # Safety
    /// As [`BytePairs::dot_u8_i8`].
    unsafe fn dot_u8_less_16_i8(u: __m256i, s: __m256i) -> __m256i;
}

/// AVX2: `vpmaddubsw` sums pairs to i16, `vpmaddwd` by ones pairs those to i32.
#[derive(Clone, Copy)]
pub(super) struct Maddubs;

impl BytePairs for Maddubs {
    #[inline(always)]
    unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller guarantees avx2.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
    }

    /// Pairs in i16: `u0 s0 + u1 s1` less `16 s0 + 16 s1` (both by
    /// `vpmaddubsw`; at most 2 * 31 * 127 and 2 * 16 * 127 in magnitude, so
    /// neither they nor their difference leave the i16 range), then to i32
    /// by `vpmaddwd`: one operation more than adding stored sums, and one
    /// load less.
    #[inline(always)]
    unsafe fn dot_u8_less_16_i8(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller guarantees avx2.
        unsafe {
            let products = _mm256_maddubs_epi16(u, s);
            let sixteens = _mm256_maddubs_epi16(_mm256_set1_epi8(16), s);
            _mm256_madd_epi16(_mm256_sub_epi16(products, sixteens), _mm256_set1_epi16(1))
        }
    }
}

/// Defines the unit struct `$name`, [`BytePairs`] by the 256-bit
/// `vpdpbusd` `$dpbusd` (AVX-VNNI's encoding or AVX-512 VNNI's with VL, the
/// same operation): one instruction sums four products per lane. A macro
/// rather than a struct generic over the encoding, which compiled
/// `dot_rows_vnni` differently.
macro_rules! vnni_byte_pairs {
    ($(#[$doc:meta])* $vis:vis struct $name:ident = $dpbusd:ident;) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        $vis struct $name;

        const _: () = {
            use std::arch::x86_64::{
                __m256i, _mm256_set1_epi8, _mm256_setzero_si256, _mm256_sub_epi32, $dpbusd,
            };

            use $crate::kernels::dot::avx2::BytePairs;

            impl BytePairs for $name {
                #[inline(always)]
                unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
                    // SAFETY: the caller guarantees the instruction's
                    // features (named on the struct).
                    unsafe { $dpbusd(_mm256_setzero_si256(), u, s) }
                }

                /// `vpdpbusd` of `u` with `s`, starting from `-16 Σ s` per
                /// lane (a `vpdpbusd` of 16 with `s`, negated), as the
                /// AVX-512 kernel does.
                #[inline(always)]
                unsafe fn dot_u8_less_16_i8(u: __m256i, s: __m256i) -> __m256i {
                    // SAFETY: as `dot_u8_i8`.
                    unsafe {
                        let sixteens = $dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(16), s);
                        let start = _mm256_sub_epi32(_mm256_setzero_si256(), sixteens);
                        $dpbusd(start, u, s)
                    }
                }
            }
        };
    };
}
pub(super) use vnni_byte_pairs;

vnni_byte_pairs! {
    /// AVX-VNNI (the `*_vnni` entries: avxvnni).
    pub(super) struct Vnni = _mm256_dpbusd_avx_epi32;
}

/// The 32 bits of a little-endian u32 (`bytes`) as 32 bytes, 16 where the
/// bit is set and 0 where it is clear (Q5's fifth bits, ready to be OR-ed
/// onto the nibbles): byte `j` is bit `j`, so elements 0..16 are in the low
/// lane and 16..32 in the high one, as [`unpack_nibbles`] places them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sixteen_where_bit_set(bytes: [u8; 4]) -> __m256i {
    let all = _mm256_set1_epi32(i32::from_le_bytes(bytes));
    // Byte j takes source byte j / 8 (each lane holds all four).
    let spread = _mm256_shuffle_epi8(
        all,
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    // Then keeps only bit j % 8: as a signed byte, positive where set (bits
    // 0..7), -128 where bit 7 is set, and 0 where clear.
    let bit = _mm256_and_si256(spread, _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64));
    // `vpsignb` takes 16 where that is positive and negates -16 (byte 7 of
    // each eight) where it is negative: 16 where set, 0 where clear. One
    // operation where a compare and a mask took two.
    let sixteen_or_minus = _mm256_set1_epi64x(0xF010_1010_1010_1010u64 as i64);
    _mm256_sign_epi8(sixteen_or_minus, bit)
}

/// Σ of signed byte products, as eight f32 lanes (each an exact integer).
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn mul_sum_i8<P: BytePairs>(x: __m256i, y: __m256i) -> __m256 {
    // SAFETY: the caller guarantees the features.
    unsafe {
        // The unsigned-by-signed product takes |x|, with x's sign moved onto y.
        let abs_x = _mm256_sign_epi8(x, x);
        let signed_y = _mm256_sign_epi8(y, x);
        _mm256_cvtepi32_ps(P::dot_u8_i8(abs_x, signed_y))
    }
}

/// The sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn horizontal_sum(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let dual = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(dual, _mm_shuffle_ps(dual, dual, 1)))
}

#[cfg(test)]
pub(super) mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::kernels::dispatch::Kernel;
    use crate::quant::block::QK;

    /// Asserts that this CPU runs the AVX2 kernel (x86_64 with avx2, fma and
    /// f16c): the tests of its helpers call them directly.
    pub(in crate::kernels::dot) fn assert_avx2_runs() {
        assert!(
            Kernel::Avx2.is_available(),
            "this test runs where the AVX2 kernel does (x86_64 with avx2, fma, f16c)"
        );
    }

    /// The i32 lanes of the [`PLUS_16`] product of Q5_0 blocks are exactly
    /// the sums of four `q_w q_x` of the signed weights `q_w` (decoded here
    /// from the block's bits by hand), the lanes of the signed form the
    /// kernel used before; so its f32 results keep their bits. Includes the
    /// extremes: every fifth bit set or clear, activations all ±127.
    #[test]
    fn q5_0_lanes_equal_the_signed_weights_lane_sums() {
        assert_avx2_runs();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for case in 0..500 {
            let mut w: [u8; 22] = rng.random();
            match case {
                0 => w[2..6].fill(0xFF),
                1 => w[2..6].fill(0),
                _ => {}
            }
            let x: Vec<f32> = (0..QK)
                .map(|_| match case {
                    2 => 1.0,
                    3 => -1.0,
                    _ => rng.random_range(-1.0..1.0),
                })
                .collect();
            let a = Q8Block::quantize(&x);
            let high = u32::from_le_bytes([w[2], w[3], w[4], w[5]]);
            let signed = |j: usize| {
                let nibble = if j < 16 {
                    w[6 + j] & 0x0F
                } else {
                    w[6 + j - 16] >> 4
                };
                i32::from(nibble) + 16 * ((high >> j) & 1) as i32 - 16
            };
            let expected: Vec<i32> = (0..8)
                .map(|k| {
                    (4 * k..4 * k + 4)
                        .map(|j| signed(j) * i32::from(a.qs[j]))
                        .sum()
                })
                .collect();
            // SAFETY: the CPU has avx2, fma and f16c (asserted above).
            let lanes: [i32; 8] = unsafe { std::mem::transmute(q5_0_lanes(&w, &a)) };
            assert_eq!(lanes.as_slice(), expected.as_slice(), "case {case}");
        }
    }

    /// The kernel's i32 lanes for one Q5_0 block and one activation block.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q5_0_lanes(w: &[u8], a: &Q8Block) -> __m256i {
        // SAFETY: compiled with the features `Maddubs` needs.
        unsafe { Maddubs::dot_u8_less_16_i8(unpack_q5_0(w), load_qs(a)) }
    }
}
