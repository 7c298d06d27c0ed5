//! The generic decoder: immutable weights ([`Decoder`]) apart from the
//! per-sequence state ([`DecoderState`]: the KV cache and the position
//! `pos`) and each thread's scratch buffers, and the forward pass that both
//! the toy decoder and llama run.
//!
//! One forward call reads `n` new tokens at positions `pos..pos + n`:
//!
//! ```text
//! x = embed(tokens) (+ learned positions)                    [n][n_embd]
//! x *= embedding_scale                                       (gemma3)
//! for each layer:
//!     h = norm(x) (olmo2: x);  q, k, v = h Wq^T, h Wk^T, h Wv^T   matrix-matrix
//!     q, k, v += biases                                       (qwen2)
//!     q, k = rmsnorm of each head (or of all heads)    (qwen3, gemma3, olmo2)
//!     rotate q, k (RoPE: the layer's table, the model's mode)
//!     write k, v to the cache at pos..pos+n
//!     a[i] = attention of q[i] over cache rows 0..=pos+i      causal
//!            (only the last `window` of them on a sliding layer;
//!             scores soft-capped before the softmax: gemma2)
//!     x += post_norm(a Wo^T)             (post_norm: gemma2, gemma3, olmo2)
//!     x += post_norm(ffn(norm(x)))          (ffn: dense, or a mixture of experts)
//! logits = norm(x[rows]) Wout^T     only for the rows returned (soft-capped: gemma2)
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
//! [`Decoder::reference_logits`] (`reference.rs`) recomputes the same
//! function over a whole prefix with plain ndarray operations and an
//! explicit mask matrix, with no cache code: the path the cached one is
//! tested against.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use lm_core::{LanguageModel, Rows, SequenceState, TokenId};
use ndarray::Array2;

use super::TransformerError;
use super::attention::{AttentionScratch, AttentionShape, attend};
use super::config::{AttentionKind, KvPrecision, PositionKind, RopeOptions, TransformerConfig};
use super::ffn::{FFN_ROWS, FeedForward};
use super::kv_cache::{KvCache, KvShape};
use super::linear::Linear;
use super::moe::MoeScratch;
use super::norm::Norm;
use super::rope::RopeTable;
use crate::kernels::dispatch::Dispatch;
use crate::thread_scratch::SharedScratch;

mod multi_sequence;

