//! MXFP4 rows · [`Q8Block`] activations, on every kernel with the bits of
//! the portable loop of `quant/mxfp4.rs` (llama.cpp's generic operations):
//! per block the exact integer sum `Σ q_w q_x`, then in block order
//! `sum += (d_x * 2^(e - 128)) * dot`.
//!
//! The SIMD paths (`x86`) keep those f32 operations and their order and
//! compute only the integer sums differently: four blocks at a time, each
//! block's 16 code bytes split into 32 nibbles and looked up in the 16-level
//! table by one byte shuffle, multiplied with the activation bytes four
//! products to an i32 lane ([`BytePairs`](super::avx2::BytePairs): AVX2's
//! `vpmaddubsw` + `vpmaddwd`, or `vpdpbusd` on AVX-VNNI and AVX-512), the
//! four blocks' eight lanes reduced to four exact sums by horizontal adds,
//! scaled as four f32 lanes and added to the running sum one block after
//! the other. Its MXFP4 blocks are 17 bytes with a power-of-two scale, so
//! they have their own loop rather than a form of the 32-weight kernels,
//! whose blocks open with an f16 scale and whose f32 sums run in eight lanes.

use crate::kernels::dispatch::Dispatch;
#[cfg(target_arch = "x86_64")]
use crate::kernels::dispatch::Kernel;
use crate::quant::activation::Q8Block;
use crate::quant::mxfp4;

