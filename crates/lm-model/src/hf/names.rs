//! Hugging Face tensor names and layouts to GGUF's, as
//! `convert_hf_to_gguf.py` maps them (its `TensorNameMap` and each model
//! class's `modify_tensors`):
//!
//! ```text
//! model.embed_tokens.weight                   token_embd.weight
//! model.norm.weight                           output_norm.weight
//! lm_head.weight                              output.weight (dropped when tied)
//! model.layers.{i}.input_layernorm            blk.{i}.attn_norm
//!   self_attn.{q,k,v,o}_proj                  attn_{q,k,v,output}   (q, k permuted: llama)
//!   self_attn.{q,k,v}_proj.bias               attn_{q,k,v}.bias     (qwen2)
//!   self_attn.{q,k}_norm                      attn_{q,k}_norm       (qwen3, gemma3)
//!   post_attention_layernorm                  ffn_norm              (gemma3: post_attention_norm)
//!   pre_feedforward_layernorm                 ffn_norm              (gemma3)
//!   post_feedforward_layernorm                post_ffw_norm         (gemma3)
//!   mlp.{gate,up,down}_proj                   ffn_{gate,up,down}
//!   self_attn.qkv_proj, mlp.gate_up_proj      attn_qkv, ffn_up      (phi3: fused as in GGUF)
//!   self_attn.{q,k}_norm [whole projection]   attn_{q,k}_norm       (olmo2, olmoe)
//!   mlp.gate / block_sparse_moe.gate          ffn_gate_inp          (MoE router)
//!   mlp.experts.{e}.{gate,up,down}_proj       ffn_{gate,up,down}_exps, expert e of the 3-d tensor
//!   block_sparse_moe.experts.{e}.w{1,3,2}     ffn_{gate,up,down}_exps (Mixtral)
//!   mlp.shared_expert.{gate,up,down}_proj     ffn_{gate,up,down}_shexp (qwen2moe)
//!   mlp.shared_expert_gate                    ffn_gate_inp_shexp    (qwen2moe, [1, n_embd])
//! ```
//!
//! Shapes are checked here against config.json (HF's `[out, in]`, GGUF's
//! reverse), so a wrong one is named by its HF name and file.

use super::config::{Dims, HfArchitecture};

/// A dimension of a tensor, from config.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dim {
    /// hidden_size
    Embd,
    /// num_attention_heads * head_dim
    Q,
    /// num_key_value_heads * head_dim
    Kv,
    /// Q + 2 Kv (phi3's fused `qkv_proj`)
    Qkv,
    /// head_dim
    Head,
    /// intermediate_size
    Ffn,
    /// 2 intermediate_size (phi3's fused `gate_up_proj`)
    GateUp,
    /// vocab_size
    Vocab,
    /// The expert count (the router's rows)
    Expert,
    /// One expert's width
    ExpertFfn,
    /// The shared expert's width
    SharedFfn,
    /// 1 (qwen2moe's shared-expert gate)
    One,
}

impl Dim {
    fn of(self, dims: &Dims) -> usize {
        match self {
            Dim::Embd => dims.n_embd,
            Dim::Q => dims.n_head * dims.head_dim,
            Dim::Kv => dims.n_kv_head * dims.head_dim,
            Dim::Qkv => (dims.n_head + 2 * dims.n_kv_head) * dims.head_dim,
            Dim::Head => dims.head_dim,
            Dim::Ffn => dims.ffn,
            Dim::GateUp => 2 * dims.ffn,
            Dim::Vocab => dims.vocab,
            Dim::Expert => dims.n_expert,
            Dim::ExpertFfn => dims.expert_ffn,
            Dim::SharedFfn => dims.shared_ffn,
            Dim::One => 1,
        }
    }
}

/// What is done to a tensor's values on the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transform {
    /// Copied as it is.
    Keep,
    /// Rows reordered within each of `n` heads: HF's two halves of a head
    /// (NeoX pairs `j`, `j + d/2`) to GGUF's adjacent pairs (`2j`, `2j + 1`).
    Permute { n_head: usize },
    /// `1 + w` (Gemma's norm gains).
    PlusOne,
}

/// An HF tensor's GGUF name, expected shape (HF order) and transform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapped {
    pub gguf: String,
    pub shape: Vec<usize>,
    pub transform: Transform,
    /// The expert this is one slice of: HF stores each expert as its own
    /// matrix, GGUF all of a layer's as one 3-d `*_exps` tensor.
    pub expert: Option<usize>,
    /// A `[1, n]` matrix written as the F32 vector `[n]` that GGUF holds
    /// (qwen2moe's `shared_expert_gate`, an `nn.Linear(n, 1)`).
    pub vector: bool,
}

