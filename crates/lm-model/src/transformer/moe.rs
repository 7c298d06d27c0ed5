//! A mixture-of-experts feed-forward block (Shazeer et al. 2017, "Outrageously
//! Large Neural Networks"; Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE, dots.llm1),
//! as llama.cpp's `build_moe_ffn` (src/llama-graph.cpp) computes it:
//!
//! ```text
//! l      = x Wrouter^T (+ router bias: gpt-oss)                 [n_expert] per token
//! p      = softmax(l), or sigmoid of each logit, or l itself (softmax-weight)
//! chosen = the n_expert_used largest p + b (b: the selection bias
//!          exp_probs_b, 0 without it; ties: the lower expert first)
//! w_e    = p_e, or p_e / max(sum of the chosen p, 2^-14) (norm_weights),
//!          or the softmax of the chosen logits alone (softmax-weight),
//!          times the weight scale (1 without it)
//! y      = sum over chosen e of w_e * down_e(act(gate_e(x), up_e(x)))
//!        + g * shared(x)     (a shared SwiGLU expert where there is one;
//!                             g = sigmoid(x . ffn_gate_inp_shexp), qwen2moe, or 1)
//! ```
//!
//! `act` is SwiGLU, GeGLU or gpt-oss's clamped SwiGLU (`FfnKind`); with
//! gpt-oss's expert biases each of gate_e, up_e and down_e adds its
//! expert's bias after its product.
//!
//! The bias only chooses (DeepSeek V3's auxiliary-loss-free balancing): the
//! weights are the unbiased probabilities.
//!
//! The experts are the 3-d tensors `ffn_{gate,up,down}_exps` of the file,
//! each expert a view of its own byte range ([`Linear`]), so only the chosen
//! experts' weights are read. A batch is grouped by expert: each expert's
//! weights stream once for all the tokens that chose it (up to
//! [`FFN_ROWS`] at a time), through the same batched products as the dense
//! block. One token reads its chosen experts' gate and up projections in one
//! product (one quantization of the token, one split of all their rows over
//! the threads). The shared expert is a dense block ([`FeedForward`]).
//!
//! Each token's outputs are summed in increasing expert order whatever the
//! batch, then the shared expert's added, so a token's result has the same
//! bits read alone or in a batch (llama.cpp sums in the order chosen; the
//! two differ in the last bits). llama.cpp's top-k is `std::sort` of the
//! probabilities, an insertion sort for up to 16 experts: ties keep the
//! lower expert first, as here.

use super::TransformerError;
use super::config::{FfnKind, Gating, TransformerConfig};
use super::ffn::{FFN_ROWS, FeedForward, gate_rows};
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
    /// How each token's experts are chosen and weighted.
    routing: Routing,
    /// The experts' gate: SiLU (SwiGLU) or GELU (GeGLU).
    kind: FfnKind,
    /// The expert every token runs, if any.
    shared: Option<SharedExpert>,
    /// Every expert's biases, if any (gpt-oss).
    biases: Option<ExpertBiases>,
    /// Every gate and up matrix is a tensor of a model file, so a token's
    /// chosen ones can go through one product.
    file_backed: bool,
}

/// How a token's experts are chosen and their outputs weighted.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Experts run per token.
    pub n_used: usize,
    /// Softmax over the experts, or a sigmoid of each.
    pub gating: Gating,
    /// Added to the probabilities to choose the experts, not to weigh
    /// them (`blk.{i}.exp_probs_b.bias`, `[n_expert]`).
    pub selection_bias: Option<Vec<f32>>,
    /// The chosen probabilities are divided by their sum.
    pub norm_weights: bool,
    /// Multiplies the chosen weights (1: none).
    pub weights_scale: f32,
    /// Added to the router's logits (`blk.{i}.ffn_gate_inp.bias`,
    /// `[n_expert]`: gpt-oss).
    pub logit_bias: Option<Vec<f32>>,
}

impl Routing {
    /// Softmax gating of `n_used` experts, with or without renormalising:
    /// Mixtral, qwen3moe and olmoe.
    pub fn softmax(n_used: usize, norm_weights: bool) -> Self {
        Self {
            n_used,
            gating: Gating::Softmax,
            selection_bias: None,
            norm_weights,
            weights_scale: 1.0,
            logit_bias: None,
        }
    }
}