/// The weights of one layer.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// Normalisation before attention (`None`: olmo2's `no_pre_norms`).
    pub attn_norm: Option<Norm>,
    /// Query projection, `[n_head * head_dim][n_embd]`.
    pub wq: Linear,
    /// Key projection, `[n_kv_head * head_dim][n_embd]`.
    pub wk: Linear,
    /// Value projection, `[n_kv_head * head_dim][n_embd]`.
    pub wv: Linear,
    /// Output projection, `[n_embd][n_head * head_dim]`.
    pub wo: Linear,
    /// Normalisation before the feed-forward block (`None`: `no_pre_norms`).
    pub ffn_norm: Option<Norm>,
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
    /// Each query head's sink logit, `[n_head]` (`attn_sinks`).
    pub attn_sinks: Option<Vec<f32>>,
    /// The output projection's bias, `[n_embd]` (`attn_output_bias`).
    pub wo_bias: Option<Vec<f32>>,
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
            attn_norm: Some(attn_norm),
            wq,
            wk,
            wv,
            wo,
            ffn_norm: Some(ffn_norm),
            ffn,
            qkv_bias: None,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            post_ffn_norm: None,
            attn_sinks: None,
            wo_bias: None,
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
pub(super) enum Positions {
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
    pub(super) token_embedding: Linear,
    pub(super) positions: Positions,
    pub(super) layers: Vec<LayerWeights>,
    pub(super) final_norm: Norm,
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
        for (layer_idx, layer) in weights.layers.iter().enumerate() {
            for (name, norm) in [
                ("attn_norm", &layer.attn_norm),
                ("ffn_norm", &layer.ffn_norm),
            ] {
                match norm {
                    Some(norm) if !c.options.no_pre_norms => check_norm(name, norm, c)?,
                    None if c.options.no_pre_norms => {}
                    _ => {
                        return Err(TransformerError::OptionalPart {
                            part: name,
                            configured: !c.options.no_pre_norms,
                        });
                    }
                }
            }
            check_layer_options(layer, c)?;
            check_linear("wq", &layer.wq, c.q_dim(), c.n_embd)?;
            check_linear("wk", &layer.wk, c.kv_dim(), c.n_embd)?;
            check_linear("wv", &layer.wv, c.kv_dim(), c.n_embd)?;
            check_linear("wo", &layer.wo, c.n_embd, c.q_dim())?;
            if c.is_moe_layer(layer_idx) != matches!(layer.ffn, FeedForward::Moe(_)) {
                return Err(TransformerError::FfnKindMismatch { expected: c.ffn });
            }
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
                (FeedForward::Moe(moe), _) => moe.check(c)?,
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
                        freq_scale: match options.scaled_sliding {
                            true => options.freq_scale,
                            false => 1.0,
                        },
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
    pub(super) fn output(&self) -> &Linear {
        self.output.as_ref().unwrap_or(&self.token_embedding)
    }

    fn attention_shape(&self, layer_idx: usize) -> AttentionShape {
        AttentionShape {
            n_head: self.config.n_head,
            n_kv_head: self.config.n_kv_head,
            head_dim: self.config.head_dim,
            precision: self.config.kv_precision,
            scale: self.config.attention_scale(),
            window: self.config.window(layer_idx),
            softcap: self.config.options.attn_softcap,
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
}

/// Per-sequence state of a [`Decoder`]: the KV cache, whose length is the
/// position `pos`. A pass's activations live in the passes' shared
/// scratch (`PASS_SCRATCH`), not here, so a waiting sequence holds its
/// cache alone. Cloning forks the sequence; the clone shares the
/// cache's written chunks (see [`KvCache`]).
#[derive(Debug)]
pub struct DecoderState {
    pub(super) cache: KvCache,
    /// With sliding-window layers (whose cache keeps only a ring), the
    /// tokens read, from position 0 to at least `pos`, so the model can
    /// recompute after a truncation further back than the ring reaches;
    /// `None` for other models, which never need them.
    pub(super) history: Option<Vec<TokenId>>,
}

impl Clone for DecoderState {
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
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
    /// A mixture of experts' buffers.
    moe: MoeScratch,
    /// Attention buffers of a pass of one tile of queries (decode; a long
    /// pass's tiles have their own, per thread).
    attention: AttentionScratch,
    /// A multi-sequence step's logits, `[n][vocab_size]`, before each row
    /// goes to its sequence's buffer.
    logits: Vec<f32>,
}

/// The buffers of forward passes, grown to the largest piece run (a
/// server's `--prefill-chunk`) and reused by every sequence and thread.
static PASS_SCRATCH: SharedScratch<Scratch> = SharedScratch::new();

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
        // A mixture of experts has buffers of its own.
        let ffn_dim = if c.has_dense_layers() { c.ffn_dim } else { 0 };
        for buf in [&mut self.hidden, &mut self.gated] {
            buf.resize(n.min(FFN_ROWS) * ffn_dim, 0.0);
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
        let windows: Vec<Option<usize>> = (0..c.n_layer).map(|i| c.window(i)).collect();
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
        }
    }

    /// Reads `tokens` on a thread of rayon's pool when the caller is not one
    /// of them (see `in_pool`). With a pool of one thread, only a pass
    /// over several tokens goes in: it runs the rows of its attention, its
    /// gating and its product transposes as parallel iterators, which from
    /// outside the pool are ~270 hand-offs per pass (a profile of an
    /// 8-token pass at 1 thread spent 7% of its time switching threads); a
    /// one-token pass has none, so it stays on the caller's thread.
    fn forward(
        &self,
        state: &mut DecoderState,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        self.check_input(state.pos(), tokens)?;
        let parallel_work = rayon::current_num_threads() > 1 || tokens.len() > 1;
        in_pool(parallel_work, || {
            let max_piece = self.catch_up(state, tokens);
            self.read_in_pieces(state, tokens, max_piece, rows, logits);
        });
        Ok(())
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
        in_pool(rayon::current_num_threads() > 1, || {
            self.step_together(states, &tokens, logits);
        });
        Ok(())
    }
}

/// Runs `work` on a thread of rayon's pool when `parallel_work` and the
/// caller is not one of them: the products of a pass then split their rows
/// with `join`s inside the pool, instead of each of the ~200 products of a
/// decode step handing its work to the pool and sleeping until it is done
/// (two context switches per product, a profile showed 2 threads decoding
/// slower than 1).
///
/// The pool's other threads keep taking the pass's jobs until it ends
/// ([`keep_taking_jobs`]) instead of going to sleep whenever the pass is
/// serial for a moment (its norms and attention between products): asleep,
/// a worker woke too late to take its half of most products, and at two
/// threads it did 42% of the products' work.
fn in_pool<R: Send>(parallel_work: bool, work: impl FnOnce() -> R + Send) -> R {
    if parallel_work && rayon::current_thread_index().is_none() {
        let done = AtomicBool::new(false);
        rayon::scope(|scope| {
            let pass_thread = rayon::current_thread_index();
            let done = &done;
            for _ in 1..rayon::current_num_threads() {
                scope.spawn(move |_| keep_taking_jobs(done, pass_thread));
            }
            let _end = SetOnDrop(done);
            work()
        })
    } else {
        work()
    }
}

/// Runs the pool's pending jobs (a pass's halves of products) on this pool
/// thread, spinning while there are none, until `done`. Returns at once on
/// `pass_thread`, the thread running the pass: there the pass is suspended
/// below on the stack and `done` would never be set.
fn keep_taking_jobs(done: &AtomicBool, pass_thread: Option<usize>) {
    if rayon::current_thread_index() == pass_thread {
        return;
    }
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::thread::yield_now();
        }
    }
}

