//! The typed shape of a decoder-only transformer: sizes, and which kind of
//! normalisation, positions and feed-forward block each layer uses.
//!
//! One [`TransformerConfig`] describes both the lessons' toy decoder (GPT-2
//! style: LayerNorm, learned positions, GELU MLP) and the llama architecture
//! (RMSNorm, rotary positions, grouped-query attention, SwiGLU), so the same
//! blocks and the same forward pass serve both.

use super::TransformerError;

/// Which normalisation the layers use before attention, before the
/// feed-forward block and before the unembedding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * weight + bias` (GPT-2).
    LayerNorm,
    /// `x / sqrt(mean(x^2) + eps) * weight` (llama).
    RmsNorm,
}

/// How a token learns its position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PositionKind {
    /// A learned vector per position added to the token embedding (GPT-2).
    Learned,
    /// Rotary position embeddings on queries and keys, rotating adjacent
    /// pairs `(x[2i], x[2i+1])` of the first `dim` components of each head
    /// by `pos * base^(-2i/dim)` (llama.cpp's "normal" mode).
    Rope {
        /// The frequency base (10000 in the original paper, 100000 for SmolLM2).
        base: f32,
        /// How many components of each head rotate (even, at most `head_dim`).
        dim: usize,
    },
}

/// The feed-forward block of each layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    /// `down(gelu(up(x)))` with the tanh approximation of GELU (GPT-2).
    GeluMlp,
    /// `down(silu(gate(x)) * up(x))` (llama).
    SwiGlu,
    /// `down(gelu(gate(x)) * up(x))`, tanh GELU (gemma).
    GeGlu,
    /// gpt-oss's clamped SwiGLU (llama.cpp's `swiglu_oai`, alpha 1.702,
    /// limit 7): with `g = min(gate(x), 7)` and `u = clamp(up(x), -7, 7)`,
    /// `down(g * sigmoid(1.702 g) * (u + 1))`.
    SwiGluOai,
}

/// Which components of a head RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])`: llama.cpp's "normal" mode (llama,
    /// whose converter permutes Q and K for it).
    #[default]
    Adjacent,
    /// The two halves `(x[i], x[i + dim/2])`: llama.cpp's NeoX mode (qwen2,
    /// qwen3, gemma3).
    Neox,
}

/// How RoPE turns beyond its base and dimension (see [`PositionKind::Rope`]).
///
/// Pair `i` at position `pos` turns by
/// `pos * freq_scale * base^(-2i/dim) / freq_factors[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeOptions {
    /// Which components form a pair.
    pub mode: RopeMode,
    /// Linear position scaling (`1 / rope.scaling.factor`; 1 without scaling).
    pub freq_scale: f32,
    /// Per-pair divisors of the frequency, `[dim / 2]`: Llama 3's
    /// `rope_freqs.weight`, which the converter computes from the model's
    /// `rope_scaling` (llama.cpp's `freq_factors`), or Phi-3's LongRoPE
    /// `rope_factors_long` / `rope_factors_short`.
    pub freq_factors: Option<Vec<f32>>,
    /// Multiplies the cosine and sine of every rotated pair (llama.cpp's
    /// `attn_factor`, `rope.scaling.attn_factor`: LongRoPE's magnitude
    /// scale; 1 without it).
    pub attn_factor: f32,
    /// YaRN (`rope.scaling.type = yarn`): the original context its
    /// correction dimensions are computed for (llama.cpp's
    /// `n_ctx_orig_yarn`, with its betas 32 and 1); `None`: linear scaling.
    pub yarn_original_context: Option<usize>,
    /// The sliding layers keep `freq_scale` (gpt-oss: llama.cpp's
    /// `rope_freq_scale_train_swa` is the global one); otherwise they turn
    /// unscaled (gemma2, gemma3, olmo2).
    pub scaled_sliding: bool,
}

impl Default for RopeOptions {
    fn default() -> Self {
        Self {
            mode: RopeMode::Adjacent,
            freq_scale: 1.0,
            freq_factors: None,
            attn_factor: 1.0,
            yarn_original_context: None,
            scaled_sliding: false,
        }
    }
}

