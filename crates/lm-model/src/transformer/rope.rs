//! Rotary position embeddings: the frequencies of each rotated pair, and the
//! rotation of adjacent pairs that llama.cpp's "normal" RoPE mode
//! applies (the GGUF conversion permutes llama's Q and K weights for it).
//!
//! ```text
//! head vector: [x0 x1 | x2 x3 | ... | x(d-2) x(d-1) | untouched beyond dim]
//!               pair 0  pair 1        pair d/2-1
//! angle of pair i at position pos:  theta = pos * base^(-2i / dim)
//! (x2i, x2i+1) -> (x2i cos theta - x2i+1 sin theta,  x2i sin theta + x2i+1 cos theta)
//! ```
//!
//! The NeoX mode ([`RopeMode::Neox`], qwen2, qwen3, gemma3) pairs `x[i]`
//! with `x[i + dim/2]` instead; on llama's weights it gives plausible but
//! wrong text (see `shared/models/SMOLLM2.md`), so the mode comes from the
//! architecture. Llama 3's frequency factors divide each pair's frequency,
//! and linear scaling multiplies every angle (see [`RopeOptions`]). YaRN
//! (Peng et al. 2023, as ggml's `rope_yarn`) scales only the slow pairs:
//! each pair's angle is a blend of the scaled and the unscaled one by a ramp
//! between two correction dimensions, and every cosine and sine is times
//! `1 + 0.1 ln(1 / freq_scale)`.

use super::config::{RopeMode, RopeOptions};

/// The rotary frequencies `base^(-2i / dim)`; each position's angles are
/// computed when a row is rotated (in f64, then rounded to f32), so memory does
/// not grow with the context length a file declares (a hostile header could
/// declare 2^32 positions).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    dim: usize,
    n_positions: usize,
    mode: RopeMode,
    /// `freq_scale * base^(-2i / dim) / freq_factors[i]` for each pair `i`.
    inv_freq: Vec<f64>,
    /// Multiplies each cosine and sine ([`RopeOptions::attn_factor`]).
    magnitude: f64,
}

impl RopeTable {
    /// The adjacent-pair rotation for rotary dimension `dim` (even) and
    /// frequency `base`, for positions `0..n_positions`.
    #[cfg(test)]
    pub fn new(dim: usize, base: f32, n_positions: usize) -> Self {
        Self::with_options(dim, base, n_positions, &RopeOptions::default())
    }

    /// The rotation for rotary dimension `dim` (even), frequency `base` and
    /// `options` (validated with the configuration), for positions
    /// `0..n_positions`.
    pub fn with_options(dim: usize, base: f32, n_positions: usize, options: &RopeOptions) -> Self {
        let half = dim / 2;
        let freq_scale = options.freq_scale;
        let yarn = options
            .yarn_original_context
            .map(|original| yarn_correction_dims(dim, original, base));
        let inv_freq = (0..half)
            .map(|i| {
                let factor = options.freq_factors.as_ref().map_or(1.0, |f| f[i]);
                // YaRN blends the scaled (interpolated) and unscaled
                // (extrapolated) angle by the pair's ramp.
                let scale = match yarn {
                    Some(dims) => {
                        let ramp = f64::from(yarn_ramp(dims, i));
                        f64::from(freq_scale) * (1.0 - ramp) + ramp
                    }
                    None => f64::from(freq_scale),
                };
                scale * f64::from(base).powf(-2.0 * i as f64 / dim as f64) / f64::from(factor)
            })
            .collect();
        // YaRN's magnitude correction, 1 + 0.1 ln(1 / freq_scale).
        let yarn_magnitude = match yarn {
            Some(_) => 1.0 + 0.1 * (1.0 / freq_scale).ln(),
            None => 1.0,
        };
        Self {
            dim: half * 2,
            n_positions,
            mode: options.mode,
            inv_freq,
            magnitude: f64::from(options.attn_factor * yarn_magnitude),
        }
    }

