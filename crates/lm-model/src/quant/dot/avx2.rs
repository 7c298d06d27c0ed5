//! AVX2 + FMA + F16C dot products (x86_64, selected at run time).
//!
//! Per block of 32: the weight bytes are widened to signed or unsigned bytes,
//! multiplied with the activation bytes by `vpmaddubsw` (pairs summed to i16,
//! which cannot saturate: |q_w| <= 128 and |q_x| <= 127), summed to eight i32
//! lanes by `vpmaddwd`, converted to f32 and accumulated with the block scale by
//! one FMA. The integer sums equal the portable path's; only the order of the
//! f32 additions differs.
//!
//! Every function requires avx2, fma and f16c, which callers check through
//! [`super::Dispatch`].

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _mm_add_ps, _mm_add_ss, _mm_cvtph_ps, _mm_cvtsi32_si128,
    _mm_cvtss_f32, _mm_loadu_si128, _mm_movehl_ps, _mm_shuffle_ps, _mm_srli_epi16, _mm256_add_ps,
    _mm256_and_si256, _mm256_castps256_ps128, _mm256_cvtepi32_ps, _mm256_extractf128_ps,
    _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16,
    _mm256_set_m128i, _mm256_set1_epi8, _mm256_set1_epi16, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_sign_epi8, _mm256_sub_epi8,
};

use super::super::activation::Q8Block;

/// Q4_0 row · quantized activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_0(row: &[u8], xq: &[Q8Block]) -> f32 {
    dot_blocks::<18>(row, xq, |w, a| {
        // SAFETY: `w` is 18 bytes, so bytes 2..18 are in bounds.
        let packed = unsafe { _mm_loadu_si128(w.as_ptr().add(2).cast()) };
        let weights = _mm256_sub_epi8(unpack_nibbles(packed), _mm256_set1_epi8(8));
        let scale = f16_to_f32(w[0], w[1]) * a.d;
        (scale, mul_sum_i8(weights, load_qs(a)), 0.0)
    })
}

/// Q4_1 row · quantized activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_1(row: &[u8], xq: &[Q8Block]) -> f32 {
    dot_blocks::<20>(row, xq, |w, a| {
        // SAFETY: `w` is 20 bytes, so bytes 4..20 are in bounds.
        let packed = unsafe { _mm_loadu_si128(w.as_ptr().add(4).cast()) };
        let pairs = _mm256_maddubs_epi16(unpack_nibbles(packed), load_qs(a));
        let products = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        let scale = f16_to_f32(w[0], w[1]) * a.d;
        (scale, products, f16_to_f32(w[2], w[3]) * a.sum)
    })
}

/// Q8_0 row · quantized activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8_0(row: &[u8], xq: &[Q8Block]) -> f32 {
    dot_blocks::<34>(row, xq, |w, a| {
        // SAFETY: `w` is 34 bytes, so bytes 2..34 are in bounds.
        let weights = unsafe { _mm256_loadu_si256(w.as_ptr().add(2).cast()) };
        let scale = f16_to_f32(w[0], w[1]) * a.d;
        (scale, mul_sum_i8(weights, load_qs(a)), 0.0)
    })
}

/// Sums `scale * Σ lanes(products) + offset` over the blocks of a row, where
/// `block` returns `(scale, products, offset)` for one weight block (`BYTES`
/// long) and its activation block. Two blocks per step into two accumulators,
/// so consecutive FMAs do not wait on each other.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_blocks<const BYTES: usize>(
    row: &[u8],
    xq: &[Q8Block],
    block: impl Fn(&[u8], &Q8Block) -> (f32, __m256, f32),
) -> f32 {
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (mut offset0, mut offset1) = (0.0f32, 0.0f32);
    let pairs = row.chunks_exact(2 * BYTES).zip(xq.chunks_exact(2));
    let n_pairs = pairs.len();
    for (w, a) in pairs {
        let (w0, w1) = w.split_at(BYTES);
        let (s0, p0, o0) = block(w0, &a[0]);
        let (s1, p1, o1) = block(w1, &a[1]);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s0), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(s1), p1, acc1);
        offset0 += o0;
        offset1 += o1;
    }
    let tail = row.get(2 * BYTES * n_pairs..).unwrap_or(&[]);
    let tail_xq = xq.get(2 * n_pairs..).unwrap_or(&[]);
    for (w, a) in tail.chunks_exact(BYTES).zip(tail_xq) {
        let (s, p, o) = block(w, a);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s), p, acc0);
        offset0 += o;
    }
    horizontal_sum(_mm256_add_ps(acc0, acc1)) + (offset0 + offset1)
}

/// 16 bytes of packed 4-bit values as 32 bytes: low nibbles (elements 0..16)
/// in the low lane, high nibbles (elements 16..32) in the high lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_nibbles(packed: __m128i) -> __m256i {
    _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed),
        _mm256_set1_epi8(0x0F),
    )
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

/// The 32 quantized activations of a block as one vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_qs(a: &Q8Block) -> __m256i {
    // SAFETY: `qs` is exactly 32 bytes.
    unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) }
}

/// Σ of signed byte products, as eight f32 lanes (each an exact integer).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
    // maddubs multiplies unsigned by signed: move x's sign onto y.
    let abs_x = _mm256_sign_epi8(x, x);
    let signed_y = _mm256_sign_epi8(y, x);
    let pairs = _mm256_maddubs_epi16(abs_x, signed_y);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// The sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn horizontal_sum(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let dual = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(dual, _mm_shuffle_ps(dual, dual, 1)))
}

/// A little-endian f16 (two bytes) as f32, by the F16C instruction.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_to_f32(lo: u8, hi: u8) -> f32 {
    let bits = i32::from(u16::from_le_bytes([lo, hi]));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
}
