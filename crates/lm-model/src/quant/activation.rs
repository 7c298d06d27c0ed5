//! Activations quantized to 8-bit blocks, so that products with quantized
//! weights run on integers (as llama.cpp does with its Q8_0 / Q8_1 blocks).
//!
//! A block of 32 activations `x` becomes a scale `d = max|x| / 127` and
//! `q[j] = round_ties_even(x[j] * 127 / max|x|)` in `-127..=127`; `sum = d * Σ q[j]`
//! is kept for Q4_1, whose per-block minimum multiplies the sum of the
//! activations. Both `d` and `sum` are rounded to f16 and back, exactly as
//! llama.cpp stores them in its Q8_0 / Q8_1 blocks: keeping them in f32 is
//! slightly more accurate, but moves the real model's logits away from
//! llama.cpp's by more than the conformance tolerance allows.

use super::block::QK;

/// 32 activations quantized to signed bytes with one f32 scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Q8Block {
    /// The scale: `x[j] ≈ d * qs[j]`.
    pub d: f32,
    /// `d * Σ qs[j]`, the (quantized) sum of the block's activations.
    pub sum: f32,
    /// The quantized values.
    pub qs: [i8; QK],
}

impl Q8Block {
    /// Quantizes 32 activations (`x.len() == 32`; missing values count as 0).
    #[inline]
    pub fn quantize(x: &[f32]) -> Q8Block {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv_d = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut qs = [0i8; QK];
        let mut isum = 0i32;
        for (q, &v) in qs.iter_mut().zip(x) {
            // `as` saturates and maps NaN to 0; |v * inv_d| <= 127 otherwise.
            *q = (v * inv_d).round_ties_even() as i8;
            isum += i32::from(*q);
        }
        Q8Block {
            d: half::f16::from_f32(d).to_f32(),
            sum: half::f16::from_f32(d * isum as f32).to_f32(),
            qs,
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into `out`, replacing its contents.
///
/// `out` is reused between calls so that steady-state products do not allocate.
pub(crate) fn quantize_activations(x: &[f32], out: &mut Vec<Q8Block>) {
    out.clear();
    out.extend(x.chunks_exact(QK).map(Q8Block::quantize));
}
