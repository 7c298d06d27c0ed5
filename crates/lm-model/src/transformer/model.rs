//! The generic decoder: immutable weights ([`Decoder`]) apart from the
//! per-sequence state ([`DecoderState`]: the KV cache, the position `pos`
//! and scratch buffers), and the forward pass that both the toy decoder and
//! llama run.
//!
//! One forward call reads `n` new tokens at positions `pos..pos + n`:
//!
//! ```text
//! x = embed(tokens) (+ learned positions)                    [n][n_embd]
//! x *= embedding_scale                                       (gemma3)
//! for each layer:
//!     h = norm(x);  q, k, v = h Wq^T, h Wk^T, h Wv^T          matrix-matrix
//!     q, k, v += biases                                       (qwen2)
//!     q, k = rmsnorm of each head                             (qwen3, gemma3)
//!     rotate q, k (RoPE: the layer's table, the model's mode)
//!     write k, v to the cache at pos..pos+n
//!     a[i] = attention of q[i] over cache rows 0..=pos+i      causal
//!            (only the last `window` of them on a sliding layer)
//!     x += post_norm(a Wo^T)                      (post_norm: gemma3 only)
//!     x += post_norm(ffn(norm(x)))
//! logits = norm(x[rows]) Wout^T     only for the rows returned
//! ```
//!
//! Each step an architecture adds is an option of the configuration
//! ([`ArchOptions`](super::config::ArchOptions)); this one pass honours
//! them all.
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

use super::TransformerError;
use super::attention::{AttentionScratch, AttentionShape, attend};
use super::config::{AttentionKind, KvPrecision, PositionKind, RopeOptions, TransformerConfig};
use super::ffn::{FFN_ROWS, FeedForward, gelu, silu};
use super::kv_cache::{KvCache, KvShape};
use super::linear::Linear;
use super::norm::Norm;
use super::rope::RopeTable;
use crate::dispatch::Dispatch;

mod multi_sequence;

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
    /// Biases of the query, key and value projections (`qkv_bias`).
    pub qkv_bias: Option<QkvBias>,
    /// RMSNorm of each query head, `[head_dim]` (`qk_norm`).
    pub q_norm: Option<Norm>,
    /// RMSNorm of each key head, `[head_dim]` (`qk_norm`).
    pub k_norm: Option<Norm>,
    /// Normalisation of the attention output before the residual add
    /// (`post_norms`).
    pub post_attn_norm: Option<Norm>,
    /// Normalisation of the feed-forward output before the residual add
    /// (`post_norms`).
    pub post_ffn_norm: Option<Norm>,
}

impl LayerWeights {
    /// A layer with none of the optional parts (the plain llama / GPT-2
    /// block).
    pub fn plain(
        attn_norm: Norm,
        [wq, wk, wv, wo]: [Linear; 4],
        ffn_norm: Norm,
        ffn: FeedForward,
    ) -> Self {
        Self {
            attn_norm,
            wq,
            wk,
            wv,
            wo,
            ffn_norm,
            ffn,
            qkv_bias: None,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            post_ffn_norm: None,
        }
    }
}

