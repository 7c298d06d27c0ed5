//! The feed-forward block of a layer: GELU MLP (GPT-2, the toy decoder),
//! SwiGLU (llama, qwen) or GeGLU (gemma).
//!
//! ```text
//! GELU MLP: y = down(gelu(up(x)))
//! SwiGLU:   y = down(silu(gate(x)) * up(x))
//! GeGLU:    y = down(gelu(gate(x)) * up(x))
//! MoE:      y = sum of the chosen experts' SwiGLU or GeGLU, weighted, plus
//!           a shared SwiGLU expert where there is one (`moe`)
//! ```

use rayon::prelude::*;

use super::config::FfnKind;
use super::linear::Linear;
use super::moe::{MixtureOfExperts, MoeScratch};
use crate::kernels::dispatch::Dispatch;
use crate::kernels::exp::exp_in_place;

/// A feed-forward block with its weights.
#[derive(Debug, Clone)]
pub enum FeedForward {
    /// `down(gelu(up(x)))`, tanh approximation of GELU.
    GeluMlp {
        /// `[ffn_dim][n_embd]`.
        up: Linear,
        /// `[n_embd][ffn_dim]`.
        down: Linear,
    },
    /// `down(silu(gate(x)) * up(x))`.
    SwiGlu {
        /// `[ffn_dim][n_embd]`.
        gate: Linear,
        /// `[ffn_dim][n_embd]`.
        up: Linear,
        /// `[n_embd][ffn_dim]`.
        down: Linear,
    },
    /// `down(gelu(gate(x)) * up(x))`, tanh approximation of GELU.
    GeGlu {
        /// `[ffn_dim][n_embd]`.
        gate: Linear,
        /// `[ffn_dim][n_embd]`.
        up: Linear,
        /// `[n_embd][ffn_dim]`.
        down: Linear,
    },
    /// A mixture of experts, each a SwiGLU or GeGLU block (`moe`).
    Moe(Box<MixtureOfExperts>),
}

/// Rows the block reads at a time. Its hidden and gate rows (`[rows]
/// [ffn_dim]` each) and the product's transposed results would be the
/// largest buffers of a prefill piece (SmolLM2, 512 tokens: 9 MB), so a
/// batch goes through in groups of this many, each one batched product per
/// weight; a layer's weights (1.7 MB for SmolLM2 Q4_1) stay in cache from
/// group to group. Every row's result has the same bits in any grouping.
pub(crate) const FFN_ROWS: usize = 128;

impl FeedForward {
    /// Applies the block to the `n` rows of `xs` (`[n][n_embd]`) into `ys`
    /// (`[n][n_embd]`), [`FFN_ROWS`] rows at a time, using `hidden` and
    /// `gated` (`[min(n, FFN_ROWS)][ffn_dim]` each) as scratch; a mixture
    /// of experts uses `moe_scratch` instead.
    pub(crate) fn forward(
        &self,
        dispatch: Dispatch,
        xs: &[f32],
        n: usize,
        [hidden, gated]: [&mut [f32]; 2],
        moe_scratch: &mut MoeScratch,
        ys: &mut [f32],
    ) {
        if n == 0 {
            return;
        }
        match self {
            Self::Moe(moe) => moe.forward(dispatch, xs, n, moe_scratch, ys),
            _ => self.forward_dense(dispatch, xs, n, [hidden, gated], ys),
        }
    }

    /// [`FeedForward::forward`] of a dense block (a mixture's shared
    /// expert included).
    pub(super) fn forward_dense(
        &self,
        dispatch: Dispatch,
        xs: &[f32],
        n: usize,
        [hidden, gated]: [&mut [f32]; 2],
        ys: &mut [f32],
    ) {
        if n == 0 {
            return;
        }
        let (width_in, width_out) = (xs.len() / n, ys.len() / n);
        let ffn_dim = hidden.len() / n.min(FFN_ROWS);
        for (xs, ys) in xs
            .chunks(FFN_ROWS * width_in)
            .zip(ys.chunks_mut(FFN_ROWS * width_out))
        {
            let m = xs.len() / width_in;
            let (hidden, gated) = (&mut hidden[..m * ffn_dim], &mut gated[..m * ffn_dim]);
            match self {
                Self::GeluMlp { up, down } => {
                    up.matmul(dispatch, xs, m, hidden);
                    hidden.iter_mut().for_each(|h| *h = gelu(*h));
                    down.matmul(dispatch, hidden, m, ys);
                }
                Self::SwiGlu { gate, up, down } | Self::GeGlu { gate, up, down } => {
                    Linear::matmul_each(dispatch, xs, m, [(gate, &mut *gated), (up, &mut *hidden)]);
                    let kind = match self {
                        Self::SwiGlu { .. } => FfnKind::SwiGlu,
                        _ => FfnKind::GeGlu,
                    };
                    gate_rows(kind, dispatch, hidden, gated, m);
                    down.matmul(dispatch, hidden, m, ys);
                }
                Self::Moe(_) => unreachable!("a mixture is not a dense block"),
            }
        }
    }
}

/// Below this many values [`gate_rows`] runs on the calling thread: a
/// decode step's few rows (a mixture's 2 chosen experts of 2,048) take a
/// few microseconds, less than a hand-off to rayon (which, from outside
/// the pool at one thread, is two thread switches).
const GATE_PARALLEL_MIN_VALUES: usize = 1 << 15;

