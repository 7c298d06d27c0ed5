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
    /// head_dim
    Head,
    /// intermediate_size
    Ffn,
    /// vocab_size
    Vocab,
}

impl Dim {
    fn of(self, dims: &Dims) -> usize {
        match self {
            Dim::Embd => dims.n_embd,
            Dim::Q => dims.n_head * dims.head_dim,
            Dim::Kv => dims.n_kv_head * dims.head_dim,
            Dim::Head => dims.head_dim,
            Dim::Ffn => dims.ffn,
            Dim::Vocab => dims.vocab,
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
}

/// The per-layer names: HF suffix, GGUF suffix, shape (HF order), and which
/// architectures have it (`None`: all).
type LayerName = (
    &'static str,
    &'static str,
    &'static [Dim],
    Option<&'static [&'static str]>,
);

#[rustfmt::skip]
const LAYER: [LayerName; 17] = [
    ("input_layernorm.weight", "attn_norm.weight", &[Dim::Embd], None),
    ("self_attn.q_proj.weight", "attn_q.weight", &[Dim::Q, Dim::Embd], None),
    ("self_attn.k_proj.weight", "attn_k.weight", &[Dim::Kv, Dim::Embd], None),
    ("self_attn.v_proj.weight", "attn_v.weight", &[Dim::Kv, Dim::Embd], None),
    ("self_attn.o_proj.weight", "attn_output.weight", &[Dim::Embd, Dim::Q], None),
    ("self_attn.q_proj.bias", "attn_q.bias", &[Dim::Q], Some(&["qwen2"])),
    ("self_attn.k_proj.bias", "attn_k.bias", &[Dim::Kv], Some(&["qwen2"])),
    ("self_attn.v_proj.bias", "attn_v.bias", &[Dim::Kv], Some(&["qwen2"])),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", &[Dim::Head], Some(&["qwen3", "gemma3"])),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", &[Dim::Head], Some(&["qwen3", "gemma3"])),
    ("post_attention_layernorm.weight", "ffn_norm.weight", &[Dim::Embd], Some(&["llama", "qwen2", "qwen3"])),
    ("post_attention_layernorm.weight", "post_attention_norm.weight", &[Dim::Embd], Some(&["gemma3"])),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight", &[Dim::Embd], Some(&["gemma3"])),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight", &[Dim::Embd], Some(&["gemma3"])),
    ("mlp.gate_proj.weight", "ffn_gate.weight", &[Dim::Ffn, Dim::Embd], None),
    ("mlp.up_proj.weight", "ffn_up.weight", &[Dim::Ffn, Dim::Embd], None),
    ("mlp.down_proj.weight", "ffn_down.weight", &[Dim::Embd, Dim::Ffn], None),
];

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
    let (gguf, shape): (String, &[Dim]) = match name {
        "model.embed_tokens.weight" => ("token_embd.weight".into(), &[Dim::Vocab, Dim::Embd]),
        "model.norm.weight" => ("output_norm.weight".into(), &[Dim::Embd]),
        "lm_head.weight" => ("output.weight".into(), &[Dim::Vocab, Dim::Embd]),
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
    }))
}

/// `model.layers.{i}.{suffix}` to `blk.{i}.{gguf suffix}`.
fn layer_name(
    arch: &HfArchitecture,
    dims: &Dims,
    name: &str,
) -> Result<(String, &'static [Dim]), String> {
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
    LAYER
        .iter()
        .find(|(hf, _, _, archs)| {
            *hf == suffix && archs.is_none_or(|archs| archs.contains(&arch.gguf))
        })
        .map(|&(_, gguf, shape, _)| (format!("blk.{layer}.{gguf}"), shape))
        .ok_or_else(unknown)
}

/// The GGUF names every layer of `arch` must have, with the HF name each
/// comes from (to name a missing one).
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
        for (hf, gguf, _, archs) in LAYER {
            if archs.is_none_or(|archs| archs.contains(&arch.gguf)) {
                names.push((
                    format!("blk.{layer}.{gguf}"),
                    format!("model.layers.{layer}.{hf}"),
                ));
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
