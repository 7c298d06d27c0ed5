//! The K-quant panel products on AVX2 + FMA + F16C (`Kernel::Avx2`), and
//! with the 256-bit `vpdpbusd` of AVX-VNNI (`Kernel::AvxVnni`): layouts and
//! arithmetic in `quant/packed_k.rs`, the portable kernel's bits.
//!
//! A record's 64-byte pieces are two halves of eight rows (rows 0..8 in
//! the low 32 bytes, rows 8..16 in the high 32), one i32 or f32 lane per
//! row, unpacked as the AVX-512 kernel unpacks its sixteen lanes: per run
//! of 32 (Q4_K's sub-blocks, `N = 8` vectors of four unsigned values a
//! lane) or 16 (Q6_K's groups, `N = 4`), which every input of a tile
//! multiplies with four of its bytes broadcast. A run's exact sum, scaled
//! by each row's integer scale, is added to the super-block's i32 sum:
//! - AVX-VNNI: `vpdpbusd` from the run's offset (Q6_K: `-32 Σ x.qs` of the
//!   group), then `vpmulld` by the scale, as on AVX-512.
//! - AVX2: `vpmaddubsw` of the unsigned values with the input bytes, whose
//!   i16 pairs are at most `2 · u_max · 128` in magnitude; they are added
//!   in i16 over as many vectors as stay within 32,767 (all eight of
//!   Q4_K's nibbles, `u_max = 15`: 30,720; two of Q6_K's six-bit values,
//!   `u_max = 63`: 32,256), and `vpmaddwd` by the scale in both i16 halves
//!   of each lane turns them into the scaled i32 sum at once; Q6_K's offset
//!   is one `vpmulld` of the scale by `-32 Σ x.qs`.
//!
//! Q4_K's minimums meet the input's sums of 32 by `vpmaddwd` on pairs of
//! 16-bit lanes. One conversion and one (Q6_K) or two (Q4_K) fused
//! multiply-adds per super-block then finish eight rows per input.
//!
//! Inputs are tiled by up to [`TILE`]; one or two inputs take both halves
//! in one pass over the panel, more a half at a time (as `panel/avx2.rs`
//! does, for the registers).
//!
//! Every function requires avx2, fma and f16c (and the `_vnni` entry
//! avxvnni), which callers check through a `Dispatch`.

use std::arch::x86_64::{
    __m256, __m256i, _mm_loadu_si128, _mm256_add_epi16, _mm256_add_epi32, _mm256_and_si256,
    _mm256_cvtepi32_ps, _mm256_cvtph_ps, _mm256_fmadd_ps, _mm256_fnmadd_ps, _mm256_loadu_si256,
    _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_mul_ps, _mm256_mullo_epi32, _mm256_or_si256,
    _mm256_set1_epi8, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps, _mm256_setzero_si256,
    _mm256_slli_epi16, _mm256_slli_epi32, _mm256_srai_epi32, _mm256_srli_epi16, _mm256_srli_epi32,
    _mm256_storeu_ps,
};

use super::PanelProduct;
use super::avx2::{AvxVnni, Dot};
use crate::quant::GgmlType;
use crate::quant::activation::Q8KBlock;
use crate::quant::packed::PANEL_ROWS;
use crate::quant::packed_k::{PIECE_BYTES, q4_k, q6_k};

/// Rows of a half panel: one 256-bit vector of i32 or f32 lanes.
const HALF_ROWS: usize = PANEL_ROWS / 2;

/// Bytes of a half piece: four bytes of each of eight rows.
const HALF_BYTES: usize = PIECE_BYTES / 2;

/// The most inputs that share one unpacking of a half's super-block: their
/// sums, a run's vectors and the constants fit AVX2's sixteen registers.
const TILE: usize = 4;

