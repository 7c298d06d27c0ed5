//! The architectures a GGUF file may name in `general.architecture`, and
//! the one mapping from their metadata to a [`TransformerConfig`]: what
//! each adds to the shared block is a row of [`ARCHITECTURES`], read from
//! llama.cpp (`src/llama-model.cpp`, `src/models/*.cpp`).
//!
//! ```text
//! arch     rope      qkv bias  qk norm  norms      ffn    embedding  sliding window
//! llama    adjacent  -         -        pre        SwiGLU -          -        (+ rope_freqs.weight)
//! qwen2    neox      yes       -        pre        SwiGLU -          -
//! qwen3    neox      -         yes      pre        SwiGLU -          -
//! gemma3   neox      -         yes      pre+post   GeGLU  sqrt(n_embd) 5 of 6 layers if the key is > 0,
//!                                                                    base 10000; logits soft-capped
//!                                                                    if final_logit_softcapping > 0
//! qwen3moe neox      -         yes      pre        MoE    -          -
//! olmoe    neox      -         whole    pre        MoE    -          -
//! gemma2   neox      -         -        pre+post   GeGLU  sqrt(n_embd) 1 of 2 layers (default 4096)
//!                                                                    + soft-capped scores, logits;
//!                                                                    output always token_embd
//! olmo2    neox      -         whole    post only  SwiGLU -          3 of 4 layers if the key is > 0
//! phi3     neox      -         -        pre        SwiGLU -          -  (fused attn_qkv, ffn_up;
//!                                                                     LongRoPE factors)
//! qwen2moe neox      yes       -        pre        MoE    -          -
//! dots1    neox      -         yes      pre        MoE    -          -
//! gpt-oss  neox      if present -       pre        MoE    -          1 of 2 layers (key required);
//!                                                                    attention sinks, output bias
//! ```
//!
//! (`whole`: one QK norm over all the heads together; `MoE`: a mixture of
//! SwiGLU experts, below (gpt-oss's: `swiglu_oai`); `post only`: no norm
//! before attention or the feed-forward block, a norm of each one's output.)
//!
//! gpt-oss (llama.cpp's `LLM_ARCH_OPENAI_MOE`, src/models/openai-moe.cpp):
//! `blk.{i}.attn_sinks.weight` `[n_head]`, a logit per head in its softmax's
//! denominator; `attn_output.bias`; the q/k/v biases read when the file has
//! them; the norm before the experts is stored as `post_attention_norm`.
//! Its sliding layers keep the RoPE scale (YaRN's, in real gpt-oss files:
//! factor 32 over an original context of 4096).
//!
//! Storage, not computation: any architecture's query, key and value
//! weights may come fused as one `blk.{i}.attn_qkv.weight` (rows `q_dim`,
//! then `kv_dim`, then `kv_dim`: llama.cpp's `create_tensor_qkv`), and
//! phi3's `ffn_up.weight` holds the gate's rows then the up projection's
//! (`2 * feed_forward_length` rows, llama.cpp's `LLM_FFN_SWIGLU`); each part
//! is a view of its rows of the one tensor.
//!
//! Sliding windows: gemma2 reads `attention.sliding_window` (default 4096)
//! and slides layers 0, 2, 4, ...; gemma3 (5 of 6) and olmo2 (OLMo 3,
//! `i % 4 < 3`) slide only when the key is above 0; all turn the sliding
//! layers with `rope.freq_base_swa` (default 10000 for gemma3, the global
//! base for the others). llama.cpp 0.3.36 reads
//! no `llama.attention.sliding_window` (Mistral 7B v0.1's window is not
//! applied there, and llama's converter writes none), nor phi3's (it
//! disables Phi's window with a warning): both are ignored here as there.
//!
//! LongRoPE (phi3, 128k variants): `rope_factors_long.weight` when the
//! context (`context_length`, the cache this backend sizes) exceeds
//! `rope.scaling.original_context_length`, else `rope_factors_short.weight`
//! (llama.cpp chooses by its `n_ctx` alike), divides each pair's frequency,
//! and `rope.scaling.attn_factor` multiplies every cosine and sine.
//!
//! Mixtures of experts (`moe`; llama.cpp's `build_moe_ffn` arguments):
//!
//! ```text
//! arch      experts when      expert width                  gating    chosen weights    shared expert
//! llama     expert_count > 0  feed_forward_length           softmax   renormalised      -
//!                                                                     (Mixtral)
//! qwen3moe  always            expert_feed_forward_length    softmax   renormalised      -
//!                             (default feed_forward_length
//!                             / top-k)
//! olmoe     always            feed_forward_length           softmax   as they are       -
//! qwen2moe  always            as qwen3moe                   softmax   as they are       expert_shared_feed_forward_length
//!                                                                                       wide (default feed_forward_length),
//!                                                                                       times sigmoid(x . ffn_gate_inp_shexp)
//! gpt-oss   always            expert_feed_forward_length    softmax-  as they are       -
//!                             (required)                    weight:   (router and experts
//!                                                           top-k of  biased)
//!                                                           logits
//! dots1     after the first   expert_feed_forward_length    expert_gating_func  expert_weights_norm   expert_shared_count
//!           leading_dense_    (required)                    (required:  (default no), times       experts' width, added
//!           block_count                                     1 softmax,  expert_weights_scale
//!           layers (dense,                                  2 sigmoid)  (0 or missing: 1);
//!           feed_forward_                                               chosen by probability
//!           length wide)                                                + exp_probs_b.bias
//! ```
//!
//! llama.cpp reads no `expert_weights_norm` key for the first four: it
//! renormalises or not whatever the file says, and so does this table.
//! dots1's K and V are as wide as Q in llama.cpp (no grouped-query
//! attention); a file with fewer KV heads loads here, not there.
//!
//! Metadata read (`{arch}` is `general.architecture`):
//!
//! ```text
//! required  {arch}.block_count  .context_length  .embedding_length
//!           .feed_forward_length  .attention.head_count
//!           .attention.layer_norm_rms_epsilon
//! optional  .attention.head_count_kv (default head_count)
//!           .attention.key_length (default embedding_length / head_count,
//!                                  which must then divide)
//!           .rope.freq_base (default 10000)
//!           .rope.dimension_count (default the head width)
//!           .rope.scaling.type (none, linear or yarn) and .rope.scaling.factor
//!           (YaRN: over .rope.scaling.original_context_length, default
//!           context_length, with llama.cpp's betas 32 and 1)
//!           .rope.scaling.attn_factor (default 1)
//!           .rope.scaling.original_context_length (LongRoPE)
//!           .attention.sliding_window (gemma2, gemma3, olmo2; gpt-oss
//!                                      required), .rope.freq_base_swa
//!           .attention.sliding_window_pattern (a period, or a flag per layer)
//!           .attn_logit_softcapping (gemma2, default 50)
//!           .final_logit_softcapping (gemma2, default 30; gemma3, default none)
//!           .vocab_size (default the rows of token_embd.weight)
//! experts   .expert_count, .expert_used_count (required by all but llama,
//!           which reads them when expert_count is present)
//!           .expert_feed_forward_length (qwen3moe, qwen2moe optional;
//!                                        dots1 required)
//!           .expert_shared_feed_forward_length (qwen2moe, optional)
//!           .expert_shared_count, .expert_gating_func (dots1, required)
//!           .expert_weights_norm, .expert_weights_scale,
//!           .leading_dense_block_count (dots1, optional)
//! ```
//!
//! Gemma's norm gains are stored by llama.cpp's converter with its `+ 1`
//! already added, so they are applied as plain RMSNorm gains (once).

