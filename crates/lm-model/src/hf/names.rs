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
//!   self_attn.o_proj.bias, self_attn.sinks    attn_output.bias, attn_sinks.weight  (gpt-oss)
//!   post_attention_layernorm                  post_attention_norm   (gpt-oss)
//!   mlp.router.{weight,bias}                  ffn_gate_inp.{weight,bias}           (gpt-oss)
//!   mlp.experts.gate_up_proj_{blocks,scales}  ffn_{gate,up}_exps.weight (MXFP4: even rows gate, odd up)
//!   mlp.experts.gate_up_proj_bias             ffn_{gate,up}_exps.bias   (even, odd)
//!   mlp.experts.down_proj_{blocks,scales,bias} ffn_down_exps.{weight,bias}
//! ```
//!
//! gpt-oss keeps a layer's experts as one tensor per projection, MXFP4 in
//! two parts (transformers' `Mxfp4GptOssExperts`, OpenAI's layout):
//!
//! ```text
//! gate_up_proj_blocks  U8 [n_expert, 2 * ffn, n_embd / 32, 16]   rows: gate 0, up 0, gate 1, up 1, ...
//! gate_up_proj_scales  U8 [n_expert, 2 * ffn, n_embd / 32]       E8M0, one per block
//! down_proj_blocks     U8 [n_expert, n_embd, ffn / 32, 16]
//! down_proj_scales     U8 [n_expert, n_embd, ffn / 32]
//! ```
//!
//! The GGUF tensor of a projection gathers its blocks and scales (two
//! parts, as a stacked tensor gathers its experts), its rows of one parity
//! for gate and up (the converter's `[:, ::2]`, `[:, 1::2]`); `mxfp4.rs`
//! turns each block into GGML's.
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
    /// num_attention_heads (gpt-oss's sinks)
    NHead,
    /// 2 * one expert's width (gpt-oss's gate and up rows, interleaved)
    ExpertGateUp,
    /// hidden_size / 32: MXFP4 blocks of a row of hidden_size
    EmbdBlocks,
    /// One expert's width / 32
    ExpertFfnBlocks,
    /// 16: the code bytes of an MXFP4 block
    BlockBytes,
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
            Dim::NHead => dims.n_head,
            Dim::ExpertGateUp => 2 * dims.expert_ffn,
            Dim::EmbdBlocks => dims.n_embd / 32,
            Dim::ExpertFfnBlocks => dims.expert_ffn / 32,
            Dim::BlockBytes => 16,
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
    /// The rows of one parity (the first two dimensions are rows): gpt-oss's
    /// gate (even) or up (odd) biases.
    Rows(Rows),
    /// MXFP4 blocks from two parts, HF's `_blocks` and `_scales`, rows as
    /// [`Rows`] picks (`mxfp4.rs`).
    Mxfp4(Rows),
}

/// Which rows of an interleaved tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rows {
    All,
    Even,
    Odd,
}

/// A GGUF tensor an HF tensor is (part of): its name, the HF tensor's
/// expected shape, the GGUF tensor's shape (both HF order) and the
/// transform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapped {
    pub gguf: String,
    /// The HF tensor's shape.
    pub shape: Vec<usize>,
    /// The GGUF tensor's shape: `shape`, the experts first when stacked,
    /// MXFP4's values `[n_expert, rows, cols]`.
    pub out_shape: Vec<usize>,
    pub transform: Transform,
    /// Which of the GGUF tensor's `n` parts this is (`(index, n)`): HF
    /// stores each expert as its own matrix, GGUF all of a layer's as one
    /// 3-d `*_exps` tensor; gpt-oss's MXFP4 blocks and scales are two.
    pub part: Option<(usize, usize)>,
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
    "qwen2moe", "dots1", "gpt-oss",
];
const PRE_NORM: &[&str] = &[
    "llama", "qwen2", "qwen3", "gemma3", "gemma2", "phi3", "qwen3moe", "olmoe", "qwen2moe",
    "dots1", "gpt-oss",
];
const SPLIT_QKV: &[&str] = &[
    "llama", "qwen2", "qwen3", "gemma3", "gemma2", "olmo2", "qwen3moe", "olmoe", "qwen2moe",
    "dots1", "gpt-oss",
];
const QKV_BIAS: &[&str] = &["qwen2", "qwen2moe", "gpt-oss"];
const GPT_OSS: &[&str] = &["gpt-oss"];
const FFN_NORM: &[&str] = &[
    "llama", "qwen2", "qwen3", "phi3", "qwen3moe", "olmoe", "qwen2moe", "dots1",
];
const GEMMA: &[&str] = &["gemma3", "gemma2"];
const POST_NORMS: &[&str] = &["gemma3", "gemma2", "olmo2"];
const QWEN_MOE: &[&str] = &["qwen3moe", "olmoe", "qwen2moe", "dots1"];

