//! MXFP4 (OCP Microscaling, 4-bit floats; GGML type 39, gpt-oss's experts):
//! blocks of 32 weights, one shared power-of-two scale and 32 FP4 (E2M1)
//! codes.
//!
//! ```text
//! MXFP4 (17 bytes) | e: E8M0 | qs: 16 bytes |  x[j]      = 2^(e - 128) * MXFP4_VALUES[qs[j] & 15]
//!                                              x[j + 16] = 2^(e - 128) * MXFP4_VALUES[qs[j] >> 4]
//! ```
//!
//! E2M1 has the eight magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 and a sign bit
//! (code bit 3); GGML stores them doubled as integers (`kvalues_mxfp4`) and
//! halves the scale instead, so a block is an integer table lookup times
//! `2^(e - 128)`, like IQ4_NL's with a power-of-two scale. The exponent byte
//! `e` is E8M0 (`2^(e - 127)`, no sign, no mantissa); GGML reads 0xFF as a
//! power of two too (not NaN), so every block is finite and there is nothing
//! to validate. The values multiply with [`Q8Block`] activations
//! (llama.cpp's `vec_dot_mxfp4_q8_0`).

use super::activation::Q8Block;
use super::block::QK;

/// The bytes of one MXFP4 block: the exponent, then 16 bytes of codes.
pub(crate) const BLOCK_BYTES: usize = 1 + QK / 2;

/// The E2M1 values doubled, indexed by a weight's 4-bit code (GGML's
/// `kvalues_mxfp4`, part of the format): codes 8..16 are the negatives.
pub(crate) const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`: the E8M0 scale halved, as GGML's `ggml_e8m0_to_fp32_half`
/// builds it from bits (subnormal for `e < 2`).
#[inline(always)]
pub(crate) const fn half_scale(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e - 1) as u32) << 23
    };
    f32::from_bits(bits)
}

/// The 32 integers of one block (table levels), element order `j`, then
/// `j + 16`.
#[inline(always)]
pub(crate) fn block_values(block: &[u8]) -> [i8; QK] {
    let mut values = [0i8; QK];
    let (low, high) = values.split_at_mut(QK / 2);
    for ((&q, lo), hi) in block[1..BLOCK_BYTES].iter().zip(low).zip(high) {
        *lo = MXFP4_VALUES[usize::from(q & 0x0F)];
        *hi = MXFP4_VALUES[usize::from(q >> 4)];
    }
    values
}

/// Dequantises one block into `out` (32 values): each level times the
/// halved scale in f32, as GGML's `dequantize_row_mxfp4` (bit for bit).
#[inline]
pub(crate) fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let d = half_scale(block[0]);
    for (o, &q) in out.iter_mut().zip(&block_values(block)) {
        *o = f32::from(q) * d;
    }
}

/// A row of MXFP4 blocks · quantized activations: per block the exact
/// integer sum `Σ q_w q_x`, times `d_x * 2^(e - 128)`, added in block order
/// (llama.cpp's `ggml_vec_dot_mxfp4_q8_0_generic`'s operations).
pub(crate) fn dot_blocks(row: &[u8], xq: &[Q8Block]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in row.chunks_exact(BLOCK_BYTES).zip(xq) {
        let values = block_values(w);
        let dot: i32 = values
            .iter()
            .zip(&a.qs)
            .map(|(&q, &x)| i32::from(q) * i32::from(x))
            .sum();
        sum += a.d * half_scale(w[0]) * dot as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scale is `2^(e - 128)` for every exponent byte, 0 and 255
    /// included (computed by `powi` in f64, exact for these powers).
    #[test]
    fn half_scale_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            let expected = 2f64.powi(i32::from(e) - 128);
            assert_eq!(f64::from(half_scale(e)), expected, "e = {e}");
        }
    }

    /// The table is E2M1 doubled: sign bit 3, exponent bits 2..1, mantissa
    /// bit 0, decoded from the format's definition.
    #[test]
    fn levels_are_e2m1_doubled() {
        for code in 0..16u8 {
            let (sign, exp, man) = (code >> 3, (code >> 1) & 3, code & 1);
            let magnitude = match exp {
                0 => 0.5 * f64::from(man),
                _ => 2f64.powi(i32::from(exp) - 1) * (1.0 + 0.5 * f64::from(man)),
            };
            let value = if sign == 1 { -magnitude } else { magnitude };
            assert_eq!(f64::from(MXFP4_VALUES[usize::from(code)]), 2.0 * value);
        }
    }

    /// The dot product equals the dequantised weights times the
    /// activations' own dequantised values, summed in f64.
    #[test]
    fn dot_matches_the_dequantised_product() {
        let n_blocks = 5;
        let mut row = Vec::new();
        let mut xq = Vec::new();
        for b in 0..n_blocks {
            row.push(120 + b as u8 * 3);
            row.extend((0..16).map(|j| ((j * 37 + b * 11) % 256) as u8));
            let x: Vec<f32> = (0..32)
                .map(|j| ((j * 13 + b * 7) % 17) as f32 * 0.25 - 2.0)
                .collect();
            xq.push(Q8Block::quantize(&x));
        }
        let mut expected = 0.0f64;
        let mut weights = [0.0f32; QK];
        for (w, a) in row.chunks_exact(BLOCK_BYTES).zip(&xq) {
            dequantize_block(w, &mut weights);
            for (&wv, &q) in weights.iter().zip(&a.qs) {
                expected += f64::from(wv) * f64::from(a.d) * f64::from(q);
            }
        }
        let ours = f64::from(dot_blocks(&row, &xq));
        assert!(
            (ours - expected).abs() <= 1e-5 * expected.abs().max(1.0),
            "{ours} vs {expected}"
        );
        assert!(expected.abs() > 1e-3, "a non-trivial product");
    }
}