use super::TransformerError;
use super::config::{
    ArchOptions, FfnKind, Gating, KvPrecision, MoeOptions, NormKind, PositionKind, RopeMode,
    RopeOptions, SharedExpertOptions, SlidingWindow, TransformerConfig,
};
use crate::gguf::{GgufError, GgufFile, MetadataValue};

/// The names of the architectures this backend runs.
pub const SUPPORTED: [&str; 12] = [
    "llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "olmoe", "gemma2", "olmo2", "phi3",
    "qwen2moe", "dots1", "gpt-oss",
];

/// What one architecture adds to the shared block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Architecture {
    /// `general.architecture`.
    pub name: &'static str,
    /// Which components RoPE pairs.
    pub rope_mode: RopeMode,
    /// `blk.{i}.attn_{q,k,v}.bias`.
    pub qkv_bias: bool,
    /// `blk.{i}.attn_{q,k,v}.bias` are read when the file has them
    /// (`blk.0.attn_q.bias` present: every layer's are then required).
    pub qkv_bias_if_present: bool,
    /// `blk.{i}.attn_output.bias`.
    pub attn_output_bias: bool,
    /// `blk.{i}.attn_sinks.weight`, a sink logit per head.
    pub attn_sinks: bool,
    /// The name of the norm before the feed-forward block,
    /// `blk.{i}.{ffn_norm}.weight` (gpt-oss: `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// `blk.{i}.attn_{q,k}_norm.weight`, RMSNorm per head.
    pub qk_norm: bool,
    /// The QK norms span all heads (olmoe) instead of one head.
    pub qk_norm_full_width: bool,
    /// `blk.{i}.post_attention_norm.weight`, `blk.{i}.post_ffw_norm.weight`.
    pub post_norms: bool,
    /// `blk.{i}.attn_norm.weight`, `blk.{i}.ffn_norm.weight` (all but olmo2).
    pub pre_norms: bool,
    /// Soft-capped attention scores (`attn_logit_softcapping`: gemma2).
    pub attn_softcap: SoftCap,
    /// Soft-capped logits (`final_logit_softcapping`: gemma2, and gemma3
    /// when the key is above 0).
    pub final_softcap: SoftCap,
    /// `blk.{i}.ffn_up.weight` holds the gate's rows, then the up
    /// projection's (phi3); no `ffn_gate.weight`.
    pub fused_gate_up: bool,
    /// `rope_factors_long.weight` / `rope_factors_short.weight` (phi3's
    /// LongRoPE) are read when present.
    pub long_rope: bool,
    /// The output projection is the token embedding even when the file has
    /// an `output.weight` (gemma2: llama.cpp never reads one).
    pub always_tied: bool,
    /// The feed-forward block.
    pub ffn: FfnKind,
    /// The token embedding is multiplied by `sqrt(n_embd)`.
    pub scaled_embedding: bool,
    /// Sliding-window attention (llama.cpp's `set_swa_pattern`).
    pub sliding_window: Option<SwaArch>,
    /// `rope_freqs.weight` (Llama 3's per-pair frequency factors) is read
    /// when present.
    pub rope_freqs: bool,
    /// The sliding layers keep the RoPE scale (gpt-oss), rather than
    /// turning unscaled.
    pub scaled_sliding_rope: bool,
    /// A mixture of experts in place of the dense feed-forward block.
    pub moe: MoeArch,
}