/// Sets its flag when dropped: when the pass returns or unwinds.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The longest piece [`Decoder::hidden_states`] reads at once, so its
/// scratch rows stay few.
const HIDDEN_PIECE: usize = 64;

impl Decoder {
    /// Reads `tokens` into `state`, as [`LanguageModel::forward`] does, and
    /// writes each token's final hidden state into `hidden`,
    /// `[tokens.len()][n_embd]`: the residual stream after the final norm,
    /// before the output projection (what embeddings pool). The pass is
    /// the logits pass, in pieces of at most 64 tokens, without the output
    /// projection.
    pub fn hidden_states(
        &self,
        state: &mut DecoderState,
        tokens: &[TokenId],
        hidden: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        self.check_input(state.pos(), tokens)?;
        let d = self.config.n_embd;
        hidden.clear();
        in_pool(true, || {
            let max_piece = self.catch_up(state, tokens).clamp(1, HIDDEN_PIECE);
            PASS_SCRATCH.with(|scratch| {
                for piece in tokens.chunks(max_piece) {
                    // No logits: `unembed` stops after the final norm, whose
                    // rows it leaves in the scratch.
                    self.forward_piece(&mut state.cache, scratch, piece, 0, &mut []);
                    hidden.extend_from_slice(&scratch.normed[..piece.len() * d]);
                }
            });
        });
        Ok(())
    }
}

impl Decoder {
    /// Readies `state` to read `tokens` and returns the longest piece they
    /// may be read in. With sliding-window layers, whose cache is a ring
    /// (see [`KvCache::ring_len`]), a piece is short enough that its keys
    /// never overwrite a row one of its queries still reads; and after a
    /// truncation further back than the ring reaches, the prefix is first
    /// recomputed from the tokens the state kept.
    fn catch_up(&self, state: &mut DecoderState, tokens: &[TokenId]) -> usize {
        let pos = state.pos();
        let largest_window = self.config.largest_window();
        let max_piece = match (largest_window, state.cache.ring_len()) {
            (Some(window), Some(ring_len)) => ring_len + 1 - window.min(ring_len),
            _ => tokens.len(),
        };
        let DecoderState { cache, history } = state;
        if let Some(history) = history {
            history.truncate(pos);
            if let Some(window) = largest_window
                && !cache.holds_window(window)
            {
                cache.reset();
                PASS_SCRATCH.with(|scratch| {
                    for piece in history.chunks(max_piece) {
                        self.forward_piece(cache, scratch, piece, piece.len(), &mut []);
                    }
                });
            }
            history.extend_from_slice(tokens);
        }
        max_piece
    }

