//! The generic decoder: immutable weights ([`Decoder`]) apart from the
//! per-sequence state ([`DecoderState`]: the KV cache, the position `pos`
//! and scratch buffers), and the forward pass that both the toy decoder and
//! llama run.
//!
//! One forward call reads `n` new tokens at positions `pos..pos + n`:
//!
//! ```text
//! x = embed(tokens) (+ learned positions)                    [n][n_embd]
//! for each layer:
//!     h = norm(x);  q, k, v = h Wq^T, h Wk^T, h Wv^T          matrix-matrix
//!     rotate q, k (RoPE);  write k, v to the cache at pos..pos+n
//!     a[i] = attention of q[i] over cache rows 0..=pos+i      causal
//!     x += a Wo^T
//!     x += ffn(norm(x))
//! logits = norm(x[rows]) Wout^T     only for the rows returned
//! ```
//!
//! With [`Rows::Last`], the last layer writes every new row's keys and values
//! but finishes only the last row, and only that row is unembedded (for
//! SmolLM2 the unembedding is 49152 x 576, the largest product of a step).
//!
//! [`Decoder::reference_logits`] recomputes the same function over a whole
//! prefix with plain ndarray operations and an explicit mask matrix, with no
//! cache code: the path the cached one is tested against.

use std::sync::atomic::{AtomicUsize, Ordering};

use lm_core::{LanguageModel, Rows, SequenceState, TokenId};
use ndarray::{Array2, Axis, s};
use rayon::prelude::*;

use super::TransformerError;
use super::attention::{AttentionScratch, AttentionShape, attend};
use super::config::{KvPrecision, PositionKind, TransformerConfig};
use super::ffn::{FeedForward, gelu, silu};
use super::kv_cache::{KvCache, KvShape};
use super::linear::Linear;
use super::norm::Norm;
use super::rope::RopeTable;
use crate::dispatch::Dispatch;

/// The weights of one layer.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// Normalisation before attention.
    pub attn_norm: Norm,
    /// Query projection, `[n_head * head_dim][n_embd]`.
    pub wq: Linear,
    /// Key projection, `[n_kv_head * head_dim][n_embd]`.
    pub wk: Linear,
    /// Value projection, `[n_kv_head * head_dim][n_embd]`.
    pub wv: Linear,
    /// Output projection, `[n_embd][n_head * head_dim]`.
    pub wo: Linear,
    /// Normalisation before the feed-forward block.
    pub ffn_norm: Norm,
    /// The feed-forward block.
    pub ffn: FeedForward,
}

/// Every weight of a decoder.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// Token embedding, `[vocab_size][n_embd]`.
    pub token_embedding: Linear,
    /// Learned position embedding, `[context_length][n_embd]`, when the
    /// configuration asks for learned positions.
    pub position_embedding: Option<Array2<f32>>,
    /// The layers, in order.
    pub layers: Vec<LayerWeights>,
    /// Normalisation before the unembedding.
    pub final_norm: Norm,
    /// Unembedding `[vocab_size][n_embd]`; `None` reuses the token
    /// embedding (tied weights).
    pub output: Option<Linear>,
}

/// How positions enter the computation, ready to use.
#[derive(Debug, Clone)]
enum Positions {
    /// `[context_length][n_embd]`, added to the token embedding.
    Learned(Array2<f32>),
    /// Rotary embedding of queries and keys.
    Rope(RopeTable),
}

/// A decoder-only transformer: configuration and immutable weights, shared
/// by `&self` between any number of [`DecoderState`]s.
#[derive(Debug)]
pub struct Decoder {
    config: TransformerConfig,
    token_embedding: Linear,
    positions: Positions,
    layers: Vec<LayerWeights>,
    final_norm: Norm,
    output: Option<Linear>,
    /// Positions computed by forward passes (lesson 001's "positions read").
    positions_computed: AtomicUsize,
    /// The SIMD paths of every product and of the f16 cache, decided once.
    dispatch: Dispatch,
}