#[rustfmt::skip]
const LAYER: [LayerName; 36] = [
    ("input_layernorm.weight", "attn_norm.weight", &[Dim::Embd], PRE_NORM, Ffn::Any),
    ("self_attn.q_proj.weight", "attn_q.weight", &[Dim::Q, Dim::Embd], SPLIT_QKV, Ffn::Any),
    ("self_attn.k_proj.weight", "attn_k.weight", &[Dim::Kv, Dim::Embd], SPLIT_QKV, Ffn::Any),
    ("self_attn.v_proj.weight", "attn_v.weight", &[Dim::Kv, Dim::Embd], SPLIT_QKV, Ffn::Any),
    ("self_attn.qkv_proj.weight", "attn_qkv.weight", &[Dim::Qkv, Dim::Embd], &["phi3"], Ffn::Any),
    ("self_attn.o_proj.weight", "attn_output.weight", &[Dim::Embd, Dim::Q], ALL, Ffn::Any),
    ("self_attn.q_proj.bias", "attn_q.bias", &[Dim::Q], QKV_BIAS, Ffn::Any),
    ("self_attn.k_proj.bias", "attn_k.bias", &[Dim::Kv], QKV_BIAS, Ffn::Any),
    ("self_attn.v_proj.bias", "attn_v.bias", &[Dim::Kv], QKV_BIAS, Ffn::Any),
    ("self_attn.o_proj.bias", "attn_output.bias", &[Dim::Embd], GPT_OSS, Ffn::Any),
    ("self_attn.sinks", "attn_sinks.weight", &[Dim::NHead], GPT_OSS, Ffn::Any),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", &[Dim::Head], &["qwen3", "gemma3", "qwen3moe", "dots1"], Ffn::Any),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", &[Dim::Head], &["qwen3", "gemma3", "qwen3moe", "dots1"], Ffn::Any),
    // OLMo's QK norms are over the whole projection.
    ("self_attn.q_norm.weight", "attn_q_norm.weight", &[Dim::Q], &["olmo2", "olmoe"], Ffn::Any),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", &[Dim::Kv], &["olmo2", "olmoe"], Ffn::Any),
    ("post_attention_layernorm.weight", "ffn_norm.weight", &[Dim::Embd], FFN_NORM, Ffn::Any),
    ("post_attention_layernorm.weight", "post_attention_norm.weight", &[Dim::Embd], POST_NORMS, Ffn::Any),
    ("post_attention_layernorm.weight", "post_attention_norm.weight", &[Dim::Embd], GPT_OSS, Ffn::Any),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight", &[Dim::Embd], GEMMA, Ffn::Any),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight", &[Dim::Embd], POST_NORMS, Ffn::Any),
    ("mlp.gate_proj.weight", "ffn_gate.weight", &[Dim::Ffn, Dim::Embd], SPLIT_QKV, Ffn::Dense),
    ("mlp.up_proj.weight", "ffn_up.weight", &[Dim::Ffn, Dim::Embd], SPLIT_QKV, Ffn::Dense),
    ("mlp.gate_up_proj.weight", "ffn_up.weight", &[Dim::GateUp, Dim::Embd], &["phi3"], Ffn::Dense),
    ("mlp.down_proj.weight", "ffn_down.weight", &[Dim::Embd, Dim::Ffn], ALL, Ffn::Dense),
    ("block_sparse_moe.gate.weight", "ffn_gate_inp.weight", &[Dim::Expert, Dim::Embd], &["llama"], Ffn::Moe),
    ("mlp.gate.weight", "ffn_gate_inp.weight", &[Dim::Expert, Dim::Embd], QWEN_MOE, Ffn::Moe),
    ("mlp.router.weight", "ffn_gate_inp.weight", &[Dim::Expert, Dim::Embd], GPT_OSS, Ffn::Moe),
    ("mlp.router.bias", "ffn_gate_inp.bias", &[Dim::Expert], GPT_OSS, Ffn::Moe),
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

/// gpt-oss's experts, one HF tensor per projection: HF suffix, GGUF name,
/// HF shape, GGUF shape, transform, part of two (blocks 0, scales 1).
type PackedName = (
    &'static str,
    &'static str,
    &'static [Dim],
    &'static [Dim],
    Transform,
    Option<usize>,
);

