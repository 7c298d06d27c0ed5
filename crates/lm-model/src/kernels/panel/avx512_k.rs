//! The K-quant panel products on AVX-512 with VNNI (layouts and arithmetic
//! in `quant/packed_k.rs`; the portable kernel's bits).
//!
//! A super-block's values are unpacked per run of 32 (Q4_K: a sub-block,
//! one nibble of eight pieces) or 16 (Q6_K: a group, a nibble of four `ql`
//! pieces with two bits of four `qh` pieces), into vectors of sixteen
//! lanes, one lane per row and four unsigned values per lane, that every
//! input of a tile multiplies: `vpdpbusd` with four of the input's bytes
//! broadcast sums a run for sixteen rows, `vpmulld` scales it by each row's
//! integer scale and the super-block's sum stays exact in i32. Q4_K's
//! minimums meet the input's sums of 32 by `vpdpwssd` on pairs of 16-bit
//! lanes; Q6_K's offset of 32 starts each group's sum at `-32 Σ x.qs`.
//! Then one conversion and one (Q6_K) or two (Q4_K) fused multiply-adds per
//! super-block finish sixteen rows.
//!
//! Every function requires avx2, fma, f16c, avx512f, avx512bw, avx512vl and
//! avx512vnni, which callers check through a `Dispatch`.

use std::arch::x86_64::{
    __m512, __m512i, _mm256_loadu_si256, _mm512_add_epi32, _mm512_and_si512, _mm512_cvtepi32_ps,
    _mm512_cvtph_ps, _mm512_dpbusd_epi32, _mm512_dpwssd_epi32, _mm512_fmadd_ps, _mm512_fnmadd_ps,
    _mm512_loadu_si512, _mm512_mul_ps, _mm512_mullo_epi32, _mm512_or_si512, _mm512_set1_epi8,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_slli_epi16,
    _mm512_slli_epi32, _mm512_srai_epi32, _mm512_srli_epi16, _mm512_srli_epi32, _mm512_storeu_ps,
    _mm512_ternarylogic_epi32,
};

use super::avx512::dpbusd_run;
use super::{PanelProduct, prefetch_ahead};
use crate::quant::GgmlType;
use crate::quant::activation::Q8KBlock;
use crate::quant::packed::PANEL_ROWS;
use crate::quant::packed_k::{PIECE_BYTES, q4_k, q6_k};

/// The most inputs that share one unpacking of a super-block. Four: the
/// tile's accumulators, integer sums and a run's vectors then fit the 32
/// registers. Measured on Zen 4 (one thread, 64 inputs, 2048 x 8192
/// and 32768 x 2048): tiles of 8 spill and run Q6_K 25% slower than tiles
/// of 4, and Q4_K no faster; tiles of 6 sit between.
const MAX_TILE: usize = 4;

/// See [`Dispatch::dot_panels`](crate::kernels::dispatch::Dispatch::dot_panels).
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and
/// avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_panels_k(
    ty: GgmlType,
    product: PanelProduct<'_, Q8KBlock>,
    out: &mut [f32],
) {
    let panel_bytes = product.n_blocks * PANEL_ROWS * ty.block_bytes();
    // Passes with one or two inputs that prefetch (`prefetch_stride`, as
    // `Dispatch::prefetches_panels` decides per CPU) ask for each line of a
    // record ahead into L1 and L2 where they first load it (`AHEAD`,
    // `prefetch_ahead`).
    product.each_tile(panel_bytes, MAX_TILE, out, |_, part, out| {
        macro_rules! tile {
            ($f:ident) => {
                match (part.n, part.prefetch_stride != 0) {
                    (1, true) => $f::<1, true>(part, out),
                    (1, false) => $f::<1, false>(part, out),
                    (2, true) => $f::<2, true>(part, out),
                    (2, false) => $f::<2, false>(part, out),
                    (3, _) => $f::<3, false>(part, out),
                    (4, _) => $f::<4, false>(part, out),
                    (size, _) => unreachable!("a tile of {size} inputs"),
                }
            };
        }
        match ty {
            GgmlType::Q4_K => tile!(tile_q4_k),
            GgmlType::Q6_K => tile!(tile_q6_k),
            _ => unreachable!("{ty} is not a packed K-quant"),
        }
    });
}

/// Byte `k` (0..4) of every 32-bit lane of `v`, zero-extended.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn unsigned_byte(v: __m512i, k: usize) -> __m512i {
    let byte = _mm512_set1_epi32(0xFF);
    match k {
        0 => _mm512_and_si512(v, byte),
        1 => _mm512_and_si512(_mm512_srli_epi32::<8>(v), byte),
        2 => _mm512_and_si512(_mm512_srli_epi32::<16>(v), byte),
        _ => _mm512_srli_epi32::<24>(v),
    }
}