/// The biases of a layer's query, key and value projections.
#[derive(Debug, Clone, PartialEq)]
pub struct QkvBias {
    /// `[n_head * head_dim]`.
    pub q: Vec<f32>,
    /// `[n_kv_head * head_dim]`.
    pub k: Vec<f32>,
    /// `[n_kv_head * head_dim]`.
    pub v: Vec<f32>,
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
    /// Rotary embedding of queries and keys: one table for the global
    /// layers and, with sliding-window attention, one for the sliding layers
    /// (their own base, no scaling).
    Rope {
        global: RopeTable,
        sliding: Option<RopeTable>,
    },
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
            check_layer_options(layer, c)?;
            check_linear("wq", &layer.wq, c.q_dim(), c.n_embd)?;
            check_linear("wk", &layer.wk, c.kv_dim(), c.n_embd)?;
            check_linear("wv", &layer.wv, c.kv_dim(), c.n_embd)?;
            check_linear("wo", &layer.wo, c.n_embd, c.q_dim())?;
            match (&layer.ffn, c.ffn) {
                (FeedForward::GeluMlp { up, down }, super::FfnKind::GeluMlp) => {
                    check_linear("ffn_up", up, c.ffn_dim, c.n_embd)?;
                    check_linear("ffn_down", down, c.n_embd, c.ffn_dim)?;
                }
                (FeedForward::SwiGlu { gate, up, down }, super::FfnKind::SwiGlu)
                | (FeedForward::GeGlu { gate, up, down }, super::FfnKind::GeGlu) => {
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
                let options = &c.options.rope;
                let sliding = c.options.sliding_window.map(|sw| {
                    let sliding_options = RopeOptions {
                        freq_scale: 1.0,
                        ..options.clone()
                    };
                    RopeTable::with_options(dim, sw.rope_base, c.context_length, &sliding_options)
                });
                Positions::Rope {
                    global: RopeTable::with_options(dim, base, c.context_length, options),
                    sliding,
                }
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

    fn attention_shape(&self, layer_idx: usize) -> AttentionShape {
        AttentionShape {
            n_head: self.config.n_head,
            n_kv_head: self.config.n_kv_head,
            head_dim: self.config.head_dim,
            precision: self.config.kv_precision,
            scale: self.config.attention_scale(),
            window: match self.config.attention_kind(layer_idx) {
                AttentionKind::Global => None,
                AttentionKind::Sliding { window } => Some(window),
            },
        }
    }

    /// The rotary table of layer `layer_idx`, if the model uses RoPE.
    fn rope(&self, layer_idx: usize) -> Option<&RopeTable> {
        match &self.positions {
            Positions::Learned(_) => None,
            Positions::Rope { global, sliding } => match self.config.attention_kind(layer_idx) {
                AttentionKind::Sliding { .. } => sliding.as_ref(),
                AttentionKind::Global => Some(global),
            },
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
        if let Some(scale) = c.options.embedding_scale {
            x *= scale;
        }
        let group = c.n_head / c.n_kv_head;
        let scale = c.attention_scale();
        for (layer_idx, layer) in self.layers.iter().enumerate() {
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
            let h = reference_norm(&layer.attn_norm, &x);
            let mut q = h.dot(&layer.wq.to_dense().t());
            let mut k = h.dot(&layer.wk.to_dense().t());
            let mut v = h.dot(&layer.wv.to_dense().t());
            if let Some(bias) = &layer.qkv_bias {
                q += &ndarray::ArrayView1::from(&bias.q);
                k += &ndarray::ArrayView1::from(&bias.k);
                v += &ndarray::ArrayView1::from(&bias.v);
            }
            if let Some(norm) = &layer.q_norm {
                q = reference_head_norm(norm, &q, c.head_dim);
            }
            if let Some(norm) = &layer.k_norm {
                k = reference_head_norm(norm, &k, c.head_dim);
            }
            if let PositionKind::Rope { base, dim } = c.position {
                let (base, freq_scale) =
                    match (c.attention_kind(layer_idx), c.options.sliding_window) {
                        (AttentionKind::Sliding { .. }, Some(sw)) => (sw.rope_base, 1.0),
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
            let mut attn_out = attended.dot(&layer.wo.to_dense().t());
            if let Some(norm) = &layer.post_attn_norm {
                attn_out = reference_norm(norm, &attn_out);
            }
            x += &attn_out;
            let h = reference_norm(&layer.ffn_norm, &x);
            let mut ffn_out = match &layer.ffn {
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
            };
            if let Some(norm) = &layer.post_ffn_norm {
                ffn_out = reference_norm(norm, &ffn_out);
            }
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
    /// With sliding-window layers (whose cache keeps only a ring), the
    /// tokens read, from position 0 to at least `pos`, so the model can
    /// recompute after a truncation further back than the ring reaches;
    /// `None` for other models, which never need them.
    history: Option<Vec<TokenId>>,
}

impl Clone for DecoderState {
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
            scratch: Scratch::default(),
            history: self
                .history
                .as_ref()
                .map(|tokens| tokens[..self.cache.pos().min(tokens.len())].to_vec()),
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
        if let Some(tokens) = &mut self.history {
            tokens.clear();
        }
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
    /// Feed-forward hidden rows, `[min(n, FFN_ROWS)][ffn_dim]`.
    hidden: Vec<f32>,
    /// Feed-forward gate rows, `[min(n, FFN_ROWS)][ffn_dim]`.
    gated: Vec<f32>,
    /// Attention buffers of a pass of one tile of queries (decode; a long
    /// pass's tiles have their own, per thread).
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
        ] {
            buf.resize(n * width, 0.0);
        }
        for buf in [&mut self.hidden, &mut self.gated] {
            buf.resize(n.min(FFN_ROWS) * c.ffn_dim, 0.0);
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
        let windows: Vec<Option<usize>> = (0..c.n_layer)
            .map(|layer_idx| match c.attention_kind(layer_idx) {
                AttentionKind::Sliding { window } => Some(window),
                AttentionKind::Global => None,
            })
            .collect();
        DecoderState {
            history: windows.iter().any(Option::is_some).then(Vec::new),
            cache: KvCache::with_windows(
                KvShape {
                    n_layer: c.n_layer,
                    n_kv_head: c.n_kv_head,
                    head_dim: c.head_dim,
                    capacity: c.context_length,
                },
                c.kv_precision,
                self.dispatch,
                &windows,
            ),
            scratch: Scratch::default(),
        }
    }

    /// Runs `Decoder::forward_here` on a thread of rayon's pool when the
    /// caller is not one of them: the products of one pass then split their
    /// rows with `join`s inside the pool, instead of each of the ~200
    /// products of a decode step handing its work to the pool and sleeping
    /// until it is done (two context switches per product, a profile showed
    /// 2 threads decoding slower than 1). With a pool of one thread, only a
    /// pass over several tokens goes in: it runs the rows of its attention,
    /// its gating and its product transposes as parallel iterators, which
    /// from outside the pool are ~270 hand-offs per pass (a profile of an
    /// 8-token pass at 1 thread spent 7% of its time switching threads); a
    /// one-token pass has none, so it stays on the caller's thread.
    fn forward(
        &self,
        state: &mut DecoderState,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        let parallel_work = rayon::current_num_threads() > 1 || tokens.len() > 1;
        if parallel_work && rayon::current_thread_index().is_none() {
            rayon::scope(|_| self.forward_here(state, tokens, rows, logits))
        } else {
            self.forward_here(state, tokens, rows, logits)
        }
    }

    /// One pass over the weights for every sequence when each reads one
    /// token (continuous batching's decode step, `multi_sequence.rs`), with
    /// each sequence's logits bit for bit those of its own `forward`; any
    /// other batch is read sequence by sequence.
    fn forward_batch(
        &self,
        states: &mut [DecoderState],
        tokens: &[&[TokenId]],
        logits: &mut [Vec<f32>],
    ) -> lm_core::Result<()> {
        for other in [tokens.len(), logits.len()] {
            if states.len() != other {
                return Err(lm_core::Error::LengthMismatch {
                    left: states.len(),
                    right: other,
                });
            }
        }
        let one_each = tokens.len() > 1 && tokens.iter().all(|t| t.len() == 1);
        if !one_each || !self.can_step_together(states) {
            for ((state, &tokens), logits) in states.iter_mut().zip(tokens).zip(logits) {
                self.forward(state, tokens, Rows::Last, logits)?;
            }
            return Ok(());
        }
        for (state, &tokens) in states.iter().zip(tokens) {
            self.check_input(state.pos(), tokens)?;
        }
        let tokens: Vec<TokenId> = tokens.iter().map(|t| t[0]).collect();
        if rayon::current_num_threads() > 1 && rayon::current_thread_index().is_none() {
            rayon::scope(|_| self.step_together(states, &tokens, logits));
        } else {
            self.step_together(states, &tokens, logits);
        }
        Ok(())
    }
}

impl Decoder {
    /// The forward pass on the calling thread (see [`LanguageModel::forward`]).
    ///
    /// With sliding-window layers, whose cache is a ring (see
    /// [`KvCache::ring_len`]), the tokens are read in pieces short enough
    /// that a piece's keys never overwrite a row one of its queries still
    /// reads; and after a truncation further back than the ring reaches,
    /// the prefix is first recomputed from the tokens the state kept.
    fn forward_here(
        &self,
        state: &mut DecoderState,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        let pos = state.pos();
        self.check_input(pos, tokens)?;
        let c = &self.config;
        let largest_window = (0..c.n_layer)
            .filter_map(|layer_idx| match c.attention_kind(layer_idx) {
                AttentionKind::Sliding { window } => Some(window),
                AttentionKind::Global => None,
            })
            .max();
        let max_piece = match (largest_window, state.cache.ring_len()) {
            (Some(window), Some(ring_len)) => ring_len + 1 - window.min(ring_len),
            _ => tokens.len(),
        };
        let DecoderState {
            cache,
            scratch,
            history,
        } = state;
        if let Some(history) = history {
            history.truncate(pos);
            if let Some(window) = largest_window
                && !cache.holds_window(window)
            {
                cache.reset();
                for piece in history.chunks(max_piece) {
                    self.forward_piece(cache, scratch, piece, piece.len(), &mut []);
                }
            }
            history.extend_from_slice(tokens);
        }
        let n_out = match rows {
            Rows::All => tokens.len(),
            Rows::Last => 1,
        };
        logits.resize(n_out * c.vocab_size, 0.0);
        let mut written = 0;
        let n_pieces = tokens.len().div_ceil(max_piece);
        for (piece_idx, piece) in tokens.chunks(max_piece).enumerate() {
            let out_first = match rows {
                Rows::All => 0,
                Rows::Last if piece_idx + 1 == n_pieces => piece.len() - 1,
                Rows::Last => piece.len(),
            };
            let n_rows = (piece.len() - out_first) * c.vocab_size;
            let out = &mut logits[written..written + n_rows];
            self.forward_piece(cache, scratch, piece, out_first, out);
            written += n_rows;
        }
        Ok(())
    }

    /// Reads `tokens` at the cache's position and writes the logits of rows
    /// `out_first..` into `logits` (`out_first == tokens.len()`: none).
    fn forward_piece(
        &self,
        cache: &mut KvCache,
        s: &mut Scratch,
        tokens: &[TokenId],
        out_first: usize,
        logits: &mut [f32],
    ) {
        let pos = cache.pos();
        let n = tokens.len();
        self.positions_computed.fetch_add(n, Ordering::Relaxed);
        let c = &self.config;
        let (d, q_dim, kv_dim) = (c.n_embd, c.q_dim(), c.kv_dim());
        s.size_for(c, n);

        for (i, (&token, x_row)) in tokens.iter().zip(s.x.chunks_exact_mut(d)).enumerate() {
            self.token_embedding.row(token as usize, x_row);
            if let Positions::Learned(table) = &self.positions {
                for (x, &p) in x_row.iter_mut().zip(table.row(pos + i)) {
                    *x += p;
                }
            }
            if let Some(scale) = c.options.embedding_scale {
                x_row.iter_mut().for_each(|x| *x *= scale);
            }
        }

        let ffn_dim = c.ffn_dim;
        for (layer_idx, layer) in self.layers.iter().enumerate() {
            // Every row's keys and values are needed, but in the last layer
            // only the returned rows need the rest of the block.
            let first = if layer_idx + 1 == self.layers.len() {
                out_first
            } else {
                0
            };
            let m = n - first;
            let shape = self.attention_shape(layer_idx);
            let rope = self.rope(layer_idx);
            layer.attn_norm.apply_rows(&s.x, &mut s.normed);
            let q = &mut s.q[..m * q_dim];
            let (k, v) = (&mut s.k[..], &mut s.v[..]);
            if first == 0 {
                // Every row goes on through the block: one product for the
                // three projections.
                let products = [(&layer.wq, q), (&layer.wk, k), (&layer.wv, v)];
                Linear::matmul_each(self.dispatch, &s.normed, n, products);
            } else {
                let products = [(&layer.wk, k), (&layer.wv, v)];
                Linear::matmul_each(self.dispatch, &s.normed, n, products);
                layer.wq.matmul(self.dispatch, &s.normed[first * d..], m, q);
            }
            if let Some(bias) = &layer.qkv_bias {
                add_bias_rows(&mut s.k, &bias.k);
                add_bias_rows(&mut s.v, &bias.v);
            }
            // An f16 cache (KvPrecision::F16) rounds keys and values to f16
            // as it stores them.
            for (i, (k_row, v_row)) in
                s.k.chunks_exact_mut(kv_dim)
                    .zip(s.v.chunks_exact(kv_dim))
                    .enumerate()
            {
                if let Some(norm) = &layer.k_norm {
                    norm.apply_rows_in_place(k_row);
                }
                if let Some(table) = rope {
                    table.rotate_heads(k_row, c.head_dim, pos + i);
                }
                cache.write(layer_idx, pos + i, k_row, v_row);
            }
            if m == 0 {
                continue;
            }
            let q = &mut s.q[..m * q_dim];
            if let Some(bias) = &layer.qkv_bias {
                add_bias_rows(q, &bias.q);
            }
            for (j, q_row) in q.chunks_exact_mut(q_dim).enumerate() {
                if let Some(norm) = &layer.q_norm {
                    norm.apply_rows_in_place(q_row);
                }
                if let Some(table) = rope {
                    table.rotate_heads(q_row, c.head_dim, pos + first + j);
                }
            }
            let cache = &*cache;
            let attended = &mut s.attended[..m * q_dim];
            attend(
                shape,
                cache,
                layer_idx,
                pos + first,
                q,
                &mut s.attention,
                attended,
            );
            let x = &mut s.x[first * d..];
            let (normed, projected) = (&mut s.normed[..m * d], &mut s.projected[..m * d]);
            layer.wo.matmul(self.dispatch, attended, m, projected);
            if let Some(norm) = &layer.post_attn_norm {
                norm.apply_rows_in_place(projected);
            }
            add_assign(x, projected);
            layer.ffn_norm.apply_rows(x, normed);
            let ffn_rows = ..m.min(FFN_ROWS) * ffn_dim;
            let (hidden, gated) = (&mut s.hidden[ffn_rows], &mut s.gated[ffn_rows]);
            layer
                .ffn
                .forward(self.dispatch, normed, m, hidden, gated, projected);
            if let Some(norm) = &layer.post_ffn_norm {
                norm.apply_rows_in_place(projected);
            }
            add_assign(x, projected);
        }
        cache.commit(n);

        let n_out = n - out_first;
        if n_out == 0 {
            return;
        }
        self.final_norm
            .apply_rows(&s.x[out_first * d..], &mut s.normed[..n_out * d]);
        self.output()
            .matmul(self.dispatch, &s.normed[..n_out * d], n_out, logits);
    }
}

/// Adds `bias` to every row of `rows` (whole rows of its width).
fn add_bias_rows(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        add_assign(row, bias);
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
    check_norm_width(name, norm, c, c.n_embd)
}

/// Checks a norm's kind against the configuration and its width against `width`.
fn check_norm_width(
    name: &str,
    norm: &Norm,
    c: &TransformerConfig,
    width: usize,
) -> Result<(), TransformerError> {
    let bias_ok = match norm.kind() {
        super::NormKind::LayerNorm => norm.bias().len() == width,
        super::NormKind::RmsNorm => true,
    };
    if norm.kind() != c.norm {
        return Err(TransformerError::NormKindMismatch { expected: c.norm });
    }
    if norm.width() == width && bias_ok {
        Ok(())
    } else {
        Err(TransformerError::TensorShape {
            name: name.into(),
            expected: vec![width],
            found: vec![norm.width()],
        })
    }
}

/// Checks that a layer has exactly the optional parts its configuration
/// asks for, each of its width.
fn check_layer_options(
    layer: &LayerWeights,
    c: &TransformerConfig,
) -> Result<(), TransformerError> {
    let o = &c.options;
    let presence = [
        ("qkv_bias", o.qkv_bias, layer.qkv_bias.is_some()),
        ("q_norm", o.qk_norm, layer.q_norm.is_some()),
        ("k_norm", o.qk_norm, layer.k_norm.is_some()),
        (
            "post_attn_norm",
            o.post_norms,
            layer.post_attn_norm.is_some(),
        ),
        ("post_ffn_norm", o.post_norms, layer.post_ffn_norm.is_some()),
    ];
    if let Some(&(part, configured, _)) = presence.iter().find(|(_, c, given)| c != given) {
        return Err(TransformerError::OptionalPart { part, configured });
    }
    if let Some(bias) = &layer.qkv_bias {
        for (name, values, width) in [
            ("q_bias", &bias.q, c.q_dim()),
            ("k_bias", &bias.k, c.kv_dim()),
            ("v_bias", &bias.v, c.kv_dim()),
        ] {
            if values.len() != width {
                return Err(TransformerError::TensorShape {
                    name: name.into(),
                    expected: vec![width],
                    found: vec![values.len()],
                });
            }
        }
    }
    let head_norms = [("q_norm", &layer.q_norm), ("k_norm", &layer.k_norm)];
    for (name, norm) in head_norms {
        if let Some(norm) = norm {
            check_norm_width(name, norm, c, c.head_dim)?;
        }
    }
    let post_norms = [
        ("post_attn_norm", &layer.post_attn_norm),
        ("post_ffn_norm", &layer.post_ffn_norm),
    ];
    for (name, norm) in post_norms {
        if let Some(norm) = norm {
            check_norm(name, norm, c)?;
        }
    }
    Ok(())
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
    fn apply(&self, x: &mut Array2<f32>) {
        let half = self.dim / 2;
        for (pos, mut row) in x.rows_mut().into_iter().enumerate() {
            for head_start in (0..row.len()).step_by(self.head_dim) {
                for i in 0..half {
                    let factor = self.options.freq_factors.as_ref().map_or(1.0, |f| f[i]);
                    let theta = pos as f64 * f64::from(self.freq_scale)
                        / f64::from(self.base).powf(2.0 * i as f64 / self.dim as f64)
                        / f64::from(factor);
                    let (sin, cos) = theta.sin_cos();
                    let (a, b) = match self.options.mode {
                        super::RopeMode::Adjacent => (head_start + 2 * i, head_start + 2 * i + 1),
                        super::RopeMode::Neox => (head_start + i, head_start + i + half),
                    };
                    let (x0, x1) = (f64::from(row[a]), f64::from(row[b]));
                    row[a] = (x0 * cos - x1 * sin) as f32;
                    row[b] = (x0 * sin + x1 * cos) as f32;
                }
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