/// Which layers of a model have a name: all, or only those of a dense
/// model or of a mixture of experts (llama and Mixtral share a GGUF
/// architecture).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ffn {
    Any,
    Dense,
    Moe,
}

/// The per-layer names: HF suffix, GGUF suffix, shape (HF order), the GGUF
/// architectures that have it, and in which models.
type LayerName = (
    &'static str,
    &'static str,
    &'static [Dim],
    &'static [&'static str],
    Ffn,
);

/// The GGUF architectures, grouped as the names below need.
const ALL: &[&str] = &[
    "llama", "qwen2", "qwen3", "gemma3", "gemma2", "phi3", "olmo2", "qwen3moe", "olmoe",
    "qwen2moe", "dots1",
];
const PRE_NORM: &[&str] = &[
    "llama", "qwen2", "qwen3", "gemma3", "gemma2", "phi3", "qwen3moe", "olmoe", "qwen2moe", "dots1",
];
const SPLIT_QKV: &[&str] = &[
    "llama", "qwen2", "qwen3", "gemma3", "gemma2", "olmo2", "qwen3moe", "olmoe", "qwen2moe",
    "dots1",
];
const FFN_NORM: &[&str] = &[
    "llama", "qwen2", "qwen3", "phi3", "qwen3moe", "olmoe", "qwen2moe", "dots1",
];
const GEMMA: &[&str] = &["gemma3", "gemma2"];
const POST_NORMS: &[&str] = &["gemma3", "gemma2", "olmo2"];
const QWEN_MOE: &[&str] = &["qwen3moe", "olmoe", "qwen2moe", "dots1"];

#[rustfmt::skip]
const LAYER: [LayerName; 31] = [
    ("input_layernorm.weight", "attn_norm.weight", &[Dim::Embd], PRE_NORM, Ffn::Any),
    ("self_attn.q_proj.weight", "attn_q.weight", &[Dim::Q, Dim::Embd], SPLIT_QKV, Ffn::Any),
    ("self_attn.k_proj.weight", "attn_k.weight", &[Dim::Kv, Dim::Embd], SPLIT_QKV, Ffn::Any),
    ("self_attn.v_proj.weight", "attn_v.weight", &[Dim::Kv, Dim::Embd], SPLIT_QKV, Ffn::Any),
    ("self_attn.qkv_proj.weight", "attn_qkv.weight", &[Dim::Qkv, Dim::Embd], &["phi3"], Ffn::Any),
    ("self_attn.o_proj.weight", "attn_output.weight", &[Dim::Embd, Dim::Q], ALL, Ffn::Any),
    ("self_attn.q_proj.bias", "attn_q.bias", &[Dim::Q], &["qwen2", "qwen2moe"], Ffn::Any),
    ("self_attn.k_proj.bias", "attn_k.bias", &[Dim::Kv], &["qwen2", "qwen2moe"], Ffn::Any),
    ("self_attn.v_proj.bias", "attn_v.bias", &[Dim::Kv], &["qwen2", "qwen2moe"], Ffn::Any),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", &[Dim::Head], &["qwen3", "gemma3", "qwen3moe", "dots1"], Ffn::Any),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", &[Dim::Head], &["qwen3", "gemma3", "qwen3moe", "dots1"], Ffn::Any),
    // OLMo's QK norms are over the whole projection.
    ("self_attn.q_norm.weight", "attn_q_norm.weight", &[Dim::Q], &["olmo2", "olmoe"], Ffn::Any),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", &[Dim::Kv], &["olmo2", "olmoe"], Ffn::Any),
    ("post_attention_layernorm.weight", "ffn_norm.weight", &[Dim::Embd], FFN_NORM, Ffn::Any),
    ("post_attention_layernorm.weight", "post_attention_norm.weight", &[Dim::Embd], POST_NORMS, Ffn::Any),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight", &[Dim::Embd], GEMMA, Ffn::Any),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight", &[Dim::Embd], POST_NORMS, Ffn::Any),
    ("mlp.gate_proj.weight", "ffn_gate.weight", &[Dim::Ffn, Dim::Embd], SPLIT_QKV, Ffn::Dense),
    ("mlp.up_proj.weight", "ffn_up.weight", &[Dim::Ffn, Dim::Embd], SPLIT_QKV, Ffn::Dense),
    ("mlp.gate_up_proj.weight", "ffn_up.weight", &[Dim::GateUp, Dim::Embd], &["phi3"], Ffn::Dense),
    ("mlp.down_proj.weight", "ffn_down.weight", &[Dim::Embd, Dim::Ffn], ALL, Ffn::Dense),
    ("block_sparse_moe.gate.weight", "ffn_gate_inp.weight", &[Dim::Expert, Dim::Embd], &["llama"], Ffn::Moe),
    ("mlp.gate.weight", "ffn_gate_inp.weight", &[Dim::Expert, Dim::Embd], QWEN_MOE, Ffn::Moe),
    ("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", &[Dim::SharedFfn, Dim::Embd], &["qwen2moe"], Ffn::Moe),
    ("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", &[Dim::SharedFfn, Dim::Embd], &["qwen2moe"], Ffn::Moe),
    ("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", &[Dim::Embd, Dim::SharedFfn], &["qwen2moe"], Ffn::Moe),
    ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", &[Dim::One, Dim::Embd], &["qwen2moe"], Ffn::Moe),
    ("mlp.gate.e_score_correction_bias", "exp_probs_b.bias", &[Dim::Expert], &["dots1"], Ffn::Moe),
    ("mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight", &[Dim::SharedFfn, Dim::Embd], &["dots1"], Ffn::Moe),
    ("mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight", &[Dim::SharedFfn, Dim::Embd], &["dots1"], Ffn::Moe),
    ("mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight", &[Dim::Embd, Dim::SharedFfn], &["dots1"], Ffn::Moe),
];