/// Byte `k` (0..4) of every 32-bit lane of `v`, sign-extended.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn signed_byte(v: __m512i, k: usize) -> __m512i {
    match k {
        0 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(v)),
        1 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(v)),
        2 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(v)),
        _ => _mm512_srai_epi32::<24>(v),
    }
}

/// Four bytes of `qs` from `at`, in every lane.
///
/// # Safety
/// `at + 4 <= qs.len()` (256).
#[inline(always)]
unsafe fn four(qs: &[i8], at: usize) -> __m512i {
    // SAFETY: the caller's bound; the caller's features.
    unsafe { _mm512_set1_epi32(qs.as_ptr().add(at).cast::<i32>().read_unaligned()) }
}

/// Calls `$f::<$t, $a, J>($args)` for every `J` listed, in order: the
/// runs of a super-block with their indices as constants, so that each
/// run's shifts and selections are fixed at compile time.
macro_rules! each_const {
    ($f:ident::<$t:ident, $a:ident> $args:tt, [$($j:literal),*]) => {
        $($f::<$t, $a, $j> $args;)*
    };
}

/// The frame of a K-quant tile: calls `block(record, x, acc)` for each of
/// the panel's records (`record_bytes` each) with the tile's `T` input
/// blocks of that super-block and their accumulators, then stores the
/// accumulators: `out[i * 16 + l] = row l · input i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn each_record<const T: usize>(
    part: PanelProduct<'_, Q8KBlock>,
    record_bytes: usize,
    out: &mut [f32],
    mut block: impl FnMut(*const u8, [&Q8KBlock; T], &mut [__m512; T]),
) {
    let PanelProduct {
        panels: panel,
        n_blocks,
        xq,
        ..
    } = part;
    assert_eq!(panel.len(), n_blocks * record_bytes);
    assert_eq!((xq.len(), out.len()), (T * n_blocks, T * PANEL_ROWS));
    let mut acc: [__m512; T] = [_mm512_setzero_ps(); T];
    for b in 0..n_blocks {
        // SAFETY: the record lies within the panel (its length asserted
        // above).
        let record = unsafe { panel.as_ptr().add(b * record_bytes) };
        block(
            record,
            std::array::from_fn(|i| &xq[i * n_blocks + b]),
            &mut acc,
        );
    }
    for (out, acc) in out.chunks_exact_mut(PANEL_ROWS).zip(acc) {
        // SAFETY: `out` is 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }
}

/// One Q4_K panel against its `T` inputs: `out[i * 16 + l] = row l ·
/// input i`. With `AHEAD`, each of a record's 36 lines is asked for
/// ahead into L1 and L2 as it is first loaded ([`prefetch_ahead`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_q4_k<const T: usize, const AHEAD: bool>(part: PanelProduct<'_, Q8KBlock>, out: &mut [f32]) {
    each_record::<T>(part, PANEL_ROWS * 144, out, |record, x, acc| {
        // SAFETY: the scales are inside the record (`packed_k`'s layout).
        let load = |at: usize| unsafe { load_ahead(record.add(at), AHEAD) };
        if AHEAD {
            prefetch_ahead(record.wrapping_add(q4_k::D));
        }
        let (scales, mins) = scales_mins_q4_k(
            load(q4_k::SCALES),
            load(q4_k::SCALES + PIECE_BYTES),
            load(q4_k::SCALES + 2 * PIECE_BYTES),
        );
        let mut sumi = [_mm512_setzero_si512(); T];
        // SAFETY: `record` is a whole record.
        unsafe {
            each_const!(
                sub_block_q4_k::<T, AHEAD>(record, &scales, &x, &mut sumi),
                [0, 1, 2, 3, 4, 5, 6, 7]
            );
        }
        // SAFETY: 32 bytes of f16 each at D and DMIN.
        let (d, dmin) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(record.add(q4_k::D).cast())),
                _mm512_cvtph_ps(_mm256_loadu_si256(record.add(q4_k::DMIN).cast())),
            )
        };
        // Minimums as 16-bit pairs: (m0, m2), (m1, m3), (m4, m6), (m5, m7).
        let words = _mm512_set1_epi32(0x00FF_00FF);
        let pairs = [
            _mm512_and_si512(mins[0], words),
            _mm512_and_si512(_mm512_srli_epi32::<8>(mins[0]), words),
            _mm512_and_si512(mins[1], words),
            _mm512_and_si512(_mm512_srli_epi32::<8>(mins[1]), words),
        ];
        for ((acc, sumi), x) in acc.iter_mut().zip(sumi).zip(x) {
            let sum32 = |j: usize| i32::from(x.bsums[2 * j]) + i32::from(x.bsums[2 * j + 1]);
            let pair =
                |lo: usize, hi: usize| _mm512_set1_epi32((sum32(lo) & 0xFFFF) | (sum32(hi) << 16));
            let mut summs = _mm512_dpwssd_epi32(_mm512_setzero_si512(), pairs[0], pair(0, 2));
            summs = _mm512_dpwssd_epi32(summs, pairs[1], pair(1, 3));
            summs = _mm512_dpwssd_epi32(summs, pairs[2], pair(4, 6));
            summs = _mm512_dpwssd_epi32(summs, pairs[3], pair(5, 7));
            let d_x = _mm512_set1_ps(x.d);
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(d, d_x), _mm512_cvtepi32_ps(sumi), *acc);
            *acc = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, d_x), _mm512_cvtepi32_ps(summs), *acc);
        }
    });
}

