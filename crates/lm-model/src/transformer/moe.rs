//! A mixture-of-experts feed-forward block (Shazeer et al. 2017, "Outrageously
//! Large Neural Networks"; Mixtral, Qwen3-MoE, OLMoE), as llama.cpp's
//! `build_moe_ffn` (src/llama-graph.cpp) computes it with softmax gating:
//!
//! ```text
//! p      = softmax(x Wrouter^T)                       [n_expert] per token
//! chosen = the n_expert_used largest p (ties: the lower expert first)
//! w_e    = p_e, or p_e / sum of the chosen p (norm_weights)
//! y      = sum over chosen e of w_e * down_e(silu(gate_e(x)) * up_e(x))
//! ```
//!
//! The experts are the 3-d tensors `ffn_{gate,up,down}_exps` of the file,
//! each expert a view of its own byte range ([`Linear`]), so only the chosen
//! experts' weights are read. A batch is grouped by expert: each expert's
//! weights stream once for all the tokens that chose it (up to
//! [`FFN_ROWS`] at a time), through the same batched products as the dense
//! block. One token reads its chosen experts' gate and up projections in one
//! product (one quantization of the token, one split of all their rows over
//! the threads).
//!
//! Each token's outputs are summed in increasing expert order whatever the
//! batch, so a token's result has the same bits read alone or in a batch
//! (llama.cpp sums in the order chosen; the two differ in the last bits).
//! llama.cpp's top-k is `std::sort` of the probabilities, an insertion sort
//! for up to 16 experts: ties keep the lower expert first, as here.

use super::TransformerError;
use super::config::{FfnKind, TransformerConfig};
use super::ffn::{FFN_ROWS, gate_rows};
use super::linear::Linear;
use crate::kernels::dispatch::Dispatch;

/// A mixture-of-experts block with its weights (see the module docs).
#[derive(Debug, Clone)]
pub struct MixtureOfExperts {
    /// `[n_expert][n_embd]`.
    router: Linear,
    /// Per expert `[expert_ffn_dim][n_embd]`.
    gate: Vec<Linear>,
    /// Per expert `[expert_ffn_dim][n_embd]`.
    up: Vec<Linear>,
    /// Per expert `[n_embd][expert_ffn_dim]`.
    down: Vec<Linear>,
    /// Experts run per token.
    n_used: usize,
    /// Whether the chosen probabilities are divided by their sum.
    norm_weights: bool,
    /// The experts' gate: SiLU (SwiGLU) or GELU (GeGLU).
    kind: FfnKind,
    /// Every gate and up matrix is a tensor of a model file, so a token's
    /// chosen ones can go through one product.
    file_backed: bool,
}

/// Buffers of one block's pass, grown to the largest seen and reused.
#[derive(Debug, Default)]
pub(crate) struct MoeScratch {
    /// Router logits, then probabilities, `[n][n_expert]`.
    probs: Vec<f32>,
    /// Each token's chosen experts and weights, `[n][n_used]`.
    chosen: Vec<Choice>,
    /// The (expert, token, weight) triples sorted by expert, then token.
    by_expert: Vec<Choice>,
    /// The tokens of one expert's group, `[rows][n_embd]`.
    xs: Vec<f32>,
    /// Hidden rows, `[rows][expert_ffn_dim]`.
    hidden: Vec<f32>,
    /// Gate rows, `[rows][expert_ffn_dim]`.
    gated: Vec<f32>,
    /// Expert outputs, `[rows][n_embd]`.
    out: Vec<f32>,
}

/// One token's use of one expert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Choice {
    /// The expert.
    pub expert: usize,
    /// The token's row in the batch.
    pub row: usize,
    /// The weight of the expert's output.
    pub weight: f32,
}

impl MixtureOfExperts {
    /// A block of `router` (`[n_expert][n_embd]`) and one gate, up and down
    /// matrix per expert, running `n_used` experts per token. The shapes are
    /// checked by [`MixtureOfExperts::check`] when the decoder is built.
    pub fn new(
        router: Linear,
        [gate, up, down]: [Vec<Linear>; 3],
        n_used: usize,
        norm_weights: bool,
        kind: FfnKind,
    ) -> Self {
        let file_backed = gate.iter().chain(&up).all(Linear::is_file_backed);
        Self {
            router,
            gate,
            up,
            down,
            n_used,
            norm_weights,
            kind,
            file_backed,
        }
    }