/// Whether an architecture reads a soft-cap's key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum SoftCap {
    /// Not read: no cap.
    Unread,
    /// The key, or this default when it is missing (gemma2: 50 and 30).
    Default(f32),
    /// The key when it is above 0, else no cap (gemma3's logits).
    WhenPositive,
}

/// How an architecture slides its attention window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SwaArch {
    /// Layer `i` slides when `i % period < period - 1`.
    pub period: usize,
    /// The sliding layers' RoPE base when `rope.freq_base_swa` is missing
    /// (gemma3: 10000, llama.cpp's default), `None`: the global base.
    pub rope_base: Option<f32>,
    /// The window when `attention.sliding_window` is missing; `Some(0)`
    /// means no sliding layer, and then neither does a window of 0
    /// (gemma3, olmo2: llama.cpp slides only when the key is above 0).
    pub default_window: Option<usize>,
}

/// Whether and how an architecture's feed-forward block is a mixture of
/// experts (llama.cpp's `build_moe_ffn` arguments for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MoeArch {
    /// Always dense.
    Dense,
    /// Experts when `{arch}.expert_count` is above 0 (llama: Mixtral),
    /// each as wide as `feed_forward_length`; the chosen softmax weights
    /// renormalised.
    WhenExpertCount,
    /// Always experts (`expert_count` and `expert_used_count` required).
    Always(MoeRow),
}

/// An always-mixture architecture's routing, widths and extra keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MoeRow {
    /// The chosen weights are divided by their sum: always or never
    /// (`Some`: llama.cpp passes a constant whatever the file says), or as
    /// `expert_weights_norm` says (`None`, default no: dots1).
    pub norm_weights: Option<bool>,
    /// Where each expert's width comes from.
    pub width: ExpertWidth,
    /// The gating function is `expert_gating_func` (required: llama.cpp
    /// aborts without it), else `gating`.
    pub gating_key: bool,
    /// The gating function without the key.
    pub gating: Gating,
    /// The router and the experts have biases (gpt-oss).
    pub biased: bool,
    /// `expert_weights_scale` multiplies the chosen weights (0 or missing:
    /// no scale), `leading_dense_block_count` layers come first, dense,
    /// and `blk.{i}.exp_probs_b.bias` is a selection bias when present
    /// (dots1).
    pub deepseek_keys: bool,
    /// The shared expert.
    pub shared: SharedArch,
}