    /// Rotates every head of `row` (heads of `head_dim` components laid end
    /// to end) to position `pos`. The decoder checks the context bound and
    /// the rotary dimension against the head width when it is built, so a
    /// position beyond `n_positions` is a bug and panics.
    pub fn rotate_heads(&self, row: &mut [f32], head_dim: usize, pos: usize) {
        assert!(
            pos < self.n_positions,
            "rotary position {pos} beyond the table's {}",
            self.n_positions
        );
        debug_assert!(self.dim <= head_dim && row.len().is_multiple_of(head_dim));
        let half = self.dim / 2;
        for (i, &freq) in self.inv_freq.iter().enumerate() {
            let (s, c) = (pos as f64 * freq).sin_cos();
            let (s, c) = ((s * self.magnitude) as f32, (c * self.magnitude) as f32);
            let (a, b) = match self.mode {
                RopeMode::Adjacent => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            for head in row.chunks_exact_mut(head_dim) {
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
}

/// YaRN's start and end correction dimensions for rotary dimension `dim`,
/// an original context `original` and frequency `base`, with llama.cpp's
/// betas 32 and 1 (ggml's `ggml_rope_yarn_corr_dims`, in its f32
/// operations): the pairs below `start` keep their unscaled angle, those
/// past `end` take the scaled one.
fn yarn_correction_dims(dim: usize, original: usize, base: f32) -> [f32; 2] {
    const BETA_FAST: f32 = 32.0;
    const BETA_SLOW: f32 = 1.0;
    let corr_dim = |beta: f32| {
        dim as f32 * (original as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let start = corr_dim(BETA_FAST).floor();
    let end = corr_dim(BETA_SLOW).ceil();
    [start.max(0.0), end.min(dim as f32 - 1.0)]
}

/// How much of pair `i`'s angle stays unscaled under YaRN: 1 below the
/// start dimension, 0 past the end, linear between (ggml's
/// `rope_yarn_ramp`).
fn yarn_ramp([low, high]: [f32; 2], i: usize) -> f32 {
    let y = (i as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_the_identity() {
        let table = RopeTable::new(4, 10000.0, 3);
        let mut row = [1.0, 2.0, 3.0, 4.0];
        table.rotate_heads(&mut row, 4, 0);
        assert_eq!(row, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn adjacent_pairs_rotate_by_hand_worked_angles() {
        // dim 4, base 100: pair 0 turns by pos * 1, pair 1 by pos * 100^(-1/2) = pos / 10.
        let table = RopeTable::new(4, 100.0, 3);
        let mut row = [1.0, 0.0, 0.0, 1.0, 5.0, 6.0];
        table.rotate_heads(&mut row[..4], 4, 2);
        let expected = [2f32.cos(), 2f32.sin(), -(0.2f32.sin()), 0.2f32.cos()];
        for (r, e) in row.iter().zip(expected) {
            assert!((r - e).abs() < 1e-6, "{row:?}");
        }
        assert_eq!(&row[4..], &[5.0, 6.0]);
    }

    #[test]
    fn neox_pairs_halves_with_scaled_and_divided_frequencies() {
        // dim 4, base 100, freq_scale 0.5, factors [1, 4]: pair 0 = (x0, x2)
        // turns by pos * 0.5, pair 1 = (x1, x3) by pos * 0.5 / 10 / 4.
        let options = RopeOptions {
            mode: RopeMode::Neox,
            freq_scale: 0.5,
            freq_factors: Some(vec![1.0, 4.0]),
            ..RopeOptions::default()
        };
        let table = RopeTable::with_options(4, 100.0, 8, &options);
        let mut row = [1.0, 1.0, 0.0, 0.0];
        table.rotate_heads(&mut row, 4, 4);
        let (a0, a1) = (2.0f64, 0.05f64);
        let expected = [a0.cos(), a1.cos(), a0.sin(), a1.sin()];
        for (r, e) in row.iter().zip(expected) {
            assert!((f64::from(*r) - e).abs() < 1e-6, "{row:?}");
        }
    }

    /// YaRN by hand: dim 32, base 10000, original context 64, scale 1/4.
    /// corr_dim(32) = 32 ln(64 / 64 pi) / 2 ln 10000 = -1.99, floored and
    /// then at least 0: 0; corr_dim(1) = 32 ln(64 / 2 pi) / 2 ln 10000 =
    /// 4.03, ceiled: 5. So pair 0 keeps its angle, pairs 5 on are scaled by
    /// 1/4, pair 3 mixes 2/5 unscaled; every cosine and sine is times
    /// 1 + 0.1 ln 4.
    #[test]
    fn yarn_blends_scaled_and_unscaled_angles_by_pair() {
        assert_eq!(yarn_correction_dims(32, 64, 10000.0), [0.0, 5.0]);
        let options = RopeOptions {
            mode: RopeMode::Neox,
            freq_scale: 0.25,
            yarn_original_context: Some(64),
            ..RopeOptions::default()
        };
        let table = RopeTable::with_options(32, 10000.0, 64, &options);
        let magnitude = 1.0 + 0.1 * 4f64.ln();
        for (pair, share) in [(0, 1.0), (1, 0.8), (3, 0.4), (5, 0.0), (15, 0.0)] {
            let mut row = [0.0f32; 32];
            row[pair] = 1.0;
            table.rotate_heads(&mut row, 32, 5);
            let unscaled = 10000f64.powf(-2.0 * pair as f64 / 32.0);
            let angle = 5.0 * unscaled * (0.25 * (1.0 - share) + share);
            let expected = [angle.cos() * magnitude, angle.sin() * magnitude];
            let ours = [f64::from(row[pair]), f64::from(row[pair + 16])];
            for (o, e) in ours.iter().zip(expected) {
                assert!(
                    (o - e).abs() < 1e-5,
                    "pair {pair}: {ours:?} vs {expected:?}"
                );
            }
        }
    }

    #[test]
    fn only_the_rotary_dimension_turns() {
        // dim 2 of a head of 4: the second pair stays, in every head.
        let table = RopeTable::new(2, 10000.0, 2);
        let mut row = [1.0, 0.0, 7.0, 8.0, 0.0, 1.0, 9.0, 10.0];
        table.rotate_heads(&mut row, 4, 1);
        assert!((row[0] - 1f32.cos()).abs() < 1e-6 && (row[1] - 1f32.sin()).abs() < 1e-6);
        assert!((row[4] + 1f32.sin()).abs() < 1e-6 && (row[5] - 1f32.cos()).abs() < 1e-6);
        assert_eq!([row[2], row[3], row[6], row[7]], [7.0, 8.0, 9.0, 10.0]);
    }
}
