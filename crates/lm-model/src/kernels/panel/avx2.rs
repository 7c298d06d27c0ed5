//! The panel products on AVX2 + FMA + F16C (`Kernel::Avx2`), and with the
//! 256-bit `vpdpbusd` of AVX-VNNI (`Kernel::AvxVnni`): a panel is two
//! halves of eight rows (rows 0..8 in the low 32 bytes of each 64-byte
//! chunk, rows 8..16 in the high 32), one i32 or f32 lane per row. A
//! half's block is eight vectors of unsigned bytes `u = q + OFFSET` (four
//! weights per lane), vector `k` meeting input bytes `4k..4k + 4`
//! broadcast to every lane, and one conversion, one scale product and one
//! fused multiply-add per input finish the block for eight rows, in the
//! order `quant/packed.rs` states (the portable kernel's bits; Q4_1 adds
//! one fused multiply-add of the minimums by the input block's sum).
//!
//! The exact integer sums, per type and instruction set:
//! - AVX-VNNI: `vpdpbusd` from `-OFFSET · Σ q_x`, as the AVX-512 kernel.
//! - AVX2, the nibble types: `vpmaddubsw` of `u` with the input bytes, the
//!   pairs added in i16 over eight vectors for Q4_0 and Q4_1 (`u` below 16:
//!   each pair at most 2 · 15 · 128 in magnitude, their sum at most 30,720:
//!   no saturation, no wrap) and over four for Q5_0 (`u` below 32: at most
//!   4 · 2 · 31 · 128 = 31,744), then `vpmaddwd` by ones to i32 and
//!   `OFFSET · Σ q_x` taken away.
//! - AVX2, Q8_0: `u = q + 128` would saturate `vpmaddubsw`'s pairs, so the
//!   signed weights are multiplied as `|q|` times the input with `q`'s sign
//!   (`vpsignb`), as `kernels/dot/avx2.rs` does, each vector's pairs
//!   summed to i32 by `vpmaddwd` at once.
//!
//! Inputs are tiled by up to [`TILE`]: the tile's integer and f32 sums, a
//! weight vector, the broadcast input bytes and the constants fit AVX2's
//! sixteen registers at four inputs. On an AMD EPYC (Zen 4, shared
//! machine, `LM_KERNEL=avx2`, one thread, medians of 3-4 interleaved runs)
//! a 131-token prefill of the 1B-shape Q4_0 file took 5.0 s row-major and
//! 2.7, 2.3, 2.1, 2.4 and 2.2 s with tiles of 1, 2, 4, 6 and 8.
//!
//! Every function requires avx2, fma and f16c (and the `_vnni` entry
//! avxvnni), which callers check through a `Dispatch`.

use std::arch::x86_64::{
    __m256, __m256i, _mm_loadu_si128, _mm256_add_epi16, _mm256_add_epi32, _mm256_and_si256,
    _mm256_cvtepi32_ps, _mm256_cvtph_ps, _mm256_dpbusd_avx_epi32, _mm256_fmadd_ps,
    _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_mul_ps, _mm256_or_si256,
    _mm256_set1_epi8, _mm256_set1_epi16, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_setzero_si256, _mm256_sign_epi8, _mm256_slli_epi16, _mm256_srli_epi16, _mm256_storeu_ps,
    _mm256_sub_epi32, _mm256_xor_si256,
};

use super::{
    PREFETCH_BYTES, Packed, PanelProduct, Q4_0, Q4_1, Q5_0, Q8_0, prefetch_line, prefetch_lines,
};
use crate::quant::GgmlType;
use crate::quant::activation::Q8Block;
use crate::quant::packed::{CHUNK_BYTES, PANEL_ROWS, SCALE_BYTES};

/// Rows of a half panel: one 256-bit vector of i32 or f32 lanes.
const HALF_ROWS: usize = PANEL_ROWS / 2;

/// Vectors of weights per block and half: 32 weights in lanes of four.
const VECTORS: usize = 8;

/// The most inputs that share one unpacking of a half's block.
const TILE: usize = 4;