/// Every expert's biases (gpt-oss), added after each expert's gate, up
/// and down products: one vector per expert.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertBiases {
    /// `[n_expert][expert_ffn_dim]`, `ffn_gate_exps.bias`.
    pub gate: Vec<Vec<f32>>,
    /// `[n_expert][expert_ffn_dim]`, `ffn_up_exps.bias`.
    pub up: Vec<Vec<f32>>,
    /// `[n_expert][n_embd]`, `ffn_down_exps.bias`.
    pub down: Vec<Vec<f32>>,
}

/// A dense SwiGLU expert every token runs (qwen2moe, dots1).
#[derive(Debug, Clone)]
pub struct SharedExpert {
    /// `ffn_{gate,up,down}_shexp`: a [`FeedForward::SwiGlu`].
    pub ffn: FeedForward,
    /// `ffn_gate_inp_shexp`, `[1][n_embd]`: the output is multiplied by the
    /// sigmoid of its product with the token (qwen2moe); `None`: added as
    /// it is (dots1).
    pub gate_inp: Option<Linear>,
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
    /// The shared expert's hidden and gate rows, `[min(n, FFN_ROWS)][width]`.
    shared_hidden: Vec<f32>,
    shared_gated: Vec<f32>,
    /// The shared expert's gate logits, `[n]`.
    shared_gate: Vec<f32>,
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
    /// matrix per expert, routed by `routing`, with an optional shared
    /// expert. The shapes are checked by [`MixtureOfExperts::check`] when
    /// the decoder is built.
    pub fn new(
        router: Linear,
        [gate, up, down]: [Vec<Linear>; 3],
        routing: Routing,
        kind: FfnKind,
        shared: Option<SharedExpert>,
    ) -> Self {
        let file_backed = gate.iter().chain(&up).all(Linear::is_file_backed);
        Self {
            router,
            gate,
            up,
            down,
            routing,
            kind,
            shared,
            biases: None,
            file_backed,
        }
    }

    /// The block with every expert's gate, up and down biases (gpt-oss),
    /// checked by [`MixtureOfExperts::check`] with the rest.
    pub fn with_biases(self, biases: ExpertBiases) -> Self {
        Self {
            biases: Some(biases),
            ..self
        }
    }