/// Every panel of `$product` (`$ty`, Q4_K or Q6_K) against every input by
/// the run sums of `$s`, balanced tiles of up to [`TILE`] inputs at a time,
/// into `$out`. A macro written out in each `#[target_feature]` entry, so
/// that the tile closure is compiled with its features (`panel/avx2.rs`
/// says what a closure without them cost).
///
/// Safety: the CPU has avx2, fma, f16c and what `$s` uses.
macro_rules! each_panel_k {
    ($s:ty, $ty:expr, $product:expr, $out:expr) => {{
        let (ty, product): (GgmlType, PanelProduct<'_, Q8KBlock>) = ($ty, $product);
        let panel_bytes = product.n_blocks * PANEL_ROWS * ty.block_bytes();
        // SAFETY: the caller's features; the panels are whole panels of
        // `ty` (the `Dispatch::dot_panels` contract).
        product.each_tile(panel_bytes, TILE, $out, |_, part, out| unsafe {
            match (ty, part.n) {
                (GgmlType::Q4_K, 1) => tile::<$s, Q4K, 1>(part, out),
                (GgmlType::Q4_K, 2) => tile::<$s, Q4K, 2>(part, out),
                (GgmlType::Q4_K, 3) => tile::<$s, Q4K, 3>(part, out),
                (GgmlType::Q4_K, 4) => tile::<$s, Q4K, 4>(part, out),
                (GgmlType::Q6_K, 1) => tile::<$s, Q6K, 1>(part, out),
                (GgmlType::Q6_K, 2) => tile::<$s, Q6K, 2>(part, out),
                (GgmlType::Q6_K, 3) => tile::<$s, Q6K, 3>(part, out),
                (GgmlType::Q6_K, 4) => tile::<$s, Q6K, 4>(part, out),
                (ty, size) => unreachable!("{ty} in a tile of {size} inputs"),
            }
        })
    }};
}

/// See [`Dispatch::dot_panels`](crate::kernels::dispatch::Dispatch::dot_panels).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_panels_k(
    ty: GgmlType,
    product: PanelProduct<'_, Q8KBlock>,
    out: &mut [f32],
) {
    each_panel_k!(Maddubs, ty, product, out)
}

/// [`dot_panels_k`] with the byte products of AVX-VNNI (`vpdpbusd`).
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn dot_panels_k_vnni(
    ty: GgmlType,
    product: PanelProduct<'_, Q8KBlock>,
    out: &mut [f32],
) {
    each_panel_k!(Dpbusd<AvxVnni>, ty, product, out)
}

/// Four bytes of `qs` from `at`, in every lane.
///
/// # Safety
/// `at + 4 <= 256`; the CPU has avx2 (inlined into a function compiled
/// with it).
#[inline(always)]
unsafe fn four(qs: &[i8; 256], at: usize) -> __m256i {
    debug_assert!(at + 4 <= qs.len());
    // SAFETY: the caller's bound.
    unsafe { _mm256_set1_epi32(qs.as_ptr().add(at).cast::<i32>().read_unaligned()) }
}

/// Half `h`'s 32 bytes of the piece at `at` of `record`.
///
/// # Safety
/// The piece lies in the record; the CPU has avx2 (inlined).
#[inline(always)]
unsafe fn load(record: *const u8, at: usize, h: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_loadu_si256(record.add(at + h * HALF_BYTES).cast()) }
}

/// How a run's exact integer sum with each input of a tile is taken and
/// scaled.
trait RunSums {
    /// For each input `i` and lane `l`: `sumi[i] += scale[l] · (offset[i] +
    /// Σ_k Σ_b w[k][l, b] · x[i].qs[at + 4k + b])`, exactly in i32, where
    /// every byte of `w` is at most `U_MAX` (unsigned) and `scale` holds
    /// signed values of at most 8 bits; `offset` is `None` for none.
    ///
    /// # Safety
    /// `at + 4 N <= 256`; the CPU has the instructions the implementation
    /// uses and the call is inlined into a function compiled with them.
    unsafe fn add_scaled<const T: usize, const N: usize, const U_MAX: i32>(
        w: &[__m256i; N],
        x: &[&Q8KBlock; T],
        at: usize,
        offset: Option<[i32; T]>,
        scale: __m256i,
        sumi: &mut [__m256i; T],
    );
}

