//! Activations quantized to 8-bit blocks, so that products with quantized
//! weights run on integers (as llama.cpp does with its Q8_0 / Q8_1 blocks for
//! the 32-weight types and Q8_K for the K-quants, [`Q8KBlock`]).
//!
//! A block of 32 activations `x` becomes a scale `d = max|x| / 127` and
//! `q[j] = round_ties_even(x[j] * 127 / max|x|)` in `-127..=127`; `sum = d * Σ q[j]`
//! is kept for Q4_1, whose per-block minimum multiplies the sum of the
//! activations. Both `d` and `sum` are rounded to f16 and back, exactly as
//! llama.cpp stores them in its Q8_0 / Q8_1 blocks: keeping them in f32 is
//! slightly more accurate, but moves the real model's logits away from
//! llama.cpp's by more than the conformance tolerance allows.
//!
//! The quantizers here, a value at a time, are the reference: products
//! quantize their inputs with the vector units (`kernels/activation.rs`),
//! which give the same bits.

use rayon::prelude::*;

use super::block::QK;
use super::block_k::{N_GROUPS, QK_K};
use super::ggml_type::ActivationKind;
use crate::kernels::activation::{Blocks, quantize};
use crate::kernels::dispatch::Dispatch;

/// The activations one product multiplies with, in the form its weight
/// type's family needs ([`GgmlType::activation_kind`](super::GgmlType)).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Activations<'a> {
    /// The f32 values, for float weights.
    F32(&'a [f32]),
    /// 32-value blocks, for the 32-weight block types.
    Q8(&'a [Q8Block]),
    /// 256-value super-blocks, for the K-quants.
    Q8K(&'a [Q8KBlock]),
}

/// Reusable buffers for quantized activations of either kind, so that
/// steady-state products do not allocate.
#[derive(Debug, Default)]
pub(crate) struct ActivationBuffers {
    q8: Vec<Q8Block>,
    /// Each Q8 block's `Σ qs`, which the panel kernels start from.
    q8_sums: Vec<i32>,
    q8k: Vec<Q8KBlock>,
}

impl ActivationBuffers {
    /// `x` in every form `kinds` names, each quantized once into these
    /// buffers (whole blocks of each kind, by `dispatch`'s vector units; the
    /// f32 values themselves serve [`ActivationKind::F32`]): the input of
    /// several products whose weight types share an activation kind is
    /// quantized once for all of them.
    pub fn quantize_each<'s>(
        &'s mut self,
        dispatch: Dispatch,
        kinds: impl IntoIterator<Item = ActivationKind>,
        x: &'s [f32],
    ) -> QuantizedInput<'s> {
        let (mut q8, mut q8k) = (false, false);
        for kind in kinds {
            match kind {
                ActivationKind::F32 => {}
                ActivationKind::Q8 => q8 = true,
                ActivationKind::Q8K => q8k = true,
            }
        }
        let parallel = x.len() >= PARALLEL_MIN_VALUES && rayon::current_num_threads() > 1;
        if q8 {
            let n = x.len() / QK;
            self.q8.resize(n, Q8Block::ZERO);
            self.q8_sums.resize(n, 0);
            let (x, blocks, sums) = (&x[..n * QK], &mut self.q8[..], &mut self.q8_sums[..]);
            if parallel {
                let task = TASK_VALUES / QK;
                (blocks.par_chunks_mut(task), sums.par_chunks_mut(task))
                    .into_par_iter()
                    .zip(x.par_chunks(task * QK))
                    .for_each(|((blocks, sums), x)| {
                        quantize(dispatch, x, Blocks::Q8 { blocks, sums })
                    });
            } else {
                quantize(dispatch, x, Blocks::Q8 { blocks, sums });
            }
        }
        if q8k {
            let n = x.len() / QK_K;
            self.q8k.resize(n, Q8KBlock::ZERO);
            let (x, blocks) = (&x[..n * QK_K], &mut self.q8k[..]);
            if parallel {
                let task = TASK_VALUES / QK_K;
                blocks
                    .par_chunks_mut(task)
                    .zip(x.par_chunks(task * QK_K))
                    .for_each(|(blocks, x)| quantize(dispatch, x, Blocks::Q8K(blocks)));
            } else {
                quantize(dispatch, x, Blocks::Q8K(blocks));
            }
        }
        QuantizedInput {
            f32: x,
            q8: q8.then_some((&self.q8[..], &self.q8_sums[..])),
            q8k: q8k.then_some(&self.q8k[..]),
        }
    }
}