/// Where an expert's width comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpertWidth {
    /// `feed_forward_length` (olmoe).
    FeedForward,
    /// `expert_feed_forward_length`, default `feed_forward_length /
    /// expert_used_count` (qwen3moe, qwen2moe).
    OwnOrShare,
    /// `expert_feed_forward_length`, required (dots1).
    Own,
}

/// An architecture's shared expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SharedArch {
    /// None.
    None,
    /// `expert_shared_feed_forward_length` wide (default
    /// `feed_forward_length`), its output times
    /// `sigmoid(x . ffn_gate_inp_shexp)` (qwen2moe).
    Gated,
    /// `expert_shared_count` (required) experts' width together, added as
    /// it is (dots1).
    Counted,
}

/// The softmax mixture every always-mixture row starts from (qwen3moe).
const SOFTMAX_MOE: MoeRow = MoeRow {
    norm_weights: Some(true),
    width: ExpertWidth::OwnOrShare,
    gating_key: false,
    gating: Gating::Softmax,
    biased: false,
    deepseek_keys: false,
    shared: SharedArch::None,
};

/// The plain block (llama without its frequency factors) that each row of
/// [`ARCHITECTURES`] adds to.
const PLAIN: Architecture = Architecture {
    name: "",
    rope_mode: RopeMode::Adjacent,
    qkv_bias: false,
    qkv_bias_if_present: false,
    attn_output_bias: false,
    attn_sinks: false,
    ffn_norm: "ffn_norm",
    qk_norm: false,
    qk_norm_full_width: false,
    post_norms: false,
    pre_norms: true,
    attn_softcap: SoftCap::Unread,
    final_softcap: SoftCap::Unread,
    fused_gate_up: false,
    long_rope: false,
    always_tied: false,
    ffn: FfnKind::SwiGlu,
    scaled_embedding: false,
    sliding_window: None,
    rope_freqs: false,
    scaled_sliding_rope: false,
    moe: MoeArch::Dense,
};

/// The supported architectures, in the order of [`SUPPORTED`]: each row
/// names what it adds to [`PLAIN`].
pub(crate) const ARCHITECTURES: [Architecture; 12] = [
    Architecture {
        name: "llama",
        rope_freqs: true,
        moe: MoeArch::WhenExpertCount,
        ..PLAIN
    },
    Architecture {
        name: "qwen2",
        rope_mode: RopeMode::Neox,
        qkv_bias: true,
        ..PLAIN
    },
    Architecture {
        name: "qwen3",
        rope_mode: RopeMode::Neox,
        qk_norm: true,
        ..PLAIN
    },
    Architecture {
        name: "gemma3",
        rope_mode: RopeMode::Neox,
        qk_norm: true,
        post_norms: true,
        ffn: FfnKind::GeGlu,
        scaled_embedding: true,
        final_softcap: SoftCap::WhenPositive,
        sliding_window: Some(SwaArch {
            period: 6,
            rope_base: Some(10000.0),
            default_window: Some(0),
        }),
        ..PLAIN
    },
    Architecture {
        name: "qwen3moe",
        rope_mode: RopeMode::Neox,
        qk_norm: true,
        moe: MoeArch::Always(SOFTMAX_MOE),
        ..PLAIN
    },
    Architecture {
        name: "olmoe",
        rope_mode: RopeMode::Neox,
        qk_norm: true,
        qk_norm_full_width: true,
        moe: MoeArch::Always(MoeRow {
            norm_weights: Some(false),
            width: ExpertWidth::FeedForward,
            ..SOFTMAX_MOE
        }),
        ..PLAIN
    },
    Architecture {
        name: "gemma2",
        rope_mode: RopeMode::Neox,
        post_norms: true,
        attn_softcap: SoftCap::Default(50.0),
        final_softcap: SoftCap::Default(30.0),
        always_tied: true,
        ffn: FfnKind::GeGlu,
        scaled_embedding: true,
        sliding_window: Some(SwaArch {
            period: 2,
            rope_base: None,
            default_window: Some(4096),
        }),
        ..PLAIN
    },
    Architecture {
        name: "olmo2",
        rope_mode: RopeMode::Neox,
        qk_norm: true,
        qk_norm_full_width: true,
        post_norms: true,
        pre_norms: false,
        sliding_window: Some(SwaArch {
            period: 4,
            rope_base: None,
            default_window: Some(0),
        }),
        ..PLAIN
    },
    Architecture {
        name: "phi3",
        rope_mode: RopeMode::Neox,
        fused_gate_up: true,
        long_rope: true,
        ..PLAIN
    },
    Architecture {
        name: "qwen2moe",
        rope_mode: RopeMode::Neox,
        qkv_bias: true,
        moe: MoeArch::Always(MoeRow {
            norm_weights: Some(false),
            shared: SharedArch::Gated,
            ..SOFTMAX_MOE
        }),
        ..PLAIN
    },
    Architecture {
        name: "dots1",
        rope_mode: RopeMode::Neox,
        qk_norm: true,
        moe: MoeArch::Always(MoeRow {
            norm_weights: None,
            width: ExpertWidth::Own,
            gating_key: true,
            deepseek_keys: true,
            shared: SharedArch::Counted,
            ..SOFTMAX_MOE
        }),
        ..PLAIN
    },
    Architecture {
        name: "gpt-oss",
        rope_mode: RopeMode::Neox,
        qkv_bias_if_present: true,
        attn_output_bias: true,
        attn_sinks: true,
        ffn_norm: "post_attention_norm",
        ffn: FfnKind::SwiGluOai,
        sliding_window: Some(SwaArch {
            period: 2,
            rope_base: None,
            default_window: None,
        }),
        scaled_sliding_rope: true,
        moe: MoeArch::Always(MoeRow {
            norm_weights: Some(false),
            width: ExpertWidth::Own,
            gating: Gating::SoftmaxWeight,
            biased: true,
            ..SOFTMAX_MOE
        }),
        ..PLAIN
    },
];