    /// Checks every weight's shape, the top-k, the weighting and the gate
    /// against `c`'s mixture of experts.
    pub(crate) fn check(&self, c: &TransformerConfig) -> Result<(), TransformerError> {
        let Some(moe) = c.options.moe else {
            return Err(TransformerError::FfnKindMismatch { expected: c.ffn });
        };
        if self.n_used != moe.n_expert_used
            || self.norm_weights != moe.norm_weights
            || self.kind != c.ffn
        {
            return Err(TransformerError::FfnKindMismatch { expected: c.ffn });
        }
        let (d, f) = (c.n_embd, moe.expert_ffn_dim);
        let shape_error = |name: &str, w: &Linear, rows: usize, cols: usize| {
            Err(TransformerError::TensorShape {
                name: name.into(),
                expected: vec![rows, cols],
                found: vec![w.n_rows(), w.n_cols()],
            })
        };
        if (self.router.n_rows(), self.router.n_cols()) != (moe.n_expert, d) {
            return shape_error("ffn_gate_inp", &self.router, moe.n_expert, d);
        }
        for (name, experts, rows, cols) in [
            ("ffn_gate_exps", &self.gate, f, d),
            ("ffn_up_exps", &self.up, f, d),
            ("ffn_down_exps", &self.down, d, f),
        ] {
            if experts.len() != moe.n_expert {
                return Err(TransformerError::TensorShape {
                    name: name.into(),
                    expected: vec![moe.n_expert],
                    found: vec![experts.len()],
                });
            }
            if let Some(w) = experts
                .iter()
                .find(|w| (w.n_rows(), w.n_cols()) != (rows, cols))
            {
                return shape_error(name, w, rows, cols);
            }
        }
        Ok(())
    }

    /// The router, `[n_expert][n_embd]`.
    pub(crate) fn router(&self) -> &Linear {
        &self.router
    }

    /// Expert `e`'s gate, up and down matrices.
    pub(crate) fn expert(&self, e: usize) -> [&Linear; 3] {
        [&self.gate[e], &self.up[e], &self.down[e]]
    }

    /// Experts run per token, and whether their weights are renormalised.
    pub(crate) fn top_k(&self) -> (usize, bool) {
        (self.n_used, self.norm_weights)
    }

    /// The experts' gate kind.
    pub(crate) fn kind(&self) -> FfnKind {
        self.kind
    }

    /// Applies the block to the `n` rows of `xs` (`[n][n_embd]`) into `ys`
    /// (`[n][n_embd]`).
    pub(crate) fn forward(
        &self,
        dispatch: Dispatch,
        xs: &[f32],
        n: usize,
        s: &mut MoeScratch,
        ys: &mut [f32],
    ) {
        if n == 0 {
            return;
        }
        let n_expert = self.router.n_rows();
        s.probs.resize(n * n_expert, 0.0);
        self.router.matmul(dispatch, xs, n, &mut s.probs);
        s.chosen.clear();
        for (row, probs) in s.probs.chunks_exact_mut(n_expert).enumerate() {
            route(probs, self.n_used, self.norm_weights, row, &mut s.chosen);
        }
        ys.fill(0.0);
        if n == 1 && self.file_backed {
            self.forward_one(dispatch, xs, s, ys);
        } else {
            self.forward_grouped(dispatch, xs, s, ys);
        }
    }

    /// One token: the chosen experts' gate and up projections as one
    /// product, then each down projection, summed in expert order.
    fn forward_one(&self, dispatch: Dispatch, xs: &[f32], s: &mut MoeScratch, ys: &mut [f32]) {
        let (d, f, k) = (xs.len(), self.gate[0].n_rows(), s.chosen.len());
        s.chosen.sort_unstable_by_key(|c| c.expert);
        for buf in [&mut s.hidden, &mut s.gated] {
            buf.resize(k * f, 0.0);
        }
        s.out.resize(k * d, 0.0);
        let products = s
            .chosen
            .iter()
            .zip(
                s.gated
                    .chunks_exact_mut(f)
                    .zip(s.hidden.chunks_exact_mut(f)),
            )
            .flat_map(|(c, (gated, hidden))| {
                [(&self.gate[c.expert], gated), (&self.up[c.expert], hidden)]
            })
            .collect();
        Linear::matmul_each_file(dispatch, xs, 1, products);
        gate_rows(self.kind, dispatch, &mut s.hidden, &s.gated, k);
        for ((c, hidden), out) in s
            .chosen
            .iter()
            .zip(s.hidden.chunks_exact(f))
            .zip(s.out.chunks_exact_mut(d))
        {
            self.down[c.expert].matmul(dispatch, hidden, 1, out);
            add_weighted(ys, out, c.weight);
        }
    }

    /// Any batch: the tokens grouped by expert, each expert's weights read
    /// once per [`FFN_ROWS`] of its tokens, its outputs added to theirs.
    fn forward_grouped(&self, dispatch: Dispatch, xs: &[f32], s: &mut MoeScratch, ys: &mut [f32]) {
        let d = self.router.n_cols();
        let f = self.gate[0].n_rows();
        s.by_expert.clear();
        s.by_expert.extend_from_slice(&s.chosen);
        s.by_expert.sort_unstable_by_key(|c| (c.expert, c.row));
        let mut rest = &s.by_expert[..];
        while let Some(first) = rest.first() {
            let run = rest
                .iter()
                .take(FFN_ROWS)
                .take_while(|c| c.expert == first.expert)
                .count();
            let (group, tail) = rest.split_at(run);
            rest = tail;
            s.xs.clear();
            for c in group {
                s.xs.extend_from_slice(&xs[c.row * d..(c.row + 1) * d]);
            }
            let (hidden, gated) = (&mut s.hidden, &mut s.gated);
            hidden.resize(run * f, 0.0);
            gated.resize(run * f, 0.0);
            s.out.resize(run * d, 0.0);
            let [gate, up, down] = self.expert(first.expert);
            Linear::matmul_each(
                dispatch,
                &s.xs,
                run,
                [(gate, &mut **gated), (up, &mut **hidden)],
            );
            gate_rows(self.kind, dispatch, hidden, gated, run);
            down.matmul(dispatch, hidden, run, &mut s.out);
            for (c, out) in group.iter().zip(s.out.chunks_exact(d)) {
                add_weighted(&mut ys[c.row * d..(c.row + 1) * d], out, c.weight);
            }
        }
    }
}