/// Every panel of `$product` (of the packed type `$ty`) against every
/// input by the sums `$sums<U, ..>` for that type `U` (written `_`),
/// balanced tiles of up to [`TILE`] inputs at a time, into `$out`. A macro,
/// written out in the `#[target_feature]` function that uses it, because a
/// closure is compiled with the target features of the function it is
/// written in: the tile closure of an `#[inline(always)]` function without
/// them called every intrinsic (1B-shape Q4_0 decode at 0.4 tokens/s).
///
/// Safety: the CPU has avx2, fma, f16c and what `$sums` uses.
macro_rules! each_panel {
    ($ty:expr, $sums:ident<_ $(, $d:ty)?>, $product:expr, $out:expr) => {
        match $ty {
            GgmlType::Q4_0 => each_panel!(@tile $sums<Q4_0 $(, $d)?>, $product, $out),
            GgmlType::Q4_1 => each_panel!(@tile $sums<Q4_1 $(, $d)?>, $product, $out),
            GgmlType::Q5_0 => each_panel!(@tile $sums<Q5_0 $(, $d)?>, $product, $out),
            GgmlType::Q8_0 => each_panel!(@tile $sums<Q8_0 $(, $d)?>, $product, $out),
            _ => unreachable!("{} is not packed", $ty),
        }
    };
    (@tile $h:ty, $product:expr, $out:expr) => {{
        let product: PanelProduct<'_, Q8Block> = $product;
        let panel_bytes = product.n_blocks * <$h as HalfSums>::Packed::RECORD_BYTES;
        // SAFETY: the caller's features.
        product.each_tile(panel_bytes, TILE, $out, |_, part, out| unsafe {
            match part.n {
                1 => tile::<$h, 1>(part, out),
                2 => tile::<$h, 2>(part, out),
                3 => tile::<$h, 3>(part, out),
                4 => tile::<$h, 4>(part, out),
                size => unreachable!("a tile of {size} inputs"),
            }
        })
    }};
}

/// See [`Dispatch::dot_panels`](crate::kernels::dispatch::Dispatch::dot_panels).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_panels(ty: GgmlType, product: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    each_panel!(ty, Maddubs<_>, product, out)
}

/// [`dot_panels`] with the byte products of AVX-VNNI (`vpdpbusd`).
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn dot_panels_vnni(
    ty: GgmlType,
    product: PanelProduct<'_, Q8Block>,
    out: &mut [f32],
) {
    each_panel!(ty, Dpbusd<_, AvxVnni>, product, out)
}

unsigned_vector!(
    vector,
    __m256i,
    _mm256_loadu_si256,
    _mm256_and_si256,
    _mm256_or_si256,
    _mm256_slli_epi16,
    _mm256_srli_epi16,
    _mm256_xor_si256,
    _mm256_set1_epi8
);

/// A half block of a panel and a tile's `T` inputs: the operands of
/// [`HalfSums::sums`].
#[derive(Clone, Copy)]
struct Half<'a, const T: usize> {
    /// The half's lanes of chunk 0 (its other chunks follow as in any
    /// block).
    quants: *const u8,
    /// The inputs' blocks.
    x: [&'a Q8Block; T],
    /// Their sums `Σ_j q_x[i, j]`.
    sum_x: [i32; T],
}

/// How the exact integer sums of a half block with a tile's inputs are
/// taken.
trait HalfSums {
    /// The packed type the sums read.
    type Packed: Packed;
    /// Lane `l` of `s[i]` is `Σ_j q_w[l, j] q_x[i, j]` for the half and
    /// input `i`.
    ///
    /// # Safety
    /// `half.quants` points into a block's chunks; the CPU has the
    /// instructions the implementation uses and the call is inlined into a
    /// function compiled with them.
    unsafe fn sums<const T: usize>(half: Half<'_, T>) -> [__m256i; T];
}

/// Bytes `4k..4k + 4` of an input block, broadcast to every lane.
///
/// # Safety
/// `k < 8`; the CPU has avx2 (inlined into a function compiled with it).
#[inline(always)]
unsafe fn four(x: &Q8Block, k: usize) -> __m256i {
    debug_assert!(k < VECTORS);
    // SAFETY: bytes 4k..4k + 4 of the block's 32.
    unsafe { _mm256_set1_epi32(x.qs.as_ptr().add(4 * k).cast::<i32>().read_unaligned()) }
}

/// The sums by `vpmaddubsw`, unsigned bytes by signed ones in i16 pairs.
/// The nibble types multiply `u` by the input bytes and sum the pairs in
/// i16 over groups of vectors (the whole block for Q4_0 and Q4_1,
/// its halves for Q5_0), then in i32, less `OFFSET · Σ q_x` (see the
/// module's note on the bounds). Q8_0 multiplies `|q|` by the input bytes with `q`'s sign
/// (at most 2 · 128 · 128 a pair) and sums each vector's pairs to i32 at
/// once.
struct Maddubs<U>(std::marker::PhantomData<U>);

impl<U: Packed> HalfSums for Maddubs<U> {
    type Packed = U;

