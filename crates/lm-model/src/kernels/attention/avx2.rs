//! Attention's kernels in AVX2 with FMA and F16C: 8 keys or output
//! dimensions in a vector (two vectors, 16 keys, a pass of the key
//! products; two vectors, 16 output values, of each row held in registers
//! across the value rows).

use std::arch::x86_64::*;

use super::x86::x86_build;

x86_build! {
    /// The AVX2 kernels; `FUSED` adds the (exact) products with fused
    /// multiply-adds.
    Avx2: "avx2,fma,f16c", __m256 of 8 lanes, 2 wide;
    splat _mm256_set1_ps, zero _mm256_setzero_ps, add _mm256_add_ps, mul _mm256_mul_ps,
    mul_add _mm256_fmadd_ps, load _mm256_loadu_ps, store _mm256_storeu_ps,
    load_f16 _mm256_cvtph_ps(_mm_loadu_si128)
}