const GATE_UP_BLOCKS: &[Dim] = &[
    Dim::Expert,
    Dim::ExpertGateUp,
    Dim::EmbdBlocks,
    Dim::BlockBytes,
];
const GATE_UP_SCALES: &[Dim] = &[Dim::Expert, Dim::ExpertGateUp, Dim::EmbdBlocks];
const DOWN_BLOCKS: &[Dim] = &[
    Dim::Expert,
    Dim::Embd,
    Dim::ExpertFfnBlocks,
    Dim::BlockBytes,
];
const DOWN_SCALES: &[Dim] = &[Dim::Expert, Dim::Embd, Dim::ExpertFfnBlocks];
const GATE_UP: &[Dim] = &[Dim::Expert, Dim::ExpertFfn, Dim::Embd];
const DOWN: &[Dim] = &[Dim::Expert, Dim::Embd, Dim::ExpertFfn];

#[rustfmt::skip]
const PACKED: [PackedName; 9] = [
    ("mlp.experts.gate_up_proj_blocks", "ffn_gate_exps.weight", GATE_UP_BLOCKS, GATE_UP, Transform::Mxfp4(Rows::Even), Some(0)),
    ("mlp.experts.gate_up_proj_blocks", "ffn_up_exps.weight", GATE_UP_BLOCKS, GATE_UP, Transform::Mxfp4(Rows::Odd), Some(0)),
    ("mlp.experts.gate_up_proj_scales", "ffn_gate_exps.weight", GATE_UP_SCALES, GATE_UP, Transform::Mxfp4(Rows::Even), Some(1)),
    ("mlp.experts.gate_up_proj_scales", "ffn_up_exps.weight", GATE_UP_SCALES, GATE_UP, Transform::Mxfp4(Rows::Odd), Some(1)),
    ("mlp.experts.gate_up_proj_bias", "ffn_gate_exps.bias", &[Dim::Expert, Dim::ExpertGateUp], &[Dim::Expert, Dim::ExpertFfn], Transform::Rows(Rows::Even), None),
    ("mlp.experts.gate_up_proj_bias", "ffn_up_exps.bias", &[Dim::Expert, Dim::ExpertGateUp], &[Dim::Expert, Dim::ExpertFfn], Transform::Rows(Rows::Odd), None),
    ("mlp.experts.down_proj_blocks", "ffn_down_exps.weight", DOWN_BLOCKS, DOWN, Transform::Mxfp4(Rows::All), Some(0)),
    ("mlp.experts.down_proj_scales", "ffn_down_exps.weight", DOWN_SCALES, DOWN, Transform::Mxfp4(Rows::All), Some(1)),
    ("mlp.experts.down_proj_bias", "ffn_down_exps.bias", &[Dim::Expert, Dim::Embd], &[Dim::Expert, Dim::Embd], Transform::Keep, None),
];

/// Whether `arch` packs a layer's experts as gpt-oss does.
fn packed(arch: &HfArchitecture) -> bool {
    arch.mxfp4_experts
}

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

/// One GGUF tensor a name is (part of), before the shapes are computed.
struct Name {
    gguf: String,
    shape: &'static [Dim],
    /// The GGUF shape when it is not `shape` (nor `shape` stacked).
    out_shape: Option<&'static [Dim]>,
    /// The transform when it is not the architecture's rule.
    transform: Option<Transform>,
    /// `(index, n)` of the GGUF tensor's parts.
    part: Option<(usize, usize)>,
}

impl Name {
    fn plain(gguf: String, shape: &'static [Dim]) -> Self {
        Name {
            gguf,
            shape,
            out_shape: None,
            transform: None,
            part: None,
        }
    }
}

