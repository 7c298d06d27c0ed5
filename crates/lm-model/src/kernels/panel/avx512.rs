//! The panel products on AVX-512 with VNNI: a panel's block is eight
//! vectors of 16 lanes (one lane per row, four weights per lane, as
//! unsigned bytes `u = q + OFFSET`), and for each input of a tile eight
//! `vpdpbusd`s with four of its bytes broadcast to every lane sum the
//! block, starting from `-OFFSET · Σ q_x` so that the lanes hold the exact
//! `Σ q_w q_x`. Then one conversion, one scale product and one fused
//! multiply-add finish the block for the sixteen rows, in the order
//! `quant/packed.rs` states (the portable kernel's bits), and for Q4_1 one
//! more fused multiply-add of the rows' minimums by the input block's sum.
//!
//! Every function requires avx2, fma, f16c, avx512f, avx512bw, avx512vl and
//! avx512vnni, which callers check through a `Dispatch`.

use std::arch::x86_64::{
    __m512, __m512i, _mm256_loadu_si256, _mm512_add_epi32, _mm512_and_si512, _mm512_cvtepi32_ps,
    _mm512_cvtph_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_loadu_si512, _mm512_mul_ps,
    _mm512_or_si512, _mm512_set1_epi8, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_setzero_si512, _mm512_slli_epi16, _mm512_srli_epi16, _mm512_storeu_ps, _mm512_xor_si512,
};

use super::{
    MAX_TILE, Packed, PanelProduct, Q4_0, Q4_1, Q5_0, Q8_0, prefetch_ahead, prefetch_lines,
};
use crate::quant::GgmlType;
use crate::quant::activation::Q8Block;
use crate::quant::packed::{CHUNK_BYTES, PANEL_ROWS, SCALE_BYTES};

/// Vectors of weights per block: 32 weights in lanes of four.
const CHUNKS: usize = 8;

/// See [`Dispatch::dot_panels`](crate::kernels::dispatch::Dispatch::dot_panels).
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and
/// avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_panels(ty: GgmlType, product: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    match ty {
        GgmlType::Q4_0 => each_panel::<Q4_0>(product, out),
        GgmlType::Q4_1 => each_panel::<Q4_1>(product, out),
        GgmlType::Q5_0 => each_panel::<Q5_0>(product, out),
        GgmlType::Q8_0 => each_panel::<Q8_0>(product, out),
        _ => unreachable!("{ty} is not packed"),
    }
}

unsigned_vector!(
    vector,
    __m512i,
    _mm512_loadu_si512,
    _mm512_and_si512,
    _mm512_or_si512,
    _mm512_slli_epi16,
    _mm512_srli_epi16,
    _mm512_xor_si512,
    _mm512_set1_epi8
);

/// `acc` plus the products of a run's eight vectors of unsigned bytes
/// `weights` with the input's bytes `x(c)` for vector `c` (`vpdpbusd`,
/// exact in i32). With one or two inputs (`T <= 2`) eight dependent
/// products would be latency-bound: two chains of four, added (exactly).
///
/// # Safety
/// The CPU has avx512f and avx512vnni, and the call is inlined into a
/// function compiled with them.
#[inline(always)]
pub(super) unsafe fn dpbusd_run<const T: usize>(
    acc: __m512i,
    weights: &[__m512i; CHUNKS],
    x: impl Fn(usize) -> __m512i,
) -> __m512i {
    // SAFETY: the caller's features.
    unsafe {
        let mut s = acc;
        if T <= 2 {
            let mut t = _mm512_setzero_si512();
            for c in 0..CHUNKS / 2 {
                s = _mm512_dpbusd_epi32(s, weights[c], x(c));
                t = _mm512_dpbusd_epi32(t, weights[c + 4], x(c + 4));
            }
            _mm512_add_epi32(s, t)
        } else {
            for (c, &w) in weights.iter().enumerate() {
                s = _mm512_dpbusd_epi32(s, w, x(c));
            }
            s
        }
    }
}

/// Every panel of `panels` against every input, tiles of up to
/// [`MAX_TILE`] inputs at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn each_panel<U: Packed>(product: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    let panel_bytes = product.n_blocks * U::RECORD_BYTES;
    product.each_tile(panel_bytes, MAX_TILE, out, |_, part, out| match part.n {
        1 => tile::<U, 1>(part, out),
        2 => tile::<U, 2>(part, out),
        3 => tile::<U, 3>(part, out),
        4 => tile::<U, 4>(part, out),
        5 => tile::<U, 5>(part, out),
        6 => tile::<U, 6>(part, out),
        7 => tile::<U, 7>(part, out),
        8 => tile::<U, 8>(part, out),
        size => unreachable!("a tile of {size} inputs"),
    });
}

/// One panel against its `T` inputs: `out[i * 16 + l] = row l · input i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile<U: Packed, const T: usize>(part: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    let (panel, n_blocks) = (part.panels, part.n_blocks);
    assert_eq!(panel.len(), n_blocks * U::RECORD_BYTES);
    debug_assert_eq!((part.n, out.len()), (T, T * PANEL_ROWS));
    let mut acc: [__m512; T] = [_mm512_setzero_ps(); T];
    for b in 0..n_blocks {
        if T <= 2 {
            let record = panel.as_ptr().wrapping_add(b * U::RECORD_BYTES);
            prefetch_lines(
                record,
                U::RECORD_BYTES,
                part.prefetch_stride,
                prefetch_ahead,
            );
        }
        // SAFETY: record b lies within the panel (its length asserted
        // above): 32 bytes of scales, Q4_1's 32 of minimums or Q5_0's 64 of
        // `qh`, then the chunks `U` has.
        let (scales, mins, weights) = unsafe {
            let record = panel.as_ptr().add(b * U::RECORD_BYTES);
            let quants = record.add(U::QUANTS_AT);
            let weights: [__m512i; CHUNKS] = std::array::from_fn(|k| vector::<U>(quants, k));
            let mins = if U::MINS {
                _mm512_cvtph_ps(_mm256_loadu_si256(record.add(SCALE_BYTES).cast()))
            } else {
                _mm512_setzero_ps()
            };
            let scales = _mm512_cvtph_ps(_mm256_loadu_si256(record.cast()));
            (scales, mins, weights)
        };
        for (i, acc) in acc.iter_mut().enumerate() {
            let x = &part.xq[i * n_blocks + b];
            // SAFETY: bytes 4c..4c + 4 of the block's 32.
            let four = |c: usize| unsafe {
                _mm512_set1_epi32(x.qs.as_ptr().add(4 * c).cast::<i32>().read_unaligned())
            };
            let start = _mm512_set1_epi32(-U::OFFSET * part.sums[i * n_blocks + b]);
            // SAFETY: this function's features.
            let s = unsafe { dpbusd_run::<T>(start, &weights, four) };
            let scale = _mm512_mul_ps(scales, _mm512_set1_ps(x.d));
            *acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), *acc);
            if U::MINS {
                *acc = _mm512_fmadd_ps(mins, _mm512_set1_ps(x.sum), *acc);
            }
        }
    }
    for (out, acc) in out.chunks_exact_mut(PANEL_ROWS).zip(acc) {
        // SAFETY: `out` is 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }
}