/// The sums by `vpmaddubsw` in i16, scaled by `vpmaddwd` (the module docs
/// give the bounds).
struct Maddubs;

impl RunSums for Maddubs {
    #[inline(always)]
    unsafe fn add_scaled<const T: usize, const N: usize, const U_MAX: i32>(
        w: &[__m256i; N],
        x: &[&Q8KBlock; T],
        at: usize,
        offset: Option<[i32; T]>,
        scale: __m256i,
        sumi: &mut [__m256i; T],
    ) {
        // Vectors whose i16 pairs add up without overflow: each pair is
        // at most 2 U_MAX 128 in magnitude.
        let group = (i16::MAX as i32 / (2 * U_MAX * 128)) as usize;
        debug_assert!(group >= 1);
        // SAFETY: the caller's contract.
        unsafe {
            // The scale in both i16 halves of each lane.
            let scale16 = _mm256_or_si256(
                _mm256_and_si256(scale, _mm256_set1_epi32(0xFFFF)),
                _mm256_slli_epi32::<16>(scale),
            );
            for i in 0..T {
                let mut s = sumi[i];
                for (c, run) in w.chunks(group).enumerate() {
                    let mut pairs = _mm256_setzero_si256();
                    for (j, &w) in run.iter().enumerate() {
                        let x = four(&x[i].qs, at + 4 * (c * group + j));
                        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w, x));
                    }
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(pairs, scale16));
                }
                if let Some(offset) = offset {
                    let o = _mm256_mullo_epi32(scale, _mm256_set1_epi32(offset[i]));
                    s = _mm256_add_epi32(s, o);
                }
                sumi[i] = s;
            }
        }
    }
}

/// The sums by `vpdpbusd` (`D`) from the offset, then `vpmulld` by the
/// scale; one input's eight products in two chains (added exactly), as
/// eight dependent ones would be latency-bound.
struct Dpbusd<D>(std::marker::PhantomData<D>);

impl<D: Dot> RunSums for Dpbusd<D> {
    #[inline(always)]
    unsafe fn add_scaled<const T: usize, const N: usize, const U_MAX: i32>(
        w: &[__m256i; N],
        x: &[&Q8KBlock; T],
        at: usize,
        offset: Option<[i32; T]>,
        scale: __m256i,
        sumi: &mut [__m256i; T],
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            for i in 0..T {
                let mut s = match offset {
                    Some(offset) => _mm256_set1_epi32(offset[i]),
                    None => _mm256_setzero_si256(),
                };
                if T == 1 && N == 8 {
                    let mut t = _mm256_setzero_si256();
                    for k in 0..N / 2 {
                        s = D::dpbusd(s, w[k], four(&x[i].qs, at + 4 * k));
                        t = D::dpbusd(t, w[k + 4], four(&x[i].qs, at + 4 * (k + 4)));
                    }
                    s = _mm256_add_epi32(s, t);
                } else {
                    for (k, &w) in w.iter().enumerate() {
                        s = D::dpbusd(s, w, four(&x[i].qs, at + 4 * k));
                    }
                }
                sumi[i] = _mm256_add_epi32(sumi[i], _mm256_mullo_epi32(s, scale));
            }
        }
    }
}

/// A packed K-quant as the kernel reads one half of its records.
trait KQuant {
    /// Bytes of a record.
    const RECORD_BYTES: usize;

    /// Half `h` of the record at `record` against the tile's inputs `x`
    /// (their blocks of this super-block), added to `acc`.
    ///
    /// # Safety
    /// `record` points at a whole record; the CPU has avx2, fma, f16c and
    /// what `S` uses, and the call is inlined into a function compiled
    /// with them.
    unsafe fn half<S: RunSums, const T: usize>(
        record: *const u8,
        h: usize,
        x: &[&Q8KBlock; T],
        acc: &mut [__m256; T],
    );
}