impl Decoder {
    /// Builds a decoder, checking the configuration and every weight's shape
    /// against it. The first one built logs a warning when lm-model was
    /// compiled with debug assertions (see the crate's "Build profile").
    pub fn new(
        config: TransformerConfig,
        weights: DecoderWeights,
    ) -> Result<Self, TransformerError> {
        crate::build_profile::warn_once_if_unoptimised();
        config.validate()?;
        let c = &config;
        check_linear(
            "token_embedding",
            &weights.token_embedding,
            c.vocab_size,
            c.n_embd,
        )?;
        if let Some(output) = &weights.output {
            check_linear("output", output, c.vocab_size, c.n_embd)?;
        }
        if c.tied_output != weights.output.is_none() {
            return Err(TransformerError::OutputTying {
                tied_output: c.tied_output,
            });
        }
        if weights.layers.len() != c.n_layer {
            return Err(TransformerError::LayerCount {
                expected: c.n_layer,
                found: weights.layers.len(),
            });
        }
        for layer in &weights.layers {
            check_norm("attn_norm", &layer.attn_norm, c)?;
            check_norm("ffn_norm", &layer.ffn_norm, c)?;
            check_linear("wq", &layer.wq, c.q_dim(), c.n_embd)?;
            check_linear("wk", &layer.wk, c.kv_dim(), c.n_embd)?;
            check_linear("wv", &layer.wv, c.kv_dim(), c.n_embd)?;
            check_linear("wo", &layer.wo, c.n_embd, c.q_dim())?;
            match (&layer.ffn, c.ffn) {
                (FeedForward::GeluMlp { up, down }, super::FfnKind::GeluMlp) => {
                    check_linear("ffn_up", up, c.ffn_dim, c.n_embd)?;
                    check_linear("ffn_down", down, c.n_embd, c.ffn_dim)?;
                }
                (FeedForward::SwiGlu { gate, up, down }, super::FfnKind::SwiGlu) => {
                    check_linear("ffn_gate", gate, c.ffn_dim, c.n_embd)?;
                    check_linear("ffn_up", up, c.ffn_dim, c.n_embd)?;
                    check_linear("ffn_down", down, c.n_embd, c.ffn_dim)?;
                }
                _ => return Err(TransformerError::FfnKindMismatch { expected: c.ffn }),
            }
        }
        check_norm("final_norm", &weights.final_norm, c)?;
        let positions = match (c.position, weights.position_embedding) {
            (PositionKind::Learned, Some(table)) => {
                if table.dim() != (c.context_length, c.n_embd) {
                    return Err(TransformerError::TensorShape {
                        name: "position_embedding".into(),
                        expected: vec![c.context_length, c.n_embd],
                        found: table.shape().to_vec(),
                    });
                }
                Positions::Learned(table)
            }
            (PositionKind::Learned, None) => {
                return Err(TransformerError::MissingPositionEmbedding);
            }
            (PositionKind::Rope { base, dim }, _) => {
                Positions::Rope(RopeTable::new(dim, base, c.context_length))
            }
        };
        Ok(Self {
            config,
            token_embedding: weights.token_embedding,
            positions,
            layers: weights.layers,
            final_norm: weights.final_norm,
            output: weights.output,
            positions_computed: AtomicUsize::new(0),
            dispatch: Dispatch::detect(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// The same decoder with attention over the KV cache at `precision`
    /// (llama defaults to [`KvPrecision::F16`], llama.cpp's default).
    pub fn with_kv_precision(mut self, precision: KvPrecision) -> Self {
        self.config.kv_precision = precision;
        self
    }

    /// How many positions forward passes have computed since creation or
    /// the last [`Decoder::reset_counter`]: lesson 001 counts 25 without a
    /// cache and 7 with one for five steps from a three-token prompt.
    pub fn positions_computed(&self) -> usize {
        self.positions_computed.load(Ordering::Relaxed)
    }

    /// Sets the positions counter back to zero.
    pub fn reset_counter(&self) {
        self.positions_computed.store(0, Ordering::Relaxed);
    }

    /// The unembedding matrix (the token embedding when tied).
    fn output(&self) -> &Linear {
        self.output.as_ref().unwrap_or(&self.token_embedding)
    }

    fn attention_shape(&self) -> AttentionShape {
        AttentionShape {
            n_head: self.config.n_head,
            n_kv_head: self.config.n_kv_head,
            head_dim: self.config.head_dim,
            precision: self.config.kv_precision,
        }
    }

    /// The logits of every position of `tokens` read from the start, one row
    /// per token (`[tokens.len()][vocab_size]`), computed with plain ndarray
    /// products, an explicit causal mask matrix and no cache: the reference
    /// the cached forward pass is tested against. Quantized weights are
    /// dequantised one matrix at a time, so this is slow on a real model.
    pub fn reference_logits(&self, tokens: &[TokenId]) -> lm_core::Result<Array2<f32>> {
        self.check_input(0, tokens)?;
        let c = &self.config;
        let n = tokens.len();
        let embedding = self.token_embedding.to_dense();
        let mut x = Array2::<f32>::zeros((n, c.n_embd));
        for (mut row, &token) in x.rows_mut().into_iter().zip(tokens) {
            row.assign(&embedding.row(token as usize));
        }
        if let Positions::Learned(table) = &self.positions {
            x += &table.slice(s![..n, ..]);
        }
        // mask[i][j] = 0 where key j is visible to query i (j <= i), else -inf.
        let mask = Array2::from_shape_fn(
            (n, n),
            |(i, j)| if j <= i { 0.0 } else { f32::NEG_INFINITY },
        );
        let group = c.n_head / c.n_kv_head;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        for layer in &self.layers {
            let h = reference_norm(&layer.attn_norm, &x);
            let mut q = h.dot(&layer.wq.to_dense().t());
            let mut k = h.dot(&layer.wk.to_dense().t());
            let v = h.dot(&layer.wv.to_dense().t());
            if let PositionKind::Rope { base, dim } = c.position {
                reference_rope(&mut q, c.head_dim, dim, base);
                reference_rope(&mut k, c.head_dim, dim, base);
            }
            let mut attended = Array2::<f32>::zeros((n, c.q_dim()));
            for head in 0..c.n_head {
                let kv_head = head / group;
                let q_cols = s![.., head * c.head_dim..(head + 1) * c.head_dim];
                let kv_cols = s![.., kv_head * c.head_dim..(kv_head + 1) * c.head_dim];
                let scores = q.slice(q_cols).dot(&k.slice(kv_cols).t()) * scale + &mask;
                let weights = reference_softmax_rows(scores);
                attended
                    .slice_mut(q_cols)
                    .assign(&weights.dot(&v.slice(kv_cols)));
            }
            x += &attended.dot(&layer.wo.to_dense().t());
            let h = reference_norm(&layer.ffn_norm, &x);
            let ffn_out = match &layer.ffn {
                FeedForward::GeluMlp { up, down } => h
                    .dot(&up.to_dense().t())
                    .mapv(gelu)
                    .dot(&down.to_dense().t()),
                FeedForward::SwiGlu { gate, up, down } => {
                    let gated = h.dot(&gate.to_dense().t()).mapv(silu) * h.dot(&up.to_dense().t());
                    gated.dot(&down.to_dense().t())
                }
            };
            x += &ffn_out;
        }
        let h = reference_norm(&self.final_norm, &x);
        Ok(h.dot(&self.output().to_dense().t()))
    }
}

/// Per-sequence state of a [`Decoder`]: the KV cache (whose length is the
/// position `pos`) and scratch buffers reused across calls. Cloning forks
/// the sequence; the clone shares the cache's written chunks (see
/// [`KvCache`]) and starts with empty scratch.
#[derive(Debug)]
pub struct DecoderState {
    cache: KvCache,
    scratch: Scratch,
}

impl Clone for DecoderState {
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
            scratch: Scratch::default(),
        }
    }
}

impl DecoderState {
    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Allocates cache storage for the first `n_positions` positions now.
    pub fn reserve(&mut self, n_positions: usize) {
        self.cache.reserve(n_positions);
    }

    /// Forgets every token (the cache keeps its storage).
    pub fn reset(&mut self) {
        self.cache.reset();
    }
}

impl SequenceState for DecoderState {
    fn pos(&self) -> usize {
        self.cache.pos()
    }

    fn truncate(&mut self, pos: usize) {
        self.cache.truncate(pos);
    }
}

/// Buffers of one forward pass, grown to the largest block seen and reused.
#[derive(Debug, Default)]
struct Scratch {
    /// Residual stream, `[n][n_embd]`.
    x: Vec<f32>,
    /// Normalised rows, `[n][n_embd]`.
    normed: Vec<f32>,
    /// Queries, `[n][n_head * head_dim]`.
    q: Vec<f32>,
    /// Keys, `[n][n_kv_head * head_dim]`.
    k: Vec<f32>,
    /// Values, `[n][n_kv_head * head_dim]`.
    v: Vec<f32>,
    /// Attention outputs, `[n][n_head * head_dim]`.
    attended: Vec<f32>,
    /// Projection outputs, `[n][n_embd]`.
    projected: Vec<f32>,
    /// Feed-forward hidden rows, `[n][ffn_dim]`.
    hidden: Vec<f32>,
    /// Feed-forward gate rows, `[n][ffn_dim]`.
    gated: Vec<f32>,
    /// Attention buffers of the single-row (decode) path.
    attention: AttentionScratch,
}

impl Scratch {
    fn size_for(&mut self, c: &TransformerConfig, n: usize) {
        for (buf, width) in [
            (&mut self.x, c.n_embd),
            (&mut self.normed, c.n_embd),
            (&mut self.q, c.q_dim()),
            (&mut self.k, c.kv_dim()),
            (&mut self.v, c.kv_dim()),
            (&mut self.attended, c.q_dim()),
            (&mut self.projected, c.n_embd),
            (&mut self.hidden, c.ffn_dim),
            (&mut self.gated, c.ffn_dim),
        ] {
            buf.resize(n * width, 0.0);
        }
    }
}

impl LanguageModel for Decoder {
    type State = DecoderState;

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn context_length(&self) -> Option<usize> {
        Some(self.config.context_length)
    }

    fn new_state(&self) -> DecoderState {
        let c = &self.config;
        DecoderState {
            cache: KvCache::new(
                KvShape {
                    n_layer: c.n_layer,
                    n_kv_head: c.n_kv_head,
                    head_dim: c.head_dim,
                    capacity: c.context_length,
                },
                c.kv_precision,
                self.dispatch,
            ),
            scratch: Scratch::default(),
        }
    }

    /// Runs `Decoder::forward_here` on a thread of rayon's pool when the
    /// pool has several threads and the caller is not one of them: the
    /// products of one pass then split their rows with `join`s inside the
    /// pool, instead of each of the ~200 products of a decode step handing
    /// its work to the pool and sleeping until it is done (two context
    /// switches per product, a profile showed 2 threads decoding slower
    /// than 1).
    fn forward(
        &self,
        state: &mut DecoderState,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        if rayon::current_num_threads() > 1 && rayon::current_thread_index().is_none() {
            rayon::scope(|_| self.forward_here(state, tokens, rows, logits))
        } else {
            self.forward_here(state, tokens, rows, logits)
        }
    }
}

impl Decoder {
    /// The forward pass on the calling thread (see [`LanguageModel::forward`]).
    fn forward_here(
        &self,
        state: &mut DecoderState,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        let pos = state.pos();
        self.check_input(pos, tokens)?;
        let n = tokens.len();
        self.positions_computed.fetch_add(n, Ordering::Relaxed);
        let c = &self.config;
        let (d, q_dim, kv_dim) = (c.n_embd, c.q_dim(), c.kv_dim());
        let DecoderState { cache, scratch: s } = state;
        s.size_for(c, n);

        for (i, (&token, x_row)) in tokens.iter().zip(s.x.chunks_exact_mut(d)).enumerate() {
            self.token_embedding.row(token as usize, x_row);
            if let Positions::Learned(table) = &self.positions {
                for (x, &p) in x_row.iter_mut().zip(table.row(pos + i)) {
                    *x += p;
                }
            }
        }

        let shape = self.attention_shape();
        let ffn_dim = c.ffn_dim;
        for (layer_idx, layer) in self.layers.iter().enumerate() {
            // Every row's keys and values are needed, but in the last layer
            // only the returned rows need the rest of the block.
            let first = match rows {
                Rows::Last if layer_idx + 1 == self.layers.len() => n - 1,
                _ => 0,
            };
            let m = n - first;
            layer.attn_norm.apply_rows(&s.x, &mut s.normed);
            layer.wk.matmul(self.dispatch, &s.normed, n, &mut s.k);
            layer.wv.matmul(self.dispatch, &s.normed, n, &mut s.v);
            // An f16 cache (KvPrecision::F16) rounds keys and values to f16
            // as it stores them.
            for (i, (k_row, v_row)) in
                s.k.chunks_exact_mut(kv_dim)
                    .zip(s.v.chunks_exact(kv_dim))
                    .enumerate()
            {
                if let Positions::Rope(table) = &self.positions {
                    table.rotate_heads(k_row, c.head_dim, pos + i);
                }
                cache.write(layer_idx, pos + i, k_row, v_row);
            }
            let q = &mut s.q[..m * q_dim];
            layer.wq.matmul(self.dispatch, &s.normed[first * d..], m, q);
            if let Positions::Rope(table) = &self.positions {
                for (j, q_row) in q.chunks_exact_mut(q_dim).enumerate() {
                    table.rotate_heads(q_row, c.head_dim, pos + first + j);
                }
            }
            let cache = &*cache;
            let attended = &mut s.attended[..m * q_dim];
            if m == 1 {
                let n_positions = pos + first + 1;
                attend(
                    shape,
                    cache,
                    layer_idx,
                    n_positions,
                    q,
                    &mut s.attention,
                    attended,
                );
            } else {
                attended
                    .par_chunks_mut(q_dim)
                    .zip(q.par_chunks(q_dim))
                    .enumerate()
                    .for_each_init(AttentionScratch::default, |scratch, (j, (out, q_row))| {
                        let n_positions = pos + first + j + 1;
                        attend(shape, cache, layer_idx, n_positions, q_row, scratch, out);
                    });
            }
            let x = &mut s.x[first * d..];
            let (normed, projected) = (&mut s.normed[..m * d], &mut s.projected[..m * d]);
            layer.wo.matmul(self.dispatch, attended, m, projected);
            add_assign(x, projected);
            layer.ffn_norm.apply_rows(x, normed);
            let (hidden, gated) = (&mut s.hidden[..m * ffn_dim], &mut s.gated[..m * ffn_dim]);
            layer
                .ffn
                .forward(self.dispatch, normed, m, hidden, gated, projected);
            add_assign(x, projected);
        }
        cache.commit(n);

        let first_row = match rows {
            Rows::Last => n - 1,
            Rows::All => 0,
        };
        let n_out = n - first_row;
        self.final_norm
            .apply_rows(&s.x[first_row * d..], &mut s.normed[..n_out * d]);
        logits.resize(n_out * c.vocab_size, 0.0);
        self.output()
            .matmul(self.dispatch, &s.normed[..n_out * d], n_out, logits);
        Ok(())
    }
}

/// `x += y`, element by element (the residual connection).
fn add_assign(x: &mut [f32], y: &[f32]) {
    debug_assert_eq!(x.len(), y.len(), "residual width");
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn check_linear(
    name: &str,
    w: &Linear,
    n_rows: usize,
    n_cols: usize,
) -> Result<(), TransformerError> {
    if (w.n_rows(), w.n_cols()) == (n_rows, n_cols) {
        Ok(())
    } else {
        Err(TransformerError::TensorShape {
            name: name.into(),
            expected: vec![n_rows, n_cols],
            found: vec![w.n_rows(), w.n_cols()],
        })
    }
}

fn check_norm(name: &str, norm: &Norm, c: &TransformerConfig) -> Result<(), TransformerError> {
    let bias_ok = match norm.kind() {
        super::NormKind::LayerNorm => norm.bias().len() == c.n_embd,
        super::NormKind::RmsNorm => true,
    };
    if norm.kind() != c.norm {
        return Err(TransformerError::NormKindMismatch { expected: c.norm });
    }
    if norm.width() == c.n_embd && bias_ok {
        Ok(())
    } else {
        Err(TransformerError::TensorShape {
            name: name.into(),
            expected: vec![c.n_embd],
            found: vec![norm.width()],
        })
    }
}

/// Normalises every row of `x` with plain ndarray operations.
fn reference_norm(norm: &Norm, x: &Array2<f32>) -> Array2<f32> {
    let x = x.mapv(f64::from);
    let width = x.ncols() as f64;
    let eps = f64::from(norm.eps());
    let weight = ndarray::Array1::from(norm.weight().to_vec()).mapv(f64::from);
    let normed = match norm.kind() {
        super::NormKind::LayerNorm => {
            let mean = x.sum_axis(Axis(1)) / width;
            let centered = &x - &mean.insert_axis(Axis(1));
            let var = centered.mapv(|v| v * v).sum_axis(Axis(1)) / width;
            let bias = ndarray::Array1::from(norm.bias().to_vec()).mapv(f64::from);
            centered / var.mapv(|v| (v + eps).sqrt()).insert_axis(Axis(1)) * &weight + &bias
        }
        super::NormKind::RmsNorm => {
            let mean_square = x.mapv(|v| v * v).sum_axis(Axis(1)) / width;
            &x / mean_square.mapv(|v| (v + eps).sqrt()).insert_axis(Axis(1)) * &weight
        }
    };
    normed.mapv(|v| v as f32)
}

/// Rotates adjacent pairs of the first `dim` components of every head of
/// every row (row index = position), angles computed afresh in f64.
fn reference_rope(x: &mut Array2<f32>, head_dim: usize, dim: usize, base: f32) {
    for (pos, mut row) in x.rows_mut().into_iter().enumerate() {
        for head_start in (0..row.len()).step_by(head_dim) {
            for i in 0..dim / 2 {
                let theta = pos as f64 / f64::from(base).powf(2.0 * i as f64 / dim as f64);
                let (sin, cos) = theta.sin_cos();
                let (a, b) = (head_start + 2 * i, head_start + 2 * i + 1);
                let (x0, x1) = (f64::from(row[a]), f64::from(row[b]));
                row[a] = (x0 * cos - x1 * sin) as f32;
                row[b] = (x0 * sin + x1 * cos) as f32;
            }
        }
    }
}

/// Softmax of every row, subtracting the row maximum first.
fn reference_softmax_rows(mut scores: Array2<f32>) -> Array2<f32> {
    for mut row in scores.rows_mut() {
        let max = row.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        row.mapv_inplace(|v| (v - max).exp());
        let sum = row.sum();
        row /= sum;
    }
    scores
}
