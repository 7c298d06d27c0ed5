//! The llama architecture read from a GGUF file: RMSNorm, rotary positions
//! (base and dimension from the metadata, adjacent-pair rotation), grouped-
//! query attention, SwiGLU, and the output projection tied to the token
//! embedding when `output.weight` is absent (SmolLM2).
//!
//! Weights stay in the file's memory map in their GGML types (F32, F16,
//! BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), checked for NaN and
//! infinite scales when the model is built; products run on the blocks and
//! no dequantised copy of the model is kept. Only the norm gains (a few KB)
//! are read into f32 vectors.
//!
//! Metadata read (`{arch}` is `general.architecture`, which must be `llama`):
//!
//! ```text
//! required  {arch}.block_count  .context_length  .embedding_length
//!           .feed_forward_length  .attention.head_count
//!           .attention.layer_norm_rms_epsilon
//! optional  .attention.head_count_kv (default head_count)
//!           .rope.freq_base (default 10000)
//!           .rope.dimension_count (default the head width)
//!           .vocab_size (default the rows of token_embd.weight)
//! ```
//!
//! Tensors (ggml dims are `[row length, rows]`):
//!
//! ```text
//! token_embd.weight [n_embd, vocab]     output_norm.weight [n_embd]
//! output.weight [n_embd, vocab] (optional: tied to token_embd when absent)
//! blk.{i}.attn_norm.weight [n_embd]     blk.{i}.ffn_norm.weight [n_embd]
//! blk.{i}.attn_q.weight [n_embd, n_head*head_dim]
//! blk.{i}.attn_k.weight / attn_v.weight [n_embd, n_kv_head*head_dim]
//! blk.{i}.attn_output.weight [n_head*head_dim, n_embd]
//! blk.{i}.ffn_gate.weight / ffn_up.weight [n_embd, ffn_dim]
//! blk.{i}.ffn_down.weight [ffn_dim, n_embd]
//! ```

use std::path::Path;
use std::sync::Arc;

use super::TransformerError;
use super::config::{FfnKind, KvPrecision, NormKind, PositionKind, TransformerConfig};
use super::ffn::FeedForward;
use super::linear::Linear;
use super::model::{Decoder, DecoderWeights, LayerWeights};
use super::norm::Norm;
use crate::gguf::{GgufError, GgufFile};

/// The architecture name this module reads.
pub const LLAMA_ARCHITECTURE: &str = "llama";

/// The llama architecture: constructors of a [`Decoder`] from a GGUF file.
/// The decoder holds the file (its weights stay in the map); a caller that
/// also needs the metadata (the tokenizer) opens the file once and passes
/// an `Arc` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Llama;

impl Llama {
    /// Opens and maps the GGUF file at `path` and builds its decoder (see
    /// the module docs for what is read).
    ///
    /// ```no_run
    /// use lm_core::{LanguageModel, Rows, argmax};
    /// use lm_model::Llama;
    ///
    /// let model = Llama::from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let mut state = model.new_state();
    /// let mut logits = Vec::new();
    /// // "The capital of France is"
    /// model.forward(&mut state, &[504, 3575, 282, 4649, 314], Rows::Last, &mut logits)?;
    /// assert_eq!(argmax(&logits)?, 7042); // " Paris"
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_gguf(path: impl AsRef<Path>) -> crate::Result<Decoder> {
        Ok(Self::from_file(GgufFile::open(path)?)?)
    }