/// One expert's matrices: HF's prefix and names (Mixtral's `w1`, `w3`,
/// `w2`; the others' `gate_proj`, `up_proj`, `down_proj`), the GGUF
/// stacked tensor, one expert's shape (HF order).
type ExpertName = (&'static str, &'static str, &'static str, &'static [Dim]);

#[rustfmt::skip]
const EXPERT: [ExpertName; 6] = [
    ("block_sparse_moe.experts.", "w1.weight", "ffn_gate_exps.weight", &[Dim::ExpertFfn, Dim::Embd]),
    ("block_sparse_moe.experts.", "w3.weight", "ffn_up_exps.weight", &[Dim::ExpertFfn, Dim::Embd]),
    ("block_sparse_moe.experts.", "w2.weight", "ffn_down_exps.weight", &[Dim::Embd, Dim::ExpertFfn]),
    ("mlp.experts.", "gate_proj.weight", "ffn_gate_exps.weight", &[Dim::ExpertFfn, Dim::Embd]),
    ("mlp.experts.", "up_proj.weight", "ffn_up_exps.weight", &[Dim::ExpertFfn, Dim::Embd]),
    ("mlp.experts.", "down_proj.weight", "ffn_down_exps.weight", &[Dim::Embd, Dim::ExpertFfn]),
];

/// Whether layer `layer` of `arch`'s model has a name of architectures
/// `archs` and kind `ffn` (a mixture's leading dense layers are dense).
fn has(arch: &HfArchitecture, dims: &Dims, layer: usize, archs: &[&str], ffn: Ffn) -> bool {
    archs.contains(&arch.gguf)
        && match ffn {
            Ffn::Any => true,
            Ffn::Dense => !is_moe(dims, layer),
            Ffn::Moe => is_moe(dims, layer),
        }
}

/// Whether layer `layer` is a mixture of experts.
fn is_moe(dims: &Dims, layer: usize) -> bool {
    dims.n_expert > 0 && layer >= dims.n_dense_lead
}

/// The expert prefix of `arch`'s checkpoints.
fn expert_prefix(arch: &HfArchitecture) -> &'static str {
    match arch.gguf {
        "llama" => "block_sparse_moe.experts.",
        _ => "mlp.experts.",
    }
}

/// Maps `name`: `Ok(None)` for a tensor the model does not use (RoPE's
/// precomputed `inv_freq`, a tied `lm_head.weight`), an error for a name
/// this architecture does not have.
pub(crate) fn map(
    arch: &HfArchitecture,
    dims: &Dims,
    tied: bool,
    name: &str,
) -> Result<Option<Mapped>, String> {
    if name.ends_with("rotary_emb.inv_freq") || (tied && name == "lm_head.weight") {
        return Ok(None);
    }
    let (gguf, shape, expert): (String, &[Dim], _) = match name {
        "model.embed_tokens.weight" => ("token_embd.weight".into(), &[Dim::Vocab, Dim::Embd], None),
        "model.norm.weight" => ("output_norm.weight".into(), &[Dim::Embd], None),
        "lm_head.weight" => ("output.weight".into(), &[Dim::Vocab, Dim::Embd], None),
        _ => layer_name(arch, dims, name)?,
    };
    let transform = if arch.permute_qk && gguf.ends_with("attn_q.weight") {
        Transform::Permute {
            n_head: dims.n_head,
        }
    } else if arch.permute_qk && gguf.ends_with("attn_k.weight") {
        Transform::Permute {
            n_head: dims.n_kv_head,
        }
    } else if arch.norm_plus_one && gguf.ends_with("norm.weight") {
        Transform::PlusOne
    } else {
        Transform::Keep
    };
    Ok(Some(Mapped {
        gguf,
        shape: shape.iter().map(|d| d.of(dims)).collect(),
        transform,
        expert,
        vector: shape.first() == Some(&Dim::One),
    }))
}