/// Sliding-window attention on some layers (gemma2, gemma3, olmo2): a query at position
/// `p` reads only keys at `p - window + 1 ..= p`, as llama.cpp's standard
/// SWA mask does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// Positions a query sees, itself included.
    pub window: usize,
    /// The layer pattern: layer `i` slides when `i % period < period - 1`
    /// (gemma3: 6, so five sliding layers, then one global; gemma2: 2).
    pub period: usize,
    /// The RoPE base of the sliding layers (llama.cpp's
    /// `rope_freq_base_train_swa`: 10000 for gemma3, the global base or
    /// `rope.freq_base_swa` for gemma2 and olmo2); their frequency scale
    /// is 1.
    pub rope_base: f32,
}

/// A mixture-of-experts feed-forward block in place of the dense one
/// (qwen3moe, Mixtral, olmoe, qwen2moe, dots1): a router scores `n_expert`
/// experts per token, the `n_expert_used` best are run and their outputs
/// summed, weighted by the router's probabilities, plus a shared expert
/// every token runs where there is one (llama.cpp's `build_moe_ffn`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeOptions {
    /// Experts per layer (`{arch}.expert_count`).
    pub n_expert: usize,
    /// Experts run per token (`{arch}.expert_used_count`).
    pub n_expert_used: usize,
    /// Hidden width of one expert (`{arch}.expert_feed_forward_length`, or
    /// the architecture's default).
    pub expert_ffn_dim: usize,
    /// The chosen experts' probabilities are divided by their sum (qwen3moe,
    /// Mixtral), or used as they are (olmoe, qwen2moe).
    pub norm_weights: bool,
    /// How the router's logits become probabilities.
    pub gating: Gating,
    /// Multiplies the chosen weights after any renormalisation
    /// (`{arch}.expert_weights_scale`; 1 without it).
    pub weights_scale: f32,
    /// The first layers are dense, of width `ffn_dim`
    /// (`{arch}.leading_dense_block_count`: dots1).
    pub n_dense_lead: usize,
    /// A dense SwiGLU expert every token runs, added to the chosen ones'
    /// sum (qwen2moe, dots1).
    pub shared: Option<SharedExpertOptions>,
    /// The router and every expert's gate, up and down projections have
    /// biases (gpt-oss: `ffn_gate_inp.bias`, `ffn_{gate,up,down}_exps.bias`).
    pub biased: bool,
}

/// The router's gating function (llama.cpp's `expert_gating_func`: 1
/// softmax, 2 sigmoid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gating {
    /// `softmax(logits)` over the experts.
    #[default]
    Softmax,
    /// `sigmoid(logit)` of each expert on its own (dots1, DeepSeek V3).
    Sigmoid,
    /// The experts chosen by their logits, then weighted by the softmax
    /// of the chosen logits alone (gpt-oss; llama.cpp's
    /// `SOFTMAX_WEIGHT`).
    SoftmaxWeight,
}

/// A mixture's shared expert: `blk.{i}.ffn_{gate,up,down}_shexp.weight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedExpertOptions {
    /// Its hidden width.
    pub width: usize,
    /// Its output is multiplied by `sigmoid(x . ffn_gate_inp_shexp)`
    /// (qwen2moe), or added as it is (dots1).
    pub gated: bool,
}

/// The most experts a layer may have: llama.cpp's `LLAMA_MAX_EXPERTS`.
pub const MAX_EXPERTS: usize = 512;

/// What one layer's attention reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Every earlier position.
    Global,
    /// The last `window` positions, the query's own included.
    Sliding {
        /// Positions seen.
        window: usize,
    },
}