    /// Checks every weight's shape, the routing, the gate and the shared
    /// expert against `c`'s mixture of experts.
    pub(crate) fn check(&self, c: &TransformerConfig) -> Result<(), TransformerError> {
        let mismatch = Err(TransformerError::FfnKindMismatch { expected: c.ffn });
        let Some(moe) = c.options.moe else {
            return mismatch;
        };
        let r = &self.routing;
        if (r.n_used, r.norm_weights, r.gating, r.weights_scale)
            != (
                moe.n_expert_used,
                moe.norm_weights,
                moe.gating,
                moe.weights_scale,
            )
            || self.kind != c.ffn
        {
            return mismatch;
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
        let vector_error = |name: &str, expected: usize, found: usize| {
            Err(TransformerError::TensorShape {
                name: name.into(),
                expected: vec![expected],
                found: vec![found],
            })
        };
        if let Some(bias) = &r.selection_bias
            && bias.len() != moe.n_expert
        {
            return vector_error("exp_probs_b", moe.n_expert, bias.len());
        }
        if r.logit_bias.is_some() != moe.biased || self.biases.is_some() != moe.biased {
            return mismatch;
        }
        if let Some(bias) = &r.logit_bias
            && bias.len() != moe.n_expert
        {
            return vector_error("ffn_gate_inp.bias", moe.n_expert, bias.len());
        }
        if let Some(b) = &self.biases {
            for (name, per_expert, width) in [
                ("ffn_gate_exps.bias", &b.gate, f),
                ("ffn_up_exps.bias", &b.up, f),
                ("ffn_down_exps.bias", &b.down, d),
            ] {
                if per_expert.len() != moe.n_expert {
                    return vector_error(name, moe.n_expert, per_expert.len());
                }
                if let Some(v) = per_expert.iter().find(|v| v.len() != width) {
                    return vector_error(name, width, v.len());
                }
            }
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
        match (&self.shared, moe.shared) {
            (None, None) => Ok(()),
            (Some(shared), Some(options)) if shared.gate_inp.is_some() == options.gated => {
                if let Some(gate_inp) = &shared.gate_inp
                    && (gate_inp.n_rows(), gate_inp.n_cols()) != (1, d)
                {
                    return shape_error("ffn_gate_inp_shexp", gate_inp, 1, d);
                }
                let FeedForward::SwiGlu { gate, up, down } = &shared.ffn else {
                    return mismatch;
                };
                let w = options.width;
                for (name, m, rows, cols) in [
                    ("ffn_gate_shexp", gate, w, d),
                    ("ffn_up_shexp", up, w, d),
                    ("ffn_down_shexp", down, d, w),
                ] {
                    if (m.n_rows(), m.n_cols()) != (rows, cols) {
                        return shape_error(name, m, rows, cols);
                    }
                }
                Ok(())
            }
            _ => mismatch,
        }
    }

    /// The router, `[n_expert][n_embd]`.
    pub(crate) fn router(&self) -> &Linear {
        &self.router
    }

    /// Expert `e`'s gate, up and down matrices.
    pub(crate) fn expert(&self, e: usize) -> [&Linear; 3] {
        [&self.gate[e], &self.up[e], &self.down[e]]
    }

    /// How the experts are chosen and weighted.
    pub(crate) fn routing(&self) -> &Routing {
        &self.routing
    }

    /// Every expert's biases, if any.
    pub(crate) fn biases(&self) -> Option<&ExpertBiases> {
        self.biases.as_ref()
    }

    /// The shared expert, if any.
    pub(crate) fn shared(&self) -> Option<&SharedExpert> {
        self.shared.as_ref()
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
        if let Some(bias) = &self.routing.logit_bias {
            for logits in s.probs.chunks_exact_mut(n_expert) {
                add_weighted(logits, bias, 1.0);
            }
        }
        s.chosen.clear();
        for (row, probs) in s.probs.chunks_exact_mut(n_expert).enumerate() {
            route(probs, &self.routing, row, &mut s.chosen);
        }
        ys.fill(0.0);
        if n == 1 && self.file_backed {
            self.forward_one(dispatch, xs, s, ys);
        } else {
            self.forward_grouped(dispatch, xs, s, ys);
        }
        if let Some(shared) = &self.shared {
            Self::add_shared(shared, dispatch, xs, n, s, ys);
        }
    }

    /// `ys += g * shared(xs)` row by row, `g` the sigmoid of the row's
    /// shared gate logit (1 without a gate).
    fn add_shared(
        shared: &SharedExpert,
        dispatch: Dispatch,
        xs: &[f32],
        n: usize,
        s: &mut MoeScratch,
        ys: &mut [f32],
    ) {
        let d = xs.len() / n;
        let FeedForward::SwiGlu { gate, .. } = &shared.ffn else {
            unreachable!("a shared expert is a SwiGLU block (checked when built)");
        };
        let width = n.min(FFN_ROWS) * gate.n_rows();
        for buf in [&mut s.shared_hidden, &mut s.shared_gated] {
            buf.resize(width, 0.0);
        }
        s.out.resize(n * d, 0.0);
        let out = &mut s.out[..n * d];
        shared.ffn.forward_dense(
            dispatch,
            xs,
            n,
            [&mut s.shared_hidden, &mut s.shared_gated],
            out,
        );
        let Some(gate_inp) = &shared.gate_inp else {
            add_weighted(ys, out, 1.0);
            return;
        };
        s.shared_gate.resize(n, 0.0);
        gate_inp.matmul(dispatch, xs, n, &mut s.shared_gate);
        for ((y, out), &logit) in ys
            .chunks_exact_mut(d)
            .zip(out.chunks_exact(d))
            .zip(&s.shared_gate)
        {
            add_weighted(y, out, sigmoid(logit));
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
        if let Some(b) = &self.biases {
            for ((c, gated), hidden) in s
                .chosen
                .iter()
                .zip(s.gated.chunks_exact_mut(f))
                .zip(s.hidden.chunks_exact_mut(f))
            {
                add_weighted(gated, &b.gate[c.expert], 1.0);
                add_weighted(hidden, &b.up[c.expert], 1.0);
            }
        }
        gate_rows(self.kind, dispatch, &mut s.hidden, &s.gated, k);
        for ((c, hidden), out) in s
            .chosen
            .iter()
            .zip(s.hidden.chunks_exact(f))
            .zip(s.out.chunks_exact_mut(d))
        {
            self.down[c.expert].matmul(dispatch, hidden, 1, out);
            if let Some(b) = &self.biases {
                add_weighted(out, &b.down[c.expert], 1.0);
            }
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
            if let Some(b) = &self.biases {
                for row in gated.chunks_exact_mut(f) {
                    add_weighted(row, &b.gate[first.expert], 1.0);
                }
                for row in hidden.chunks_exact_mut(f) {
                    add_weighted(row, &b.up[first.expert], 1.0);
                }
            }
            gate_rows(self.kind, dispatch, hidden, gated, run);
            down.matmul(dispatch, hidden, run, &mut s.out);
            if let Some(b) = &self.biases {
                for row in s.out.chunks_exact_mut(d) {
                    add_weighted(row, &b.down[first.expert], 1.0);
                }
            }
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

/// Turns one token's router logits into probabilities in place (softmax or
/// sigmoid; left as logits for softmax-weight gating) and pushes its chosen
/// experts, largest probability (plus selection bias) first (ties: the
/// lower expert first), each weighted by its probability (softmax-weight:
/// by the softmax of the chosen logits), divided by the chosen ones' sum
/// when `norm_weights` (the sum at least 2^-14, as llama.cpp clamps it),
/// times the scale.
pub(crate) fn route(probs: &mut [f32], r: &Routing, row: usize, chosen: &mut Vec<Choice>) {
    match r.gating {
        Gating::Softmax => softmax_in_place(probs),
        Gating::Sigmoid => probs.iter_mut().for_each(|p| *p = sigmoid(*p)),
        Gating::SoftmaxWeight => {}
    }
    let bias = |e: usize| r.selection_bias.as_ref().map_or(0.0, |b| b[e]);
    let first = chosen.len();
    for _ in 0..r.n_used.min(probs.len()) {
        let taken = &chosen[first..];
        let mut best: Option<(usize, f32)> = None;
        for (e, &p) in probs.iter().enumerate() {
            if taken.iter().any(|c| c.expert == e) {
                continue;
            }
            let key = p + bias(e);
            // Strictly greater: a tie keeps the lower expert; a NaN is
            // taken only when nothing else is left.
            if best.is_none_or(|(_, b)| key > b || b.is_nan()) {
                best = Some((e, key));
            }
        }
        let Some((expert, _)) = best else { break };
        chosen.push(Choice {
            expert,
            row,
            weight: probs[expert],
        });
    }
    if r.gating == Gating::SoftmaxWeight {
        let mut weights = [0.0f32; super::config::MAX_EXPERTS];
        let weights = &mut weights[..chosen.len() - first];
        for (w, c) in weights.iter_mut().zip(&chosen[first..]) {
            *w = c.weight;
        }
        softmax_in_place(weights);
        for (c, &w) in chosen[first..].iter_mut().zip(weights.iter()) {
            c.weight = w;
        }
    }
    if r.norm_weights {
        let sum: f32 = chosen[first..].iter().map(|c| c.weight).sum();
        let sum = sum.max(MIN_WEIGHT_SUM);
        for c in &mut chosen[first..] {
            c.weight /= sum;
        }
    }
    if r.weights_scale != 1.0 {
        for c in &mut chosen[first..] {
            c.weight *= r.weights_scale;
        }
    }
}

/// The least sum renormalised weights are divided by: the smallest normal
/// f16, llama.cpp's clamp against a division by zero.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// `1 / (1 + exp(-x))`.
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
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
                route(&mut probs, &Routing::softmax(k, norm), 3, &mut chosen);
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
        route(&mut probs, &Routing::softmax(4, false), 0, &mut chosen);
        let experts: Vec<usize> = chosen.iter().map(|c| c.expert).collect();
        assert_eq!(experts, [1, 3, 5, 2]);
    }

    #[test]
    fn nan_logits_choose_without_panicking() {
        let mut probs = vec![f32::NAN, 1.0, f32::NAN];
        let mut chosen = Vec::new();
        route(&mut probs, &Routing::softmax(3, true), 0, &mut chosen);
        assert_eq!(chosen.len(), 3);
    }

    fn sigmoid64(x: f32) -> f64 {
        1.0 / (1.0 + (-f64::from(x)).exp())
    }

    /// Sigmoid gating with a selection bias: the bias changes which experts
    /// are chosen, not their weights (the unbiased sigmoids, renormalised,
    /// then scaled), as a brute force in f64 computes.
    #[test]
    fn sigmoid_routing_chooses_by_the_biased_and_weighs_by_the_unbiased() {
        let logits: Vec<f32> = (0..8).map(|i| ((i * 37) % 11) as f32 * 0.3 - 1.5).collect();
        // Expert 0's logit is the lowest; a bias of 2 makes it the first.
        let mut bias = vec![0.0f32; 8];
        bias[0] = 2.0;
        for (norm, scale) in [(false, 1.0), (true, 1.0), (true, 2.5), (false, 16.0)] {
            let routing = Routing {
                n_used: 3,
                gating: Gating::Sigmoid,
                selection_bias: Some(bias.clone()),
                norm_weights: norm,
                weights_scale: scale,
                logit_bias: None,
            };
            let mut probs = logits.clone();
            let mut chosen = Vec::new();
            route(&mut probs, &routing, 1, &mut chosen);
            let p: Vec<f64> = logits.iter().map(|&x| sigmoid64(x)).collect();
            let mut order: Vec<usize> = (0..8).collect();
            order.sort_by(|&a, &b| {
                (p[b] + f64::from(bias[b])).total_cmp(&(p[a] + f64::from(bias[a])))
            });
            let expected = &order[..3];
            assert_eq!(expected[0], 0, "the bias decides");
            let sum: f64 = expected.iter().map(|&e| p[e]).sum();
            let experts: Vec<usize> = chosen.iter().map(|c| c.expert).collect();
            assert_eq!(experts, expected);
            for (c, &e) in chosen.iter().zip(expected) {
                let w = p[e] / if norm { sum } else { 1.0 } * f64::from(scale);
                assert!(
                    (f64::from(c.weight) - w).abs() < 1e-6,
                    "{} vs {w}",
                    c.weight
                );
            }
        }
        // Without the bias expert 0 is not chosen.
        let mut probs = logits.clone();
        let mut chosen = Vec::new();
        let routing = Routing {
            gating: Gating::Sigmoid,
            ..Routing::softmax(3, false)
        };
        route(&mut probs, &routing, 0, &mut chosen);
        assert!(chosen.iter().all(|c| c.expert != 0));
    }

    /// Renormalising divides by at least 2^-14 (llama.cpp's clamp): tiny
    /// sigmoids stay tiny instead of summing to 1.
    #[test]
    fn renormalising_clamps_a_tiny_sum() {
        let logits = [-30.0f32, -31.0, -32.0, -40.0];
        let routing = Routing {
            gating: Gating::Sigmoid,
            ..Routing::softmax(2, true)
        };
        let mut probs = logits.to_vec();
        let mut chosen = Vec::new();
        route(&mut probs, &routing, 0, &mut chosen);
        for (c, &logit) in chosen.iter().zip(&logits) {
            let expected = sigmoid64(logit) / 6.103_515_625e-5;
            assert!((f64::from(c.weight) / expected - 1.0).abs() < 1e-5);
            assert!(c.weight < 1e-8);
        }
    }

    /// Deterministic values in about [-1, 1).
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1009) as f32 / 504.5 - 1.0)
            .collect()
    }

    fn matrix(rows: usize, cols: usize, seed: usize) -> Linear {
        Linear::dense(
            ndarray::Array2::from_shape_vec((rows, cols), values(rows * cols, seed)).unwrap(),
        )
    }

    /// The gate, up and down matrices of `n_expert` experts (`f x d`, `f x
    /// d`, `d x f`), expert `e` of each seeded `seeds[k] + e`.
    fn expert_weights(n_expert: usize, d: usize, f: usize, seeds: [usize; 3]) -> [Vec<Linear>; 3] {
        let shapes = [(f, d), (f, d), (d, f)];
        std::array::from_fn(|k| {
            let (rows, cols) = shapes[k];
            (0..n_expert)
                .map(|e| matrix(rows, cols, seeds[k] + e))
                .collect()
        })
    }

    /// `down(silu(gate x) * up x)` in f64.
    fn swiglu64(gate: &Linear, up: &Linear, down: &Linear, x: &[f32]) -> Vec<f64> {
        let (g, u, d) = (gate.to_dense(), up.to_dense(), down.to_dense());
        let dot = |m: &ndarray::Array2<f32>, r: usize, v: &[f64]| -> f64 {
            m.row(r)
                .iter()
                .zip(v)
                .map(|(&w, &x)| f64::from(w) * x)
                .sum()
        };
        let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let hidden: Vec<f64> = (0..g.nrows())
            .map(|r| {
                let a = dot(&g, r, &x);
                a / (1.0 + (-a).exp()) * dot(&u, r, &x)
            })
            .collect();
        (0..d.nrows()).map(|r| dot(&d, r, &hidden)).collect()
    }

    /// A block with sigmoid routing, a selection bias, a scale and a gated
    /// shared expert, on every kernel path and batch size, equals the sum
    /// written out in f64 (and a token reads the same in any batch).
    #[test]
    fn a_block_with_a_shared_expert_matches_the_sum_written_out() {
        let (d, f, fs, n_expert, n) = (8, 6, 10, 4, 5);
        let router = matrix(n_expert, d, 1);
        let weights = expert_weights(n_expert, d, f, [10, 20, 30]);
        let shared_weights = [matrix(fs, d, 40), matrix(fs, d, 41), matrix(d, fs, 42)];
        let gate_inp = matrix(1, d, 43);
        let routing = Routing {
            n_used: 2,
            gating: Gating::Sigmoid,
            selection_bias: Some(vec![0.0, 0.3, -0.2, 0.1]),
            norm_weights: true,
            weights_scale: 1.5,
            logit_bias: None,
        };
        let [g, u, dn] = shared_weights.clone();
        let moe = MixtureOfExperts::new(
            router.clone(),
            weights.clone(),
            routing.clone(),
            FfnKind::SwiGlu,
            Some(SharedExpert {
                ffn: FeedForward::SwiGlu {
                    gate: g,
                    up: u,
                    down: dn,
                },
                gate_inp: Some(gate_inp.clone()),
            }),
        );
        let xs = values(n * d, 7);
        for dispatch in Dispatch::every_available() {
            let mut ys = vec![0.0; n * d];
            moe.forward(dispatch, &xs, n, &mut MoeScratch::default(), &mut ys);
            for (row, (x, y)) in xs.chunks_exact(d).zip(ys.chunks_exact(d)).enumerate() {
                let mut probs = vec![0.0; n_expert];
                router.matmul(dispatch, x, 1, &mut probs);
                let mut chosen = Vec::new();
                route(&mut probs, &routing, row, &mut chosen);
                let mut expected = vec![0.0f64; d];
                for c in &chosen {
                    let e = c.expert;
                    let out = swiglu64(&weights[0][e], &weights[1][e], &weights[2][e], x);
                    for (acc, v) in expected.iter_mut().zip(out) {
                        *acc += f64::from(c.weight) * v;
                    }
                }
                let [sg, su, sd] = &shared_weights;
                let logit: f64 = gate_inp
                    .to_dense()
                    .row(0)
                    .iter()
                    .zip(x)
                    .map(|(&w, &v)| f64::from(w) * f64::from(v))
                    .sum();
                let gate = 1.0 / (1.0 + (-logit).exp());
                for (acc, v) in expected.iter_mut().zip(swiglu64(sg, su, sd, x)) {
                    *acc += gate * v;
                }
                for (&ours, &theirs) in y.iter().zip(&expected) {
                    assert!(
                        (f64::from(ours) - theirs).abs() < 1e-4,
                        "{dispatch:?} row {row}: {ours} vs {theirs}"
                    );
                }
                // Alone, the row has the same bits.
                let mut alone = vec![0.0; d];
                moe.forward(dispatch, x, 1, &mut MoeScratch::default(), &mut alone);
                assert_eq!(alone, y, "{dispatch:?} row {row}");
            }
        }
    }

    /// `down(swiglu_oai(gate x + b_g, up x + b_u)) + b_d` in f64.
    fn swiglu_oai64(w: [&Linear; 3], b: [&[f32]; 3], x: &[f32]) -> Vec<f64> {
        let dense = w.map(|m| m.to_dense().into_owned());
        let affine = |m: &ndarray::Array2<f32>, bias: &[f32], v: &[f64]| -> Vec<f64> {
            (0..m.nrows())
                .map(|r| {
                    let dot: f64 = m
                        .row(r)
                        .iter()
                        .zip(v)
                        .map(|(&w, &x)| f64::from(w) * x)
                        .sum();
                    dot + f64::from(bias[r])
                })
                .collect()
        };
        let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let gate = affine(&dense[0], b[0], &x);
        let up = affine(&dense[1], b[1], &x);
        let hidden: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| {
                let g = g.min(7.0);
                g / (1.0 + (-1.702 * g).exp()) * (u.clamp(-7.0, 7.0) + 1.0)
            })
            .collect();
        affine(&dense[2], b[2], &hidden)
    }

