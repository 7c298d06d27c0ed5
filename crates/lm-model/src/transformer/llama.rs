//! The decoder of a GGUF file: llama (and Mixtral), qwen2, qwen3, gemma3,
//! qwen3moe, olmoe, gemma2, olmo2, phi3, qwen2moe, dots1 or gpt-oss (the table and
//! the metadata read are in `arch`). RMSNorm, rotary positions,
//! grouped-query attention, a gated feed-forward block (dense or a mixture
//! of experts), and the output projection tied to the token embedding when
//! `output.weight` is absent (SmolLM2, gemma3); each architecture's
//! additions are options of the one configuration.
//!
//! Weights stay in the `GgufFile`'s bytes (read into huge pages, or mapped)
//! in their GGML types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
//! IQ4_NL, the K-quants, IQ4_XS, MXFP4), checked for NaN and infinite scales when
//! the model is built; products run on the blocks and no dequantised copy
//! of the model is kept. Only the norm gains, biases and RoPE frequency
//! factors (a few KB) are read into f32 vectors.
//!
//! Tensors (ggml dims are `[row length, rows]`; `q_dim = n_head * head_dim`,
//! `kv_dim = n_kv_head * head_dim`):
//!
//! ```text
//! token_embd.weight [n_embd, vocab]     output_norm.weight [n_embd]
//! output.weight [n_embd, vocab] (optional: tied to token_embd when absent)
//! rope_freqs.weight [rope_dim / 2] (llama, optional: Llama 3 frequency factors)
//! blk.{i}.attn_norm.weight [n_embd]     blk.{i}.ffn_norm.weight [n_embd]
//! blk.{i}.attn_q.weight [n_embd, q_dim]
//! blk.{i}.attn_k.weight / attn_v.weight [n_embd, kv_dim]
//!   (or fused: blk.{i}.attn_qkv.weight [n_embd, q_dim + 2 kv_dim], phi3)
//! blk.{i}.attn_output.weight [q_dim, n_embd]
//! blk.{i}.ffn_gate.weight / ffn_up.weight [n_embd, ffn_dim]
//! blk.{i}.ffn_down.weight [ffn_dim, n_embd]
//! phi3: blk.{i}.ffn_up.weight [n_embd, 2 ffn_dim] (gate rows, then up), no ffn_gate;
//!   rope_factors_long.weight / rope_factors_short.weight [rope_dim / 2] (optional)
//! olmo2: no attn_norm / ffn_norm
//! qwen2:  blk.{i}.attn_q.bias [q_dim], attn_k.bias / attn_v.bias [kv_dim]
//! qwen3, gemma3, qwen3moe: blk.{i}.attn_q_norm.weight / attn_k_norm.weight [head_dim]
//! olmoe: blk.{i}.attn_q_norm.weight [q_dim], attn_k_norm.weight [kv_dim]
//! gemma2, gemma3, olmo2: blk.{i}.post_attention_norm.weight / post_ffw_norm.weight [n_embd]
//! a mixture of experts (qwen3moe, olmoe, qwen2moe, dots1; llama with
//! experts, Mixtral), in place of ffn_gate / ffn_up / ffn_down (f = the
//! expert width, e = expert_count, s = the shared expert's width; dots1's
//! first leading_dense_block_count layers are dense):
//!   blk.{i}.ffn_gate_inp.weight [n_embd, e]   (the router)
//!   blk.{i}.ffn_gate_exps.weight / ffn_up_exps.weight [n_embd, f, e]
//!   blk.{i}.ffn_down_exps.weight [f, n_embd, e]
//!   blk.{i}.exp_probs_b.bias [e]   (dots1, optional: the selection bias)
//!   blk.{i}.ffn_gate_shexp.weight / ffn_up_shexp.weight [n_embd, s]  (qwen2moe, dots1)
//!   blk.{i}.ffn_down_shexp.weight [s, n_embd]
//!   blk.{i}.ffn_gate_inp_shexp.weight [n_embd]   (qwen2moe: the shared expert's gate)
//! gpt-oss: blk.{i}.attn_sinks.weight [n_head], attn_output.bias [n_embd],
//!   attn_{q,k,v}.bias when blk.0.attn_q.bias is present, the norm before the
//!   experts as post_attention_norm.weight (no ffn_norm), and the biases
//!   ffn_gate_inp.bias [e], ffn_gate_exps.bias / ffn_up_exps.bias [f, e],
//!   ffn_down_exps.bias [n_embd, e]; experts usually MXFP4
//! ```