/// What an architecture adds to the shared block: each option is off (the
/// plain llama / GPT-2 block) by default, and the one forward pass honours
/// each.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ArchOptions {
    /// RoPE pairing, scaling and frequency factors.
    pub rope: RopeOptions,
    /// Biases added to the query, key and value projections (qwen2).
    pub qkv_bias: bool,
    /// RMSNorm of each query and key head (width `head_dim`) before RoPE
    /// (qwen3, gemma3).
    pub qk_norm: bool,
    /// With `qk_norm`: one RMSNorm over all the query heads together
    /// (width `q_dim`) and one over all the key heads (`kv_dim`) instead of
    /// one per head (olmoe).
    pub qk_norm_full_width: bool,
    /// RMSNorms of the attention output and of the feed-forward output
    /// before each is added to the residual stream (gemma2, gemma3, olmo2:
    /// `post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// The block has no norms before attention and the feed-forward block
    /// (olmo2: only the post-norms and the QK norms).
    pub no_pre_norms: bool,
    /// Attention scores are soft-capped, `cap * tanh(score / cap)`, before
    /// the softmax (gemma2's `attn_logit_softcapping`).
    pub attn_softcap: Option<f32>,
    /// The logits are soft-capped the same way (gemma2's
    /// `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// Multiplies the token embedding (gemma3: `sqrt(n_embd)`).
    pub embedding_scale: Option<f32>,
    /// The factor of the query-key products (`None`: `1 / sqrt(head_dim)`).
    pub attention_scale: Option<f32>,
    /// Sliding-window attention on some layers.
    pub sliding_window: Option<SlidingWindow>,
    /// A mixture of experts in place of the dense feed-forward block
    /// (`None`: dense); the experts use [`TransformerConfig::ffn`]'s gate.
    pub moe: Option<MoeOptions>,
    /// Each head has a learned sink logit (`attn_sinks.weight`,
    /// `[n_head]`) that joins its softmax's denominator and takes no value
    /// (gpt-oss).
    pub attn_sinks: bool,
    /// The output projection has a bias (`attn_output.bias`, gpt-oss).
    pub attn_output_bias: bool,
}

/// The precision of attention over the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvPrecision {
    /// Keys, values, queries and attention weights in f32.
    #[default]
    F32,
    /// llama.cpp's default (an f16 KV cache, flash attention off): keys and
    /// values are stored rounded to f16, and queries and attention weights
    /// are rounded to f16 before their products; sums stay in f32. Matching
    /// it moves SmolLM2's logits by up to ~1 toward llama.cpp's (its own
    /// f16-versus-f32 cache difference).
    F16,
    /// llama.cpp's `type_k = type_v = q8_0` cache (with flash attention,
    /// which a quantized V needs there): each run of 32 values of a key or
    /// value along its head's dimensions stored as 32 int8s and an f16
    /// scale, 34 bytes against f16's 64; queries are rounded through q8_0
    /// as llama.cpp's do before their products with q8_0 keys; weights and
    /// sums stay in f32.
    Q8_0,
}

impl KvPrecision {
    /// llama.cpp's name of the cache type (`f32`, `f16`, `q8_0`), which
    /// `--kv-type` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
        }
    }

    /// Bytes of one head's key (or value) of `head_dim` values as stored:
    /// at q8_0 a byte a value and two per block of 32 (a shorter last
    /// block included).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            Self::F32 => 4 * head_dim,
            Self::F16 => 2 * head_dim,
            Self::Q8_0 => head_dim + 2 * head_dim.div_ceil(32),
        }
    }
}

/// The sizes and block kinds of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    /// Tokens in the vocabulary: the length of one logits row.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Number of transformer layers.
    pub n_layer: usize,
    /// Number of query heads.
    pub n_head: usize,
    /// Number of key/value heads (`n_head` for plain multi-head attention;
    /// fewer for grouped-query attention, each shared by `n_head / n_kv_head`
    /// query heads).
    pub n_kv_head: usize,
    /// Width of one head (`n_embd / n_head`).
    pub head_dim: usize,
    /// Hidden width of the feed-forward block.
    pub ffn_dim: usize,
    /// The longest prefix the model reads (the KV cache's capacity).
    pub context_length: usize,
    /// The normalisation kind.
    pub norm: NormKind,
    /// The normalisation epsilon.
    pub norm_eps: f32,
    /// The position encoding.
    pub position: PositionKind,
    /// The feed-forward block kind.
    pub ffn: FfnKind,
    /// Whether the unembedding reuses the token embedding matrix.
    pub tied_output: bool,
    /// The precision of attention over the KV cache.
    pub kv_precision: KvPrecision,
    /// The architecture's additions to the block (all off by default).
    pub options: ArchOptions,
}