/// Sub-block `J` of a Q4_K record at `record` times each of the `T`
/// inputs `x`, scaled by the rows' scales (`scales`, four bytes a lane:
/// `scales_mins_q4_k`), added to `sumi`.
///
/// # Safety
/// `record` points at a whole Q4_K record; the CPU has the features of
/// [`dot_panels_k`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn sub_block_q4_k<const T: usize, const AHEAD: bool, const J: usize>(
    record: *const u8,
    scales: &[__m512i; 2],
    x: &[&Q8KBlock; T],
    sumi: &mut [__m512i; T],
) {
    // SAFETY: the caller's contract: pieces 8 (J / 2) .. + 8 are in the
    // record, and 32 J + 4 c + 4 <= 256.
    unsafe {
        let low4 = _mm512_set1_epi8(0x0F);
        let scale = unsigned_byte(scales[J / 4], J % 4);
        let pieces = record.add(q4_k::QS + 8 * (J / 2) * PIECE_BYTES);
        let weights: [__m512i; 8] = std::array::from_fn(|c| {
            // The even sub-block reads the pieces first; the odd one, again.
            let first = AHEAD && J.is_multiple_of(2);
            let v = load_ahead(pieces.add(c * PIECE_BYTES), first);
            let v = if J % 2 == 1 {
                _mm512_srli_epi16::<4>(v)
            } else {
                v
            };
            _mm512_and_si512(v, low4)
        });
        for (sumi, x) in sumi.iter_mut().zip(x) {
            let x = |c: usize| four(&x.qs, 32 * J + 4 * c);
            let s = dpbusd_run::<T>(_mm512_setzero_si512(), &weights, x);
            *sumi = _mm512_add_epi32(*sumi, _mm512_mullo_epi32(s, scale));
        }
    }
}

/// Q4_K's 12 bytes of 6-bit scales and minimums (pieces `a`, `b`, `c`:
/// bytes 0..4, 4..8, 8..12 of each row) as four bytes per lane each:
/// scales 0..4 and 4..8, minimums 0..4 and 4..8 (`block_k::scales_mins_k4`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scales_mins_q4_k(a: __m512i, b: __m512i, c: __m512i) -> ([__m512i; 2], [__m512i; 2]) {
    let low6 = _mm512_set1_epi8(0x3F);
    let low4 = _mm512_set1_epi8(0x0F);
    let top2 = _mm512_set1_epi8(0x30);
    // The top two bits of bytes 0..8, as bits 4 and 5 of the same byte.
    let high = |v: __m512i| _mm512_and_si512(_mm512_srli_epi32::<2>(v), top2);
    let scales = [
        _mm512_and_si512(a, low6),
        _mm512_or_si512(_mm512_and_si512(c, low4), high(a)),
    ];
    let mins = [
        _mm512_and_si512(b, low6),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(c), low4), high(b)),
    ];
    (scales, mins)
}