use std::path::Path;
use std::sync::Arc;

use ndarray::{Array1, Axis};

use super::TransformerError;
use super::arch::{Architecture, config_from_metadata};
use super::config::{FfnKind, TransformerConfig};
use super::ffn::FeedForward;
use super::linear::Linear;
use super::model::{Decoder, DecoderWeights, LayerWeights, QkvBias};
use super::moe::{ExpertBiases, MixtureOfExperts, Routing, SharedExpert};
use super::norm::Norm;
use crate::gguf::GgufFile;
use crate::kernels::dispatch::Dispatch;

/// Constructors of a [`Decoder`] from a GGUF file of any supported
/// architecture (llama, qwen2, qwen3, gemma3; the name is historical).
/// The decoder holds the file (its weights stay in the map); a caller that
/// also needs the metadata (the tokenizer) opens the file once and passes
/// an `Arc` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Llama;

impl Llama {
    /// Reads the GGUF file at `path` ([`GgufFile::open`]: into huge pages)
    /// and builds its decoder (see the module docs for what is read).
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

    /// The configuration `file`'s metadata describes, checked, without
    /// reading any weight: its architecture's options included.
    pub fn config(file: &GgufFile) -> Result<TransformerConfig, TransformerError> {
        config_from_metadata(file)
    }