/// Maps `name` to the GGUF tensors it is (part of): none for a tensor the
/// model does not use (RoPE's precomputed `inv_freq`, a tied
/// `lm_head.weight`), two for gpt-oss's gate and up, an error for a name
/// this architecture does not have.
pub(crate) fn map(
    arch: &HfArchitecture,
    dims: &Dims,
    tied: bool,
    name: &str,
) -> Result<Vec<Mapped>, String> {
    if name.ends_with("rotary_emb.inv_freq") || (tied && name == "lm_head.weight") {
        return Ok(Vec::new());
    }
    let names = match name {
        "model.embed_tokens.weight" => vec![Name::plain(
            "token_embd.weight".into(),
            &[Dim::Vocab, Dim::Embd],
        )],
        "model.norm.weight" => vec![Name::plain("output_norm.weight".into(), &[Dim::Embd])],
        "lm_head.weight" => vec![Name::plain(
            "output.weight".into(),
            &[Dim::Vocab, Dim::Embd],
        )],
        _ => layer_names(arch, dims, name)?,
    };
    let of = |shape: &[Dim]| shape.iter().map(|d| d.of(dims)).collect::<Vec<_>>();
    Ok(names
        .into_iter()
        .map(|named| {
            let gguf = named.gguf;
            let transform = named.transform.unwrap_or_else(|| {
                if arch.permute_qk && gguf.ends_with("attn_q.weight") {
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
                }
            });
            let shape = of(named.shape);
            let out_shape = match (named.out_shape, named.part) {
                (Some(out), _) => of(out),
                (None, Some((_, n))) => [n].into_iter().chain(shape.iter().copied()).collect(),
                (None, None) => shape.clone(),
            };
            Mapped {
                gguf,
                shape,
                out_shape,
                transform,
                part: named.part,
                vector: named.shape.first() == Some(&Dim::One),
            }
        })
        .collect())
}

/// `model.layers.{i}.{suffix}` to `blk.{i}.{gguf suffix}`: the expert when
/// it is one expert's matrix, gate and up when gpt-oss's packed pair.
fn layer_names(arch: &HfArchitecture, dims: &Dims, name: &str) -> Result<Vec<Name>, String> {
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
    if packed(arch) && is_moe(dims, layer) {
        let found: Vec<Name> = PACKED
            .iter()
            .filter(|p| p.0 == suffix)
            .map(|&(_, gguf, shape, out, transform, part)| Name {
                gguf: format!("blk.{layer}.{gguf}"),
                shape,
                out_shape: Some(out),
                transform: Some(transform),
                part: part.map(|idx| (idx, 2)),
            })
            .collect();
        if !found.is_empty() {
            return Ok(found);
        }
        if matches!(suffix, "mlp.experts.gate_up_proj" | "mlp.experts.down_proj") {
            return Err(format!(
                "experts not in MXFP4 (no `_blocks`, `_scales`): {} is read with MXFP4 experts only",
                arch.class
            ));
        }
    } else if is_moe(dims, layer)
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
            .map(|&(_, _, gguf, shape)| {
                vec![Name {
                    part: Some((expert_idx, dims.n_expert)),
                    ..Name::plain(format!("blk.{layer}.{gguf}"), shape)
                }]
            })
            .ok_or_else(unknown);
    }
    LAYER
        .iter()
        .find(|(hf, _, _, archs, ffn)| *hf == suffix && has(arch, dims, layer, archs, *ffn))
        .map(|&(_, gguf, shape, _, _)| vec![Name::plain(format!("blk.{layer}.{gguf}"), shape)])
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
        if packed(arch) && is_moe(dims, layer) {
            for (hf, gguf, _, _, _, part) in PACKED {
                let gguf = match part {
                    Some(idx) => format!("blk.{layer}.{gguf}#{idx}"),
                    None => format!("blk.{layer}.{gguf}"),
                };
                names.push((gguf, format!("model.layers.{layer}.{hf}")));
            }
        } else if is_moe(dims, layer) {
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

/// The rows of `rows`' parity of a `[n_rows, row_bytes]` matrix (all of
/// them: `None`, nothing to do); `None` too when `data` does not split
/// into `n_rows` rows.
pub(crate) fn pick_rows(data: &[u8], n_rows: usize, rows: Rows) -> Option<Vec<u8>> {
    let first = match rows {
        Rows::All => return None,
        Rows::Even => 0,
        Rows::Odd => 1,
    };
    let row_bytes = data.len().checked_div(n_rows)?;
    if !n_rows.is_multiple_of(2) || row_bytes * n_rows != data.len() {
        return None;
    }
    Some(
        data.chunks_exact(row_bytes)
            .skip(first)
            .step_by(2)
            .flatten()
            .copied()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt-oss's interleaved gate/up rows: even rows the gate's, odd the
    /// up projection's (the converter's `[:, ::2]`, `[:, 1::2]`).
    #[test]
    fn pick_rows_takes_one_parity() {
        let data: Vec<u8> = (0..12).collect();
        assert_eq!(pick_rows(&data, 4, Rows::Even).unwrap(), [0, 1, 2, 6, 7, 8]);
        assert_eq!(
            pick_rows(&data, 4, Rows::Odd).unwrap(),
            [3, 4, 5, 9, 10, 11]
        );
        assert!(pick_rows(&data, 4, Rows::All).is_none());
        assert!(pick_rows(&data, 3, Rows::Even).is_none());
        assert!(pick_rows(&data, 5, Rows::Even).is_none());
    }

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