/// `model.layers.{i}.{suffix}` to `blk.{i}.{gguf suffix}`, and the expert
/// when it is one expert's matrix.
fn layer_name(
    arch: &HfArchitecture,
    dims: &Dims,
    name: &str,
) -> Result<(String, &'static [Dim], Option<usize>), String> {
    let unknown = || format!("not a tensor of {}", arch.class);
    let rest = name.strip_prefix("model.layers.").ok_or_else(unknown)?;
    let (layer, suffix) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    if layer >= dims.n_layer || layer.to_string() != rest[..rest.len() - suffix.len() - 1] {
        return Err(format!(
            "layer {layer} of a model of {} layers (num_hidden_layers)",
            dims.n_layer
        ));
    }
    if is_moe(dims, layer)
        && let Some(rest) = suffix.strip_prefix(expert_prefix(arch))
    {
        let (expert, matrix) = rest.split_once('.').ok_or_else(unknown)?;
        let expert_idx: usize = expert.parse().map_err(|_| unknown())?;
        if expert_idx >= dims.n_expert || expert_idx.to_string() != expert {
            return Err(format!(
                "expert {expert} of {} (num_experts / num_local_experts)",
                dims.n_expert
            ));
        }
        return EXPERT
            .iter()
            .find(|(prefix, hf, _, _)| *prefix == expert_prefix(arch) && *hf == matrix)
            .map(|&(_, _, gguf, shape)| (format!("blk.{layer}.{gguf}"), shape, Some(expert_idx)))
            .ok_or_else(unknown);
    }
    LAYER
        .iter()
        .find(|(hf, _, _, archs, ffn)| *hf == suffix && has(arch, dims, layer, archs, *ffn))
        .map(|&(_, gguf, shape, _, _)| (format!("blk.{layer}.{gguf}"), shape, None))
        .ok_or_else(unknown)
}

/// The GGUF names every layer of `arch` must have, with the HF name each
/// comes from (to name a missing one); an expert's matrices are named by
/// expert.
pub(crate) fn required(arch: &HfArchitecture, dims: &Dims) -> Vec<(String, String)> {
    let mut names = vec![
        (
            "token_embd.weight".to_owned(),
            "model.embed_tokens.weight".to_owned(),
        ),
        (
            "output_norm.weight".to_owned(),
            "model.norm.weight".to_owned(),
        ),
    ];
    for layer in 0..dims.n_layer {
        for (hf, gguf, _, archs, ffn) in LAYER {
            if has(arch, dims, layer, archs, ffn) {
                names.push((
                    format!("blk.{layer}.{gguf}"),
                    format!("model.layers.{layer}.{hf}"),
                ));
            }
        }
        if is_moe(dims, layer) {
            let prefix = expert_prefix(arch);
            for (_, hf, gguf, _) in EXPERT.iter().filter(|e| e.0 == prefix) {
                for expert in 0..dims.n_expert {
                    names.push((
                        format!("blk.{layer}.{gguf}#{expert}"),
                        format!("model.layers.{layer}.{prefix}{expert}.{hf}"),
                    ));
                }
            }
        }
    }
    names
}

/// Reorders the rows of a `[rows, row_bytes]` matrix as
/// `convert_hf_to_gguf.py`'s `LlamaModel.permute`: within each of `n_head`
/// heads of `d` rows, GGUF row `2j + t` is HF row `t * d/2 + j`.
pub(crate) fn permute_rows(data: &[u8], row_bytes: usize, n_head: usize) -> Option<Vec<u8>> {
    let n_rows = data.len().checked_div(row_bytes)?;
    let head = n_rows.checked_div(n_head)?;
    if head % 2 != 0 || n_rows % n_head != 0 || !data.len().is_multiple_of(row_bytes) {
        return None;
    }
    let half = head / 2;
    let mut out = Vec::with_capacity(data.len());
    for h in 0..n_head {
        for j in 0..half {
            for t in 0..2 {
                let src = h * head + t * half + j;
                out.extend_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation on a head of 4 rows: HF rows 0 1 | 2 3 (halves) to
    /// GGUF 0 2 1 3 (pairs), as numpy's reshape/swapaxes computes it.
    #[test]
    fn permute_pairs_the_halves() {
        let data: Vec<u8> = (0..8).collect();
        assert_eq!(permute_rows(&data, 1, 2).unwrap(), [0, 2, 1, 3, 4, 6, 5, 7]);
        assert_eq!(permute_rows(&data, 2, 1).unwrap(), [0, 1, 4, 5, 2, 3, 6, 7]);
        assert!(permute_rows(&data, 1, 3).is_none());
    }
}
