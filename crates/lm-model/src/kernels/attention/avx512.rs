//! Attention's kernels in AVX-512 F (with AVX2, FMA and F16C): 16 keys or
//! output dimensions in a vector (a whole chunk's 32 keys in the two
//! vectors of a pass of the key products, so each query value broadcast
//! serves 32 keys; four vectors, 64 output values, of each row held in
//! registers across the value rows).

use std::arch::x86_64::*;

use super::x86::x86_build;

x86_build! {
    /// The AVX-512 kernels for the products and weighted sums (F16C's
    /// 8-wide rounding, as in AVX2); `FUSED` adds the (exact) products with
    /// fused multiply-adds.
    Avx512: "avx512f,avx512vl,avx2,fma,f16c", __m512 of 16 lanes, 4 wide;
    splat _mm512_set1_ps, zero _mm512_setzero_ps, add _mm512_add_ps, mul _mm512_mul_ps,
    mul_add _mm512_fmadd_ps, load _mm512_loadu_ps, store _mm512_storeu_ps,
    load_f16 _mm512_cvtph_ps(_mm256_loadu_si256)
}
