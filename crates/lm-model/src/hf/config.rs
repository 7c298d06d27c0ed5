//! `config.json` to GGUF metadata: one table per architecture from Hugging
//! Face's field names to the `{arch}.*` keys llama.cpp's
//! `convert_hf_to_gguf.py` writes, so that the one GGUF mapping
//! (`transformer/arch.rs`) turns either into a `TransformerConfig`.
//!
//! ```text
//! config.json                    GGUF key ({arch}.)                 default
//! num_hidden_layers              block_count                        required
//! max_position_embeddings        context_length                     required
//! hidden_size                    embedding_length                   required
//! intermediate_size              feed_forward_length                required
//! num_attention_heads            attention.head_count               required
//! num_key_value_heads            attention.head_count_kv            head count
//! rms_norm_eps                   attention.layer_norm_rms_epsilon   llama, qwen: required; else the class's
//! rope_theta                     rope.freq_base                     10000 (gemma3, mixtral 1e6)
//! vocab_size                     vocab_size                         required
//! head_dim                       attention.key_length, value_length width / heads (gemma2, gemma3 256)
//! sliding_window                 attention.sliding_window           gemma3 required; gemma2, OLMo 3 4096;
//!                                                                   mistral, mixtral, phi3 kept, unread
//! layer_types (OLMo 3, gpt-oss)  attention.sliding_window_pattern   OLMo 3: all but every 4th layer slide;
//!                                                                   gpt-oss: every other, from layer 0
//! intermediate_size (gpt-oss)    also expert_feed_forward_length    multiple of 32 (MXFP4 blocks)
//! swiglu_limit, attention_bias   (fixed: 7, true)                   gpt-oss
//! rope_scaling (gpt-oss)         absent is refused (the class's     null: none
//!                                default is YaRN, factor 32)
//! attn_logit_softcapping         attn_logit_softcapping             gemma2 50
//! final_logit_softcapping        final_logit_softcapping            gemma2 30
//! original_max_position_embeddings rope.scaling.original_context_length  phi3 4096
//! num_local_experts (mixtral,    expert_count                       8, 128, 64, 60
//!   gpt-oss),
//!   num_experts (qwen3moe, olmoe, qwen2moe)
//! num_experts_per_tok            expert_used_count                  2, 8, 8, 4
//! moe_intermediate_size          expert_feed_forward_length         qwen3moe 768, qwen2moe 1408
//! shared_expert_intermediate_size expert_shared_feed_forward_length qwen2moe 5632
//! n_routed_experts (dots1)       expert_count                       required
//! n_shared_experts (dots1)       expert_shared_count                required
//! first_k_dense_replace (dots1)  leading_dense_block_count          0
//! norm_topk_prob (dots1)         expert_weights_norm                false
//! routed_scaling_factor (dots1)  expert_weights_scale               1
//! (dots1)                        expert_gating_func 2 (sigmoid)     always
//! rope_scaling linear            rope.scaling.type, .factor
//! rope_scaling yarn              rope.scaling.type, .factor,        beta_fast 32, beta_slow 1 (llama.cpp's);
//!                                .original_context_length           truncate read as true, as llama.cpp
//!                                                                   computes (gpt-oss says false)
//! rope_scaling llama3 (llama)    the tensor rope_freqs.weight, as the converter computes it
//! rope_scaling longrope, su      rope_factors_{long,short}.weight and rope.scaling.attn_factor
//!   (phi3)                       (attention_factor, else sqrt(1 + ln s / ln original), s the
//!                                context over the original: transformers' rule; the
//!                                converter always computes it, ignoring attention_factor)
//! partial_rotary_factor (phi3)   rope.dimension_count               1: int(f * hidden_size) / heads
//! rope_local_base_freq (gemma3)  rope.freq_base_swa                 10000 (the GGUF default)
//! rope_parameters (transformers 5) read as rope_theta, rope_scaling, and the fields above
//!                                that moved into it, where those are absent
//! tie_word_embeddings            no output.weight                   gemma2, gemma3: true; else false
//! ```
//!
//! Classes and their GGUF architectures: Llama, Mistral and Mixtral are
//! `llama` (q/k permuted; Mixtral's experts make it a mixture), Qwen2 and
//! Qwen3 `qwen2`, `qwen3`, Gemma2 and Gemma3 `gemma2`, `gemma3` (norms
//! `+ 1`), Phi3 `phi3`, Olmo2 and Olmo3 `olmo2`, Qwen3Moe, Olmoe, Qwen2Moe
//! `qwen3moe`, `olmoe`, `qwen2moe`, Dots1 `dots1`, GptOss `gpt-oss`.
//! Defaults are each `transformers` config class's.
//!
//! Fields the GGUF architecture does not read but computes as if they had
//! one value are checked ([`Fixed`]): `norm_topk_prob` (qwen3moe
//! renormalises the chosen experts' weights, olmoe and qwen2moe do not, as
//! llama.cpp fixes it per architecture; Qwen3Moe's default `false` is
//! refused), `decoder_sparse_step` 1 and `mlp_only_layers` empty (every
//! layer a mixture), `clip_qkv` null (OLMo), `scoring_func` `noaux_tc` and `n_group`, `topk_group` 1 (dots1),
//! and Gemma's `query_pre_attn_scalar` equal to the scale the GGUF path
//! computes. A field the table defaults that config.json sets to null
//! (gemma2's soft-caps: no capping) is refused too: GGUF cannot say it.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::HfError;
use crate::gguf::MetadataValue;

