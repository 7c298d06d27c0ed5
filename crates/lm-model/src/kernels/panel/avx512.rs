//! The panel products on AVX-512 with VNNI: a panel's block is eight
//! vectors of 16 lanes (one lane per row, four weights per lane, as
//! unsigned bytes `u = q + OFFSET`), and for each input of a tile eight
//! `vpdpbusd`s with four of its bytes broadcast to every lane sum the
//! block, starting from `-OFFSET · Σ q_x` so that the lanes hold the exact
//! `Σ q_w q_x`. Then one conversion, one scale product and one fused
//! multiply-add finish the block for the sixteen rows, in the order
//! `quant/packed.rs` states (the portable kernel's bits).
//!
//! Every function requires avx2, fma, f16c, avx512f, avx512bw, avx512vl and
//! avx512vnni, which callers check through a `Dispatch`.

use std::arch::x86_64::{
    __m512, __m512i, _MM_HINT_T0, _mm_prefetch, _mm256_loadu_si256, _mm512_add_epi32,
    _mm512_and_si512, _mm512_cvtepi32_ps, _mm512_cvtph_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps,
    _mm512_loadu_si512, _mm512_mul_ps, _mm512_set1_epi8, _mm512_set1_epi32, _mm512_set1_ps,
    _mm512_setzero_ps, _mm512_setzero_si512, _mm512_srli_epi16, _mm512_storeu_ps, _mm512_xor_si512,
};

use super::MAX_TILE;
use super::PanelProduct;
use crate::quant::GgmlType;
use crate::quant::activation::Q8Block;
use crate::quant::packed::{CHUNK_BYTES, PANEL_ROWS, SCALE_BYTES};

/// Vectors of weights per block: 32 weights in lanes of four.
const CHUNKS: usize = 8;

/// How far ahead of the block being multiplied a pass with one or two
/// inputs asks for its lines: a panel is one stream, which the hardware
/// prefetcher alone left 1B-shape Q8_0 decode at a third of the read
/// bandwidth (its loads stalled on memory; `perf annotate`).
const PREFETCH_BYTES: usize = 2048;

/// See [`Dispatch::dot_panels`](crate::kernels::dispatch::Dispatch::dot_panels).
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and
/// avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_panels(ty: GgmlType, product: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    match ty {
        GgmlType::Q4_0 => each_panel::<Q4_0>(product, out),
        GgmlType::Q8_0 => each_panel::<Q8_0>(product, out),
        _ => unreachable!("{ty} is not packed"),
    }
}

/// How a packed type's block becomes [`CHUNKS`] vectors of unsigned bytes.
trait Unpack {
    /// Bytes of a panel's block: the scales, then the chunks.
    const RECORD_BYTES: usize;
    /// What the unsigned bytes exceed the weights by.
    const OFFSET: i32;
    /// The block's weights from its chunks at `quants`.
    ///
    /// # Safety
    /// `quants` points at the block's chunks; the CPU has the features of
    /// [`dot_panels`].
    unsafe fn unpack(quants: *const u8) -> [__m512i; CHUNKS];
}

/// Q4_0: four chunks of nibbles; the low nibbles are weights 0..16, the
/// high ones 16..32, so chunk `c`'s low nibbles meet input bytes `4c..`
/// and its high ones bytes `16 + 4c..`, the vectors `c` and `4 + c`.
struct Q4_0;

impl Unpack for Q4_0 {
    const RECORD_BYTES: usize = PANEL_ROWS * 18;
    const OFFSET: i32 = 8;

    #[inline(always)]
    unsafe fn unpack(quants: *const u8) -> [__m512i; CHUNKS] {
        // SAFETY: the caller's contract: the CPU's features, and four
        // chunks at `quants`.
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            let chunk = |c: usize| _mm512_loadu_si512(quants.add(c * CHUNK_BYTES).cast());
            let (c0, c1, c2, c3) = (chunk(0), chunk(1), chunk(2), chunk(3));
            let high = |v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
            [
                _mm512_and_si512(c0, low),
                _mm512_and_si512(c1, low),
                _mm512_and_si512(c2, low),
                _mm512_and_si512(c3, low),
                high(c0),
                high(c1),
                high(c2),
                high(c3),
            ]
        }
    }
}

/// Q8_0: eight chunks of signed bytes, made unsigned by flipping the sign
/// bit (`q + 128`).
struct Q8_0;