impl Architecture {
    /// The architecture named `name`, or an error listing the supported ones.
    pub(crate) fn from_name(name: &str) -> Result<Self, TransformerError> {
        ARCHITECTURES
            .into_iter()
            .find(|arch| arch.name == name)
            .ok_or_else(|| TransformerError::UnsupportedArchitecture {
                found: name.to_owned(),
            })
    }

    /// Whether a mixture's layers read `blk.{i}.exp_probs_b.bias`, the
    /// experts' selection bias, when the file has it (dots1).
    pub(crate) fn reads_selection_bias(&self) -> bool {
        matches!(
            self.moe,
            MoeArch::Always(MoeRow {
                deepseek_keys: true,
                ..
            })
        )
    }

    /// The architecture `file` names in `general.architecture`.
    pub(crate) fn of_file(file: &GgufFile) -> Result<Self, TransformerError> {
        let name = file
            .get_str("general.architecture")
            .map_err(|e| missing_or(e, "general.architecture"))?;
        Self::from_name(name)
    }
}

/// Reads the configuration of `file`'s architecture from its metadata,
/// listing every missing required key at once.
pub fn config_from_metadata(file: &GgufFile) -> Result<TransformerConfig, TransformerError> {
    let arch = Architecture::of_file(file)?;
    let mut meta = ArchMetadata {
        file,
        arch: arch.name,
        missing: Vec::new(),
    };
    let n_layer = meta.required_usize("block_count")?;
    let context_length = meta.required_usize("context_length")?;
    let n_embd = meta.required_usize("embedding_length")?;
    let ffn_dim = meta.required_usize("feed_forward_length")?;
    let n_head = meta.required_usize("attention.head_count")?;
    let window = match arch.sliding_window {
        Some(SwaArch {
            default_window: None,
            ..
        }) => Some(meta.required_usize("attention.sliding_window")?),
        Some(SwaArch {
            default_window: Some(default),
            ..
        }) => Some(
            meta.optional_usize("attention.sliding_window")?
                .unwrap_or(default),
        ),
        None => None,
    };
    let norm_eps = meta.required("attention.layer_norm_rms_epsilon", GgufFile::get_f32)?;
    let moe = meta.moe(arch.moe, ffn_dim)?;
    if !meta.missing.is_empty() {
        return Err(TransformerError::MissingMetadata { keys: meta.missing });
    }
    // The head width: given (qwen3, gemma3), or the width over the heads,
    // which must then divide it.
    let head_dim = match meta.optional_usize("attention.key_length")? {
        Some(head_dim) => head_dim,
        None => {
            if n_head == 0 || !n_embd.is_multiple_of(n_head) {
                return Err(TransformerError::HeadCountDoesNotDivide { n_embd, n_head });
            }
            n_embd / n_head
        }
    };
    let n_kv_head = meta
        .optional_usize("attention.head_count_kv")?
        .unwrap_or(n_head);
    let rope_dim = meta
        .optional_usize("rope.dimension_count")?
        .unwrap_or(head_dim);
    let rope_base = meta
        .optional("rope.freq_base", GgufFile::get_f32)?
        .unwrap_or(10000.0);
    let (freq_scale, yarn) = meta.rope_freq_scale()?;
    // YaRN's original context: the key, else the trained one (llama.cpp's
    // n_ctx_orig_yarn).
    let yarn_original_context = match yarn {
        true => Some(
            meta.optional_usize("rope.scaling.original_context_length")?
                .unwrap_or(context_length),
        ),
        false => None,
    };
    let freq_factors = meta.freq_factors(arch, context_length)?;
    let attn_factor = meta
        .optional("rope.scaling.attn_factor", GgufFile::get_f32)?
        .unwrap_or(1.0);
    let embedding_rows = file
        .tensor("token_embd.weight")
        .ok()
        .map(|t| t.info.n_rows());
    let vocab_size = meta
        .optional_usize("vocab_size")?
        .unwrap_or(embedding_rows.unwrap_or(0));
    let sliding_window = match (arch.sliding_window, window) {
        // A window of 0 (olmo2 without the key): no layer slides.
        (Some(swa), Some(window)) if swa.default_window != Some(0) || window > 0 => {
            let rope_base = meta
                .optional("rope.freq_base_swa", GgufFile::get_f32)?
                .unwrap_or(swa.rope_base.unwrap_or(rope_base));
            Some(SlidingWindow {
                window,
                period: meta.swa_period(swa.period, n_layer)?,
                rope_base,
            })
        }
        _ => None,
    };
    // Gemma 3 27B (62 layers) and Gemma 2 27B (46) scale queries by the
    // width per head, the others by the key length (llama.cpp's
    // f_attention_scale).
    let wide_gemma = matches!((arch.name, n_layer), ("gemma3", 62) | ("gemma2", 46));
    let attention_scale =
        (wide_gemma && n_head > 0).then(|| 1.0 / ((n_embd / n_head) as f32).sqrt());
    let attn_softcap = meta.softcap("attn_logit_softcapping", arch.attn_softcap)?;
    let final_softcap = meta.softcap("final_logit_softcapping", arch.final_softcap)?;
    let config = TransformerConfig {
        vocab_size,
        n_embd,
        n_layer,
        n_head,
        n_kv_head,
        head_dim,
        ffn_dim,
        context_length,
        norm: NormKind::RmsNorm,
        norm_eps,
        position: PositionKind::Rope {
            base: rope_base,
            dim: rope_dim,
        },
        ffn: arch.ffn,
        tied_output: arch.always_tied || file.tensor("output.weight").is_err(),
        kv_precision: KvPrecision::F16,
        options: ArchOptions {
            rope: RopeOptions {
                mode: arch.rope_mode,
                freq_scale,
                freq_factors,
                attn_factor,
                yarn_original_context,
                scaled_sliding: arch.scaled_sliding_rope,
            },
            qkv_bias: arch.qkv_bias
                || (arch.qkv_bias_if_present && file.tensor("blk.0.attn_q.bias").is_ok()),
            qk_norm: arch.qk_norm,
            qk_norm_full_width: arch.qk_norm_full_width,
            post_norms: arch.post_norms,
            no_pre_norms: !arch.pre_norms,
            attn_softcap,
            final_softcap,
            embedding_scale: arch.scaled_embedding.then(|| (n_embd as f32).sqrt()),
            attention_scale,
            sliding_window,
            moe,
            attn_sinks: arch.attn_sinks,
            attn_output_bias: arch.attn_output_bias,
        },
    };
    config.validate()?;
    Ok(config)
}