/// Values from which an input is quantized in parallel tasks (a batch of
/// inputs, in prefill) rather than on the calling thread (one input, a
/// decode step, where handing out work costs more): above one input of the
/// widest products (a 1B model's 8,192-wide down projection took a
/// hand-off of its own for a few microseconds of work at every layer of a
/// decode step).
const PARALLEL_MIN_VALUES: usize = 1 << 16;

/// Values a parallel task quantizes: whole blocks of either kind.
const TASK_VALUES: usize = 1 << 13;

/// One input in each form [`ActivationBuffers::quantize_each`] was asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuantizedInput<'a> {
    f32: &'a [f32],
    q8: Option<(&'a [Q8Block], &'a [i32])>,
    q8k: Option<&'a [Q8KBlock]>,
}

impl<'a> QuantizedInput<'a> {
    /// The input in the form `kind`, which must have been asked for: a
    /// product whose kind was not is a bug and panics.
    pub fn get(&self, kind: ActivationKind) -> Activations<'a> {
        match kind {
            ActivationKind::F32 => Activations::F32(self.f32),
            ActivationKind::Q8 => Activations::Q8(self.q8.expect("the input as Q8 blocks").0),
            ActivationKind::Q8K => Activations::Q8K(self.q8k.expect("the input as Q8K blocks")),
        }
    }

    /// Each Q8 block's `Σ qs` (empty when Q8 blocks were not asked for).
    pub fn q8_sums(&self) -> &'a [i32] {
        self.q8.map_or(&[], |(_, sums)| sums)
    }
}

/// 32 activations quantized to signed bytes with one f32 scale: 40 bytes,
/// nothing the kernels do not read for every weight block. A decode step
/// reads the whole input once per weight row, so its size counts: with 32
/// bytes more (per-lane sums for one AVX2 kernel) an 8192-wide input was
/// 18 KB instead of 10, and Q4_0 decode at 1B scale ran at 21.3 tok/s
/// instead of 24.1 (docs/performance.md, "Models at real scale").
///
/// `repr(C)` keeps `d` and `sum` adjacent at the start, so the SIMD kernel
/// loads both with one 8-byte load.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub(crate) struct Q8Block {
    /// The scale: `x[j] ≈ d * qs[j]`.
    pub d: f32,
    /// `d * Σ qs[j]`, the (quantized) sum of the block's activations.
    pub sum: f32,
    /// The quantized values.
    pub qs: [i8; QK],
}

impl Q8Block {
    /// A block of zeros.
    pub const ZERO: Q8Block = Q8Block {
        d: 0.0,
        sum: 0.0,
        qs: [0; QK],
    };

    /// Quantizes 32 activations (`x.len() == 32`; missing values count as 0).
    #[inline]
    pub fn quantize(x: &[f32]) -> Q8Block {
        let amax = largest_magnitude(x);
        let d = amax / 127.0;
        let inv_d = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut qs = [0i8; QK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = round_to_i8(v * inv_d);
        }
        let isum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        Q8Block {
            d: half::f16::from_f32(d).to_f32(),
            sum: half::f16::from_f32(d * isum as f32).to_f32(),
            qs,
        }
    }
}

/// `v.round_ties_even()` as a byte for |v| < 127.5, and 0 for NaN, with
/// no conversion instruction (`f32 as i8` saturates, which the compiler
/// does value by value): adding 1.5 * 2^23 leaves no fraction bits, so the
/// addition itself rounds to the nearest integer, ties to even, and the
/// sum's low bits are that integer plus those of 1.5 * 2^23.
#[inline(always)]
fn round_to_i8(v: f32) -> i8 {
    const ROUNDING_SHIFT: f32 = 12_582_912.0; // 1.5 * 2^23
    let rounded = (v + ROUNDING_SHIFT)
        .to_bits()
        .wrapping_sub(ROUNDING_SHIFT.to_bits());
    if v.is_nan() { 0 } else { rounded as i8 }
}