    /// gpt-oss's block: a router with a bias, the top-k chosen by logit and
    /// weighted by the softmax of the chosen logits alone, experts with
    /// biases through swiglu_oai; on every kernel path and batch size it
    /// equals the sum written out in f64, and a token reads the same alone.
    #[test]
    fn a_gpt_oss_block_matches_the_sum_written_out() {
        let (d, f, n_expert, k, n) = (8, 6, 5, 3, 6);
        let router = matrix(n_expert, d, 2);
        let weights = expert_weights(n_expert, d, f, [50, 60, 70]);
        let per_expert = |width, seed| -> Vec<Vec<f32>> {
            (0..n_expert).map(|e| values(width, seed + e)).collect()
        };
        let biases = ExpertBiases {
            gate: per_expert(f, 80),
            up: per_expert(f, 90),
            down: per_expert(d, 100),
        };
        let logit_bias = vec![0.4, -0.3, 0.0, 0.25, -0.5];
        let routing = Routing {
            gating: Gating::SoftmaxWeight,
            logit_bias: Some(logit_bias.clone()),
            ..Routing::softmax(k, false)
        };
        let moe = MixtureOfExperts::new(
            router.clone(),
            weights.clone(),
            routing,
            FfnKind::SwiGluOai,
            None,
        )
        .with_biases(biases.clone());
        // Scaled up so that some gates pass the clamp at 7.
        let xs: Vec<f32> = values(n * d, 11).iter().map(|v| v * 6.0).collect();
        let dense_router = router.to_dense();
        for dispatch in Dispatch::every_available() {
            let mut ys = vec![0.0; n * d];
            moe.forward(dispatch, &xs, n, &mut MoeScratch::default(), &mut ys);
            for (row, (x, y)) in xs.chunks_exact(d).zip(ys.chunks_exact(d)).enumerate() {
                let logits: Vec<f64> = (0..n_expert)
                    .map(|e| {
                        let dot: f64 = dense_router
                            .row(e)
                            .iter()
                            .zip(x)
                            .map(|(&w, &v)| f64::from(w) * f64::from(v))
                            .sum();
                        dot + f64::from(logit_bias[e])
                    })
                    .collect();
                let mut order: Vec<usize> = (0..n_expert).collect();
                order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
                let chosen = &order[..k];
                let max = logits[chosen[0]];
                let total: f64 = chosen.iter().map(|&e| (logits[e] - max).exp()).sum();
                let mut expected = vec![0.0f64; d];
                for &e in chosen {
                    let weight = (logits[e] - max).exp() / total;
                    let w = [&weights[0][e], &weights[1][e], &weights[2][e]];
                    let b = [&biases.gate[e][..], &biases.up[e][..], &biases.down[e][..]];
                    for (acc, v) in expected.iter_mut().zip(swiglu_oai64(w, b, x)) {
                        *acc += weight * v;
                    }
                }
                for (&ours, &theirs) in y.iter().zip(&expected) {
                    assert!(
                        (f64::from(ours) - theirs).abs() < 1e-4 * theirs.abs().max(1.0),
                        "{dispatch:?} row {row}: {ours} vs {theirs}"
                    );
                }
                let mut alone = vec![0.0; d];
                moe.forward(dispatch, x, 1, &mut MoeScratch::default(), &mut alone);
                assert_eq!(alone, y, "{dispatch:?} row {row}");
            }
        }
    }
}
