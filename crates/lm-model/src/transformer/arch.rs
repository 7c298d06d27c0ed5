//! The architectures a GGUF file may name in `general.architecture`, and
//! the one mapping from their metadata to a [`TransformerConfig`]: what
//! each adds to the shared block is a row of [`ARCHITECTURES`], read from
//! llama.cpp (`src/llama-model.cpp`, `src/models/*.cpp`).
//!
//! ```text
//! arch    rope      qkv bias  qk norm  post norms  ffn    embedding  sliding window
//! llama   adjacent  -         -        -           SwiGLU -          -        (+ rope_freqs.weight)
//! qwen2   neox      yes       -        -           SwiGLU -          -
//! qwen3   neox      -         yes      -           SwiGLU -          -
//! gemma3  neox      -         yes      yes         GeGLU  sqrt(n_embd) 5 of 6 layers, base 10000
//! ```
//!
//! Metadata read (`{arch}` is `general.architecture`):
//!
//! ```text
//! required  {arch}.block_count  .context_length  .embedding_length
//!           .feed_forward_length  .attention.head_count
//!           .attention.layer_norm_rms_epsilon
//!           .attention.sliding_window (gemma3)
//! optional  .attention.head_count_kv (default head_count)
//!           .attention.key_length (default embedding_length / head_count,
//!                                  which must then divide)
//!           .rope.freq_base (default 10000)
//!           .rope.dimension_count (default the head width)
//!           .rope.scaling.type (none or linear) and .rope.scaling.factor
//!           .vocab_size (default the rows of token_embd.weight)
//! ```
//!
//! Gemma's norm gains are stored by llama.cpp's converter with its `+ 1`
//! already added, so they are applied as plain RMSNorm gains (once).

use super::TransformerError;
use super::config::{
    ArchOptions, FfnKind, KvPrecision, NormKind, PositionKind, RopeMode, RopeOptions,
    SlidingWindow, TransformerConfig,
};
use crate::gguf::{GgufError, GgufFile};

/// The names of the architectures this backend runs.
pub const SUPPORTED: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];

/// What one architecture adds to the shared block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Architecture {
    /// `general.architecture`.
    pub name: &'static str,
    /// Which components RoPE pairs.
    pub rope_mode: RopeMode,
    /// `blk.{i}.attn_{q,k,v}.bias`.
    pub qkv_bias: bool,
    /// `blk.{i}.attn_{q,k}_norm.weight`, RMSNorm per head.
    pub qk_norm: bool,
    /// `blk.{i}.post_attention_norm.weight`, `blk.{i}.post_ffw_norm.weight`.
    pub post_norms: bool,
    /// The feed-forward block.
    pub ffn: FfnKind,
    /// The token embedding is multiplied by `sqrt(n_embd)`.
    pub scaled_embedding: bool,
    /// Sliding-window attention: the layer period and the sliding layers'
    /// RoPE base (llama.cpp's `set_swa_pattern` and
    /// `rope_freq_base_train_swa`).
    pub sliding_window: Option<(usize, f32)>,
    /// `rope_freqs.weight` (Llama 3's per-pair frequency factors) is read
    /// when present.
    pub rope_freqs: bool,
}