    /// Builds the decoder from an opened GGUF file (a map or an in-memory
    /// buffer, owned or shared): the configuration from the metadata, then
    /// every required tensor, checked against it, and every block's scales
    /// checked to be finite ([`GgufFile::validate_tensor_data`]).
    pub fn from_file(file: impl Into<Arc<GgufFile>>) -> Result<Decoder, TransformerError> {
        let file: Arc<GgufFile> = file.into();
        let config = config_from_metadata(&file)?;
        check_tensors_present(&file, config.n_layer)?;
        file.validate_tensor_data()?;
        let c = &config;
        let norm = |name: &str| -> Result<Norm, TransformerError> {
            let weight = file.tensor(name)?.to_f32_vec()?;
            if weight.len() != c.n_embd {
                return Err(TransformerError::TensorShape {
                    name: name.to_owned(),
                    expected: vec![c.n_embd],
                    found: vec![weight.len()],
                });
            }
            Ok(Norm::rms_norm(weight, c.norm_eps))
        };
        let linear =
            |name: &str, n_rows: usize, n_cols: usize| -> Result<Linear, TransformerError> {
                let w = Linear::from_gguf(&file, name)?;
                if (w.n_rows(), w.n_cols()) != (n_rows, n_cols) {
                    return Err(TransformerError::TensorShape {
                        name: name.to_owned(),
                        // Reported in ggml order, as the file and llama.cpp list them.
                        expected: vec![n_cols, n_rows],
                        found: vec![w.n_cols(), w.n_rows()],
                    });
                }
                Ok(w)
            };
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let name = |part: &str| format!("blk.{i}.{part}.weight");
            layers.push(LayerWeights {
                attn_norm: norm(&name("attn_norm"))?,
                wq: linear(&name("attn_q"), c.q_dim(), c.n_embd)?,
                wk: linear(&name("attn_k"), c.kv_dim(), c.n_embd)?,
                wv: linear(&name("attn_v"), c.kv_dim(), c.n_embd)?,
                wo: linear(&name("attn_output"), c.n_embd, c.q_dim())?,
                ffn_norm: norm(&name("ffn_norm"))?,
                ffn: FeedForward::SwiGlu {
                    gate: linear(&name("ffn_gate"), c.ffn_dim, c.n_embd)?,
                    up: linear(&name("ffn_up"), c.ffn_dim, c.n_embd)?,
                    down: linear(&name("ffn_down"), c.n_embd, c.ffn_dim)?,
                },
            });
        }
        let output = if c.tied_output {
            None
        } else {
            Some(linear("output.weight", c.vocab_size, c.n_embd)?)
        };
        let weights = DecoderWeights {
            token_embedding: linear("token_embd.weight", c.vocab_size, c.n_embd)?,
            position_embedding: None,
            layers,
            final_norm: norm("output_norm.weight")?,
            output,
        };
        Decoder::new(config, weights)
    }
}

/// Reads the configuration, listing every missing required key at once.
pub fn config_from_metadata(file: &GgufFile) -> Result<TransformerConfig, TransformerError> {
    let arch = file
        .get_str("general.architecture")
        .map_err(|e| missing_or(e, "general.architecture"))?;
    if arch != LLAMA_ARCHITECTURE {
        return Err(TransformerError::UnsupportedArchitecture {
            found: arch.to_owned(),
        });
    }
    let key = |suffix: &str| format!("{arch}.{suffix}");
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
    if n_head == 0 || !n_embd.is_multiple_of(n_head) {
        return Err(TransformerError::HeadCountDoesNotDivide { n_embd, n_head });
    }
    let head_dim = n_embd / n_head;
    let optional_u32 = |suffix: &str, default: usize| -> Result<usize, TransformerError> {
        match file.get_u32(&key(suffix)) {
            Ok(v) => Ok(v as usize),
            Err(GgufError::MissingKey { .. }) => Ok(default),
            Err(e) => Err(e.into()),
        }
    };
    let n_kv_head = optional_u32("attention.head_count_kv", n_head)?;
    let rope_dim = optional_u32("rope.dimension_count", head_dim)?;
    let rope_base = match file.get_f32(&key("rope.freq_base")) {
        Ok(v) => v,
        Err(GgufError::MissingKey { .. }) => 10000.0,
        Err(e) => return Err(e.into()),
    };
    let embedding_rows = file
        .tensor("token_embd.weight")
        .ok()
        .map(|t| t.info.n_rows());
    let vocab_size = optional_u32("vocab_size", embedding_rows.unwrap_or(0))?;
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
        ffn: FfnKind::SwiGlu,
        tied_output: file.tensor("output.weight").is_err(),
        kv_precision: KvPrecision::F16,
    };
    config.validate()?;
    Ok(config)
}

/// The tensors of one llama layer, `blk.{i}.{part}.weight`.
const LAYER_TENSORS: [&str; 9] = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// Errors unless every tensor the architecture needs is in the file,
/// listing all the missing ones.
fn check_tensors_present(file: &GgufFile, n_layer: usize) -> Result<(), TransformerError> {
    // Every layer needs tensors of its own, so a block count above the
    // file's tensor count is refused before any per-layer name is built: the
    // list of missing names stays bounded by the file.
    let n_tensors = file.tensors().len();
    if n_layer > n_tensors {
        return Err(TransformerError::TooFewTensorsForLayers { n_layer, n_tensors });
    }
    let mut names = vec![
        "token_embd.weight".to_owned(),
        "output_norm.weight".to_owned(),
    ];
    for i in 0..n_layer {
        for part in LAYER_TENSORS {
            names.push(format!("blk.{i}.{part}.weight"));
        }
    }
    names.retain(|name| file.tensor(name).is_err());
    if names.is_empty() {
        Ok(())
    } else {
        Err(TransformerError::MissingTensors { names })
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