    /// Builds the decoder from an opened GGUF file (a map or an in-memory
    /// buffer, owned or shared): the configuration from the metadata, then
    /// every required tensor, checked against it, and every block's scales
    /// checked to be finite ([`GgufFile::validate_tensor_data`]; on a mapped
    /// file all but the experts', which are read only when chosen).
    ///
    /// Where the kernel has panel products (AVX2, AVX-VNNI, AVX-512) and the
    /// file's bytes are this decoder's alone (an owned `GgufFile`, read by
    /// [`GgufFile::open`]; of a mixture of experts, every tensor but the
    /// mapped experts), the weight matrices the process's
    /// [`Packing`](crate::Packing) includes (Q4_0, Q4_1 and Q8_0, and Q5_0,
    /// Q4_K and Q6_K on AVX-512, unless `LM_PACK` says otherwise:
    /// [`Kernel::packs`](crate::Kernel::packs)) are packed in place
    /// first ([`GgufFile::pack_tensors`]): prefill runs 2-3x faster on them
    /// and no memory is added.
    pub fn from_file(file: impl Into<Arc<GgufFile>>) -> Result<Decoder, TransformerError> {
        let mut file: Arc<GgufFile> = file.into();
        let config = config_from_metadata(&file)?;
        let arch = Architecture::of_file(&file)?;
        check_tensors_present(&file, &config, arch)?;
        file.validate_tensor_data()?;
        if Dispatch::detect().packs_at_load()
            && let Some(file) = Arc::get_mut(&mut file)
        {
            // The token embedding is read by rows unless it is also the
            // output matrix; a fused tensor is read as views of its rows.
            let tied = config.tied_output;
            file.pack_tensors(|info| {
                let fused = info.name.ends_with(".attn_qkv.weight")
                    || (arch.fused_gate_up && info.name.ends_with(".ffn_up.weight"));
                !fused && (tied || info.name != "token_embd.weight")
            });
        }
        let c = &config;
        // A vector tensor of `len` f32 values (a gain or a bias).
        let vector = |name: &str, len: usize| -> Result<Vec<f32>, TransformerError> {
            let tensor = file.tensor(name)?;
            if tensor.info.n_elements() != len {
                return Err(TransformerError::TensorShape {
                    name: name.to_owned(),
                    expected: vec![len],
                    found: tensor.info.dims.clone(),
                });
            }
            Ok(tensor.to_f32_vec()?)
        };
        let norm_of = |name: &str, width: usize| -> Result<Norm, TransformerError> {
            Ok(Norm::rms_norm(vector(name, width)?, c.norm_eps))
        };
        let norm = |name: &str| norm_of(name, c.n_embd);
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
        // Rows `rows` of the matrix `name` of `n_rows` rows of `c.n_embd`.
        let rows_of = |name: &str, n_rows: usize, rows: std::ops::Range<usize>| {
            linear(name, n_rows, c.n_embd)?;
            Linear::rows_from_gguf(&file, name, rows)
        };
        // qwen2moe's shared-expert gate: a vector `[n_embd]`, as a matrix
        // of one row.
        let shared_gate = |name: &str| -> Result<Linear, TransformerError> {
            let dims = &file.tensor(name)?.info.dims;
            if dims[..] != [c.n_embd] {
                return Err(TransformerError::TensorShape {
                    name: name.to_owned(),
                    expected: vec![c.n_embd],
                    found: dims.clone(),
                });
            }
            let gate = Array1::from(vector(name, c.n_embd)?);
            Ok(Linear::dense(gate.insert_axis(Axis(0))))
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        let o = &c.options;
        for i in 0..c.n_layer {
            let name = |part: &str| format!("blk.{i}.{part}.weight");
            let bias = |part: &str| format!("blk.{i}.{part}.bias");
            let ffn = match o.moe {
                Some(moe) if c.is_moe_layer(i) => {
                    let router = linear(&name("ffn_gate_inp"), moe.n_expert, c.n_embd)?;
                    let experts = |part: &str, n_rows: usize, n_cols: usize| {
                        experts(&file, &name(part), [n_cols, n_rows, moe.n_expert])
                    };
                    let f = moe.expert_ffn_dim;
                    let weights = [
                        experts("ffn_gate_exps", f, c.n_embd)?,
                        experts("ffn_up_exps", f, c.n_embd)?,
                        experts("ffn_down_exps", c.n_embd, f)?,
                    ];
                    let bias_name = bias("exp_probs_b");
                    let selection_bias = match file.tensor(&bias_name) {
                        Ok(_) if arch.reads_selection_bias() => {
                            Some(vector(&bias_name, moe.n_expert)?)
                        }
                        _ => None,
                    };
                    let routing = Routing {
                        n_used: moe.n_expert_used,
                        gating: moe.gating,
                        selection_bias,
                        norm_weights: moe.norm_weights,
                        weights_scale: moe.weights_scale,
                        logit_bias: moe
                            .biased
                            .then(|| vector(&bias("ffn_gate_inp"), moe.n_expert))
                            .transpose()?,
                    };
                    // gpt-oss: `[width, n_expert]` per projection, one
                    // vector per expert.
                    let per_expert = |part: &str, width: usize| {
                        let name = bias(part);
                        let dims = &file.tensor(&name)?.info.dims;
                        if dims[..] != [width, moe.n_expert] {
                            return Err(TransformerError::TensorShape {
                                name,
                                expected: vec![width, moe.n_expert],
                                found: dims.clone(),
                            });
                        }
                        let values = vector(&name, width * moe.n_expert)?;
                        Ok(values.chunks_exact(width).map(<[f32]>::to_vec).collect())
                    };
                    let biases = match moe.biased {
                        true => Some(ExpertBiases {
                            gate: per_expert("ffn_gate_exps", f)?,
                            up: per_expert("ffn_up_exps", f)?,
                            down: per_expert("ffn_down_exps", c.n_embd)?,
                        }),
                        false => None,
                    };
                    let shared = match moe.shared {
                        Some(shared) => {
                            let w = shared.width;
                            Some(SharedExpert {
                                ffn: FeedForward::SwiGlu {
                                    gate: linear(&name("ffn_gate_shexp"), w, c.n_embd)?,
                                    up: linear(&name("ffn_up_shexp"), w, c.n_embd)?,
                                    down: linear(&name("ffn_down_shexp"), c.n_embd, w)?,
                                },
                                gate_inp: shared
                                    .gated
                                    .then(|| shared_gate(&name("ffn_gate_inp_shexp")))
                                    .transpose()?,
                            })
                        }
                        None => None,
                    };
                    let moe = MixtureOfExperts::new(router, weights, routing, c.ffn, shared);
                    FeedForward::Moe(Box::new(match biases {
                        Some(biases) => moe.with_biases(biases),
                        None => moe,
                    }))
                }
                // Dense: a dense architecture's, or a mixture's leading layers.
                _ => {
                    let f = c.ffn_dim;
                    let (gate, up) = match arch.fused_gate_up {
                        true => (
                            rows_of(&name("ffn_up"), 2 * f, 0..f)?,
                            rows_of(&name("ffn_up"), 2 * f, f..2 * f)?,
                        ),
                        false => (
                            linear(&name("ffn_gate"), f, c.n_embd)?,
                            linear(&name("ffn_up"), f, c.n_embd)?,
                        ),
                    };
                    let down = linear(&name("ffn_down"), c.n_embd, f)?;
                    match c.ffn {
                        FfnKind::GeGlu => FeedForward::GeGlu { gate, up, down },
                        _ => FeedForward::SwiGlu { gate, up, down },
                    }
                }
            };
            let optional_norm = |on: bool, part: &str, width: usize| {
                on.then(|| norm_of(&name(part), width)).transpose()
            };
            let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
            let [wq, wk, wv] = match file.tensor(&name("attn_qkv")) {
                Ok(_) => {
                    let (fused, n_rows) = (name("attn_qkv"), q_dim + 2 * kv_dim);
                    [0..q_dim, q_dim..q_dim + kv_dim, q_dim + kv_dim..n_rows]
                        .map(|rows| rows_of(&fused, n_rows, rows))
                }
                Err(_) => [("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)]
                    .map(|(part, n_rows)| linear(&name(part), n_rows, c.n_embd)),
            };
            layers.push(LayerWeights {
                attn_norm: optional_norm(arch.pre_norms, "attn_norm", c.n_embd)?,
                wq: wq?,
                wk: wk?,
                wv: wv?,
                wo: linear(&name("attn_output"), c.n_embd, c.q_dim())?,
                ffn_norm: optional_norm(arch.pre_norms, arch.ffn_norm, c.n_embd)?,
                ffn,
                qkv_bias: o
                    .qkv_bias
                    .then(|| -> Result<QkvBias, TransformerError> {
                        Ok(QkvBias {
                            q: vector(&bias("attn_q"), c.q_dim())?,
                            k: vector(&bias("attn_k"), c.kv_dim())?,
                            v: vector(&bias("attn_v"), c.kv_dim())?,
                        })
                    })
                    .transpose()?,
                q_norm: optional_norm(o.qk_norm, "attn_q_norm", c.qk_norm_widths().0)?,
                k_norm: optional_norm(o.qk_norm, "attn_k_norm", c.qk_norm_widths().1)?,
                post_attn_norm: optional_norm(o.post_norms, "post_attention_norm", c.n_embd)?,
                post_ffn_norm: optional_norm(o.post_norms, "post_ffw_norm", c.n_embd)?,
                attn_sinks: o
                    .attn_sinks
                    .then(|| vector(&name("attn_sinks"), c.n_head))
                    .transpose()?,
                wo_bias: o
                    .attn_output_bias
                    .then(|| vector(&bias("attn_output"), c.n_embd))
                    .transpose()?,
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

/// The 3-d tensor `name` of `file` as one matrix per expert, its ggml dims
/// checked to be `dims` (`[n_cols, n_rows, n_expert]`).
fn experts(
    file: &Arc<GgufFile>,
    name: &str,
    dims: [usize; 3],
) -> Result<Vec<Linear>, TransformerError> {
    let found = &file.tensor(name)?.info.dims;
    if found[..] != dims {
        return Err(TransformerError::TensorShape {
            name: name.to_owned(),
            expected: dims.to_vec(),
            found: found.clone(),
        });
    }
    Linear::experts_from_gguf(file, name)
}

/// The attention tensors of every layer, `blk.{i}.{part}.weight` (the
/// query, key and value ones unless fused as `attn_qkv`).
const ATTENTION_TENSORS: [&str; 4] = ["attn_q", "attn_k", "attn_v", "attn_output"];

/// The feed-forward tensors of a dense layer, `blk.{i}.{part}.weight`.
const DENSE_FFN_TENSORS: [&str; 3] = ["ffn_gate", "ffn_up", "ffn_down"];

/// phi3's feed-forward tensors: the gate fused into `ffn_up`.
const FUSED_FFN_TENSORS: [&str; 2] = ["ffn_up", "ffn_down"];

/// The feed-forward tensors of a mixture of experts: the router and the
/// experts' 3-d tensors.
const MOE_TENSORS: [&str; 4] = [
    "ffn_gate_inp",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
];

/// A mixture's shared expert: its gate (qwen2moe only), then its SwiGLU.
const SHARED_EXPERT_TENSORS: [&str; 4] = [
    "ffn_gate_inp_shexp",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
];

/// The optional tensors of layer `i`, `blk.{i}.{part}`, with the option
/// that asks for each.
fn optional_layer_tensors(c: &TransformerConfig, i: usize) -> Vec<&'static str> {
    let o = &c.options;
    let mut parts = Vec::new();
    if o.attn_sinks {
        parts.push("attn_sinks.weight");
    }
    if o.attn_output_bias {
        parts.push("attn_output.bias");
    }
    if c.is_moe_layer(i) && o.moe.is_some_and(|moe| moe.biased) {
        parts.extend([
            "ffn_gate_inp.bias",
            "ffn_gate_exps.bias",
            "ffn_up_exps.bias",
            "ffn_down_exps.bias",
        ]);
    }
    if o.qkv_bias {
        parts.extend(["attn_q.bias", "attn_k.bias", "attn_v.bias"]);
    }
    if o.qk_norm {
        parts.extend(["attn_q_norm.weight", "attn_k_norm.weight"]);
    }
    if o.post_norms {
        parts.extend(["post_attention_norm.weight", "post_ffw_norm.weight"]);
    }
    parts
}

/// Errors unless every tensor the architecture needs is in the file,
/// listing all the missing ones.
fn check_tensors_present(
    file: &GgufFile,
    c: &TransformerConfig,
    arch: Architecture,
) -> Result<(), TransformerError> {
    let n_layer = c.n_layer;
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
        let ffn_tensors = match (c.is_moe_layer(i), arch.fused_gate_up) {
            (true, _) => &MOE_TENSORS[..],
            (false, true) => &FUSED_FFN_TENSORS[..],
            (false, false) => &DENSE_FFN_TENSORS[..],
        };
        let shared_tensors = match c.options.moe.and_then(|moe| moe.shared) {
            Some(shared) if c.is_moe_layer(i) => match shared.gated {
                true => &SHARED_EXPERT_TENSORS[..],
                false => &SHARED_EXPERT_TENSORS[1..],
            },
            _ => &[],
        };
        let fused_qkv = file.tensor(&format!("blk.{i}.attn_qkv.weight")).is_ok();
        let attention = match fused_qkv {
            true => &ATTENTION_TENSORS[3..],
            false => &ATTENTION_TENSORS[..],
        };
        // The norms before attention and the feed-forward block (not olmo2's).
        let pre_norm_tensors = ["attn_norm", arch.ffn_norm];
        let pre_norms = match arch.pre_norms {
            true => &pre_norm_tensors[..],
            false => &[],
        };
        for part in attention
            .iter()
            .chain(pre_norms)
            .chain(ffn_tensors)
            .chain(shared_tensors)
        {
            names.push(format!("blk.{i}.{part}.weight"));
        }
        for part in optional_layer_tensors(c, i) {
            names.push(format!("blk.{i}.{part}"));
        }
    }
    names.retain(|name| file.tensor(name).is_err());
    if names.is_empty() {
        Ok(())
    } else {
        Err(TransformerError::MissingTensors { names })
    }
}