/// The Hugging Face classes (`architectures[0]`) this loader maps.
pub(crate) const SUPPORTED_CLASSES: [&str; 15] = {
    let mut names = [""; 15];
    let mut i = 0;
    while i < ARCHITECTURES.len() {
        names[i] = ARCHITECTURES[i].class;
        i += 1;
    }
    names
};

/// What one Hugging Face class is in GGUF terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HfArchitecture {
    /// `architectures[0]` in config.json.
    pub class: &'static str,
    /// `general.architecture` in GGUF.
    pub gguf: &'static str,
    /// The q and k rows are reordered from NeoX halves to adjacent pairs
    /// (the converter's `LlamaModel.permute`).
    pub permute_qk: bool,
    /// Norm gains are stored as `weight` and applied as `1 + weight`
    /// (the converter adds the 1).
    pub norm_plus_one: bool,
    /// `tie_word_embeddings` when config.json does not say.
    pub tied_default: bool,
    /// Defaults of optional fields that differ from the table's.
    pub defaults: &'static [(&'static str, f64)],
    /// Fields beyond [`COMMON`].
    pub extra: &'static [Field],
    /// Fields the GGUF architecture does not read but assumes a value of:
    /// a config.json that says otherwise is refused by name.
    pub fixed: &'static [Fixed],
    /// `rope_scaling` LongRoPE (`longrope`, `su`): the factors become
    /// `rope_factors_{long,short}.weight` (phi3).
    pub long_rope: bool,
    /// `layer_types` becomes `attention.sliding_window_pattern` (OLMo 3).
    pub layer_types: bool,
    /// GGUF keys of one value for the class (`{arch}.` + key, u32).
    pub constants: &'static [(&'static str, u32)],
    /// The class defaults `rope_scaling` to a scaling (GptOss: YaRN,
    /// factor 32), which GGUF has no default for: an absent one is
    /// refused, `null` is none.
    pub explicit_rope_scaling: bool,
    /// The experts' matrices are MXFP4 (`*_blocks`, `*_scales`), whose
    /// rows split into blocks of 32 (gpt-oss).
    pub mxfp4_experts: bool,
}

/// A config.json field the GGUF path assumes: its Hugging Face default and
/// the value the GGUF architecture computes with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fixed {
    hf: &'static str,
    default: Json,
    expected: Json,
    why: &'static str,
}

/// A JSON constant (for [`Fixed`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(f64),
    Str(&'static str),
    EmptyList,
}

impl Json {
    fn matches(self, value: &Value) -> bool {
        match self {
            Json::Null => value.is_null(),
            Json::Bool(b) => value.as_bool() == Some(b),
            Json::Number(n) => value.as_f64() == Some(n),
            Json::Str(text) => value.as_str() == Some(text),
            Json::EmptyList => value.as_array().is_some_and(Vec::is_empty) || value.is_null(),
        }
    }
}

const fn fixed(hf: &'static str, default: Json, expected: Json, why: &'static str) -> Fixed {
    Fixed {
        hf,
        default,
        expected,
        why,
    }
}

/// A [`Fixed`] whose Hugging Face default is the value the GGUF
/// architecture assumes (all but `norm_topk_prob`'s, which differ by class).
const fn assumed(hf: &'static str, value: Json, why: &'static str) -> Fixed {
    fixed(hf, value, value, why)
}

/// One config.json field and the GGUF key it becomes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Field {
    hf: &'static str,
    gguf: &'static str,
    kind: Kind,
    required: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    U32,
    F32,
    Bool,
}

const fn field(hf: &'static str, gguf: &'static str, kind: Kind, required: bool) -> Field {
    Field {
        hf,
        gguf,
        kind,
        required,
    }
}

/// The fields every supported class has.
const COMMON: [Field; 10] = [
    field("num_hidden_layers", "block_count", Kind::U32, true),
    field("max_position_embeddings", "context_length", Kind::U32, true),
    field("hidden_size", "embedding_length", Kind::U32, true),
    field("intermediate_size", "feed_forward_length", Kind::U32, true),
    field(
        "num_attention_heads",
        "attention.head_count",
        Kind::U32,
        true,
    ),
    field(
        "num_key_value_heads",
        "attention.head_count_kv",
        Kind::U32,
        false,
    ),
    field(
        "rms_norm_eps",
        "attention.layer_norm_rms_epsilon",
        Kind::F32,
        true,
    ),
    field("rope_theta", "rope.freq_base", Kind::F32, false),
    field("vocab_size", "vocab_size", Kind::U32, true),
    field("head_dim", "attention.key_length", Kind::U32, false),
];

/// `sliding_window`, where the GGUF architecture has the key.
const SLIDING_WINDOW: Field = field(
    "sliding_window",
    "attention.sliding_window",
    Kind::U32,
    false,
);
/// The router's top-k.
const EXPERTS_USED: Field = field("num_experts_per_tok", "expert_used_count", Kind::U32, false);
/// The expert count as Qwen and OLMoE spell it.
const EXPERTS: Field = field("num_experts", "expert_count", Kind::U32, false);
/// The experts' width as Qwen spells it.
const EXPERT_WIDTH: Field = field(
    "moe_intermediate_size",
    "expert_feed_forward_length",
    Kind::U32,
    false,
);