/// The largest magnitude in `x` that is not NaN (0 when none), as
/// `f32::max` over the magnitudes finds it: eight running maxima side by
/// side, which the compiler makes one vector operation (a single running
/// maximum it must take value by value, in order).
#[inline(always)]
fn largest_magnitude(x: &[f32]) -> f32 {
    // `a > m` is false for a NaN, which is therefore skipped.
    let larger = |m: f32, v: &f32| if v.abs() > m { v.abs() } else { m };
    let (eights, rest) = x.as_chunks::<8>();
    let mut lanes = [0.0f32; 8];
    for eight in eights {
        lanes = std::array::from_fn(|i| larger(lanes[i], &eight[i]));
    }
    lanes.iter().chain(rest).fold(0.0, larger)
}

/// 256 activations quantized to signed bytes with one f32 scale and the sums
/// of each group of 16 (GGML's `block_q8_K`), for the K-quants: their group
/// offsets multiply the group sums.
///
/// Quantized as GGML's `quantize_row_q8_K_ref`: the value of largest
/// magnitude `max` (the first, on ties) maps to -127,
/// `q[j] = min(127, round_ties_even(-127 / max * x[j]))` and `d = 1 / (-127 / max)`,
/// kept in f32.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub(crate) struct Q8KBlock {
    /// The scale: `x[j] ≈ d * qs[j]`.
    pub d: f32,
    /// The quantized values.
    pub qs: [i8; QK_K],
    /// `Σ qs[j]` over each group of 16 values.
    pub bsums: [i16; N_GROUPS],
}