impl TransformerConfig {
    /// Width of all query heads together (`n_head * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key (or value) heads together (`n_kv_head * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// What layer `layer_idx` attends to.
    pub fn attention_kind(&self, layer_idx: usize) -> AttentionKind {
        match self.options.sliding_window {
            Some(sw) if layer_idx % sw.period < sw.period - 1 => {
                AttentionKind::Sliding { window: sw.window }
            }
            _ => AttentionKind::Global,
        }
    }

    /// The window of layer `layer_idx`'s attention (`None`: global).
    pub(crate) fn window(&self, layer_idx: usize) -> Option<usize> {
        match self.attention_kind(layer_idx) {
            AttentionKind::Sliding { window } => Some(window),
            AttentionKind::Global => None,
        }
    }

    /// The widest window of any sliding layer (`None`: no layer slides).
    pub(crate) fn largest_window(&self) -> Option<usize> {
        (0..self.n_layer)
            .filter_map(|layer_idx| self.window(layer_idx))
            .max()
    }

    /// Whether layer `layer_idx`'s feed-forward block is a mixture of
    /// experts (all but the leading dense layers of a mixture).
    pub fn is_moe_layer(&self, layer_idx: usize) -> bool {
        self.options
            .moe
            .is_some_and(|moe| layer_idx >= moe.n_dense_lead)
    }

    /// Whether some layer's feed-forward block is dense (of width `ffn_dim`).
    pub(crate) fn has_dense_layers(&self) -> bool {
        (0..self.n_layer).any(|layer_idx| !self.is_moe_layer(layer_idx))
    }

    /// The widths of the query and key norms (`qk_norm`): a head's, or all
    /// heads' together (`qk_norm_full_width`).
    pub fn qk_norm_widths(&self) -> (usize, usize) {
        if self.options.qk_norm_full_width {
            (self.q_dim(), self.kv_dim())
        } else {
            (self.head_dim, self.head_dim)
        }
    }