/// `norm_topk_prob`: whether the chosen experts' weights are renormalised,
/// which the GGUF architecture fixes (llama.cpp reads no key for it).
const fn topk_norm(default: bool, gguf: bool) -> Fixed {
    fixed(
        "norm_topk_prob",
        Json::Bool(default),
        Json::Bool(gguf),
        "the GGUF architecture fixes whether the chosen weights are renormalised",
    )
}
/// Qwen's MoE classes: every layer a mixture.
const EVERY_LAYER_SPARSE: [Fixed; 2] = [
    assumed(
        "decoder_sparse_step",
        Json::Number(1.0),
        "every layer must be a mixture of experts",
    ),
    assumed(
        "mlp_only_layers",
        Json::EmptyList,
        "every layer must be a mixture of experts",
    ),
];

const LLAMA: HfArchitecture = HfArchitecture {
    class: "LlamaForCausalLM",
    gguf: "llama",
    permute_qk: true,
    norm_plus_one: false,
    tied_default: false,
    defaults: &[],
    extra: &[],
    fixed: &[],
    long_rope: false,
    layer_types: false,
    constants: &[],
    explicit_rope_scaling: false,
    mxfp4_experts: false,
};

/// The supported classes, in the order of [`SUPPORTED_CLASSES`]. Defaults
/// are those of each class's `PretrainedConfig` in `transformers`.
pub(crate) const ARCHITECTURES: [HfArchitecture; 15] = [
    LLAMA,
    HfArchitecture {
        class: "Qwen2ForCausalLM",
        gguf: "qwen2",
        permute_qk: false,
        ..LLAMA
    },
    HfArchitecture {
        class: "Qwen3ForCausalLM",
        gguf: "qwen3",
        permute_qk: false,
        ..LLAMA
    },
    HfArchitecture {
        class: "Gemma3ForCausalLM",
        gguf: "gemma3",
        permute_qk: false,
        norm_plus_one: true,
        tied_default: true,
        defaults: &[
            ("rms_norm_eps", 1e-6),
            ("rope_theta", 1e6),
            ("head_dim", 256.0),
        ],
        extra: &[
            field(
                "sliding_window",
                "attention.sliding_window",
                Kind::U32,
                true,
            ),
            field(
                "rope_local_base_freq",
                "rope.freq_base_swa",
                Kind::F32,
                false,
            ),
        ],
        ..LLAMA
    },
    // Mistral is llama to the converter; llama.cpp (and so the GGUF path)
    // applies no window for llama: the key is kept, as written, unread.
    HfArchitecture {
        class: "MistralForCausalLM",
        defaults: &[("rms_norm_eps", 1e-6)],
        extra: &[SLIDING_WINDOW],
        ..LLAMA
    },
    HfArchitecture {
        class: "Gemma2ForCausalLM",
        gguf: "gemma2",
        permute_qk: false,
        norm_plus_one: true,
        tied_default: true,
        defaults: &[
            ("rms_norm_eps", 1e-6),
            ("head_dim", 256.0),
            ("sliding_window", 4096.0),
            ("attn_logit_softcapping", 50.0),
            ("final_logit_softcapping", 30.0),
        ],
        extra: &[
            SLIDING_WINDOW,
            field(
                "attn_logit_softcapping",
                "attn_logit_softcapping",
                Kind::F32,
                false,
            ),
            field(
                "final_logit_softcapping",
                "final_logit_softcapping",
                Kind::F32,
                false,
            ),
        ],
        ..LLAMA
    },
    // Phi-3's window is not applied by llama.cpp (nor the GGUF path); the
    // key is kept as the converter writes it.
    HfArchitecture {
        class: "Phi3ForCausalLM",
        gguf: "phi3",
        permute_qk: false,
        defaults: &[
            ("rms_norm_eps", 1e-5),
            ("original_max_position_embeddings", 4096.0),
        ],
        extra: &[
            SLIDING_WINDOW,
            field(
                "original_max_position_embeddings",
                "rope.scaling.original_context_length",
                Kind::U32,
                false,
            ),
        ],
        long_rope: true,
        ..LLAMA
    },
    HfArchitecture {
        class: "Olmo2ForCausalLM",
        gguf: "olmo2",
        permute_qk: false,
        defaults: &[("rms_norm_eps", 1e-5)],
        fixed: &[assumed(
            "clip_qkv",
            Json::Null,
            "olmo2 in GGUF does not clip q, k, v",
        )],
        ..LLAMA
    },
    // OLMo 3: OLMo 2 with a sliding window on the layers `layer_types`
    // names (default: all but every fourth).
    HfArchitecture {
        class: "Olmo3ForCausalLM",
        gguf: "olmo2",
        permute_qk: false,
        defaults: &[("rms_norm_eps", 1e-6), ("sliding_window", 4096.0)],
        extra: &[SLIDING_WINDOW],
        layer_types: true,
        ..LLAMA
    },
    HfArchitecture {
        class: "MixtralForCausalLM",
        defaults: &[
            ("rope_theta", 1e6),
            ("num_local_experts", 8.0),
            ("num_experts_per_tok", 2.0),
        ],
        extra: &[
            SLIDING_WINDOW,
            field("num_local_experts", "expert_count", Kind::U32, false),
            EXPERTS_USED,
        ],
        ..LLAMA
    },
    HfArchitecture {
        class: "Qwen3MoeForCausalLM",
        gguf: "qwen3moe",
        permute_qk: false,
        defaults: &[
            ("rms_norm_eps", 1e-6),
            ("num_experts", 128.0),
            ("num_experts_per_tok", 8.0),
            ("moe_intermediate_size", 768.0),
        ],
        extra: &[EXPERTS, EXPERTS_USED, EXPERT_WIDTH],
        fixed: &[
            topk_norm(false, true),
            EVERY_LAYER_SPARSE[0],
            EVERY_LAYER_SPARSE[1],
        ],
        ..LLAMA
    },
    HfArchitecture {
        class: "OlmoeForCausalLM",
        gguf: "olmoe",
        permute_qk: false,
        defaults: &[
            ("rms_norm_eps", 1e-5),
            ("num_experts", 64.0),
            ("num_experts_per_tok", 8.0),
        ],
        extra: &[EXPERTS, EXPERTS_USED],
        fixed: &[
            topk_norm(false, false),
            assumed(
                "clip_qkv",
                Json::Null,
                "olmoe in GGUF does not clip q, k, v",
            ),
        ],
        ..LLAMA
    },
    HfArchitecture {
        class: "Qwen2MoeForCausalLM",
        gguf: "qwen2moe",
        permute_qk: false,
        defaults: &[
            ("rms_norm_eps", 1e-6),
            ("num_experts", 60.0),
            ("num_experts_per_tok", 4.0),
            ("moe_intermediate_size", 1408.0),
            ("shared_expert_intermediate_size", 5632.0),
        ],
        extra: &[
            EXPERTS,
            EXPERTS_USED,
            EXPERT_WIDTH,
            field(
                "shared_expert_intermediate_size",
                "expert_shared_feed_forward_length",
                Kind::U32,
                false,
            ),
        ],
        fixed: &[
            topk_norm(false, false),
            EVERY_LAYER_SPARSE[0],
            EVERY_LAYER_SPARSE[1],
        ],
        ..LLAMA
    },
    // dots.llm1: DeepSeek-V3's router (sigmoid scores plus a selection
    // bias, `noaux_tc`) on Qwen3's attention; the first
    // `first_k_dense_replace` layers dense.
    HfArchitecture {
        class: "Dots1ForCausalLM",
        gguf: "dots1",
        permute_qk: false,
        defaults: &[
            ("rms_norm_eps", 1e-6),
            ("moe_intermediate_size", 1408.0),
            ("first_k_dense_replace", 0.0),
            ("norm_topk_prob", 0.0),
            ("routed_scaling_factor", 1.0),
        ],
        extra: &[
            field("n_routed_experts", "expert_count", Kind::U32, true),
            field("num_experts_per_tok", "expert_used_count", Kind::U32, true),
            EXPERT_WIDTH,
            field("n_shared_experts", "expert_shared_count", Kind::U32, true),
            field(
                "first_k_dense_replace",
                "leading_dense_block_count",
                Kind::U32,
                false,
            ),
            field("norm_topk_prob", "expert_weights_norm", Kind::Bool, false),
            field(
                "routed_scaling_factor",
                "expert_weights_scale",
                Kind::F32,
                false,
            ),
        ],
        fixed: &[
            assumed(
                "scoring_func",
                Json::Str("noaux_tc"),
                "dots1 in GGUF scores experts by sigmoid plus the selection bias",
            ),
            assumed(
                "n_group",
                Json::Number(1.0),
                "dots1 in GGUF chooses among all experts, not by group",
            ),
            assumed(
                "topk_group",
                Json::Number(1.0),
                "dots1 in GGUF chooses among all experts, not by group",
            ),
        ],
        // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID.
        constants: &[("expert_gating_func", 2)],
        ..LLAMA
    },
    // gpt-oss: sinks, biases everywhere, a router with a bias, the experts
    // of a layer as one tensor per projection in MXFP4 (names.rs), the
    // sliding layers as `layer_types` says (default: every other one).
    HfArchitecture {
        class: "GptOssForCausalLM",
        gguf: "gpt-oss",
        permute_qk: false,
        defaults: &[
            ("rms_norm_eps", 1e-5),
            ("rope_theta", 150000.0),
            ("head_dim", 64.0),
            ("sliding_window", 128.0),
            ("num_local_experts", 128.0),
            ("num_experts_per_tok", 4.0),
        ],
        extra: &[
            SLIDING_WINDOW,
            field("num_local_experts", "expert_count", Kind::U32, false),
            EXPERTS_USED,
            // The converter writes intermediate_size as both widths.
            field(
                "intermediate_size",
                "expert_feed_forward_length",
                Kind::U32,
                false,
            ),
        ],
        fixed: &[
            assumed(
                "swiglu_limit",
                Json::Number(7.0),
                "gpt-oss in GGUF clamps the gated unit at 7 (llama.cpp's swiglu_oai)",
            ),
            assumed(
                "attention_bias",
                Json::Bool(true),
                "gpt-oss in GGUF has q, k, v and output biases",
            ),
        ],
        layer_types: true,
        explicit_rope_scaling: true,
        mxfp4_experts: true,
        ..LLAMA
    },
];

