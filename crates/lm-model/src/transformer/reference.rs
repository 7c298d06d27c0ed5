//! The reference forward pass: [`Decoder::reference_logits`] recomputes the
//! cached pass's function over a whole prefix with plain ndarray operations,
//! an explicit causal mask matrix and no cache code, so the cached path
//! (`model.rs`) has something written apart from it to be tested against.
//!
//! ```text
//! x = embed(tokens) (+ learned positions) (* embedding_scale)   [n][n_embd]
//! for each layer:
//!     q, k, v = norm(x) Wq^T, Wk^T, Wv^T (+ biases) (head norms) (RoPE)
//!     a = softmax(softcap(q k^T * scale) + mask) v  per head, mask [n][n]
//!         (with a sink logit s: one more term exp(s) in the denominator)
//!     x += post_norm(a Wo^T (+ bias));  x += post_norm(ffn(norm(x)))
//!     (a mixture of experts: each token's chosen experts, by a stable sort,
//!     plus its shared expert)
//! logits = softcap(norm(x) Wout^T)                             [n][vocab]
//! ```
//!
//! Norms and RoPE are computed in f64 from their definitions; quantized
//! weights are dequantised one matrix at a time, so this is slow on a real
//! model.

use lm_core::{LanguageModel, TokenId};
use ndarray::{Array1, Array2, ArrayView1, Axis, s};

use super::NormKind;
use super::config::{AttentionKind, FfnKind, Gating, PositionKind, RopeMode, RopeOptions};
use super::ffn::{FeedForward, gelu, silu, swiglu_oai};
use super::model::{Decoder, LayerWeights, Positions};
use super::moe::MixtureOfExperts;
use super::norm::Norm;

impl Decoder {
    /// The logits of every position of `tokens` read from the start, one row
    /// per token (`[tokens.len()][vocab_size]`), computed with plain ndarray
    /// products, an explicit causal mask matrix and no cache: the reference
    /// the cached forward pass is tested against. Quantized weights are
    /// dequantised one matrix at a time, so this is slow on a real model.
    pub fn reference_logits(&self, tokens: &[TokenId]) -> lm_core::Result<Array2<f32>> {
        self.check_input(0, tokens)?;
        let c = self.config();
        let n = tokens.len();
        // the token embeddings, plus learned positions, times the scale
        let embedding = self.token_embedding.to_dense();
        let mut x = Array2::<f32>::zeros((n, c.n_embd));
        for (mut row, &token) in x.rows_mut().into_iter().zip(tokens) {
            row.assign(&embedding.row(token as usize));
        }
        if let Positions::Learned(table) = &self.positions {
            x += &table.slice(s![..n, ..]);
        }
        if let Some(scale) = c.options.embedding_scale {
            x *= scale;
        }
        for (layer_idx, layer) in self.layers.iter().enumerate() {
            // attention, then its residual connection
            let mut attn_out = self.reference_attention(layer_idx, layer, &x);
            if let Some(norm) = &layer.post_attn_norm {
                attn_out = reference_norm(norm, &attn_out);
            }
            x += &attn_out;
            // the feed-forward block, then its residual connection
            let mut ffn_out = reference_ffn(&layer.ffn, &reference_pre_norm(&layer.ffn_norm, &x));
            if let Some(norm) = &layer.post_ffn_norm {
                ffn_out = reference_norm(norm, &ffn_out);
            }
            x += &ffn_out;
        }
        let h = reference_norm(&self.final_norm, &x);
        let logits = h.dot(&self.output().to_dense().t());
        Ok(match c.options.final_softcap {
            Some(cap) => logits.mapv(|v| cap * (v / cap).tanh()),
            None => logits,
        })
    }