impl Q8KBlock {
    /// A block of zeros.
    pub const ZERO: Q8KBlock = Q8KBlock {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; N_GROUPS],
    };

    /// Quantizes 256 activations (`x.len() == 256`; missing values count as 0).
    #[inline]
    pub fn quantize(x: &[f32]) -> Q8KBlock {
        let amax = largest_magnitude(x);
        let mut block = Q8KBlock::ZERO;
        if amax == 0.0 {
            return block;
        }
        // The first value of that magnitude (there is one): its sign is the scale's.
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        for (q, &v) in block.qs.iter_mut().zip(x) {
            *q = round_to_i8(iscale * v);
        }
        for (sum, group) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
            *sum = group.iter().map(|&q| i16::from(q)).sum();
        }
        block.d = 1.0 / iscale;
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_bytes(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Q8_K blocks of seeded activation vectors as llama.cpp's own
    /// `quantize_row_q8_K` wrote them (fixtures/quant/kquant_dots.json,
    /// written by scripts/reference/kquant_dots.py): the same bits.
    #[test]
    fn q8_k_blocks_match_llama_cpp_bit_for_bit() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/quant/kquant_dots.json"
        );
        let text = std::fs::read_to_string(path).expect("fixtures/quant/kquant_dots.json");
        let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (mut n_blocks, mut n_expected) = (0, 0);
        for entry in fixture.as_object().unwrap().values() {
            for product in entry["products"].as_array().unwrap() {
                n_expected += entry["n_cols"].as_u64().unwrap() / QK_K as u64;
                let x: Vec<f32> = hex_bytes(product["x"].as_str().unwrap())
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                let expected = hex_bytes(product["q8_K"].as_str().unwrap());
                for (values, bytes) in x.chunks_exact(QK_K).zip(expected.chunks_exact(292)) {
                    let block = Q8KBlock::quantize(values);
                    let d = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                    assert_eq!(block.d.to_bits(), d.to_bits(), "d");
                    let qs: Vec<i8> = bytes[4..260].iter().map(|&b| b as i8).collect();
                    assert_eq!(block.qs.as_slice(), qs.as_slice(), "qs");
                    let bsums: Vec<i16> = bytes[260..292]
                        .chunks_exact(2)
                        .map(|b| i16::from_le_bytes([b[0], b[1]]))
                        .collect();
                    assert_eq!(block.bsums.as_slice(), bsums.as_slice(), "bsums");
                    n_blocks += 1;
                }
            }
        }
        assert_eq!(n_blocks, n_expected, "every block of the fixture");
        assert!(
            n_blocks >= 36,
            "six types, two vectors, three or four blocks each"
        );
    }

    /// `d = max|x| / 127` and `sum = d Σ q`, both through f16 as llama.cpp
    /// stores them, with `q` rounded ties-to-even; and 40 bytes, the size
    /// every decode product streams once per weight row.
    #[test]
    fn q8_blocks_hold_the_scale_the_values_and_their_sum() {
        assert_eq!(std::mem::size_of::<Q8Block>(), 40);
        let x: Vec<f32> = (0..QK).map(|j| (j as f32 * 0.37).sin() * 3.0).collect();
        let block = Q8Block::quantize(&x);
        let amax = x.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
        for (&q, &v) in block.qs.iter().zip(&x) {
            let exact = f64::from(v) * 127.0 / amax;
            assert!((f64::from(q) - exact).abs() <= 0.5 + 1e-4, "{v}: {q}");
        }
        let d = amax as f32 / 127.0;
        assert_eq!(block.d, half::f16::from_f32(d).to_f32());
        let isum: i32 = block.qs.iter().map(|&q| i32::from(q)).sum();
        assert!(isum != 0, "a block whose sum is not zero");
        assert_eq!(block.sum, half::f16::from_f32(d * isum as f32).to_f32());
        let zero = Q8Block::quantize(&[0.0; QK]);
        assert_eq!((zero.d, zero.sum, zero.qs), (0.0, 0.0, [0; QK]));
    }

    #[test]
    fn q8_k_of_zeros_is_zero_and_the_largest_magnitude_maps_to_minus_127() {
        assert_eq!(
            Q8KBlock::quantize(&[0.0; QK_K]),
            Q8KBlock {
                d: 0.0,
                qs: [0; QK_K],
                bsums: [0; N_GROUPS]
            }
        );
        let mut x = [0.25f32; QK_K];
        x[3] = 2.0;
        x[4] = -2.0; // same magnitude, later: the first one sets the sign
        let block = Q8KBlock::quantize(&x);
        assert_eq!((block.qs[3], block.qs[4], block.qs[0]), (-127, 127, -16));
        assert_eq!(block.d, 1.0 / (-127.0 / 2.0));
        assert_eq!(block.bsums[0], 14 * -16 - 127 + 127);
    }

    #[test]
    fn byte_rounding_matches_round_ties_even() {
        let expected = |v: f32| v.round_ties_even() as i8;
        for v in [
            0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 127.00002, -127.4, 0.49999997, -0.0,
        ] {
            assert_eq!(round_to_i8(v), expected(v), "{v}");
        }
        // Every quarter step in the range the quantizers use.
        for i in -509..=509 {
            let v = i as f32 / 4.0;
            assert_eq!(round_to_i8(v), expected(v), "{v}");
        }
        // A dense sweep of non-representable steps across -127.5..127.5.
        for i in 0..99_000 {
            let v = i as f32 * 0.002_57 - 127.2;
            assert_eq!(round_to_i8(v), expected(v), "{v}");
        }
        assert_eq!(round_to_i8(f32::NAN), 0);
    }

    /// The largest magnitude is that of `f32::max` over the magnitudes,
    /// which skips NaN, taken in order.
    #[test]
    fn largest_magnitude_is_the_float_maximum() {
        let cases: [&[f32]; 6] = [
            &[0.0, -0.0],
            &[1.0, -3.5, 2.0],
            &[f32::NAN, -1e-30, 1e-31],
            &[f32::NEG_INFINITY, 5.0],
            &[-f32::NAN, f32::MIN_POSITIVE / 2.0],
            &[f32::MAX, -f32::MAX, 0.5],
        ];
        let long: Vec<f32> = (0..37)
            .map(|i| ((i * 7 % 37) as f32 - 18.0) * 0.3)
            .collect();
        for x in cases
            .into_iter()
            .chain([long.as_slice(), &long[..16], &long[5..]])
        {
            let float = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(largest_magnitude(x).to_bits(), float.to_bits(), "{x:?}");
        }
    }

    /// The first value of the largest magnitude sets the sign, as the
    /// scalar search of GGML's `quantize_row_q8_K_ref` finds it, with NaN
    /// skipped, over seeded blocks with repeated magnitudes.
    #[test]
    fn q8_k_scale_comes_from_the_first_largest_value() {
        let mut state = 0x9e37_79b9_u32;
        for _ in 0..200 {
            let x: Vec<f32> = (0..QK_K)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    // Few distinct magnitudes, both signs, some NaN.
                    match state >> 28 {
                        0 => f32::NAN,
                        k => (k % 5) as f32 * if state & 0x100 == 0 { 1.0 } else { -1.0 },
                    }
                })
                .collect();
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in &x {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            assert_eq!(Q8KBlock::quantize(&x).d, 1.0 / (-127.0 / max));
        }
    }
}