/// The `{arch}.*` keys of one file's metadata as the mapping reads them: a
/// missing required key is collected, so that all are named at once; a
/// malformed key is an error at once.
struct ArchMetadata<'a> {
    file: &'a GgufFile,
    arch: &'static str,
    /// The required keys found missing so far.
    missing: Vec<String>,
}

impl<'a> ArchMetadata<'a> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `{arch}.{suffix}` read by `get`, `None` when the key is missing.
    fn optional<T>(
        &self,
        suffix: &str,
        get: fn(&'a GgufFile, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, TransformerError> {
        match get(self.file, &self.key(suffix)) {
            Ok(value) => Ok(Some(value)),
            Err(GgufError::MissingKey { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `{arch}.{suffix}` read by `get`; a missing key is collected and read
    /// as the default (zero), which no caller uses once one is missing.
    fn required<T: Default>(
        &mut self,
        suffix: &str,
        get: fn(&'a GgufFile, &str) -> Result<T, GgufError>,
    ) -> Result<T, TransformerError> {
        let value = self.optional(suffix, get)?;
        if value.is_none() {
            self.missing.push(self.key(suffix));
        }
        Ok(value.unwrap_or_default())
    }

    fn optional_usize(&self, suffix: &str) -> Result<Option<usize>, TransformerError> {
        Ok(self
            .optional(suffix, GgufFile::get_u32)?
            .map(|v| v as usize))
    }

    fn required_usize(&mut self, suffix: &str) -> Result<usize, TransformerError> {
        Ok(self.required(suffix, GgufFile::get_u32)? as usize)
    }

    /// The mixture of experts `moe` asks for, read from `expert_count`,
    /// `expert_used_count`, the width keys and the row's other keys, and
    /// checked naming the key at fault; `None` for a dense block (a missing
    /// required key is collected).
    fn moe(
        &mut self,
        moe: MoeArch,
        ffn_dim: usize,
    ) -> Result<Option<MoeOptions>, TransformerError> {
        let (row, n_expert, n_expert_used) = match moe {
            MoeArch::Dense => return Ok(None),
            MoeArch::WhenExpertCount => match self.optional_usize("expert_count")? {
                None | Some(0) => return Ok(None),
                Some(n_expert) => {
                    let row = MoeRow {
                        width: ExpertWidth::FeedForward,
                        ..SOFTMAX_MOE
                    };
                    (row, n_expert, self.required_usize("expert_used_count")?)
                }
            },
            MoeArch::Always(row) => (
                row,
                self.required_usize("expert_count")?,
                self.required_usize("expert_used_count")?,
            ),
        };
        let (width_key, expert_ffn_dim) = match row.width {
            ExpertWidth::FeedForward => ("feed_forward_length", ffn_dim),
            ExpertWidth::OwnOrShare => (
                "expert_feed_forward_length",
                self.optional_usize("expert_feed_forward_length")?
                    .unwrap_or(ffn_dim / n_expert_used.max(1)),
            ),
            ExpertWidth::Own => (
                "expert_feed_forward_length",
                self.required_usize("expert_feed_forward_length")?,
            ),
        };
        let gating = match row.gating_key {
            true => match self.required_usize("expert_gating_func")? {
                1 => Gating::Softmax,
                2 => Gating::Sigmoid,
                // Missing: collected above.
                _ if !self.missing.is_empty() => Gating::Softmax,
                other => {
                    return Err(TransformerError::InvalidExperts {
                        key: self.key("expert_gating_func"),
                        value: other,
                        reason: "the gating function is 1 (softmax) or 2 (sigmoid)".into(),
                    });
                }
            },
            false => row.gating,
        };
        let (shared_key, shared) = match row.shared {
            SharedArch::None => ("expert_shared_feed_forward_length", None),
            SharedArch::Gated => (
                "expert_shared_feed_forward_length",
                Some(SharedExpertOptions {
                    width: self
                        .optional_usize("expert_shared_feed_forward_length")?
                        .unwrap_or(ffn_dim),
                    gated: true,
                }),
            ),
            SharedArch::Counted => (
                "expert_shared_count",
                Some(SharedExpertOptions {
                    width: self.required_usize("expert_shared_count")? * expert_ffn_dim,
                    gated: false,
                }),
            ),
        };
        let norm_weights = match row.norm_weights {
            Some(norm) => norm,
            None => self
                .optional("expert_weights_norm", GgufFile::get_bool)?
                .unwrap_or(false),
        };
        let (weights_scale, n_dense_lead) = match row.deepseek_keys {
            true => (
                self.optional("expert_weights_scale", GgufFile::get_f32)?,
                self.optional_usize("leading_dense_block_count")?,
            ),
            false => (None, None),
        };
        if !self.missing.is_empty() {
            return Ok(None);
        }
        let options = MoeOptions {
            n_expert,
            n_expert_used,
            expert_ffn_dim,
            norm_weights,
            gating,
            // llama.cpp scales by neither 0 nor 1.
            weights_scale: weights_scale.filter(|&scale| scale != 0.0).unwrap_or(1.0),
            n_dense_lead: n_dense_lead.unwrap_or(0),
            shared,
            biased: row.biased,
        };
        options.validate(
            ["expert_count", "expert_used_count", width_key, shared_key]
                .map(|key| self.key(key))
                .each_ref()
                .map(String::as_str),
        )?;
        Ok(Some(options))
    }

    /// The per-pair frequency divisors: Llama 3's `rope_freqs.weight`, or
    /// phi3's LongRoPE factors, long when `context_length` exceeds
    /// `rope.scaling.original_context_length` (default `context_length`),
    /// else short (llama.cpp's `get_rope_factors`).
    fn freq_factors(
        &self,
        arch: Architecture,
        context_length: usize,
    ) -> Result<Option<Vec<f32>>, TransformerError> {
        let name = if arch.rope_freqs {
            "rope_freqs.weight"
        } else if arch.long_rope {
            let original = self
                .optional_usize("rope.scaling.original_context_length")?
                .unwrap_or(context_length);
            match context_length > original {
                true => "rope_factors_long.weight",
                false => "rope_factors_short.weight",
            }
        } else {
            return Ok(None);
        };
        match self.file.tensor(name) {
            Ok(tensor) => Ok(Some(tensor.to_f32_vec()?)),
            Err(_) => Ok(None),
        }
    }

    /// The soft-cap `cap` asks for, read from `{arch}.{suffix}`.
    fn softcap(&self, suffix: &str, cap: SoftCap) -> Result<Option<f32>, TransformerError> {
        Ok(match cap {
            SoftCap::Unread => None,
            SoftCap::Default(default) => {
                Some(self.optional(suffix, GgufFile::get_f32)?.unwrap_or(default))
            }
            SoftCap::WhenPositive => self
                .optional(suffix, GgufFile::get_f32)?
                .filter(|&cap| cap > 0.0),
        })
    }

    /// The sliding window's layer period: `attention.sliding_window_pattern`
    /// (llama.cpp's `load_swa_pattern`: a period, 0 for every layer, or one
    /// flag per layer, as OLMo 3's converter writes, which must then repeat
    /// with some period), else `default`.
    fn swa_period(&self, default: usize, n_layer: usize) -> Result<usize, TransformerError> {
        let key = self.key("attention.sliding_window_pattern");
        let Some(value) = self.file.get(&key) else {
            return Ok(default);
        };
        let Some(items) = value.as_array() else {
            return Ok(match self.file.get_u32(&key)? {
                0 => n_layer + 1,
                period => period as usize,
            });
        };
        let flags: Option<Vec<bool>> = items
            .iter()
            .map(|item| match item {
                MetadataValue::Bool(flag) => Some(*flag),
                _ => None,
            })
            .collect();
        // Layer p - 1 is the first global one of period p.
        let period = flags.as_ref().map(|flags| {
            flags
                .iter()
                .position(|&sliding| !sliding)
                .map_or(n_layer + 1, |first_global| first_global + 1)
        });
        match (flags, period) {
            (Some(flags), Some(p))
                if flags.len() == n_layer
                    && flags.iter().enumerate().all(|(i, &f)| f == (i % p < p - 1)) =>
            {
                Ok(p)
            }
            _ => Err(TransformerError::UnsupportedSlidingWindowPattern { key }),
        }
    }

    /// The RoPE scale `1 / rope.scaling.factor` (1 without scaling), and
    /// whether it is YaRN's (`rope.scaling.type = yarn`) rather than linear;
    /// other scaling kinds (LongRoPE's `longrope`, ...) are refused by name.
    fn rope_freq_scale(&self) -> Result<(f32, bool), TransformerError> {
        let yarn = match self.optional("rope.scaling.type", GgufFile::get_str)? {
            Some("none") => return Ok((1.0, false)),
            Some("linear") | None => false,
            Some("yarn") => true,
            Some(other) => {
                return Err(TransformerError::UnsupportedRopeScaling {
                    found: other.to_owned(),
                });
            }
        };
        let factor = self.optional("rope.scaling.factor", GgufFile::get_f32)?;
        let scale = match factor {
            // llama.cpp reads a factor of 0 as no scaling.
            Some(0.0) | None => 1.0,
            Some(factor) => 1.0 / factor,
        };
        Ok((scale, yarn))
    }
}

/// A missing `key` as `MissingMetadata`, any other lookup error as itself.
fn missing_or(error: GgufError, key: &str) -> TransformerError {
    match error {
        GgufError::MissingKey { .. } => TransformerError::MissingMetadata {
            keys: vec![key.to_owned()],
        },
        other => other.into(),
    }
}