/// One panel against its `T` inputs: `out[i * 16 + l] = row l · input i`.
///
/// # Safety
/// The CPU has avx2, fma, f16c and what `S` uses; inlined into a function
/// compiled with them.
#[inline(always)]
unsafe fn tile<S: RunSums, K: KQuant, const T: usize>(
    part: PanelProduct<'_, Q8KBlock>,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract.
    unsafe {
        if T <= 2 {
            halves::<S, K, T, 2>(part, 0, out);
        } else {
            halves::<S, K, T, 1>(part, 0, out);
            halves::<S, K, T, 1>(part, 1, out);
        }
    }
}

/// Halves `first..first + N` of [`tile`]'s panel against its inputs, over
/// the super-blocks in order from zero accumulators.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn halves<S: RunSums, K: KQuant, const T: usize, const N: usize>(
    part: PanelProduct<'_, Q8KBlock>,
    first: usize,
    out: &mut [f32],
) {
    let PanelProduct {
        panels: panel,
        n_blocks,
        xq,
        ..
    } = part;
    assert_eq!(panel.len(), n_blocks * K::RECORD_BYTES);
    assert_eq!((xq.len(), out.len()), (T * n_blocks, T * PANEL_ROWS));
    // SAFETY: the caller's features.
    let mut acc: [[__m256; T]; N] = [[unsafe { _mm256_setzero_ps() }; T]; N];
    for b in 0..n_blocks {
        let mut x = [&xq[b]; T];
        for (i, x) in x.iter_mut().enumerate() {
            *x = &xq[i * n_blocks + b];
        }
        // SAFETY: record b lies within the panel (its length asserted
        // above); the features are the caller's.
        unsafe {
            let record = panel.as_ptr().add(b * K::RECORD_BYTES);
            for (h, acc) in (first..).zip(&mut acc) {
                K::half::<S, T>(record, h, &x, acc);
            }
        }
    }
    for (h, acc) in (first..).zip(acc) {
        for (out, acc) in out.chunks_exact_mut(PANEL_ROWS).zip(acc) {
            // SAFETY: `out` is 16 floats, this half's 8 at `8 * h`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(HALF_ROWS * h), acc) };
        }
    }
}

/// Byte `k` (0..4) of every 32-bit lane of `v`, zero-extended.
///
/// # Safety
/// The CPU has avx2 (inlined).
#[inline(always)]
unsafe fn unsigned_byte(v: __m256i, k: usize) -> __m256i {
    // SAFETY: the caller's features.
    unsafe {
        let byte = _mm256_set1_epi32(0xFF);
        match k {
            0 => _mm256_and_si256(v, byte),
            1 => _mm256_and_si256(_mm256_srli_epi32::<8>(v), byte),
            2 => _mm256_and_si256(_mm256_srli_epi32::<16>(v), byte),
            _ => _mm256_srli_epi32::<24>(v),
        }
    }
}

/// Byte `k` (0..4) of every 32-bit lane of `v`, sign-extended.
///
/// # Safety
/// The CPU has avx2 (inlined).
#[inline(always)]
unsafe fn signed_byte(v: __m256i, k: usize) -> __m256i {
    // SAFETY: the caller's features.
    unsafe {
        match k {
            0 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(v)),
            1 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(v)),
            2 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<8>(v)),
            _ => _mm256_srai_epi32::<24>(v),
        }
    }
}

/// Calls `$f::<$s, $t, J>($args)` for every `J` listed, in order: the runs
/// of a super-block with their indices as constants, so that each run's
/// offsets, shifts and selections are fixed at compile time.
macro_rules! each_const {
    ($f:ident::<$s:ident, $t:ident> $args:tt, [$($j:literal),*]) => {
        $($f::<$s, $t, $j> $args;)*
    };
}

/// Q4_K in panels.
struct Q4K;

impl KQuant for Q4K {
    const RECORD_BYTES: usize = PANEL_ROWS * 144;