    /// Layer `layer_idx`'s attention over the rows of `x` (`[n][n_embd]`),
    /// projected by `Wo`: `[n][n_embd]`.
    fn reference_attention(
        &self,
        layer_idx: usize,
        layer: &LayerWeights,
        x: &Array2<f32>,
    ) -> Array2<f32> {
        let c = self.config();
        let n = x.nrows();
        let h = reference_pre_norm(&layer.attn_norm, x);
        let mut q = h.dot(&layer.wq.to_dense().t());
        let mut k = h.dot(&layer.wk.to_dense().t());
        let mut v = h.dot(&layer.wv.to_dense().t());
        if let Some(bias) = &layer.qkv_bias {
            q += &ArrayView1::from(&bias.q);
            k += &ArrayView1::from(&bias.k);
            v += &ArrayView1::from(&bias.v);
        }
        if let Some(norm) = &layer.q_norm {
            q = reference_head_norm(norm, &q, norm.width());
        }
        if let Some(norm) = &layer.k_norm {
            k = reference_head_norm(norm, &k, norm.width());
        }
        if let PositionKind::Rope { base, dim } = c.position {
            let (base, freq_scale) = match (c.attention_kind(layer_idx), c.options.sliding_window) {
                (AttentionKind::Sliding { .. }, Some(sw)) if !c.options.rope.scaled_sliding => {
                    (sw.rope_base, 1.0)
                }
                (AttentionKind::Sliding { .. }, Some(sw)) => {
                    (sw.rope_base, c.options.rope.freq_scale)
                }
                _ => (base, c.options.rope.freq_scale),
            };
            let rope = ReferenceRope {
                head_dim: c.head_dim,
                dim,
                base,
                freq_scale,
                options: &c.options.rope,
            };
            rope.apply(&mut q);
            rope.apply(&mut k);
        }
        // mask[i][j] = 0 where key j is visible to query i (j <= i, and
        // within the window on a sliding layer), else -inf.
        let window = match c.attention_kind(layer_idx) {
            AttentionKind::Global => n,
            AttentionKind::Sliding { window } => window,
        };
        let mask = Array2::from_shape_fn((n, n), |(i, j)| {
            if j <= i && i - j < window {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        });
        let group = c.n_head / c.n_kv_head;
        let scale = c.attention_scale();
        let mut attended = Array2::<f32>::zeros((n, c.q_dim()));
        for head in 0..c.n_head {
            let kv_head = head / group;
            let q_cols = s![.., head * c.head_dim..(head + 1) * c.head_dim];
            let kv_cols = s![.., kv_head * c.head_dim..(kv_head + 1) * c.head_dim];
            let mut scores = q.slice(q_cols).dot(&k.slice(kv_cols).t()) * scale;
            if let Some(cap) = c.options.attn_softcap {
                scores.mapv_inplace(|v| cap * (v / cap).tanh());
            }
            let scores = scores + &mask;
            let sink = layer.attn_sinks.as_ref().map(|sinks| sinks[head]);
            let weights = reference_softmax_rows(scores, sink);
            attended
                .slice_mut(q_cols)
                .assign(&weights.dot(&v.slice(kv_cols)));
        }
        let out = attended.dot(&layer.wo.to_dense().t());
        match &layer.wo_bias {
            Some(bias) => out + ArrayView1::from(bias),
            None => out,
        }
    }
}

/// The feed-forward block over the normalised rows `h`.
fn reference_ffn(ffn: &FeedForward, h: &Array2<f32>) -> Array2<f32> {
    match ffn {
        FeedForward::GeluMlp { up, down } => h
            .dot(&up.to_dense().t())
            .mapv(gelu)
            .dot(&down.to_dense().t()),
        FeedForward::SwiGlu { gate, up, down } => {
            let gated = h.dot(&gate.to_dense().t()).mapv(silu) * h.dot(&up.to_dense().t());
            gated.dot(&down.to_dense().t())
        }
        FeedForward::GeGlu { gate, up, down } => {
            let gated = h.dot(&gate.to_dense().t()).mapv(gelu) * h.dot(&up.to_dense().t());
            gated.dot(&down.to_dense().t())
        }
        FeedForward::Moe(moe) => reference_moe(moe, h),
    }
}

/// A mixture of experts over the rows `h`, token by token: the router's
/// logits (plus its bias) in f64, their softmax (or sigmoids; the logits
/// themselves for softmax-weight gating), every expert sorted by
/// probability plus selection bias (a stable sort: ties keep the lower
/// expert), the first `k` run and summed with their (renormalised, scaled;
/// softmax-weight: the softmax of their logits) weights, then the shared
/// expert (times its sigmoid gate) added.
fn reference_moe(moe: &MixtureOfExperts, h: &Array2<f32>) -> Array2<f32> {
    let r = moe.routing();
    let mut logits = h.dot(&moe.router().to_dense().t());
    if let Some(bias) = &r.logit_bias {
        logits += &ArrayView1::from(bias);
    }
    let softmax = |xs: &[f64]| -> Vec<f64> {
        let max = xs.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
        let exps: Vec<f64> = xs.iter().map(|&x| (x - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        exps.iter().map(|e| e / total).collect()
    };
    let mut out = Array2::zeros(h.raw_dim());
    for (row, logits) in logits.rows().into_iter().enumerate() {
        let logits: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        let probs: Vec<f64> = match r.gating {
            Gating::Softmax => softmax(&logits),
            Gating::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
            Gating::SoftmaxWeight => logits.clone(),
        };
        let bias = |e: usize| r.selection_bias.as_ref().map_or(0.0, |b| f64::from(b[e]));
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| (probs[b] + bias(b)).total_cmp(&(probs[a] + bias(a))));
        let chosen = &order[..r.n_used];
        let chosen_probs: Vec<f64> = chosen.iter().map(|&e| probs[e]).collect();
        let weights = match r.gating {
            Gating::SoftmaxWeight => softmax(&chosen_probs),
            _ => chosen_probs,
        };
        let chosen_sum: f64 = weights.iter().sum();
        let x = h.slice(s![row..=row, ..]).to_owned();
        for (&e, &weight) in chosen.iter().zip(&weights) {
            let norm = if r.norm_weights { chosen_sum } else { 1.0 };
            let weight = weight / norm * f64::from(r.weights_scale);
            let y = reference_expert(moe, e, &x);
            let mut out_row = out.row_mut(row);
            out_row.scaled_add(weight as f32, &y.row(0));
        }
        if let Some(shared) = moe.shared() {
            let y = reference_ffn(&shared.ffn, &x);
            let gate = shared.gate_inp.as_ref().map_or(1.0, |w| {
                let logit = f64::from(x.dot(&w.to_dense().t())[[0, 0]]);
                1.0 / (1.0 + (-logit).exp())
            });
            out.row_mut(row).scaled_add(gate as f32, &y.row(0));
        }
    }
    out
}

/// Expert `e` of `moe` on the rows `x`: `down(act(gate x + b_g, up x +
/// b_u)) + b_d` (the biases where the block has them: gpt-oss), `act` the
/// block's gated unit.
fn reference_expert(moe: &MixtureOfExperts, e: usize, x: &Array2<f32>) -> Array2<f32> {
    let [gate, up, down] = moe.expert(e);
    let [gate_bias, up_bias, down_bias] = match moe.biases() {
        Some(b) => [&b.gate[e][..], &b.up[e][..], &b.down[e][..]].map(Some),
        None => [None; 3],
    };
    let with_bias = |y: Array2<f32>, bias: Option<&[f32]>| match bias {
        Some(bias) => y + ArrayView1::from(bias),
        None => y,
    };
    let g = with_bias(x.dot(&gate.to_dense().t()), gate_bias);
    let u = with_bias(x.dot(&up.to_dense().t()), up_bias);
    let hidden = match moe.kind() {
        FfnKind::GeGlu => g.mapv(gelu) * u,
        FfnKind::SwiGluOai => {
            let mut hidden = u;
            hidden.zip_mut_with(&g, |u, &g| *u = swiglu_oai(g, *u));
            hidden
        }
        _ => g.mapv(silu) * u,
    };
    with_bias(hidden.dot(&down.to_dense().t()), down_bias)
}

/// `x` normalised by `norm`, or `x` itself where the block has no such norm.
fn reference_pre_norm(norm: &Option<Norm>, x: &Array2<f32>) -> Array2<f32> {
    norm.as_ref()
        .map_or_else(|| x.clone(), |norm| reference_norm(norm, x))
}

/// Normalises every row of `x` with plain ndarray operations.
fn reference_norm(norm: &Norm, x: &Array2<f32>) -> Array2<f32> {
    let x = x.mapv(f64::from);
    let width = x.ncols() as f64;
    let eps = f64::from(norm.eps());
    let weight = Array1::from(norm.weight().to_vec()).mapv(f64::from);
    let normed = match norm.kind() {
        NormKind::LayerNorm => {
            let mean = x.sum_axis(Axis(1)) / width;
            let centered = &x - &mean.insert_axis(Axis(1));
            let var = centered.mapv(|v| v * v).sum_axis(Axis(1)) / width;
            let bias = Array1::from(norm.bias().to_vec()).mapv(f64::from);
            centered / var.mapv(|v| (v + eps).sqrt()).insert_axis(Axis(1)) * &weight + &bias
        }
        NormKind::RmsNorm => {
            let mean_square = x.mapv(|v| v * v).sum_axis(Axis(1)) / width;
            &x / mean_square.mapv(|v| (v + eps).sqrt()).insert_axis(Axis(1)) * &weight
        }
    };
    normed.mapv(|v| v as f32)
}

/// Normalises every head (`head_dim` columns) of every row of `x`.
fn reference_head_norm(norm: &Norm, x: &Array2<f32>, head_dim: usize) -> Array2<f32> {
    let (n, width) = x.dim();
    let heads = x
        .to_shape((n * width / head_dim, head_dim))
        .expect("rows of whole heads")
        .to_owned();
    reference_norm(norm, &heads)
        .into_shape_with_order((n, width))
        .expect("the same number of values")
}

/// RoPE written out from its definition: every head of every row (row
/// index = position) turned pair by pair, angles computed afresh in f64.
struct ReferenceRope<'a> {
    head_dim: usize,
    dim: usize,
    base: f32,
    freq_scale: f32,
    options: &'a RopeOptions,
}

impl ReferenceRope<'_> {
    /// YaRN's share of pair `i`'s angle left unscaled (0 without YaRN:
    /// every angle scaled),
    /// from the YaRN paper's ramp between the dimensions where a pair
    /// turns 32 times and once over the original context (in f64).
    fn unscaled_share(&self, i: usize) -> f64 {
        let Some(original) = self.options.yarn_original_context else {
            return 0.0;
        };
        let dim = self.dim as f64;
        let base = f64::from(self.base);
        let corr_dim = |turns: f64| {
            dim * (original as f64 / (turns * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let low = corr_dim(32.0).floor().max(0.0);
        let high = corr_dim(1.0).ceil().min(dim - 1.0);
        1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0)
    }

    fn apply(&self, x: &mut Array2<f32>) {
        let half = self.dim / 2;
        let scale = f64::from(self.freq_scale);
        let yarn_magnitude = match self.options.yarn_original_context {
            Some(_) => 1.0 + 0.1 * (1.0 / scale).ln(),
            None => 1.0,
        };
        for (pos, mut row) in x.rows_mut().into_iter().enumerate() {
            for head_start in (0..row.len()).step_by(self.head_dim) {
                for i in 0..half {
                    let factor = self.options.freq_factors.as_ref().map_or(1.0, |f| f[i]);
                    let share = self.unscaled_share(i);
                    let theta = pos as f64 * (scale * (1.0 - share) + share)
                        / f64::from(self.base).powf(2.0 * i as f64 / self.dim as f64)
                        / f64::from(factor);
                    let (sin, cos) = theta.sin_cos();
                    let magnitude = f64::from(self.options.attn_factor) * yarn_magnitude;
                    let (sin, cos) = (sin * magnitude, cos * magnitude);
                    let (a, b) = match self.options.mode {
                        RopeMode::Adjacent => (head_start + 2 * i, head_start + 2 * i + 1),
                        RopeMode::Neox => (head_start + i, head_start + i + half),
                    };
                    let (x0, x1) = (f64::from(row[a]), f64::from(row[b]));
                    row[a] = (x0 * cos - x1 * sin) as f32;
                    row[b] = (x0 * sin + x1 * cos) as f32;
                }
            }
        }
    }
}

/// Softmax of every row, subtracting the row maximum first; a sink logit
/// `s` adds `exp(s)` to every row's denominator (and takes no value).
fn reference_softmax_rows(mut scores: Array2<f32>, sink: Option<f32>) -> Array2<f32> {
    for mut row in scores.rows_mut() {
        let max = row.fold(sink.unwrap_or(f32::NEG_INFINITY), |m, &v| m.max(v));
        row.mapv_inplace(|v| (v - max).exp());
        let sum = row.sum() + sink.map_or(0.0, |s| (s - max).exp());
        row /= sum;
    }
    scores
}