/// The supported architectures, in the order of [`SUPPORTED`].
pub(crate) const ARCHITECTURES: [Architecture; 4] = [
    Architecture {
        name: "llama",
        rope_mode: RopeMode::Adjacent,
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
        ffn: FfnKind::SwiGlu,
        scaled_embedding: false,
        sliding_window: None,
        rope_freqs: true,
    },
    Architecture {
        name: "qwen2",
        rope_mode: RopeMode::Neox,
        qkv_bias: true,
        qk_norm: false,
        post_norms: false,
        ffn: FfnKind::SwiGlu,
        scaled_embedding: false,
        sliding_window: None,
        rope_freqs: false,
    },
    Architecture {
        name: "qwen3",
        rope_mode: RopeMode::Neox,
        qkv_bias: false,
        qk_norm: true,
        post_norms: false,
        ffn: FfnKind::SwiGlu,
        scaled_embedding: false,
        sliding_window: None,
        rope_freqs: false,
    },
    Architecture {
        name: "gemma3",
        rope_mode: RopeMode::Neox,
        qkv_bias: false,
        qk_norm: true,
        post_norms: true,
        ffn: FfnKind::GeGlu,
        scaled_embedding: true,
        sliding_window: Some((6, 10000.0)),
        rope_freqs: false,
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
    let key = |suffix: &str| format!("{}.{suffix}", arch.name);
    let mut missing = Vec::new();
    // A required integer: a missing key is collected, a malformed one is an error.
    let mut required = |suffix: &str| -> Result<usize, TransformerError> {
        let name = key(suffix);
        match file.get_u32(&name) {
            Ok(v) => Ok(v as usize),
            Err(GgufError::MissingKey { .. }) => {
                missing.push(name);
                Ok(0)
            }
            Err(e) => Err(e.into()),
        }
    };
    let n_layer = required("block_count")?;
    let context_length = required("context_length")?;
    let n_embd = required("embedding_length")?;
    let ffn_dim = required("feed_forward_length")?;
    let n_head = required("attention.head_count")?;
    let window = match arch.sliding_window {
        Some(_) => Some(required("attention.sliding_window")?),
        None => None,
    };
    let eps_key = key("attention.layer_norm_rms_epsilon");
    let norm_eps = match file.get_f32(&eps_key) {
        Ok(v) => v,
        Err(GgufError::MissingKey { .. }) => {
            missing.push(eps_key);
            0.0
        }
        Err(e) => return Err(e.into()),
    };
    if !missing.is_empty() {
        return Err(TransformerError::MissingMetadata { keys: missing });
    }
    let optional_u32 = |suffix: &str| -> Result<Option<usize>, TransformerError> {
        match file.get_u32(&key(suffix)) {
            Ok(v) => Ok(Some(v as usize)),
            Err(GgufError::MissingKey { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    let optional_f32 = |suffix: &str| -> Result<Option<f32>, TransformerError> {
        match file.get_f32(&key(suffix)) {
            Ok(v) => Ok(Some(v)),
            Err(GgufError::MissingKey { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    // The head width: given (qwen3, gemma3), or the width over the heads,
    // which must then divide it.
    let head_dim = match optional_u32("attention.key_length")? {
        Some(head_dim) => head_dim,
        None => {
            if n_head == 0 || !n_embd.is_multiple_of(n_head) {
                return Err(TransformerError::HeadCountDoesNotDivide { n_embd, n_head });
            }
            n_embd / n_head
        }
    };
    let n_kv_head = optional_u32("attention.head_count_kv")?.unwrap_or(n_head);
    let rope_dim = optional_u32("rope.dimension_count")?.unwrap_or(head_dim);
    let rope_base = optional_f32("rope.freq_base")?.unwrap_or(10000.0);
    let freq_scale = rope_freq_scale(file, &key)?;
    let freq_factors = match file.tensor("rope_freqs.weight") {
        Ok(tensor) if arch.rope_freqs => Some(tensor.to_f32_vec()?),
        _ => None,
    };
    let embedding_rows = file
        .tensor("token_embd.weight")
        .ok()
        .map(|t| t.info.n_rows());
    let vocab_size = optional_u32("vocab_size")?.unwrap_or(embedding_rows.unwrap_or(0));
    let sliding_window = match (arch.sliding_window, window) {
        (Some((period, rope_base)), Some(window)) => Some(SlidingWindow {
            window,
            period,
            rope_base,
        }),
        _ => None,
    };
    // Gemma 3 27B (62 layers) scales queries by the width per head, the
    // others by the key length (llama.cpp's f_attention_scale).
    let attention_scale = (arch.name == "gemma3" && n_layer == 62 && n_head > 0)
        .then(|| 1.0 / ((n_embd / n_head) as f32).sqrt());
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
        tied_output: file.tensor("output.weight").is_err(),
        kv_precision: KvPrecision::F16,
        options: ArchOptions {
            rope: RopeOptions {
                mode: arch.rope_mode,
                freq_scale,
                freq_factors,
            },
            qkv_bias: arch.qkv_bias,
            qk_norm: arch.qk_norm,
            post_norms: arch.post_norms,
            embedding_scale: arch.scaled_embedding.then(|| (n_embd as f32).sqrt()),
            attention_scale,
            sliding_window,
        },
    };
    config.validate()?;
    Ok(config)
}

/// The linear RoPE scale `1 / rope.scaling.factor` (1 without scaling);
/// other scaling kinds (YaRN, LongRoPE) are refused by name.
fn rope_freq_scale(file: &GgufFile, key: &dyn Fn(&str) -> String) -> Result<f32, TransformerError> {
    match file.get_str(&key("rope.scaling.type")) {
        Ok("none") => return Ok(1.0),
        Ok("linear") | Err(GgufError::MissingKey { .. }) => {}
        Ok(other) => {
            return Err(TransformerError::UnsupportedRopeScaling {
                found: other.to_owned(),
            });
        }
        Err(e) => return Err(e.into()),
    }
    match file.get_f32(&key("rope.scaling.factor")) {
        // llama.cpp reads a factor of 0 as no scaling.
        Ok(0.0) => Ok(1.0),
        Ok(factor) => Ok(1.0 / factor),
        Err(GgufError::MissingKey { .. }) => Ok(1.0),
        Err(e) => Err(e.into()),
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