    #[inline(always)]
    unsafe fn half<S: RunSums, const T: usize>(
        record: *const u8,
        h: usize,
        x: &[&Q8KBlock; T],
        acc: &mut [__m256; T],
    ) {
        // SAFETY: the caller's contract: every piece read is in the record
        // (`packed_k`'s layout), and 32 j + 4 c + 4 <= 256.
        unsafe {
            // The 6-bit scales and minimums (`block_k::scales_mins_k4`),
            // four bytes a lane: scales 0..4 and 4..8, minimums 0..4, 4..8.
            let (a, b, c) = (
                load(record, q4_k::SCALES, h),
                load(record, q4_k::SCALES + PIECE_BYTES, h),
                load(record, q4_k::SCALES + 2 * PIECE_BYTES, h),
            );
            let low6 = _mm256_set1_epi8(0x3F);
            let low4 = _mm256_set1_epi8(0x0F);
            let top2 = _mm256_set1_epi8(0x30);
            let scales = [
                _mm256_and_si256(a, low6),
                _mm256_or_si256(
                    _mm256_and_si256(c, low4),
                    _mm256_and_si256(_mm256_srli_epi32::<2>(a), top2),
                ),
            ];
            let mins = [
                _mm256_and_si256(b, low6),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi32::<4>(c), low4),
                    _mm256_and_si256(_mm256_srli_epi32::<2>(b), top2),
                ),
            ];
            let mut sumi = [_mm256_setzero_si256(); T];
            each_const!(
                sub_block_q4_k::<S, T>(record, h, &scales, x, &mut sumi),
                [0, 1, 2, 3, 4, 5, 6, 7]
            );
            let d = _mm256_cvtph_ps(_mm_loadu_si128(record.add(q4_k::D + 16 * h).cast()));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(record.add(q4_k::DMIN + 16 * h).cast()));
            // Minimums as 16-bit pairs: (m0, m2), (m1, m3), (m4, m6), (m5, m7).
            let words = _mm256_set1_epi32(0x00FF_00FF);
            let pairs = [
                _mm256_and_si256(mins[0], words),
                _mm256_and_si256(_mm256_srli_epi32::<8>(mins[0]), words),
                _mm256_and_si256(mins[1], words),
                _mm256_and_si256(_mm256_srli_epi32::<8>(mins[1]), words),
            ];
            for i in 0..T {
                let bsums = &x[i].bsums;
                let sum32 = |j: usize| i32::from(bsums[2 * j]) + i32::from(bsums[2 * j + 1]);
                let pair = |lo: usize, hi: usize| (sum32(lo) & 0xFFFF) | (sum32(hi) << 16);
                let mut summs = _mm256_madd_epi16(pairs[0], _mm256_set1_epi32(pair(0, 2)));
                for (k, (lo, hi)) in [(1, 3), (4, 6), (5, 7)].into_iter().enumerate() {
                    let m = _mm256_madd_epi16(pairs[k + 1], _mm256_set1_epi32(pair(lo, hi)));
                    summs = _mm256_add_epi32(summs, m);
                }
                let d_x = _mm256_set1_ps(x[i].d);
                acc[i] =
                    _mm256_fmadd_ps(_mm256_mul_ps(d, d_x), _mm256_cvtepi32_ps(sumi[i]), acc[i]);
                acc[i] =
                    _mm256_fnmadd_ps(_mm256_mul_ps(dmin, d_x), _mm256_cvtepi32_ps(summs), acc[i]);
            }
        }
    }
}

/// Q6_K in panels.
struct Q6K;

impl KQuant for Q6K {
    const RECORD_BYTES: usize = PANEL_ROWS * 210;