    /// Reads `tokens` into `state` in pieces of at most `max_piece` and
    /// writes the logits of `rows` into `logits`.
    fn read_in_pieces(
        &self,
        state: &mut DecoderState,
        tokens: &[TokenId],
        max_piece: usize,
        rows: Rows,
        logits: &mut Vec<f32>,
    ) {
        let vocab_size = self.config.vocab_size;
        let n_out = match rows {
            Rows::All => tokens.len(),
            Rows::Last => 1,
        };
        logits.resize(n_out * vocab_size, 0.0);
        let mut written = 0;
        let n_pieces = tokens.len().div_ceil(max_piece);
        PASS_SCRATCH.with(|scratch| {
            for (piece_idx, piece) in tokens.chunks(max_piece).enumerate() {
                let out_first = match rows {
                    Rows::All => 0,
                    Rows::Last if piece_idx + 1 == n_pieces => piece.len() - 1,
                    Rows::Last => piece.len(),
                };
                let n_rows = (piece.len() - out_first) * vocab_size;
                let out = &mut logits[written..written + n_rows];
                self.forward_piece(&mut state.cache, scratch, piece, out_first, out);
                written += n_rows;
            }
        });
    }

    /// Reads `tokens` at the cache's position and writes the logits of rows
    /// `out_first..` into `logits` (`out_first == tokens.len()`: none). The
    /// steps follow llama2.c's `forward`, for a piece of `n` rows at once.
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
        let (d, q_dim) = (c.n_embd, c.q_dim());
        s.size_for(c, n);

        // copy the token embeddings into x
        for (i, (&token, x_row)) in tokens.iter().zip(s.x.chunks_exact_mut(d)).enumerate() {
            self.embed(token, pos + i, x_row);
        }

        // forward all the layers
        for (layer_idx, layer) in self.layers.iter().enumerate() {
            // Every row's keys and values are needed, but in the last layer
            // only the returned rows need the rest of the block.
            let first = if layer_idx + 1 == self.layers.len() {
                out_first
            } else {
                0
            };
            let m = n - first;
            // attention norm, qkv matmuls, keys and values into the kv cache
            self.project_piece(layer_idx, layer, cache, s, n, first);
            if m == 0 {
                continue;
            }
            // query bias and norm, RoPE relative positional encoding
            let q = &mut s.q[..m * q_dim];
            if let Some(bias) = &layer.qkv_bias {
                add_bias_rows(q, &bias.q);
            }
            let rope = self.rope(layer_idx);
            for (j, q_row) in q.chunks_exact_mut(q_dim).enumerate() {
                if let Some(norm) = &layer.q_norm {
                    norm.apply_rows_in_place(q_row);
                }
                if let Some(table) = rope {
                    table.rotate_heads(q_row, c.head_dim, pos + first + j);
                }
            }
            // multihead attention over the cache rows each query sees
            let shape = self.attention_shape(layer_idx);
            let attended = &mut s.attended[..m * q_dim];
            attend(
                shape,
                layer.attn_sinks.as_deref(),
                cache,
                layer_idx,
                pos + first,
                q,
                &mut s.attention,
                attended,
            );
            // output projection and residual, then the ffn and its residual
            self.finish_block(layer, s, first, m);
        }
        cache.commit(n);