/// `hidden[k] *= act(gated[k])` for the `m` rows of both, `act` SiLU
/// (`SwiGlu`) or GELU (otherwise), or `hidden[k] = swiglu_oai(gated[k],
/// hidden[k])` (`SwiGluOai`); the rows of a batch (prefill) in parallel.
pub(super) fn gate_rows(
    kind: FfnKind,
    dispatch: Dispatch,
    hidden: &mut [f32],
    gated: &[f32],
    m: usize,
) {
    let gate_row = |(hidden, gated): (&mut [f32], &[f32])| match kind {
        FfnKind::SwiGlu => silu_gate(dispatch, hidden, gated),
        FfnKind::SwiGluOai => {
            for (h, &g) in hidden.iter_mut().zip(gated) {
                *h = swiglu_oai(g, *h);
            }
        }
        _ => {
            for (h, &g) in hidden.iter_mut().zip(gated) {
                *h *= gelu(g);
            }
        }
    };
    if m > 1 && hidden.len() >= GATE_PARALLEL_MIN_VALUES && rayon::current_num_threads() > 1 {
        let width = (hidden.len() / m).max(1);
        hidden
            .par_chunks_mut(width)
            .zip(gated.par_chunks(width))
            .for_each(gate_row);
    } else {
        gate_row((hidden, gated));
    }
}

/// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// gpt-oss's gated unit of a gate value `g` and an up value `u` (llama.cpp's
/// `swiglu_oai` with its alpha 1.702 and limit 7, in its f32 operations):
/// `x = min(g, 7)`, `y = clamp(u, -7, 7)`, `x / (1 + exp(-1.702 x)) * (y + 1)`.
pub fn swiglu_oai(g: f32, u: f32) -> f32 {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    let x = g.min(LIMIT);
    let y = u.clamp(-LIMIT, LIMIT);
    x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0)
}

/// SiLU (swish): `x / (1 + exp(-x))`.
pub fn silu(x: f32) -> f32 {
    silu_from_exp(x, (-x).exp())
}

/// SiLU of `x` given `exp(-x)`: the one formula [`silu`] and
/// [`silu_gate`] share.
#[inline(always)]
fn silu_from_exp(x: f32, exp_minus_x: f32) -> f32 {
    x / (1.0 + exp_minus_x)
}

/// `hidden[k] *= silu(gated[k])` with the bits of [`silu`], the
/// exponentials taken [`GATE_RUN`] at a time by the vectorised
/// [`exp_in_place`] (libm's bits) instead of one `expf` call per value.
fn silu_gate(dispatch: Dispatch, hidden: &mut [f32], gated: &[f32]) {
    let mut exps = [0.0f32; GATE_RUN];
    for (hidden, gated) in hidden.chunks_mut(GATE_RUN).zip(gated.chunks(GATE_RUN)) {
        let exps = &mut exps[..gated.len()];
        for (e, &g) in exps.iter_mut().zip(gated) {
            *e = -g;
        }
        exp_in_place(dispatch, exps);
        for ((h, &g), &e) in hidden.iter_mut().zip(gated).zip(&*exps) {
            *h *= silu_from_exp(g, e);
        }
    }
}

/// Values [`silu_gate`] exponentiates at a time: a stack buffer of 1 KB.
const GATE_RUN: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    /// swiglu_oai against its formula in f64 at points inside and beyond
    /// the clamps (a gate above 7 is cut to 7; an up value beyond +-7 too;
    /// a very negative gate is not clamped and gives about 0).
    #[test]
    fn swiglu_oai_clamps_and_adds_one_to_up() {
        let reference = |g: f64, u: f64| {
            let x = g.min(7.0);
            let y = u.clamp(-7.0, 7.0);
            x / (1.0 + (-1.702 * x).exp()) * (y + 1.0)
        };
        for (g, u) in [
            (0.5, -0.3),
            (-2.0, 3.0),
            (9.0, 1.0),
            (3.0, 12.0),
            (1.5, -20.0),
            (-40.0, 2.0),
        ] {
            let ours = f64::from(swiglu_oai(g as f32, u as f32));
            let expected = reference(g, u);
            assert!(
                (ours - expected).abs() < 1e-5 * expected.abs().max(1.0),
                "({g}, {u}): {ours} vs {expected}"
            );
        }
        // The + 1 on the up value: u = -1 silences the unit.
        assert_eq!(swiglu_oai(2.0, -1.0), 0.0);
        // The gate clamp: every gate above 7 gives the same value.
        assert_eq!(swiglu_oai(7.0, 0.5), swiglu_oai(100.0, 0.5));
    }

    #[test]
    fn activations_at_known_points() {
        assert_eq!(gelu(0.0), 0.0);
        // gelu(1) with the tanh approximation: 0.841192 (GPT-2's value).
        assert!((gelu(1.0) - 0.841_192).abs() < 1e-5);
        assert!((silu(1.0) - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-7);
        assert!(silu(-50.0).abs() < 1e-15);
    }

    /// The vectorised gate has the bits of `silu` one value at a time, over
    /// a sweep wider than any gate output (past both ends of the vector
    /// exponential's range, through zero and the subnormals) and a length
    /// that leaves a partial run and a partial vector.
    #[test]
    fn silu_gate_keeps_the_bits_of_silu() {
        let gated: Vec<f32> = (0..2_003)
            .map(|k| (k as f32 - 1_001.0) * 0.137)
            .chain([0.0, -0.0, 1e-40, -1e-40, 88.9, -104.5, f32::MIN_POSITIVE])
            .collect();
        let hidden: Vec<f32> = (0..gated.len()).map(|k| 1.0 + k as f32 * 1e-3).collect();
        for dispatch in Dispatch::every_available() {
            let mut gated_hidden = hidden.clone();
            silu_gate(dispatch, &mut gated_hidden, &gated);
            for ((&out, &h), &g) in gated_hidden.iter().zip(&hidden).zip(&gated) {
                assert_eq!(
                    out.to_bits(),
                    (h * silu(g)).to_bits(),
                    "{dispatch:?} at {g}"
                );
            }
        }
    }
}