impl Unpack for Q8_0 {
    const RECORD_BYTES: usize = PANEL_ROWS * 34;
    const OFFSET: i32 = 128;

    #[inline(always)]
    unsafe fn unpack(quants: *const u8) -> [__m512i; CHUNKS] {
        // SAFETY: the caller's contract: the CPU's features, and eight
        // chunks at `quants`.
        unsafe {
            let sign = _mm512_set1_epi8(0x80u8 as i8);
            let mut weights = [sign; CHUNKS];
            for (c, w) in weights.iter_mut().enumerate() {
                *w = _mm512_xor_si512(_mm512_loadu_si512(quants.add(c * CHUNK_BYTES).cast()), sign);
            }
            weights
        }
    }
}

/// Every panel of `panels` against every input, tiles of up to
/// [`MAX_TILE`] inputs at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn each_panel<U: Unpack>(product: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    let n_blocks = product.n_blocks;
    product.each_tile(
        n_blocks * U::RECORD_BYTES,
        MAX_TILE,
        out,
        |panel, part, out| {
            let (x, s) = (part.xq, part.sums);
            match part.n {
                1 => tile::<U, 1>(panel, n_blocks, x, s, out),
                2 => tile::<U, 2>(panel, n_blocks, x, s, out),
                3 => tile::<U, 3>(panel, n_blocks, x, s, out),
                4 => tile::<U, 4>(panel, n_blocks, x, s, out),
                5 => tile::<U, 5>(panel, n_blocks, x, s, out),
                6 => tile::<U, 6>(panel, n_blocks, x, s, out),
                7 => tile::<U, 7>(panel, n_blocks, x, s, out),
                8 => tile::<U, 8>(panel, n_blocks, x, s, out),
                size => unreachable!("a tile of {size} inputs"),
            }
        },
    );
}

/// One panel against `T` inputs (`xq` and `sums` hold `T * n_blocks`
/// entries): `out[i * 16 + l] = row l · input i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile<U: Unpack, const T: usize>(
    panel: &[u8],
    n_blocks: usize,
    xq: &[Q8Block],
    sums: &[i32],
    out: &mut [f32],
) {
    debug_assert_eq!(panel.len(), n_blocks * U::RECORD_BYTES);
    debug_assert_eq!(
        (xq.len(), sums.len(), out.len()),
        (T * n_blocks, T * n_blocks, T * PANEL_ROWS)
    );
    let mut acc: [__m512; T] = [_mm512_setzero_ps(); T];
    for b in 0..n_blocks {
        if T <= 2 {
            let ahead = panel
                .as_ptr()
                .wrapping_add(b * U::RECORD_BYTES + PREFETCH_BYTES);
            for line in (0..U::RECORD_BYTES).step_by(64) {
                // A prefetch does not fault, whatever the address; the
                // pointer is never dereferenced.
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
            }
        }
        // SAFETY: record b lies within the panel (its length checked
        // above): 32 bytes of scales, then the chunks `U` reads.
        let (scales, weights) = unsafe {
            let record = panel.as_ptr().add(b * U::RECORD_BYTES);
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(record.cast())),
                U::unpack(record.add(SCALE_BYTES)),
            )
        };
        for (i, acc) in acc.iter_mut().enumerate() {
            let x = &xq[i * n_blocks + b];
            // SAFETY: bytes 4c..4c + 4 of the block's 32.
            let four = |c: usize| unsafe {
                _mm512_set1_epi32(x.qs.as_ptr().add(4 * c).cast::<i32>().read_unaligned())
            };
            let mut s = _mm512_set1_epi32(-U::OFFSET * sums[i * n_blocks + b]);
            if T <= 2 {
                // Few inputs leave the eight dependent `vpdpbusd`s
                // latency-bound: two chains of four, added (exactly).
                let mut t = _mm512_setzero_si512();
                for c in 0..CHUNKS / 2 {
                    s = _mm512_dpbusd_epi32(s, weights[c], four(c));
                    t = _mm512_dpbusd_epi32(t, weights[c + 4], four(c + 4));
                }
                s = _mm512_add_epi32(s, t);
            } else {
                for (c, &w) in weights.iter().enumerate() {
                    s = _mm512_dpbusd_epi32(s, w, four(c));
                }
            }
            let scale = _mm512_mul_ps(scales, _mm512_set1_ps(x.d));
            *acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), *acc);
        }
    }
    for (out, acc) in out.chunks_exact_mut(PANEL_ROWS).zip(acc) {
        // SAFETY: `out` is 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }
}