        // final norm and the classifier into the logits
        if n > out_first {
            self.unembed(s, out_first, logits);
        }
    }

    /// Writes the embedding of `token` at position `pos` into `x_row`: the
    /// token's row, plus the learned position's, times the embedding scale.
    fn embed(&self, token: TokenId, pos: usize, x_row: &mut [f32]) {
        self.token_embedding.row(token as usize, x_row);
        if let Positions::Learned(table) = &self.positions {
            for (x, &p) in x_row.iter_mut().zip(table.row(pos)) {
                *x += p;
            }
        }
        if let Some(scale) = self.config.options.embedding_scale {
            x_row.iter_mut().for_each(|x| *x *= scale);
        }
    }

    /// The start of layer `layer_idx` for a piece of `n` rows at the cache's
    /// position: the attention norm of every row, the queries of rows
    /// `first..` into `s.q` (no bias, norm or rotation yet), and every row's
    /// keys and values, biased, normalised and rotated, into the cache.
    fn project_piece(
        &self,
        layer_idx: usize,
        layer: &LayerWeights,
        cache: &mut KvCache,
        s: &mut Scratch,
        n: usize,
        first: usize,
    ) {
        let c = &self.config;
        let (d, kv_dim) = (c.n_embd, c.kv_dim());
        let pos = cache.pos();
        let m = n - first;
        // attention norm
        pre_norm(&layer.attn_norm, &s.x, &mut s.normed);
        // qkv matmuls for these positions
        let q = &mut s.q[..m * c.q_dim()];
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
        // key norm and RoPE, then keys and values into the kv cache (an f16
        // cache, KvPrecision::F16, rounds them to f16 as it stores them)
        let rope = self.rope(layer_idx);
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
    }

    /// The rest of a layer for the `m` rows of the residual stream from row
    /// `first`, whose attention outputs are in `s.attended`:
    /// `x += post_norm(attended Wo^T)`, then `x += post_norm(ffn(norm(x)))`.
    fn finish_block(&self, layer: &LayerWeights, s: &mut Scratch, first: usize, m: usize) {
        let c = &self.config;
        let d = c.n_embd;
        let x = &mut s.x[first * d..];
        let attended = &s.attended[..m * c.q_dim()];
        let (normed, projected) = (&mut s.normed[..m * d], &mut s.projected[..m * d]);
        // final matmul to get the output of the attention
        layer.wo.matmul(self.dispatch, attended, m, projected);
        if let Some(bias) = &layer.wo_bias {
            add_bias_rows(projected, bias);
        }
        if let Some(norm) = &layer.post_attn_norm {
            norm.apply_rows_in_place(projected);
        }
        // residual connection back into x
        add_assign(x, projected);
        // ffn norm, then the feed-forward block
        pre_norm(&layer.ffn_norm, x, normed);
        let ffn_rows = ..s.hidden.len().min(m * c.ffn_dim);
        let (hidden, gated) = (&mut s.hidden[ffn_rows], &mut s.gated[ffn_rows]);
        let moe = &mut s.moe;
        layer
            .ffn
            .forward(self.dispatch, normed, m, [hidden, gated], moe, projected);
        if let Some(norm) = &layer.post_ffn_norm {
            norm.apply_rows_in_place(projected);
        }
        // residual connection
        add_assign(x, projected);
    }

    /// The final norm of the residual stream's rows from row `first` and
    /// their logits, `[rows][vocab_size]`, into `logits`.
    fn unembed(&self, s: &mut Scratch, first: usize, logits: &mut [f32]) {
        let d = self.config.n_embd;
        let x = &s.x[first * d..];
        let n_out = x.len() / d;
        let normed = &mut s.normed[..n_out * d];
        self.final_norm.apply_rows(x, normed);
        // No logits asked (`hidden_states`): the normed rows are the output.
        if logits.is_empty() {
            return;
        }
        self.output().matmul(self.dispatch, normed, n_out, logits);
        if let Some(cap) = self.config.options.final_softcap {
            // llama.cpp's order: times 1 / cap, tanh, times cap.
            let inv_cap = 1.0 / cap;
            for logit in logits.iter_mut() {
                *logit = (*logit * inv_cap).tanh() * cap;
            }
        }
    }
}

/// The norm before attention or the feed-forward block of `x`'s rows into
/// `out`, or a copy where the block has none (olmo2).
pub(super) fn pre_norm(norm: &Option<Norm>, x: &[f32], out: &mut [f32]) {
    match norm {
        Some(norm) => norm.apply_rows(x, out),
        None => out.copy_from_slice(x),
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
        ("attn_sinks", o.attn_sinks, layer.attn_sinks.is_some()),
        ("wo_bias", o.attn_output_bias, layer.wo_bias.is_some()),
    ];
    if let Some(&(part, configured, _)) = presence.iter().find(|(_, c, given)| c != given) {
        return Err(TransformerError::OptionalPart { part, configured });
    }
    let vectors = [
        ("attn_sinks", &layer.attn_sinks, c.n_head),
        ("wo_bias", &layer.wo_bias, c.n_embd),
    ];
    for (name, values, width) in vectors {
        if let Some(values) = values
            && values.len() != width
        {
            return Err(TransformerError::TensorShape {
                name: name.into(),
                expected: vec![width],
                found: vec![values.len()],
            });
        }
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
    let (q_width, k_width) = c.qk_norm_widths();
    let head_norms = [
        ("q_norm", &layer.q_norm, q_width),
        ("k_norm", &layer.k_norm, k_width),
    ];
    for (name, norm, width) in head_norms {
        if let Some(norm) = norm {
            check_norm_width(name, norm, c, width)?;
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