    #[inline(always)]
    unsafe fn half<S: RunSums, const T: usize>(
        record: *const u8,
        h: usize,
        x: &[&Q8KBlock; T],
        acc: &mut [__m256; T],
    ) {
        // SAFETY: the caller's contract: the scales and quarters read are
        // in the record, and 16 g + 4 k + 4 <= 256.
        unsafe {
            let mut sumi = [_mm256_setzero_si256(); T];
            // Quarter 2 h6 + e holds the groups 8 h6 + 2 t + e (t = 0..4),
            // read in the record's order.
            each_const!(
                group_q6_k::<S, T>(record, h, x, &mut sumi),
                [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]
            );
            let d = _mm256_cvtph_ps(_mm_loadu_si128(record.add(q6_k::D + 16 * h).cast()));
            for i in 0..T {
                let d_x = _mm256_set1_ps(x[i].d);
                acc[i] =
                    _mm256_fmadd_ps(_mm256_mul_ps(d, d_x), _mm256_cvtepi32_ps(sumi[i]), acc[i]);
            }
        }
    }
}

/// Sub-block `J` of half `h` of the Q4_K record at `record` times each of
/// the tile's inputs `x`, scaled by the rows' scales (`scales`, four bytes
/// a lane), added to `sumi`.
///
/// # Safety
/// As [`KQuant::half`].
#[inline(always)]
unsafe fn sub_block_q4_k<S: RunSums, const T: usize, const J: usize>(
    record: *const u8,
    h: usize,
    scales: &[__m256i; 2],
    x: &[&Q8KBlock; T],
    sumi: &mut [__m256i; T],
) {
    // SAFETY: the caller's contract: pieces 8 (J / 2) .. + 8 are in the
    // record, and 32 J + 4 c + 4 <= 256.
    unsafe {
        let low4 = _mm256_set1_epi8(0x0F);
        let scale = unsigned_byte(scales[J / 4], J % 4);
        let pieces = q4_k::QS + 8 * (J / 2) * PIECE_BYTES;
        let mut w = [_mm256_setzero_si256(); 8];
        for (c, w) in w.iter_mut().enumerate() {
            let v = load(record, pieces + c * PIECE_BYTES, h);
            let v = if J % 2 == 1 {
                _mm256_srli_epi16::<4>(v)
            } else {
                v
            };
            *w = _mm256_and_si256(v, low4);
        }
        S::add_scaled::<T, 8, 15>(&w, x, 32 * J, None, scale, sumi);
    }
}