/// One Q6_K panel against its `T` inputs: `out[i * 16 + l] = row l ·
/// input i`. With `AHEAD`, each piece of a record asks for the lines
/// further on into L1 and L2 as it is first loaded ([`prefetch_ahead`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_q6_k<const T: usize, const AHEAD: bool>(part: PanelProduct<'_, Q8KBlock>, out: &mut [f32]) {
    each_record::<T>(part, PANEL_ROWS * 210, out, |record, x, acc| {
        if AHEAD {
            prefetch_ahead(record.wrapping_add(q6_k::D));
        }
        let mut sumi = [_mm512_setzero_si512(); T];
        // SAFETY: `record` is a whole record. Quarter Q = 2h + e holds the
        // groups 8h + 2t + e (t = 0..4), read in the record's order.
        unsafe {
            each_const!(
                group_q6_k::<T, AHEAD>(record, &x, &mut sumi),
                [0, 2, 4, 6, 1, 3, 5, 7]
            );
            each_const!(
                group_q6_k::<T, AHEAD>(record, &x, &mut sumi),
                [8, 10, 12, 14, 9, 11, 13, 15]
            );
        }
        // SAFETY: 32 bytes of f16 at D.
        let d = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(record.add(q6_k::D).cast())) };
        for ((acc, sumi), x) in acc.iter_mut().zip(sumi).zip(x) {
            let d_x = _mm512_set1_ps(x.d);
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(d, d_x), _mm512_cvtepi32_ps(sumi), *acc);
        }
    });
}

/// Group `G` (values 16G .. 16G + 16) of a Q6_K record at `record` times
/// each of the `T` inputs `x`, scaled by the rows' scales, added to `sumi`.
///
/// # Safety
/// `record` points at a whole Q6_K record; the CPU has the features of
/// [`dot_panels_k`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group_q6_k<const T: usize, const AHEAD: bool, const G: usize>(
    record: *const u8,
    x: &[&Q8KBlock; T],
    sumi: &mut [__m512i; T],
) {
    // G = 8h + 2t + e: sub-block 4h + t, half e of it, in quarter 2h + e.
    let (h, t, e) = (G / 8, G % 8 / 2, G % 2);
    // SAFETY: the caller's contract: the scales and the quarter's pieces
    // are in the record, and 16 G + 4 k + 4 <= 256.
    unsafe {
        let low4 = _mm512_set1_epi8(0x0F);
        let bits45 = _mm512_set1_epi8(0x30);
        // Each piece is asked for ahead where the record's order first
        // reads it: a scale piece by groups 0, 4, 8, 12; a quarter's `H`
        // and `A` pieces by its first group (t = 0), `B` by its second.
        let scale = signed_byte(
            load_ahead(
                record.add(q6_k::SCALES + G / 4 * PIECE_BYTES),
                AHEAD && G.is_multiple_of(4),
            ),
            G % 4,
        );
        let pieces = q6_k::QUARTERS + (2 * h + e) * q6_k::QUARTER_BYTES;
        // A loop rather than `array::from_fn`, whose closure the compiler
        // once left out of line here: a call per vector, and Q6_K streamed
        // 30% slower.
        let mut weights = [_mm512_setzero_si512(); 4];
        for (k, weight) in weights.iter_mut().enumerate() {
            let ql = load_ahead(
                record.add(pieces + q6_k::QL + (4 * (t % 2) + k) * PIECE_BYTES),
                AHEAD && t < 2,
            );
            let low = if t < 2 {
                _mm512_and_si512(ql, low4)
            } else {
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4)
            };
            let qh = load_ahead(
                record.add(pieces + q6_k::QH + k * PIECE_BYTES),
                AHEAD && t == 0,
            );
            // Bits 2t, 2t + 1 of each byte to bits 4, 5.
            let high = match t {
                0 => _mm512_slli_epi16::<4>(qh),
                1 => _mm512_slli_epi16::<2>(qh),
                2 => qh,
                _ => _mm512_srli_epi16::<2>(qh),
            };
            // low | (high & 0x30)
            *weight = _mm512_ternarylogic_epi32::<0xF8>(low, high, bits45);
        }
        for (sumi, x) in sumi.iter_mut().zip(x) {
            let mut s = _mm512_set1_epi32(-32 * i32::from(x.bsums[G]));
            for (k, &w) in weights.iter().enumerate() {
                s = _mm512_dpbusd_epi32(s, w, four(&x.qs, 16 * G + 4 * k));
            }
            *sumi = _mm512_add_epi32(*sumi, _mm512_mullo_epi32(s, scale));
        }
    }
}

/// The 64 bytes at `at`, first asking for the lines further on into L1
/// and L2 when `ahead` ([`prefetch_ahead`]).
///
/// # Safety
/// The 64 bytes at `at` are readable; the CPU has avx512f.
#[inline(always)]
unsafe fn load_ahead(at: *const u8, ahead: bool) -> __m512i {
    if ahead {
        prefetch_ahead(at);
    }
    // SAFETY: the caller's contract.
    unsafe { _mm512_loadu_si512(at.cast()) }
}