    #[inline(always)]
    unsafe fn sums<const T: usize>(half: Half<'_, T>) -> [__m256i; T] {
        // SAFETY: the caller's contract: chunk k (Q8_0) is the block's.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut s = [_mm256_setzero_si256(); T];
            if U::NIBBLES {
                // Vectors whose pairs are summed in i16 before i32.
                let group = if U::HIGH_BIT { VECTORS / 2 } else { VECTORS };
                let mut pairs = s;
                for k in 0..VECTORS {
                    let w = vector::<U>(half.quants, k);
                    for (pairs, x) in pairs.iter_mut().zip(half.x) {
                        *pairs = _mm256_add_epi16(*pairs, _mm256_maddubs_epi16(w, four(x, k)));
                    }
                    if (k + 1) % group == 0 {
                        for (s, pairs) in s.iter_mut().zip(&mut pairs) {
                            *s = _mm256_add_epi32(*s, _mm256_madd_epi16(*pairs, ones));
                            *pairs = _mm256_setzero_si256();
                        }
                    }
                }
                for (s, sum_x) in s.iter_mut().zip(half.sum_x) {
                    *s = _mm256_sub_epi32(*s, _mm256_set1_epi32(U::OFFSET * sum_x));
                }
            } else {
                for k in 0..VECTORS {
                    let w = _mm256_loadu_si256(half.quants.add(k * CHUNK_BYTES).cast());
                    let magnitude = _mm256_sign_epi8(w, w);
                    for (s, x) in s.iter_mut().zip(half.x) {
                        let signed = _mm256_sign_epi8(four(x, k), w);
                        let pairs = _mm256_maddubs_epi16(magnitude, signed);
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
            s
        }
    }
}

/// A 256-bit `vpdpbusd`: `acc` plus, per i32 lane, the four products of
/// unsigned bytes `u` with signed bytes `s`, without saturation (the K-quant
/// panels' kernel, `avx2_k.rs`, uses it too).
pub(super) trait Dot {
    /// # Safety
    /// The CPU has the instruction and the call is inlined into a function
    /// compiled with it.
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// AVX-VNNI's VEX-encoded `vpdpbusd`.
pub(super) struct AvxVnni;

impl Dot for AvxVnni {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller guarantees avxvnni.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

/// The sums by `vpdpbusd` (`D`) of the unsigned weights of `U`, from
/// `-OFFSET · Σ q_x`; with one or two inputs, in two chains of four
/// (added exactly), as the eight dependent products would be
/// latency-bound.
struct Dpbusd<U, D>(std::marker::PhantomData<(U, D)>);

impl<U: Packed, D: Dot> HalfSums for Dpbusd<U, D> {
    type Packed = U;

    #[inline(always)]
    unsafe fn sums<const T: usize>(half: Half<'_, T>) -> [__m256i; T] {
        let Half { quants, x, sum_x } = half;
        // SAFETY: the caller's contract.
        unsafe {
            let mut s = sum_x.map(|sum| _mm256_set1_epi32(-U::OFFSET * sum));
            if T <= 2 {
                let mut t = [_mm256_setzero_si256(); T];
                for k in 0..VECTORS / 2 {
                    let (w, v) = (vector::<U>(quants, k), vector::<U>(quants, k + 4));
                    for i in 0..T {
                        s[i] = D::dpbusd(s[i], w, four(x[i], k));
                        t[i] = D::dpbusd(t[i], v, four(x[i], k + 4));
                    }
                }
                for (s, t) in s.iter_mut().zip(t) {
                    *s = _mm256_add_epi32(*s, t);
                }
            } else {
                for k in 0..VECTORS {
                    let w = vector::<U>(quants, k);
                    for (s, x) in s.iter_mut().zip(x) {
                        *s = D::dpbusd(*s, w, four(x, k));
                    }
                }
            }
            s
        }
    }
}

/// One panel against its `T` inputs: `out[i * 16 + l] = row l · input i`.
/// One or two inputs take both halves in one pass over the panel (a pass
/// per half reads its cache lines twice: 1B-shape Q4_0 decode took 0.87 s
/// for 15 tokens so, 0.60 s in one pass); more take a half at a time, as
/// the accumulators of both would not fit the registers.
///
/// # Safety
/// The CPU has avx2, fma, f16c and what `H` uses; inlined into a function
/// compiled with them.
#[inline(always)]
unsafe fn tile<H: HalfSums, const T: usize>(part: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    assert_eq!(part.panels.len(), part.n_blocks * H::Packed::RECORD_BYTES);
    debug_assert_eq!((part.n, out.len()), (T, T * PANEL_ROWS));
    // SAFETY: the caller's contract, and the panel's length checked above.
    unsafe {
        if T <= 2 {
            halves::<H, T, 2>(part, 0, out);
        } else {
            halves::<H, T, 1>(part, 0, out);
            halves::<H, T, 1>(part, 1, out);
        }
    }
}

/// Halves `first..first + N` of [`tile`]'s panel against its inputs.
///
/// # Safety
/// As [`tile`], and the panel is `n_blocks` records of `H`'s type.
#[inline(always)]
unsafe fn halves<H: HalfSums, const T: usize, const N: usize>(
    part: PanelProduct<'_, Q8Block>,
    first: usize,
    out: &mut [f32],
) {
    let PanelProduct {
        panels: panel,
        n_blocks,
        xq,
        sums,
        prefetch_stride,
        ..
    } = part;
    let record_bytes = H::Packed::RECORD_BYTES;
    // SAFETY: the caller's features.
    let mut acc: [[__m256; T]; N] = [[unsafe { _mm256_setzero_ps() }; T]; N];
    for b in 0..n_blocks {
        let x: [&Q8Block; T] = std::array::from_fn(|i| &xq[i * n_blocks + b]);
        let sum_x: [i32; T] = std::array::from_fn(|i| sums[i * n_blocks + b]);
        if N == 2 {
            let ahead = panel
                .as_ptr()
                .wrapping_add(b * record_bytes + PREFETCH_BYTES);
            prefetch_lines(ahead, record_bytes, prefetch_stride, prefetch_line);
        }
        for (half, acc) in (first..).zip(&mut acc) {
            // SAFETY: record b lies within the panel (the caller's
            // contract): 32 bytes of scales, this half's 16 of them at `2
            // * 8 * half`, Q4_1's minimums likewise, then Q5_0's `qh` lanes
            // and the chunks, this half's lanes at `32 * half` in each; the
            // features are the caller's.
            unsafe {
                let record = panel.as_ptr().add(b * record_bytes);
                let f16s = |at: usize| {
                    _mm256_cvtph_ps(_mm_loadu_si128(
                        record.add(at + 2 * HALF_ROWS * half).cast(),
                    ))
                };
                let scales = f16s(0);
                let quants = record.add(H::Packed::QUANTS_AT + CHUNK_BYTES / 2 * half);
                let s = H::sums::<T>(Half { quants, x, sum_x });
                for ((acc, x), s) in acc.iter_mut().zip(x).zip(s) {
                    let scale = _mm256_mul_ps(scales, _mm256_set1_ps(x.d));
                    *acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s), *acc);
                    if H::Packed::MINS {
                        *acc = _mm256_fmadd_ps(f16s(SCALE_BYTES), _mm256_set1_ps(x.sum), *acc);
                    }
                }
            }
        }
    }
    for (half, acc) in (first..).zip(acc) {
        for (out, acc) in out.chunks_exact_mut(PANEL_ROWS).zip(acc) {
            // SAFETY: `out` is 16 floats, this half's 8 at `8 * half`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(HALF_ROWS * half), acc) };
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::arch::x86_64::_mm256_dpbusd_epi32;

    use super::*;
    use crate::kernels::panel::simd_check::{assert_same_bits, candidates, lcg};
    use crate::kernels::panel::{avx512, portable};
    use crate::quant::block::QK;

    /// AVX-512 VNNI's `vpdpbusd` on 256-bit vectors: the operation of
    /// AVX-VNNI's in another encoding, so that the `AvxVnni` path's
    /// arithmetic runs on CPUs with AVX-512 VNNI and no AVX-VNNI.
    pub(in crate::kernels::panel) struct Avx512Vl;

    impl Dot for Avx512Vl {
        #[inline(always)]
        unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
            // SAFETY: the caller guarantees avx512vnni and avx512vl.
            unsafe { _mm256_dpbusd_epi32(acc, u, s) }
        }
    }

    /// [`dot_panels_vnni`] with [`Avx512Vl`].
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    unsafe fn dot_panels_evex(ty: GgmlType, product: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
        each_panel!(ty, Dpbusd<_, Avx512Vl>, product, out)
    }

    /// Panels of random quant (and Q5_0 `qh`) bytes and finite scales and
    /// minimums; block 0's bytes are all `extreme` (the largest weights'
    /// magnitudes: the bounds of the i16 sums).
    fn panels(ty: GgmlType, n_panels: usize, n_blocks: usize, extreme: u8) -> Vec<u8> {
        let mut next = lcg(11);
        let record_bytes = PANEL_ROWS * ty.block_bytes();
        let f16_bytes = if ty == GgmlType::Q4_1 { 2 } else { 1 } * SCALE_BYTES;
        let mut data: Vec<u8> = (0..n_panels * n_blocks * record_bytes)
            .map(|_| next() as u8)
            .collect();
        for (i, record) in data.chunks_exact_mut(record_bytes).enumerate() {
            for d in record[..f16_bytes].chunks_exact_mut(2) {
                let value = 0.001 + (next() % 1000) as f32 * 1e-5;
                let sign = if next().is_multiple_of(2) { 1.0 } else { -1.0 };
                d.copy_from_slice(&half::f16::from_f32(sign * value).to_le_bytes());
            }
            if i % n_blocks == 0 {
                record[f16_bytes..].fill(extreme);
            }
        }
        data
    }

    /// `n` inputs of `n_blocks` blocks with values in -127..=127 (as
    /// `Q8Block::quantize` gives), and their blocks' sums; block 0 of
    /// every input is all `extreme`.
    fn inputs(n: usize, n_blocks: usize, extreme: i8) -> (Vec<Q8Block>, Vec<i32>) {
        let mut next = lcg(5);
        let xq: Vec<Q8Block> = (0..n * n_blocks)
            .map(|i| {
                let qs: [i8; QK] = std::array::from_fn(|_| {
                    if i % n_blocks == 0 {
                        extreme
                    } else {
                        ((next() % 255) as i32 - 127) as i8
                    }
                });
                let d = 0.01 + (next() % 100) as f32 * 1e-3;
                let sum = d * qs.iter().map(|&q| f32::from(q)).sum::<f32>();
                Q8Block { d, sum, qs }
            })
            .collect();
        let sums = xq
            .iter()
            .map(|x| x.qs.iter().map(|&q| i32::from(q)).sum())
            .collect();
        (xq, sums)
    }

    /// The AVX2 kernel, the AVX-VNNI one (in either encoding the CPU
    /// runs) and the AVX-512 one give the portable kernel's bits, for tiles
    /// of every size and at the integer sums' extremes, prefetching or not.
    #[test]
    fn simd_panel_products_equal_the_portable_bits() {
        let candidates = candidates(
            dot_panels,
            dot_panels_vnni,
            dot_panels_evex,
            avx512::dot_panels,
        );
        let n_blocks = 3;
        let nibbles = [0x00, 0xFF, 0x88];
        for (ty, extremes) in [
            (GgmlType::Q4_0, nibbles),
            (GgmlType::Q4_1, nibbles),
            (GgmlType::Q5_0, nibbles),
            (GgmlType::Q8_0, [0x80, 0x7F, 0x81]),
        ] {
            for (extreme_w, extreme_x) in extremes.into_iter().zip([127, -127, 127]) {
                assert_same_bits(
                    &candidates,
                    portable::dot_panels,
                    (ty, &panels(ty, 2, n_blocks, extreme_w), n_blocks),
                    &[1, 2, 3, 4, 5, 6, 7, 8, 9, 17],
                    |n| inputs(n, n_blocks, extreme_x),
                    &format!("weights {extreme_w:#x}, input {extreme_x}"),
                );
            }
        }
    }
}