/// Group `G` (values 16 G .. 16 G + 16) of half `h` of the Q6_K record at
/// `record` times each of the tile's inputs `x`, scaled by the rows'
/// scales, added to `sumi`.
///
/// # Safety
/// As [`KQuant::half`].
#[inline(always)]
unsafe fn group_q6_k<S: RunSums, const T: usize, const G: usize>(
    record: *const u8,
    h: usize,
    x: &[&Q8KBlock; T],
    sumi: &mut [__m256i; T],
) {
    // G = 8 h6 + 2 t + e: sub-block 4 h6 + t, half e of it.
    let (h6, t, e) = (G / 8, G % 8 / 2, G % 2);
    // SAFETY: the caller's contract: the scales and the quarter's pieces
    // are in the record, and 16 G + 4 k + 4 <= 256.
    unsafe {
        let low4 = _mm256_set1_epi8(0x0F);
        let bits45 = _mm256_set1_epi8(0x30);
        let scale = signed_byte(load(record, q6_k::SCALES + G / 4 * PIECE_BYTES, h), G % 4);
        let quarter = q6_k::QUARTERS + (2 * h6 + e) * q6_k::QUARTER_BYTES;
        let mut w = [_mm256_setzero_si256(); 4];
        for (k, w) in w.iter_mut().enumerate() {
            let ql = load(
                record,
                quarter + q6_k::QL + (4 * (t % 2) + k) * PIECE_BYTES,
                h,
            );
            let low = if t < 2 {
                _mm256_and_si256(ql, low4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql), low4)
            };
            let qh = load(record, quarter + q6_k::QH + k * PIECE_BYTES, h);
            // Bits 2t, 2t + 1 of each byte to bits 4, 5.
            let high = match t {
                0 => _mm256_slli_epi16::<4>(qh),
                1 => _mm256_slli_epi16::<2>(qh),
                2 => qh,
                _ => _mm256_srli_epi16::<2>(qh),
            };
            *w = _mm256_or_si256(low, _mm256_and_si256(high, bits45));
        }
        let mut offset = [0; T];
        for (o, x) in offset.iter_mut().zip(x) {
            *o = -32 * i32::from(x.bsums[G]);
        }
        S::add_scaled::<T, 4, 63>(&w, x, 16 * G, Some(offset), scale, sumi);
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::kernels::panel::avx2::tests::Avx512Vl;
    use crate::kernels::panel::simd_check::{assert_same_bits, candidates, lcg};
    use crate::kernels::panel::{avx512_k, portable_k};
    use crate::quant::block_k::QK_K;

    /// [`dot_panels_k_vnni`] with [`Avx512Vl`].
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    unsafe fn dot_panels_k_evex(
        ty: GgmlType,
        product: PanelProduct<'_, Q8KBlock>,
        out: &mut [f32],
    ) {
        each_panel_k!(Dpbusd<Avx512Vl>, ty, product, out)
    }

    /// Panels of random records with finite f16 factors; the first record
    /// of each panel has every other byte `extreme` (0xFF: the largest
    /// values and scales; 0x80: Q6_K's most negative scale, Q4_K's
    /// smallest values with its largest minimums).
    fn panels(ty: GgmlType, n_panels: usize, n_blocks: usize, extreme: u8) -> Vec<u8> {
        let mut next = lcg(17);
        let record_bytes = PANEL_ROWS * ty.block_bytes();
        let factors = if ty == GgmlType::Q4_K { 64 } else { 32 };
        let mut data: Vec<u8> = (0..n_panels * n_blocks * record_bytes)
            .map(|_| next() as u8)
            .collect();
        for (i, record) in data.chunks_exact_mut(record_bytes).enumerate() {
            if i % n_blocks == 0 {
                record.fill(extreme);
            }
            for d in record[..factors].chunks_exact_mut(2) {
                let scale = half::f16::from_f32(0.001 + (next() % 1000) as f32 * 1e-5);
                d.copy_from_slice(&scale.to_le_bytes());
            }
        }
        data
    }

    /// `n` inputs of `n_blocks` Q8_K blocks with values in -128..=127 and
    /// their groups' sums; block 0 of every input is all `extreme`.
    fn inputs(n: usize, n_blocks: usize, extreme: i8) -> Vec<Q8KBlock> {
        let mut next = lcg(23);
        (0..n * n_blocks)
            .map(|i| {
                let qs: [i8; QK_K] = std::array::from_fn(|_| {
                    if i % n_blocks == 0 {
                        extreme
                    } else {
                        (next() % 256) as i32 as u8 as i8
                    }
                });
                let bsums =
                    std::array::from_fn(|g| qs[16 * g..][..16].iter().map(|&q| i16::from(q)).sum());
                let d = 0.01 + (next() % 100) as f32 * 1e-3;
                Q8KBlock { d, qs, bsums }
            })
            .collect()
    }

    /// The AVX2 kernel, the AVX-VNNI one (in either encoding the CPU runs)
    /// and the AVX-512 one give the portable kernel's bits, for tiles of
    /// every size and at the integer sums' extremes (the i16 bounds of the
    /// AVX2 sums), prefetching or not.
    #[test]
    fn simd_k_panel_products_equal_the_portable_bits() {
        let candidates = candidates(
            dot_panels_k,
            dot_panels_k_vnni,
            dot_panels_k_evex,
            avx512_k::dot_panels_k,
        );
        let n_blocks = 3;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            for (extreme_w, extreme_x) in [(0xFF, 127), (0xFF, -128), (0x80, -128), (0x00, 127)] {
                assert_same_bits(
                    &candidates,
                    portable_k::dot_panels_k,
                    (ty, &panels(ty, 2, n_blocks, extreme_w), n_blocks),
                    &[1, 2, 3, 4, 5, 7, 9],
                    |n| (inputs(n, n_blocks, extreme_x), Vec::new()),
                    &format!("weights {extreme_w:#x}, input {extreme_x}"),
                );
            }
        }
    }
}