    /// The factor of the query-key products.
    pub fn attention_scale(&self) -> f32 {
        self.options
            .attention_scale
            .unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    /// Checks that the sizes fit together: every size positive, the
    /// key/value head count divides the head count, the rotary dimension is
    /// even and fits in a head, and the options are usable (frequency
    /// factors one per rotated pair and positive, a positive window and
    /// period, finite positive scales). The head width need not be
    /// `n_embd / n_head` (qwen3 and gemma3 give it apart); the architecture
    /// mapping checks that division where it derives the width from it.
    pub fn validate(&self) -> Result<(), TransformerError> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
            ("head_dim", self.head_dim),
            ("ffn_dim", self.ffn_dim),
            ("context_length", self.context_length),
        ];
        if let Some(&(field, _)) = sizes.iter().find(|(_, value)| *value == 0) {
            return Err(TransformerError::ZeroSize { field });
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return Err(TransformerError::KvHeadCountDoesNotDivide {
                n_head: self.n_head,
                n_kv_head: self.n_kv_head,
            });
        }
        // A NaN or infinite base would give every position the same angles
        // (or NaN ones): named as the base, not as a shape that does not fit.
        if let PositionKind::Rope { base, .. } = self.position
            && !(base.is_finite() && base > 0.0)
        {
            return Err(TransformerError::InvalidScale {
                name: "rope frequency base (rope.freq_base)",
                value: base,
            });
        }
        if let PositionKind::Rope { base, dim } = self.position
            && (dim == 0 || !dim.is_multiple_of(2) || dim > self.head_dim)
        {
            return Err(TransformerError::InvalidRope {
                base,
                dim,
                head_dim: self.head_dim,
            });
        }
        if self.norm_eps.is_nan() || self.norm_eps < 0.0 {
            return Err(TransformerError::InvalidNormEpsilon {
                value: self.norm_eps,
            });
        }
        self.validate_options()
    }

    fn validate_options(&self) -> Result<(), TransformerError> {
        let o = &self.options;
        let usable = |v: f32| v.is_finite() && v > 0.0;
        for (name, value) in [
            ("rope frequency scale", Some(o.rope.freq_scale)),
            ("embedding scale", o.embedding_scale),
            ("attention scale", o.attention_scale),
            (
                "rope attention factor (rope.scaling.attn_factor)",
                Some(o.rope.attn_factor),
            ),
            (
                "attention logit soft-cap (attn_logit_softcapping)",
                o.attn_softcap,
            ),
            (
                "final logit soft-cap (final_logit_softcapping)",
                o.final_softcap,
            ),
            (
                "sliding-window rope base",
                o.sliding_window.map(|s| s.rope_base),
            ),
        ] {
            if let Some(value) = value
                && !usable(value)
            {
                return Err(TransformerError::InvalidScale { name, value });
            }
        }
        if let Some(factors) = &o.rope.freq_factors {
            let n_pairs = match self.position {
                PositionKind::Rope { dim, .. } => dim / 2,
                PositionKind::Learned => 0,
            };
            if factors.len() != n_pairs {
                return Err(TransformerError::RopeFreqFactorsLength {
                    expected: n_pairs,
                    found: factors.len(),
                });
            }
            if let Some(&value) = factors.iter().find(|&&v| !usable(v)) {
                return Err(TransformerError::InvalidScale {
                    name: "rope frequency factor",
                    value,
                });
            }
        }
        if let Some(sw) = o.sliding_window
            && (sw.window == 0 || sw.period == 0)
        {
            return Err(TransformerError::InvalidSlidingWindow {
                window: sw.window,
                period: sw.period,
            });
        }
        match o.moe {
            Some(moe) => moe.validate([
                "n_expert",
                "n_expert_used",
                "expert_ffn_dim",
                "shared.width",
            ]),
            None => Ok(()),
        }
    }
}

impl MoeOptions {
    /// Checks the counts, naming each by `keys` (the fields, or the
    /// metadata keys they were read from: the expert count, the top-k, the
    /// expert width and the shared expert's width): at least one expert
    /// and at most [`MAX_EXPERTS`], between one and all of them used,
    /// experts of a positive width, a finite positive weight scale.
    pub(crate) fn validate(&self, keys: [&str; 4]) -> Result<(), TransformerError> {
        let [count_key, used_key, width_key, shared_key] = keys;
        let invalid = |key: &str, value: usize, reason: String| {
            Err(TransformerError::InvalidExperts {
                key: key.to_owned(),
                value,
                reason,
            })
        };
        if self.n_expert == 0 || self.n_expert > MAX_EXPERTS {
            return invalid(
                count_key,
                self.n_expert,
                format!("a mixture of experts has 1 to {MAX_EXPERTS} experts"),
            );
        }
        if self.n_expert_used == 0 || self.n_expert_used > self.n_expert {
            return invalid(
                used_key,
                self.n_expert_used,
                format!("between 1 and the {} experts are used", self.n_expert),
            );
        }
        if self.expert_ffn_dim == 0 {
            return invalid(width_key, 0, "an expert's width must be positive".into());
        }
        if let Some(shared) = self.shared
            && shared.width == 0
        {
            return invalid(
                shared_key,
                0,
                "a shared expert's width must be positive".into(),
            );
        }
        if !(self.weights_scale.is_finite() && self.weights_scale > 0.0) {
            return Err(TransformerError::InvalidScale {
                name: "expert weights scale (expert_weights_scale)",
                value: self.weights_scale,
            });
        }
        Ok(())
    }
}
