//! Rotary position embeddings: one precomputed table of cosines and sines,
//! and the rotation of adjacent pairs that llama.cpp's "normal" RoPE mode
//! applies (the GGUF conversion permutes llama's Q and K weights for it).
//!
//! ```text
//! head vector: [x0 x1 | x2 x3 | ... | x(d-2) x(d-1) | untouched beyond dim]
//!               pair 0  pair 1        pair d/2-1
//! angle of pair i at position pos:  theta = pos * base^(-2i / dim)
//! (x2i, x2i+1) -> (x2i cos theta - x2i+1 sin theta,  x2i sin theta + x2i+1 cos theta)
//! ```
//!
//! The "NeoX" layout would pair `x[i]` with `x[i + dim/2]` instead; on these
//! weights it gives plausible but wrong text (see `shared/models/SMOLLM2.md`).

/// Cosines and sines for every position up to the context length, computed
/// once in f64 and stored as f32, `[n_positions][dim / 2]` each.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    dim: usize,
    n_positions: usize,
    /// `cos[pos * dim/2 + i]`.
    cos: Vec<f32>,
    /// `sin[pos * dim/2 + i]`.
    sin: Vec<f32>,
}

impl RopeTable {
    /// The table for rotary dimension `dim` (even) and frequency `base`, for
    /// positions `0..n_positions`.
    pub fn new(dim: usize, base: f32, n_positions: usize) -> Self {
        let half = dim / 2;
        let mut cos = Vec::with_capacity(n_positions * half);
        let mut sin = Vec::with_capacity(n_positions * half);
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| f64::from(base).powf(-2.0 * i as f64 / dim as f64))
            .collect();
        for pos in 0..n_positions {
            for &freq in &inv_freq {
                let theta = pos as f64 * freq;
                cos.push(theta.cos() as f32);
                sin.push(theta.sin() as f32);
            }
        }
        Self {
            dim: half * 2,
            n_positions,
            cos,
            sin,
        }
    }

    /// The rotary dimension: how many leading components of a head rotate.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// How many positions the table covers.
    pub fn n_positions(&self) -> usize {
        self.n_positions
    }

    /// Rotates every head of `row` (heads of `head_dim` components laid end
    /// to end) to position `pos`. Positions beyond the table leave the row
    /// unchanged; callers check the context bound first.
    pub fn rotate_heads(&self, row: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.dim / 2;
        let Some(cos) = self.cos.get(pos * half..(pos + 1) * half) else {
            return;
        };
        let Some(sin) = self.sin.get(pos * half..(pos + 1) * half) else {
            return;
        };
        for head in row.chunks_exact_mut(head_dim) {
            for ((pair, &c), &s) in head[..self.dim.min(head_dim)]
                .chunks_exact_mut(2)
                .zip(cos)
                .zip(sin)
            {
                let (x0, x1) = (pair[0], pair[1]);
                pair[0] = x0 * c - x1 * s;
                pair[1] = x0 * s + x1 * c;
            }
        }
    }
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