/// `y += w * x`, element by element.
fn add_weighted(y: &mut [f32], x: &[f32], w: f32) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += w * x;
    }
}

/// Turns one token's router logits into probabilities (softmax, in place)
/// and pushes its `k` chosen experts, largest probability first (ties: the
/// lower expert first), each weighted by its probability, divided by the
/// chosen ones' sum when `norm_weights`.
pub(crate) fn route(
    probs: &mut [f32],
    k: usize,
    norm_weights: bool,
    row: usize,
    chosen: &mut Vec<Choice>,
) {
    softmax_in_place(probs);
    let first = chosen.len();
    for _ in 0..k.min(probs.len()) {
        let taken = &chosen[first..];
        let mut best: Option<usize> = None;
        for (e, &p) in probs.iter().enumerate() {
            if taken.iter().any(|c| c.expert == e) {
                continue;
            }
            // Strictly greater: a tie keeps the lower expert; a NaN is
            // taken only when nothing else is left.
            if best.is_none_or(|b| p > probs[b] || probs[b].is_nan()) {
                best = Some(e);
            }
        }
        let Some(expert) = best else { break };
        chosen.push(Choice {
            expert,
            row,
            weight: probs[expert],
        });
    }
    if norm_weights {
        let sum: f32 = chosen[first..].iter().map(|c| c.weight).sum();
        for c in &mut chosen[first..] {
            c.weight /= sum;
        }
    }
}

/// Softmax of one row in place: `exp(x - max) / sum`, the sum in f64 (as
/// ggml's `soft_max` sums).
fn softmax_in_place(xs: &mut [f32]) {
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for x in xs.iter_mut() {
        *x = (*x - max).exp();
        sum += f64::from(*x);
    }
    let scale = (1.0 / sum) as f32;
    xs.iter_mut().for_each(|x| *x *= scale);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: every expert sorted by probability (a stable sort, so
    /// ties keep the lower expert first), the first `k` taken.
    fn brute_force(logits: &[f32], k: usize, norm: bool) -> Vec<(usize, f32)> {
        let max = logits
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, |m, x| m.max(f64::from(x)));
        let exps: Vec<f64> = logits.iter().map(|&x| (f64::from(x) - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| exps[b].partial_cmp(&exps[a]).unwrap());
        let chosen = &order[..k];
        let chosen_sum: f64 = chosen.iter().map(|&e| exps[e] / total).sum();
        chosen
            .iter()
            .map(|&e| {
                let p = exps[e] / total;
                (e, if norm { p / chosen_sum } else { p } as f32)
            })
            .collect()
    }

    #[test]
    fn routing_matches_brute_force() {
        let logits: Vec<f32> = (0..16)
            .map(|i| ((i * 7919) % 23) as f32 * 0.37 - 3.0)
            .collect();
        for k in [1, 2, 8, 16] {
            for norm in [false, true] {
                let mut probs = logits.clone();
                let mut chosen = Vec::new();
                route(&mut probs, k, norm, 3, &mut chosen);
                let expected = brute_force(&logits, k, norm);
                assert_eq!(chosen.len(), k);
                for (c, (e, w)) in chosen.iter().zip(expected) {
                    assert_eq!((c.expert, c.row), (e, 3), "k {k}");
                    assert!((c.weight - w).abs() < 1e-6, "k {k}: {} vs {w}", c.weight);
                }
                if norm {
                    let sum: f32 = chosen.iter().map(|c| c.weight).sum();
                    assert!((sum - 1.0).abs() < 1e-6);
                }
            }
        }
    }

    #[test]
    fn ties_keep_the_lower_expert_first() {
        let mut probs = vec![0.5, 2.0, 1.0, 2.0, 1.0, 2.0];
        let mut chosen = Vec::new();
        route(&mut probs, 4, false, 0, &mut chosen);
        let experts: Vec<usize> = chosen.iter().map(|c| c.expert).collect();
        assert_eq!(experts, [1, 3, 5, 2]);
    }

    #[test]
    fn nan_logits_choose_without_panicking() {
        let mut probs = vec![f32::NAN, 1.0, f32::NAN];
        let mut chosen = Vec::new();
        route(&mut probs, 3, true, 0, &mut chosen);
        assert_eq!(chosen.len(), 3);
    }
}
