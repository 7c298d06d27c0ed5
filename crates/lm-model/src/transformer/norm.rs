//! Normalisation of one residual-stream row: LayerNorm (GPT-2, the toy
//! decoder) and RMSNorm (llama).
//!
//! ```text
//! LayerNorm: y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias
//! RMSNorm:   y = x / sqrt(mean(x^2) + eps) * weight
//! ```
//!
//! Sums are taken in f64, so the result does not depend on the row's length
//! or summation order beyond f32 rounding of the output.

use super::config::NormKind;

/// A normalisation layer with its learned gain (and bias for LayerNorm).
#[derive(Debug, Clone, PartialEq)]
pub struct Norm {
    kind: NormKind,
    eps: f32,
    /// Per-component gain, `[n_embd]`.
    weight: Vec<f32>,
    /// Per-component bias, `[n_embd]`; LayerNorm only (zeros if absent).
    bias: Vec<f32>,
}

impl Norm {
    /// A LayerNorm with gain `weight` and bias `bias` (same length).
    pub fn layer_norm(weight: Vec<f32>, bias: Vec<f32>, eps: f32) -> Self {
        Self {
            kind: NormKind::LayerNorm,
            eps,
            weight,
            bias,
        }
    }

    /// An RMSNorm with gain `weight`.
    pub fn rms_norm(weight: Vec<f32>, eps: f32) -> Self {
        Self {
            kind: NormKind::RmsNorm,
            eps,
            weight,
            bias: Vec::new(),
        }
    }

    /// The kind of this layer.
    pub(crate) fn kind(&self) -> NormKind {
        self.kind
    }

    /// The width this layer normalises.
    pub(crate) fn width(&self) -> usize {
        self.weight.len()
    }

    /// The epsilon added to the variance.
    pub(crate) fn eps(&self) -> f32 {
        self.eps
    }

    /// The per-component gain.
    pub(crate) fn weight(&self) -> &[f32] {
        &self.weight
    }

    /// The per-component bias (empty for RMSNorm).
    pub(crate) fn bias(&self) -> &[f32] {
        &self.bias
    }

    /// Normalises every `width()`-long row of `x` into the same row of `out`
    /// (the same length, whole rows: the decoder sizes both).
    pub(crate) fn apply_rows(&self, x: &[f32], out: &mut [f32]) {
        let width = self.width();
        debug_assert!(x.len() == out.len() && x.len().is_multiple_of(width.max(1)));
        for (x_row, out_row) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
            self.apply(x_row, out_row);
        }
    }

    /// Normalises every `width()`-long row of `x` in place (a layer's
    /// output, or each head of a query or key row).
    pub(crate) fn apply_rows_in_place(&self, x: &mut [f32]) {
        let width = self.width();
        debug_assert!(x.len().is_multiple_of(width.max(1)));
        for row in x.chunks_exact_mut(width) {
            // The statistics are read before any value is written.
            let (shift, inv) = self.statistics(row);
            match self.kind {
                NormKind::LayerNorm => {
                    for ((v, &w), &b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
                        *v = ((f64::from(*v) - shift) * inv) as f32 * w + b;
                    }
                }
                NormKind::RmsNorm => {
                    let inv = inv as f32;
                    for (v, &w) in row.iter_mut().zip(&self.weight) {
                        *v = *v * inv * w;
                    }
                }
            }
        }
    }

    /// The mean subtracted (0 for RMSNorm) and the inverse scale of one row.
    fn statistics(&self, x: &[f32]) -> (f64, f64) {
        let n = x.len().max(1) as f64;
        match self.kind {
            NormKind::LayerNorm => {
                let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
                let var = x
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>()
                    / n;
                (mean, 1.0 / (var + f64::from(self.eps)).sqrt())
            }
            NormKind::RmsNorm => {
                let mean_square = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n;
                (0.0, 1.0 / (mean_square + f64::from(self.eps)).sqrt())
            }
        }
    }

    /// Normalises one row `x` (of `width()` components) into `out` (as long).
    pub(crate) fn apply(&self, x: &[f32], out: &mut [f32]) {
        debug_assert!(x.len() == self.width() && out.len() == self.width());
        let (shift, inv) = self.statistics(x);
        match self.kind {
            NormKind::LayerNorm => {
                for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(&self.weight).zip(&self.bias) {
                    *o = ((f64::from(v) - shift) * inv) as f32 * w + b;
                }
            }
            NormKind::RmsNorm => {
                let inv = inv as f32;
                for ((o, &v), &w) in out.iter_mut().zip(x).zip(&self.weight) {
                    *o = v * inv * w;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_of_a_hand_worked_row() {
        // x = [1, 2, 3]: mean 2, variance 2/3, so y = (x - 2) / sqrt(2/3).
        let norm = Norm::layer_norm(vec![1.0, 2.0, 1.0], vec![0.0, 0.5, 0.0], 0.0);
        let mut out = [0.0; 3];
        norm.apply(&[1.0, 2.0, 3.0], &mut out);
        let s = (2.0f32 / 3.0).sqrt();
        let expected = [-1.0 / s, 0.5, 1.0 / s];
        for (o, e) in out.iter().zip(expected) {
            assert!((o - e).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn rms_norm_of_a_hand_worked_row() {
        // x = [3, 4]: mean square 12.5, so y = x / sqrt(12.5) * weight.
        let norm = Norm::rms_norm(vec![1.0, 2.0], 0.0);
        let mut out = [0.0; 2];
        norm.apply(&[3.0, 4.0], &mut out);
        let r = 12.5f32.sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6);
        assert!((out[1] - 8.0 / r).abs() < 1e-6);
    }
}