/// The shapes of the model, in config.json's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dims {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Experts per layer (0: a dense model).
    pub n_expert: usize,
    /// One expert's width.
    pub expert_ffn: usize,
    /// The shared experts' width (qwen2moe; dots1's experts together).
    pub shared_ffn: usize,
    /// The leading dense layers of a mixture (dots1).
    pub n_dense_lead: usize,
}

/// A config.json read and mapped.
#[derive(Debug, Clone)]
pub(crate) struct HfConfig {
    pub arch: HfArchitecture,
    /// The GGUF metadata pairs, `general.architecture` first.
    pub metadata: Vec<(String, MetadataValue)>,
    pub dims: Dims,
    /// Whether the output projection is the embedding's.
    pub tied: bool,
    /// F32 tensors computed from config.json, written before the
    /// checkpoint's: Llama 3's `rope_freqs.weight`, LongRoPE's
    /// `rope_factors_{long,short}.weight`.
    pub generated: Vec<(String, Vec<f32>)>,
}

/// The largest JSON file read whole (config, index, tokenizer configs).
pub(crate) const MAX_JSON_BYTES: u64 = 64 << 20;

/// Reads `path` (at most [`MAX_JSON_BYTES`]) as a JSON object.
pub(crate) fn read_json_object(path: &Path) -> Result<Map<String, Value>, HfError> {
    let io = |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_JSON_BYTES {
        return Err(HfError::BadField {
            path: path.to_path_buf(),
            field: "(file)".into(),
            reason: format!("{len} bytes, more than the {MAX_JSON_BYTES} read"),
        });
    }
    let text = std::fs::read(path).map_err(io)?;
    match serde_json::from_slice(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(HfError::BadField {
            path: path.to_path_buf(),
            field: "(top level)".into(),
            reason: "not a JSON object".into(),
        }),
        Err(source) => Err(HfError::Json {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Reads `dir/config.json` and maps it.
pub(crate) fn read(dir: &Path) -> Result<HfConfig, HfError> {
    let path = dir.join("config.json");
    let json = with_rope_parameters(&path, read_json_object(&path)?)?;
    Fields {
        path: path.clone(),
        json: &json,
    }
    .config()
}

/// transformers 5 saves `rope_parameters` where 4 saved `rope_theta`,
/// `rope_scaling` (and Phi-3's `original_max_position_embeddings`,
/// `partial_rotary_factor`, Gemma 3's `rope_local_base_freq`): one object,
/// or one per attention type (`full_attention`, `sliding_attention`). Its
/// values are read as those fields, where config.json does not give them.
fn with_rope_parameters(
    path: &Path,
    mut json: Map<String, Value>,
) -> Result<Map<String, Value>, HfError> {
    let Some(params) = json.get("rope_parameters").filter(|v| !v.is_null()) else {
        return Ok(json);
    };
    let bad = |field: &str| HfError::BadField {
        path: path.to_path_buf(),
        field: field.into(),
        reason: "expected an object".into(),
    };
    let params = params.as_object().ok_or_else(|| bad("rope_parameters"))?;
    let (full, sliding) = match params.get("full_attention") {
        Some(full) => (
            full.as_object()
                .ok_or_else(|| bad("rope_parameters.full_attention"))?
                .clone(),
            match params.get("sliding_attention") {
                Some(sliding) => Some(
                    sliding
                        .as_object()
                        .ok_or_else(|| bad("rope_parameters.sliding_attention"))?
                        .clone(),
                ),
                None => None,
            },
        ),
        None => (params.clone(), None),
    };
    let mut give = |field: &str, value: Option<&Value>| {
        if let Some(value) = value
            && json.get(field).is_none_or(Value::is_null)
        {
            json.insert(field.to_owned(), value.clone());
        }
    };
    give("rope_theta", full.get("rope_theta"));
    for field in ["original_max_position_embeddings", "partial_rotary_factor"] {
        give(field, full.get(field));
    }
    if full
        .get("rope_type")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind != "default")
    {
        give("rope_scaling", Some(&Value::Object(full.clone())));
    }
    give(
        "rope_local_base_freq",
        sliding.as_ref().and_then(|s| s.get("rope_theta")),
    );
    Ok(json)
}

/// config.json's fields, read with errors naming the file and the field.
struct Fields<'a> {
    path: PathBuf,
    json: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn bad(&self, field: &str, reason: impl Into<String>) -> HfError {
        HfError::BadField {
            path: self.path.clone(),
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    fn present(&self, name: &str) -> Option<&Value> {
        self.json.get(name).filter(|v| !v.is_null())
    }

    /// A number field, `None` when absent or null.
    fn number(&self, name: &str) -> Result<Option<f64>, HfError> {
        match self.present(name) {
            None => Ok(None),
            Some(value) => value
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(name, format!("expected a number, found {value}"))),
        }
    }

    /// A true/false field, `None` when absent or null.
    fn flag(&self, name: &str) -> Result<Option<u8>, HfError> {
        match self.present(name) {
            None => Ok(None),
            Some(value) => value
                .as_bool()
                .map(|b| Some(u8::from(b)))
                .ok_or_else(|| self.bad(name, format!("expected true or false, found {value}"))),
        }
    }

    /// A count: a non-negative integer that fits a u32.
    fn count(&self, name: &str, value: f64) -> Result<u32, HfError> {
        if value.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&value) {
            return Err(self.bad(name, format!("expected a count, found {value}")));
        }
        Ok(value as u32)
    }

    /// The class named by `architectures`.
    fn architecture(&self) -> Result<HfArchitecture, HfError> {
        let Some(value) = self.present("architectures") else {
            return Err(HfError::MissingField {
                path: self.path.clone(),
                field: "architectures".into(),
            });
        };
        let names: Vec<String> = match value {
            Value::Array(items) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| self.bad("architectures", "expected a list of strings"))?,
            _ => return Err(self.bad("architectures", "expected a list of strings")),
        };
        ARCHITECTURES
            .into_iter()
            .find(|arch| names.iter().any(|name| name == arch.class))
            .ok_or_else(|| HfError::UnsupportedArchitecture {
                path: self.path.clone(),
                found: names,
            })
    }

    fn config(&self) -> Result<HfConfig, HfError> {
        let arch = self.architecture()?;
        let mut metadata = vec![(
            "general.architecture".to_owned(),
            MetadataValue::String(arch.gguf.into()),
        )];
        self.check_fixed(&arch)?;
        for (key, value) in arch.constants {
            metadata.push((format!("{}.{key}", arch.gguf), MetadataValue::U32(*value)));
        }
        let mut values = std::collections::HashMap::new();
        for field in COMMON.iter().chain(arch.extra) {
            let default = arch
                .defaults
                .iter()
                .find(|(name, _)| *name == field.hf)
                .map(|&(_, v)| v);
            if let (Some(default), Some(Value::Null)) = (default, self.json.get(field.hf)) {
                return Err(self.bad(
                    field.hf,
                    format!("null, where the GGUF architecture needs a value (default {default})"),
                ));
            }
            let given = match field.kind {
                Kind::Bool => self.flag(field.hf)?.map(f64::from),
                _ => self.number(field.hf)?,
            };
            let value = match (given.or(default), field.required) {
                (Some(value), _) => value,
                (None, true) => {
                    return Err(HfError::MissingField {
                        path: self.path.clone(),
                        field: field.hf.into(),
                    });
                }
                (None, false) => continue,
            };
            let value = match field.kind {
                Kind::U32 => MetadataValue::U32(self.count(field.hf, value)?),
                Kind::F32 => MetadataValue::F32(value as f32),
                Kind::Bool => MetadataValue::Bool(value != 0.0),
            };
            values.insert(field.hf, value.clone());
            metadata.push((format!("{}.{}", arch.gguf, field.gguf), value.clone()));
            if field.hf == "head_dim" {
                metadata.push((format!("{}.attention.value_length", arch.gguf), value));
            }
        }
        let get = |name: &str| match values.get(name) {
            Some(MetadataValue::U32(v)) => Some(*v as usize),
            _ => None,
        };
        let (n_embd, n_head) = (
            get("hidden_size").unwrap_or(0),
            get("num_attention_heads").unwrap_or(0),
        );
        if n_head == 0 || get("num_key_value_heads") == Some(0) {
            return Err(self.bad("num_attention_heads", "a head count of 0"));
        }
        let head_dim = match get("head_dim") {
            Some(head_dim) => head_dim,
            None if n_embd.is_multiple_of(n_head) => n_embd / n_head,
            None => return Err(self.bad("num_attention_heads", "does not divide hidden_size")),
        };
        let dims = Dims {
            n_embd,
            n_layer: get("num_hidden_layers").unwrap_or(0),
            n_head,
            n_kv_head: get("num_key_value_heads").unwrap_or(n_head),
            head_dim,
            ffn: get("intermediate_size").unwrap_or(0),
            vocab: get("vocab_size").unwrap_or(0),
            n_expert: get("num_local_experts")
                .or(get("num_experts"))
                .or(get("n_routed_experts"))
                .unwrap_or(0),
            n_dense_lead: get("first_k_dense_replace").unwrap_or(0),
            expert_ffn: get("moe_intermediate_size")
                .or(get("intermediate_size"))
                .unwrap_or(0),
            shared_ffn: get("shared_expert_intermediate_size")
                .or(get("n_shared_experts").map(|n| n * get("moe_intermediate_size").unwrap_or(0)))
                .unwrap_or(0),
        };
        if dims.n_expert > 0
            && !(1..=dims.n_expert).contains(&get("num_experts_per_tok").unwrap_or(0))
        {
            return Err(self.bad(
                "num_experts_per_tok",
                format!("must be 1 to the {} experts", dims.n_expert),
            ));
        }
        if arch.mxfp4_experts {
            for (field, width) in [
                ("hidden_size", dims.n_embd),
                ("intermediate_size", dims.expert_ffn),
            ] {
                if !width.is_multiple_of(32) {
                    return Err(self.bad(
                        field,
                        format!("{width} does not split into MXFP4's blocks of 32"),
                    ));
                }
            }
        }
        if arch.explicit_rope_scaling
            && !self.json.contains_key("rope_scaling")
            && !self.json.contains_key("rope_parameters")
        {
            return Err(HfError::MissingField {
                path: self.path.clone(),
                field: "rope_scaling".into(),
            });
        }
        if arch.layer_types {
            self.layer_types(&arch, dims.n_layer, &mut metadata)?;
        }
        self.query_scale(&arch, &dims)?;
        let tied = match self.present("tie_word_embeddings") {
            None => arch.tied_default,
            Some(value) => value
                .as_bool()
                .ok_or_else(|| self.bad("tie_word_embeddings", "expected true or false"))?,
        };
        let base = match values.get("rope_theta") {
            Some(MetadataValue::F32(v)) => f64::from(*v),
            _ => 10000.0,
        };
        let rope_dim = self.rope_dim(&arch, &dims, &mut metadata)?;
        let generated = self.rope_scaling(&arch, &mut metadata, base, rope_dim, &values)?;
        Ok(HfConfig {
            arch,
            metadata,
            dims,
            tied,
            generated,
        })
    }

    /// Each of `arch.fixed` absent (its default) or the value the GGUF
    /// architecture computes with.
    fn check_fixed(&self, arch: &HfArchitecture) -> Result<(), HfError> {
        for fixed in arch.fixed {
            let ok = match self.json.get(fixed.hf) {
                None => fixed.default == fixed.expected,
                Some(value) => fixed.expected.matches(value),
            };
            if !ok {
                let found = self.json.get(fixed.hf).map_or_else(
                    || format!("absent (default {:?})", fixed.default),
                    Value::to_string,
                );
                return Err(self.bad(
                    fixed.hf,
                    format!("{found} is not supported for {}: {}", arch.class, fixed.why),
                ));
            }
        }
        Ok(())
    }

    /// The rotated width of a head: phi3's `partial_rotary_factor` (Phi-4
    /// mini's 0.75) as `rope.dimension_count`, `int(f * hidden_size) /
    /// heads` as the converter writes it; the whole head for the others.
    fn rope_dim(
        &self,
        arch: &HfArchitecture,
        dims: &Dims,
        metadata: &mut Vec<(String, MetadataValue)>,
    ) -> Result<usize, HfError> {
        const FIELD: &str = "partial_rotary_factor";
        if !arch.long_rope {
            return Ok(dims.head_dim);
        }
        let factor = self.number(FIELD)?.unwrap_or(1.0);
        let rope_dim = (factor * dims.n_embd as f64) as usize / dims.n_head;
        if !(factor > 0.0 && factor <= 1.0)
            || rope_dim == 0
            || !rope_dim.is_multiple_of(2)
            || rope_dim > dims.head_dim
        {
            return Err(self.bad(
                FIELD,
                format!(
                    "{factor} gives a rotated width of {rope_dim} of a head of {}",
                    dims.head_dim
                ),
            ));
        }
        let value = MetadataValue::U32(rope_dim as u32);
        metadata.push((format!("{}.rope.dimension_count", arch.gguf), value));
        Ok(rope_dim)
    }

    /// Gemma's `query_pre_attn_scalar`, which GGUF does not hold: the
    /// GGUF path scales queries by `1 / sqrt(head_dim)`, or by the width per
    /// head for the 27B models (gemma2 of 46 layers, gemma3 of 62) as
    /// llama.cpp does; a config.json asking for another scale is refused.
    fn query_scale(&self, arch: &HfArchitecture, dims: &Dims) -> Result<(), HfError> {
        const FIELD: &str = "query_pre_attn_scalar";
        if !matches!(arch.gguf, "gemma2" | "gemma3") {
            return Ok(());
        }
        let Some(value) = self.number(FIELD)? else {
            return Ok(());
        };
        let wide = matches!((arch.gguf, dims.n_layer), ("gemma3", 62) | ("gemma2", 46));
        let used = if wide {
            dims.n_embd / dims.n_head
        } else {
            dims.head_dim
        };
        if value != used as f64 {
            return Err(self.bad(
                FIELD,
                format!("{value}, where the GGUF architecture scales queries by 1/sqrt({used})"),
            ));
        }
        Ok(())
    }

    /// OLMo 3's `layer_types` (`sliding_attention` / `full_attention` per
    /// layer) as `attention.sliding_window_pattern`, one flag per layer as
    /// the converter writes it; absent, the GGUF default (all but every
    /// fourth layer slide) is transformers' default too.
    fn layer_types(
        &self,
        arch: &HfArchitecture,
        n_layer: usize,
        metadata: &mut Vec<(String, MetadataValue)>,
    ) -> Result<(), HfError> {
        let Some(value) = self.present("layer_types") else {
            return Ok(());
        };
        let flags = value
            .as_array()
            .filter(|items| items.len() == n_layer)
            .and_then(|items| {
                items
                    .iter()
                    .map(|item| match item.as_str() {
                        Some("sliding_attention") => Some(MetadataValue::Bool(true)),
                        Some("full_attention") => Some(MetadataValue::Bool(false)),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| {
                self.bad(
                    "layer_types",
                    format!("expected {n_layer} of \"sliding_attention\" or \"full_attention\""),
                )
            })?;
        metadata.push((
            format!("{}.attention.sliding_window_pattern", arch.gguf),
            MetadataValue::Array(flags),
        ));
        Ok(())
    }

    /// `rope_scaling`: none, `default`, `linear`, `yarn` (GGUF keys), `llama3`
    /// (llama only: the factors tensor) or LongRoPE (phi3: two factor
    /// tensors and the attention factor); anything else is refused by name.
    fn rope_scaling(
        &self,
        arch: &HfArchitecture,
        metadata: &mut Vec<(String, MetadataValue)>,
        base: f64,
        rope_dim: usize,
        values: &std::collections::HashMap<&str, MetadataValue>,
    ) -> Result<Vec<(String, Vec<f32>)>, HfError> {
        let Some(value) = self.present("rope_scaling") else {
            return Ok(Vec::new());
        };
        let Some(scaling) = value.as_object() else {
            return Err(self.bad("rope_scaling", "expected an object"));
        };
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(Value::as_str)
            .ok_or_else(|| self.bad("rope_scaling.rope_type", "missing"))?;
        let number = |name: &str, default: Option<f64>| -> Result<f64, HfError> {
            match scaling.get(name) {
                Some(value) => value
                    .as_f64()
                    .ok_or_else(|| self.bad(&format!("rope_scaling.{name}"), "expected a number")),
                None => default.ok_or_else(|| HfError::MissingField {
                    path: self.path.clone(),
                    field: format!("rope_scaling.{name}"),
                }),
            }
        };
        let key = |suffix: &str| format!("{}.rope.scaling.{suffix}", arch.gguf);
        match kind {
            "default" => Ok(Vec::new()),
            "linear" => {
                metadata.push((key("type"), MetadataValue::String("linear".into())));
                let factor = number("factor", None)?;
                metadata.push((key("factor"), MetadataValue::F32(factor as f32)));
                Ok(Vec::new())
            }
            "longrope" | "su" if arch.long_rope => {
                let count = |name: &str| match values.get(name) {
                    Some(MetadataValue::U32(v)) => f64::from(*v),
                    _ => 0.0,
                };
                let (context, original) = (
                    count("max_position_embeddings"),
                    count("original_max_position_embeddings"),
                );
                // transformers' `_compute_longrope_parameters`: the given
                // attention factor, else sqrt(1 + ln(s) / ln(original)).
                let scale = context / original;
                let computed = if scale > 1.0 {
                    (1.0 + scale.ln() / original.ln()).sqrt()
                } else {
                    1.0
                };
                let attn_factor = number("attention_factor", Some(computed))?;
                metadata.push((key("attn_factor"), MetadataValue::F32(attn_factor as f32)));
                let mut tensors = Vec::new();
                for (hf, gguf) in [
                    ("long_factor", "rope_factors_long.weight"),
                    ("short_factor", "rope_factors_short.weight"),
                ] {
                    let field = format!("rope_scaling.{hf}");
                    let factors = scaling
                        .get(hf)
                        .and_then(Value::as_array)
                        .ok_or_else(|| HfError::MissingField {
                            path: self.path.clone(),
                            field: field.clone(),
                        })?
                        .iter()
                        .map(|v| v.as_f64().map(|v| v as f32))
                        .collect::<Option<Vec<f32>>>()
                        .filter(|f| f.len() == rope_dim / 2)
                        .ok_or_else(|| {
                            self.bad(&field, format!("expected {} numbers", rope_dim / 2))
                        })?;
                    if factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
                        return Err(self.bad(&field, "a factor that is not finite and positive"));
                    }
                    tensors.push((gguf.to_owned(), factors));
                }
                Ok(tensors)
            }
            // llama.cpp's YaRN: ramp bounds beta_fast 32 and beta_slow 1
            // (read from no key), the range rounded outwards whatever
            // `truncate` says (gpt-oss's false is transformers' alone, as
            // the converter drops it), magnitude 1 + 0.1 ln(factor).
            "yarn" => {
                for (name, used) in [("beta_fast", 32.0), ("beta_slow", 1.0)] {
                    let value = number(name, Some(used))?;
                    if value != used {
                        return Err(self.bad(
                            &format!("rope_scaling.{name}"),
                            format!("{value}, where the GGUF path's YaRN uses {used}"),
                        ));
                    }
                }
                for name in ["attention_factor", "mscale", "mscale_all_dim"] {
                    if scaling.get(name).is_some_and(|v| !v.is_null()) {
                        return Err(self.bad(
                            &format!("rope_scaling.{name}"),
                            "not supported: the GGUF path's YaRN magnitude is 1 + 0.1 ln(factor)",
                        ));
                    }
                }
                let factor = number("factor", None)?;
                if !(factor >= 1.0 && factor.is_finite()) {
                    return Err(
                        self.bad("rope_scaling.factor", format!("{factor} is not at least 1"))
                    );
                }
                metadata.push((key("type"), MetadataValue::String("yarn".into())));
                metadata.push((key("factor"), MetadataValue::F32(factor as f32)));
                if scaling.get("original_max_position_embeddings").is_some() {
                    let original = number("original_max_position_embeddings", None)?;
                    let original =
                        self.count("rope_scaling.original_max_position_embeddings", original)?;
                    metadata.push((key("original_context_length"), MetadataValue::U32(original)));
                }
                Ok(Vec::new())
            }
            "llama3" if arch.gguf == "llama" => {
                let factors = Llama3Scaling {
                    factor: number("factor", Some(8.0))?,
                    low_freq_factor: number("low_freq_factor", Some(1.0))?,
                    high_freq_factor: number("high_freq_factor", Some(4.0))?,
                    original_context: number("original_max_position_embeddings", Some(8192.0))?,
                }
                .factors(base, rope_dim);
                if factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
                    return Err(self.bad("rope_scaling", "gives non-finite frequency factors"));
                }
                Ok(vec![("rope_freqs.weight".to_owned(), factors)])
            }
            other => Err(self.bad(
                "rope_scaling.rope_type",
                format!("{other:?} is not supported for {}", arch.class),
            )),
        }
    }
}

/// Llama 3.1's RoPE scaling: a factor per rotated pair, computed as
/// `convert_hf_to_gguf.py` does for `rope_freqs.weight` (pairs of short
/// wavelength kept, long ones divided by `factor`, a smooth blend between).
struct Llama3Scaling {
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_context: f64,
}

impl Llama3Scaling {
    fn factors(&self, base: f64, head_dim: usize) -> Vec<f32> {
        let low_freq_wavelen = self.original_context / self.low_freq_factor;
        let high_freq_wavelen = self.original_context / self.high_freq_factor;
        (0..head_dim)
            .step_by(2)
            .map(|i| {
                let freq = 1.0 / base.powf(i as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let factor = if wavelen < high_freq_wavelen {
                    1.0
                } else if wavelen > low_freq_wavelen {
                    self.factor
                } else {
                    let smooth = (self.original_context / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    1.0 / ((1.0 - smooth) / self.factor + smooth)
                };
                factor as f32
            })
            .collect()
    }
}