/// `out[r * n + i] = row r · input i` for the whole rows of `rows`
/// (`row_bytes` each) and `n` inputs of `n_blocks` blocks each, by
/// `dispatch`'s kernel: the same bits on every kernel.
pub(crate) fn dot_rows(
    dispatch: Dispatch,
    rows: &[u8],
    row_bytes: usize,
    n_blocks: usize,
    xq: &[Q8Block],
    n: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let batch = super::frame::Batch {
            rows,
            row_bytes,
            n_blocks,
            n,
        };
        match dispatch.kernel() {
            // SAFETY (each arm): a `Dispatch` holds a SIMD kernel only after
            // `lm_core::cpu` detected the features it requires
            // (`Kernel::runs_on`), the features of each entry.
            Kernel::Avx2 => return unsafe { x86::dot_rows_avx2(batch, xq, out) },
            Kernel::AvxVnni => return unsafe { x86::dot_rows_avxvnni(batch, xq, out) },
            Kernel::Avx512 => return unsafe { x86::dot_rows_avx512(batch, xq, out) },
            _ => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = dispatch;
    for (row, results) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
        for (i, o) in results.iter_mut().enumerate() {
            *o = mxfp4::dot_blocks(row, &xq[i * n_blocks..][..n_blocks]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_add_epi32, _mm_cvtepi32_ps, _mm_loadu_si128, _mm_mul_ps, _mm_setr_ps,
        _mm_storeu_ps, _mm256_abs_epi8, _mm256_castsi256_si128, _mm256_extracti128_si256,
        _mm256_hadd_epi32, _mm256_loadu_si256, _mm256_set_m128i, _mm256_setzero_si256,
        _mm256_shuffle_epi8, _mm256_sign_epi8,
    };

    use super::super::avx2::{BytePairs, Maddubs, Vnni, unpack_nibbles, vnni_byte_pairs};
    use super::super::frame::{Batch, BlockKernel, Group, each_row_and_input};
    use crate::quant::activation::Q8Block;
    use crate::quant::mxfp4::{BLOCK_BYTES, MXFP4_VALUES, half_scale};

    /// How many blocks one step of the loop reduces together.
    const STEP: usize = 4;

    /// `2^(e - 128)` for every exponent byte `e` ([`half_scale`]), so a
    /// block's scale is one load.
    static HALF_SCALES: [f32; 256] = {
        let mut table = [0.0; 256];
        let mut e = 0;
        while e < 256 {
            table[e] = half_scale(e as u8);
            e += 1;
        }
        table
    };

    /// The MXFP4 products with AVX2's byte products.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_avx2(batch: Batch<'_>, xq: &[Q8Block], out: &mut [f32]) {
        // SAFETY: the features `Maddubs` needs are this function's.
        unsafe { each_row_and_input(batch, xq, out, Mxfp4Kernel(Maddubs)) }
    }

    /// The MXFP4 products with AVX-VNNI's `vpdpbusd`.
    ///
    /// # Safety
    /// The CPU must support avx2, fma, f16c and avxvnni.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub(super) unsafe fn dot_rows_avxvnni(batch: Batch<'_>, xq: &[Q8Block], out: &mut [f32]) {
        // SAFETY: the features `Vnni` needs are this function's.
        unsafe { each_row_and_input(batch, xq, out, Mxfp4Kernel(Vnni)) }
    }

    /// The MXFP4 products with AVX512-VNNI's 256-bit `vpdpbusd`.
    ///
    /// # Safety
    /// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl
    /// and avx512vnni.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_rows_avx512(batch: Batch<'_>, xq: &[Q8Block], out: &mut [f32]) {
        // SAFETY: the features `Vnni512` needs are this function's.
        unsafe { each_row_and_input(batch, xq, out, Mxfp4Kernel(Vnni512)) }
    }

    vnni_byte_pairs! {
        /// AVX512-VNNI (with VL; avx512vnni and avx512vl). The MXFP4 kernel
        /// uses only `dot_u8_i8` (its weights are signed).
        struct Vnni512 = _mm256_dpbusd_epi32;
    }

    /// The MXFP4 kernel with the byte products `P`, for
    /// [`each_row_and_input`].
    struct Mxfp4Kernel<P>(P);

    impl<P: BytePairs> BlockKernel<Q8Block> for Mxfp4Kernel<P> {
        #[inline(always)]
        unsafe fn dot<const N: usize>(&self, row: &[u8], group: Group<'_, Q8Block, N>) -> [f32; N] {
            // SAFETY: the caller guarantees the features `P` needs.
            unsafe { dot::<N, P>(row, group.inputs) }
        }
    }

    /// A row of MXFP4 blocks · each of `N` inputs (as many blocks each),
    /// [`STEP`] blocks at a time: each weight block is unpacked once for
    /// all inputs.
    ///
    /// # Safety
    /// The CPU must support avx2 and what `P` needs; inlined into an entry
    /// compiled with them.
    #[inline(always)]
    unsafe fn dot<const N: usize, P: BytePairs>(row: &[u8], inputs: [&[Q8Block]; N]) -> [f32; N] {
        let (blocks, _) = row.as_chunks::<BLOCK_BYTES>();
        let inputs = inputs.map(|x| &x[..blocks.len()]);
        // SAFETY: the caller guarantees the features; the table is 16 bytes.
        let levels = unsafe {
            let levels = _mm_loadu_si128(MXFP4_VALUES.as_ptr().cast());
            _mm256_set_m128i(levels, levels)
        };
        let mut sums = [0.0f32; N];
        let (steps, rest) = blocks.as_chunks::<STEP>();
        for (k, step) in steps.iter().enumerate() {
            // SAFETY: as above; blocks `STEP * k ..` of this step are inside
            // every input (each as long as `blocks`).
            unsafe { add_blocks::<N, STEP, P>(step, STEP * k, &inputs, levels, &mut sums) };
        }
        let first = STEP * steps.len();
        // SAFETY: as above, for the last blocks (a count made a constant).
        unsafe {
            match *rest {
                [] => {}
                [a] => add_blocks::<N, 1, P>(&[a], first, &inputs, levels, &mut sums),
                [a, b] => add_blocks::<N, 2, P>(&[a, b], first, &inputs, levels, &mut sums),
                [a, b, c] => add_blocks::<N, 3, P>(&[a, b, c], first, &inputs, levels, &mut sums),
                _ => unreachable!("fewer than {STEP} blocks are left"),
            }
        }
        sums
    }

    /// Adds the products of `blocks` (`K`, 1 to [`STEP`], the row's blocks
    /// from `first`) with each input into `sums`, one block after the other
    /// as the portable loop does: `sum += (d_x * 2^(e - 128)) * dot`.
    ///
    /// # Safety
    /// As [`dot`], and `first + K` at most every input's length.
    #[inline(always)]
    unsafe fn add_blocks<const N: usize, const K: usize, P: BytePairs>(
        blocks: &[[u8; BLOCK_BYTES]; K],
        first: usize,
        inputs: &[&[Q8Block]; N],
        levels: __m256i,
        sums: &mut [f32; N],
    ) {
        const { assert!(K >= 1 && K <= STEP) };
        // SAFETY: the caller guarantees the features and the lengths; each
        // code load reads bytes 1..17 of a whole block.
        unsafe {
            let zero = _mm256_setzero_si256();
            let mut signed = [zero; STEP];
            let mut magnitude = [zero; STEP];
            let mut e = [0usize; STEP];
            for (j, w) in blocks.iter().enumerate() {
                let codes: __m128i = _mm_loadu_si128(w.as_ptr().add(1).cast());
                signed[j] = _mm256_shuffle_epi8(levels, unpack_nibbles(codes));
                magnitude[j] = _mm256_abs_epi8(signed[j]);
                e[j] = usize::from(w[0]);
            }
            let half_scales = _mm_setr_ps(
                HALF_SCALES[e[0]],
                HALF_SCALES[e[1]],
                HALF_SCALES[e[2]],
                HALF_SCALES[e[3]],
            );
            for (sum, x) in sums.iter_mut().zip(inputs) {
                let mut lanes = [zero; STEP];
                let mut d = [0.0f32; STEP];
                for j in 0..K {
                    let a = x.get_unchecked(first + j);
                    let qs = _mm256_loadu_si256(a.qs.as_ptr().cast());
                    // |q_w| times q_x with q_w's sign (zero where q_w is).
                    lanes[j] = P::dot_u8_i8(magnitude[j], _mm256_sign_epi8(qs, signed[j]));
                    d[j] = a.d;
                }
                // [Σ block 0, Σ block 1, Σ block 2, Σ block 3]: exact (each
                // at most 32 * 12 * 127 in magnitude).
                let pairs = _mm256_hadd_epi32(
                    _mm256_hadd_epi32(lanes[0], lanes[1]),
                    _mm256_hadd_epi32(lanes[2], lanes[3]),
                );
                let dots = _mm_add_epi32(
                    _mm256_castsi256_si128(pairs),
                    _mm256_extracti128_si256::<1>(pairs),
                );
                let scales = _mm_mul_ps(_mm_setr_ps(d[0], d[1], d[2], d[3]), half_scales);
                let mut terms = [0.0f32; STEP];
                _mm_storeu_ps(
                    terms.as_mut_ptr(),
                    _mm_mul_ps(scales, _mm_cvtepi32_ps(dots)),
                );
                for &term in &terms[..K] {
                    *sum += term;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::quant::block::QK;

    /// Every path's products of `rows` (`n_blocks` blocks each) with `n`
    /// inputs against `mxfp4::dot_blocks` of each row and input alone, bit
    /// for bit; returns how many kernels ran.
    fn assert_every_path_gives_portable_bits(
        rows: &[u8],
        n_blocks: usize,
        xq: &[Q8Block],
        n: usize,
    ) -> usize {
        let row_bytes = n_blocks * mxfp4::BLOCK_BYTES;
        let n_rows = rows.len() / row_bytes;
        let expected: Vec<f32> = rows
            .chunks_exact(row_bytes)
            .flat_map(|row| {
                (0..n).map(move |i| mxfp4::dot_blocks(row, &xq[i * n_blocks..][..n_blocks]))
            })
            .collect();
        let dispatches = Dispatch::every_available();
        for &dispatch in &dispatches {
            let mut out = vec![f32::NAN; n_rows * n];
            dot_rows(dispatch, rows, row_bytes, n_blocks, xq, n, &mut out);
            for (k, (o, e)) in out.iter().zip(&expected).enumerate() {
                assert_eq!(
                    o.to_bits(),
                    e.to_bits(),
                    "{:?}, {n_blocks} blocks, n = {n}, row {} input {}: {o} vs {e}",
                    dispatch.kernel(),
                    k / n,
                    k % n
                );
            }
        }
        dispatches.len()
    }

    fn random_inputs(n: usize, n_blocks: usize, scale: f32, rng: &mut ChaCha8Rng) -> Vec<Q8Block> {
        (0..n * n_blocks)
            .map(|_| {
                let x: Vec<f32> = (0..QK)
                    .map(|_| rng.random_range(-1.0..1.0) * scale)
                    .collect();
                Q8Block::quantize(&x)
            })
            .collect()
    }

    /// Random rows of 1 to 13 blocks (every remainder of the four-block
    /// step) with realistic exponents, 1 to 9 inputs (groups of one to
    /// four) and an odd and an even row count: the same bits on every path.
    #[test]
    fn every_path_gives_the_portable_bits_on_random_rows() {
        let mut rng = ChaCha8Rng::seed_from_u64(39);
        let mut kernels = 0;
        for n_blocks in 1..=13 {
            for (n, n_rows) in [(1, 7), (2, 4), (3, 5), (4, 2), (5, 3), (9, 3)] {
                let rows: Vec<u8> = (0..n_rows * n_blocks)
                    .flat_map(|_| {
                        let mut block = [0u8; mxfp4::BLOCK_BYTES];
                        rng.fill(&mut block[..]);
                        block[0] = rng.random_range(118..=124);
                        block
                    })
                    .collect();
                let xq = random_inputs(n, n_blocks, 1.0, &mut rng);
                kernels = assert_every_path_gives_portable_bits(&rows, n_blocks, &xq, n);
            }
        }
        assert!(kernels >= 1);
        if cfg!(target_arch = "x86_64") && Kernel::Avx2.is_available() {
            assert!(kernels >= 2, "a SIMD path ran");
        }
    }

    /// Every exponent byte (0 and 1, whose scales are subnormal, to 254 and
    /// 255) with every code byte (so every nibble in both halves of a
    /// block), against inputs of every sign, all ±127, all zero (d = 0) and
    /// tiny (so the largest scales stay finite): the same bits on every path.
    #[test]
    fn every_path_gives_the_portable_bits_on_every_scale_and_code() {
        let mut rng = ChaCha8Rng::seed_from_u64(254);
        let n_blocks = 16; // 256 code bytes per row: each byte once
        let rows: Vec<u8> = (0..=255u8)
            .flat_map(|e| {
                (0..n_blocks).flat_map(move |b| {
                    std::iter::once(e).chain((0..16).map(move |j| (b * 16 + j) as u8 ^ e))
                })
            })
            .collect();
        let signs = |scale: f32| -> Vec<Q8Block> {
            (0..n_blocks)
                .map(|b| Q8Block::quantize(&[if b % 2 == 0 { scale } else { -scale }; QK]))
                .collect()
        };
        // Inputs: all ±127 tiny, all zero (d = 0), random tiny; then for the
        // rows whose exponents stay below 200 (whose products cannot
        // overflow f32), all ±127 of 1 and random of 1.
        let mut xq = signs(1e-30);
        assert!(xq.iter().all(|a| a.qs.iter().all(|&q| q.abs() == 127)));
        xq.extend(vec![Q8Block::quantize(&[0.0; QK]); n_blocks]);
        xq.extend(random_inputs(1, n_blocks, 1e-30, &mut rng));
        xq.extend(signs(1.0));
        xq.extend(random_inputs(1, n_blocks, 1.0, &mut rng));
        let (low, high) = rows.split_at(200 * n_blocks * mxfp4::BLOCK_BYTES);
        assert_every_path_gives_portable_bits(low, n_blocks, &xq, 5);
        assert_every_path_gives_portable_bits(high, n_blocks, &xq[..3 * n_blocks], 3);
    }
}
