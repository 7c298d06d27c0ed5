//! `lm-cli quantize IN OUT TYPE`: requantize a GGUF model, as llama.cpp's
//! `llama-quantize` does.
//!
//! Every tensor llama.cpp would quantize (src/llama-quant.cpp,
//! `tensor_allows_quantization`: a weight of two or more dimensions that is
//! not a norm, an expert router, a position or token-type embedding, ...) is
//! dequantized to f32 row by row and quantized to TYPE with ggml's reference
//! algorithm (`GgmlType::quantize_row`: the same blocks as llama-quantize's).
//! The others are copied as they are. The output tensor (or the token
//! embedding when the output is tied to it) follows llama.cpp's rule for
//! it: Q6_K when its rows are a multiple of 256, else Q8_0. A tensor
//! already of its target type is copied, as llama.cpp does. The metadata is copied, with `general.file_type` and
//! `general.quantization_version` set and the split keys removed.
//!
//! From a Hugging Face directory the `tokenizer.*` keys are written from its
//! `tokenizer.json` (a byte-level BPE: tokens, token types, merges) and
//! `tokenizer_config.json` (BOS, EOS, whether BOS is added, the chat
//! template), as `convert_hf_to_gguf.py` writes them, so that llama.cpp
//! runs the output.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use lm_model::{GgmlType, GgufFile, GgufWriter, MetadataValue, QuantizeError, TensorInfo};
use rayon::prelude::*;

use crate::commands::configure_threads;

/// `lm-cli quantize`.
#[derive(Debug, Clone, Args)]
pub struct QuantizeArgs {
    /// The GGUF model to read (any type this program reads).
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// The GGUF file to write (replaced only once complete; never IN).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// The type of the quantized weights.
    #[arg(value_name = "TYPE", ignore_case = true)]
    pub ty: QuantType,
    /// Worker threads (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<u64>,
}

/// The help's examples and rules.
pub const QUANTIZE_HELP: &str = "\
EXAMPLES:
  lm-cli quantize SmolLM2-135M-Instruct.Q8_0.gguf smollm2-q4_0.gguf q4_0
  lm-cli quantize model-f16.gguf model-q8_0.gguf Q8_0 --threads 2

WHAT IS QUANTIZED (llama.cpp's rules, src/llama-quant.cpp):
  weights of two or more dimensions, but norms, expert routers (ffn_gate_inp),
  position and token-type embeddings: to TYPE, with ggml's reference algorithm
  (the same bytes as llama-quantize's for every TYPE).
  1-D tensors and norms are copied as they are (F32 stays F32).
  output.weight (or token_embd.weight when the output is tied to it): Q8_0 when
  TYPE is q8_0 or its rows are not a multiple of 256, else Q6_K.
  q2_k, q3_k_s, q3_k_m (q3_k), q3_k_l, q4_k_s, q4_k_m (q4_k), q5_k_s,
  q5_k_m (q5_k), iq4_nl, iq4_xs: llama.cpp's mixes for dense models (attn_v,
  attn_output and ffn_down get more bits, some by layer; q2_k's attn_v 3
  bits, or 4 where four or more query heads share a key head; the iq4 types'
  attn_v 5 bits there).
  K-quants fall back where rows are not a multiple of 256: q2_K and q3_K to
  q4_0, q4_K to q5_0, q5_K to q5_1, q6_K to q8_0, iq4_xs to iq4_nl; rows
  that not even 32 divides to f16.
  A tensor already of its target type is copied.
  Not written yet: q2_k_s and the i-quants below 4 bits; mixture-of-experts
  rules.";

/// The file types `lm-cli quantize` writes, with llama.cpp's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuantType {
    /// 8-bit, blocks of 32 (llama.cpp's Q8_0).
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit with a scale, blocks of 32.
    #[value(name = "q4_0")]
    Q4_0,
    /// 4-bit with a scale and a minimum, blocks of 32.
    #[value(name = "q4_1")]
    Q4_1,
    /// 5-bit with a scale, blocks of 32.
    #[value(name = "q5_0")]
    Q5_0,
    /// 5-bit with a scale and a minimum, blocks of 32.
    #[value(name = "q5_1")]
    Q5_1,
    /// 6-bit K-quant, super-blocks of 256 (rows of other lengths: Q8_0).
    #[value(name = "q6_k")]
    Q6K,
    /// 2-bit K-quants, attn_v, attn_output and ffn_down 3-bit or more
    /// (llama.cpp's Q2_K mix).
    #[value(name = "q2_k")]
    Q2K,
    /// 3-bit K-quants (llama.cpp's Q3_K_S mix).
    #[value(name = "q3_k_s")]
    Q3KS,
    /// 3-bit K-quants, attn_v, attn_output and ffn_down 4- or 5-bit
    /// (llama.cpp's Q3_K_M mix, its Q3_K).
    #[value(name = "q3_k_m", alias = "q3_k")]
    Q3KM,
    /// 3-bit K-quants, attn_v, attn_output and ffn_down 5-bit (llama.cpp's
    /// Q3_K_L mix).
    #[value(name = "q3_k_l")]
    Q3KL,
    /// 4-bit K-quants, the first four attention-V and first eighth of
    /// ffn_down tensors 5-bit (llama.cpp's Q4_K_S mix).
    #[value(name = "q4_k_s")]
    Q4KS,
    /// 4-bit K-quants, a third of the attention-V and ffn_down tensors 6-bit
    /// (llama.cpp's Q4_K_M mix, its Q4_K).
    #[value(name = "q4_k_m", alias = "q4_k")]
    Q4KM,
    /// 5-bit K-quants (llama.cpp's Q5_K_S mix).
    #[value(name = "q5_k_s")]
    Q5KS,
    /// 5-bit K-quants, a third of the attention-V and ffn_down tensors 6-bit
    /// (llama.cpp's Q5_K_M mix, its Q5_K).
    #[value(name = "q5_k_m", alias = "q5_k")]
    Q5KM,
    /// 4-bit non-linear, blocks of 32 (llama.cpp's IQ4_NL mix).
    #[value(name = "iq4_nl")]
    Iq4Nl,
    /// 4-bit non-linear, super-blocks of 256 with 6-bit group scales
    /// (llama.cpp's IQ4_XS mix).
    #[value(name = "iq4_xs")]
    Iq4Xs,
    /// Half precision.
    #[value(name = "f16")]
    F16,
    /// bfloat16.
    #[value(name = "bf16")]
    Bf16,
    /// Single precision.
    #[value(name = "f32")]
    F32,
}

impl QuantType {
    /// The tensor type and llama.cpp's file type id (`llama_ftype`).
    fn types(self) -> (GgmlType, u32) {
        match self {
            QuantType::Q8_0 => (GgmlType::Q8_0, 7),
            QuantType::Q4_0 => (GgmlType::Q4_0, 2),
            QuantType::Q4_1 => (GgmlType::Q4_1, 3),
            QuantType::Q5_0 => (GgmlType::Q5_0, 8),
            QuantType::Q5_1 => (GgmlType::Q5_1, 9),
            QuantType::Q6K => (GgmlType::Q6_K, 18),
            QuantType::Q2K => (GgmlType::Q2_K, 10),
            QuantType::Q3KS => (GgmlType::Q3_K, 11),
            QuantType::Q3KM => (GgmlType::Q3_K, 12),
            QuantType::Q3KL => (GgmlType::Q3_K, 13),
            QuantType::Iq4Nl => (GgmlType::IQ4_NL, 25),
            QuantType::Iq4Xs => (GgmlType::IQ4_XS, 30),
            QuantType::Q4KS => (GgmlType::Q4_K, 14),
            QuantType::Q4KM => (GgmlType::Q4_K, 15),
            QuantType::Q5KS => (GgmlType::Q5_K, 16),
            QuantType::Q5KM => (GgmlType::Q5_K, 17),
            QuantType::F16 => (GgmlType::F16, 1),
            QuantType::Bf16 => (GgmlType::BF16, 32),
            QuantType::F32 => (GgmlType::F32, 0),
        }
    }
}

/// ggml's `GGML_QNT_VERSION`, written as `general.quantization_version`.
const QUANTIZATION_VERSION: u32 = 2;

/// What happens to one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Copied as it is: not a tensor llama.cpp quantizes.
    Keep,
    /// Copied: already of its target type.
    Same,
    /// Dequantized and quantized to this type.
    Quantize(GgmlType),
    /// Copied: llama.cpp would make it this type, which cannot be written
    /// (no file type offered here reaches one; the i-quants would).
    Unwritable(GgmlType),
}

/// Runs `lm-cli quantize`.
pub fn run(args: QuantizeArgs) -> Result<()> {
    configure_threads(args.threads)?;
    refuse_same_file(&args.input, &args.output)?;
    let reading = || format!("reading {}", args.input.display());
    // A Hugging Face directory is read as the GGUF its conversion gives.
    let input = if args.input.is_dir() {
        lm_model::open_hf_dir(&args.input).with_context(reading)?
    } else {
        GgufFile::map(&args.input).with_context(reading)?
    };
    let file_type = args.ty.types().1;
    // llama.cpp's order (its loader's `weight_name_comparer`): tensors
    // outside the blocks first, then block by block, by name within each.
    let mut tensors: Vec<&TensorInfo> = input.tensors().iter().collect();
    tensors.sort_by_cached_key(|t| (layer_of(&t.name), t.name.clone()));
    let arch = input.get_str("general.architecture").unwrap_or_default();
    let n_layer = input.get_u32(&format!("{arch}.block_count")).map_or_else(
        |_| {
            tensors
                .iter()
                .filter(|t| t.name.contains("ffn_down"))
                .count()
        },
        |n| n as usize,
    );
    let n_gqa = gqa_ratio(&input, arch);
    let mut rules = Rules::new(args.ty, &tensors, n_layer, n_gqa);
    let plans = tensors
        .iter()
        .map(|info| rules.plan(info))
        .collect::<Result<Vec<_>>>()?;

    let mut writer = GgufWriter::new();
    for (key, value) in input.metadata() {
        writer.set(key, value.clone());
    }
    // ggml's gguf_set_val moves a key it sets to the end: these two last.
    let set_last = ["general.quantization_version", "general.file_type"];
    if args.input.is_dir() {
        for (key, value) in hf_tokenizer_keys(&args.input)? {
            writer.set(&key, value);
        }
    }
    for key in ["split.no", "split.count", "split.tensors.count"]
        .iter()
        .chain(&set_last)
    {
        writer.remove(key);
    }
    writer.set(
        "general.quantization_version",
        MetadataValue::U32(QUANTIZATION_VERSION),
    );
    writer.set("general.file_type", MetadataValue::U32(file_type));
    for (info, plan) in tensors.iter().zip(&plans) {
        let ty = match *plan {
            Plan::Quantize(ty) => ty,
            _ => info.ggml_type,
        };
        writer.add_tensor(&info.name, &info.dims, ty)?;
    }
    writer
        .write(&args.output, |idx, out_info| {
            let view = input.tensor(&out_info.name)?;
            match plans[idx] {
                Plan::Quantize(ty) => Ok(requantize(&view.matrix()?, ty)?),
                _ => Ok(view.data.to_vec()),
            }
        })
        .with_context(|| format!("writing {}", args.output.display()))?;
    print_summary(&tensors, &plans, writer.tensors(), &args.output);
    Ok(())
}

/// The `tokenizer.*` keys of the Hugging Face directory `dir`, as
/// `convert_hf_to_gguf.py` writes them for a byte-level BPE (its
/// `_set_vocab_gpt2`): the tokens in id order, their types (1 normal, 3 a
/// special added token, 4 another added token), the merges, the special
/// ids, whether BOS is added, the chat template. `tokenizer.ggml.pre` names
/// the pre-tokenizer llama.cpp applies: `smollm` for single digits then
/// GPT-2's regex (SmolLM2), `gpt-2` for GPT-2's regex alone, else
/// `default` (llama.cpp's fallback; its pre-tokenizer may then split text
/// differently from `tokenizer.json`, never the ids given to the model).
fn hf_tokenizer_keys(dir: &Path) -> Result<Vec<(String, MetadataValue)>> {
    let path = dir.join("tokenizer.json");
    let read = || format!("reading {}", path.display());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).with_context(read)?)
            .with_context(read)?;
    let byte_level = json["decoder"]["type"] == "ByteLevel";
    if json["model"]["type"] != "BPE" || !byte_level {
        bail!(
            "{}: only a byte-level BPE tokenizer is written to GGUF (model {}, decoder {})",
            path.display(),
            json["model"]["type"],
            json["decoder"]["type"]
        );
    }
    let merges = json["model"]["merges"]
        .as_array()
        .with_context(|| format!("{}: model.merges is not a list", path.display()))?
        .iter()
        .map(|merge| match merge {
            serde_json::Value::String(pair) => Some(pair.clone()),
            serde_json::Value::Array(pair) => match &pair[..] {
                [a, b] => Some(format!("{} {}", a.as_str()?, b.as_str()?)),
                _ => None,
            },
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .with_context(|| format!("{}: a merge is not a pair", path.display()))?;
    let added: std::collections::HashSet<u64> = json["added_tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|token| token["id"].as_u64())
        .collect();
    let text = lm::GgufText::from_hf_dir(dir).with_context(read)?;
    let tokenizer = &text.tokenizer;
    let n_vocab = tokenizer.vocab_size() as u32;
    let tokens = (0..n_vocab)
        .map(|id| {
            let token = tokenizer.token_text(id).unwrap_or_default();
            MetadataValue::String(token.to_owned())
        })
        .collect();
    let types = (0..n_vocab)
        .map(
            |id| match (tokenizer.is_special(id), added.contains(&u64::from(id))) {
                (true, _) => MetadataValue::I32(3),
                (false, true) => MetadataValue::I32(4),
                (false, false) => MetadataValue::I32(1),
            },
        )
        .collect();
    let pre = &json["pre_tokenizer"];
    let is_gpt2_byte_level =
        |p: &serde_json::Value| p["type"] == "ByteLevel" && p["use_regex"] != false;
    let pre = match pre["pretokenizers"].as_array().map(Vec::as_slice) {
        Some([digits, level])
            if digits["type"] == "Digits"
                && digits["individual_digits"] == true
                && is_gpt2_byte_level(level) =>
        {
            "smollm"
        }
        _ if is_gpt2_byte_level(pre) => "gpt-2",
        _ => "default",
    };
    let mut keys = vec![
        ("tokenizer.ggml.model", MetadataValue::String("gpt2".into())),
        ("tokenizer.ggml.pre", MetadataValue::String(pre.into())),
        ("tokenizer.ggml.tokens", MetadataValue::Array(tokens)),
        ("tokenizer.ggml.token_type", MetadataValue::Array(types)),
        (
            "tokenizer.ggml.merges",
            MetadataValue::Array(merges.into_iter().map(MetadataValue::String).collect()),
        ),
        (
            "tokenizer.ggml.add_bos_token",
            MetadataValue::Bool(tokenizer.add_bos()),
        ),
    ];
    if let Some(id) = tokenizer.bos_id() {
        keys.push(("tokenizer.ggml.bos_token_id", MetadataValue::U32(id)));
    }
    if let Some(id) = tokenizer.eos_id() {
        keys.push(("tokenizer.ggml.eos_token_id", MetadataValue::U32(id)));
    }
    if let Some(template) = tokenizer.chat_template() {
        keys.push((
            "tokenizer.chat_template",
            MetadataValue::String(template.into()),
        ));
    }
    Ok(keys.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// Refuses OUT when it is IN (the same file by device and inode, whatever
/// the paths): IN is mapped while OUT is written.
fn refuse_same_file(input: &Path, output: &Path) -> Result<()> {
    let same = match (std::fs::metadata(input), std::fs::metadata(output)) {
        (Ok(i), Ok(o)) => i.dev() == o.dev() && i.ino() == o.ino(),
        _ => false,
    };
    if same || input == output {
        bail!(
            "the output {} is the input {}: write to another file",
            output.display(),
            input.display()
        );
    }
    Ok(())
}

/// llama.cpp's `n_gqa()`: query heads per key-value head in the first
/// layer (`head_count_kv` defaults to `head_count`; 0 without heads).
fn gqa_ratio(input: &GgufFile, arch: &str) -> usize {
    // A count is one number, or one per layer.
    let first = |key: &str| -> Option<usize> {
        let key = format!("{arch}.attention.{key}");
        input.get_u32(&key).map(|n| n as usize).ok().or_else(|| {
            let counts = input.get_i32_array(&key).ok()?;
            usize::try_from(*counts.first()?).ok()
        })
    };
    let n_head = first("head_count").unwrap_or(0);
    match first("head_count_kv").unwrap_or(n_head) {
        0 => 0,
        n_head_kv => n_head / n_head_kv,
    }
}

/// llama.cpp's `tensor_allows_quantization` for the architectures this
/// program reads: a weight of two or more dimensions that is not a norm,
/// an expert router or a position / token-type embedding.
fn allows_quantization(info: &TensorInfo) -> bool {
    const EXCLUDED: [&str; 7] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "attn_rel_b.weight",
    ];
    // ggml_n_dims: the dimensions up to the last one above 1.
    let n_dims = info.dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    n_dims >= 2
        && info.name.ends_with("weight")
        && !EXCLUDED.iter().any(|part| info.name.contains(part))
        && info.name != "position_embd.weight"
        && info.name != "token_types.weight"
}

/// llama.cpp's choice of type per tensor (`llama_tensor_get_type` with no
/// overrides and no importance matrix), with its counters: tensors must be
/// planned in the order they are written (by layer), as llama.cpp counts
/// them.
struct Rules {
    ty: QuantType,
    default_type: GgmlType,
    has_output: bool,
    n_layer: usize,
    /// Query heads per key-value head (llama.cpp's `n_gqa`).
    n_gqa: usize,
    n_attn_v: usize,
    i_attn_v: usize,
    i_ffn_down: usize,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and
/// every third one between, which the _M mixes give more bits.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// llama.cpp's attention-V tensors (the most sensitive to quantization).
fn is_attn_v(name: &str) -> bool {
    ["attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight"]
        .iter()
        .any(|part| name.contains(part))
}

impl Rules {
    fn new(ty: QuantType, tensors: &[&TensorInfo], n_layer: usize, n_gqa: usize) -> Rules {
        Rules {
            ty,
            default_type: ty.types().0,
            has_output: tensors.iter().any(|t| t.name == "output.weight"),
            n_layer,
            n_gqa,
            n_attn_v: tensors.iter().filter(|t| is_attn_v(&t.name)).count(),
            i_attn_v: 0,
            i_ffn_down: 0,
        }
    }

    /// What llama.cpp would do with `info`.
    fn plan(&mut self, info: &TensorInfo) -> Result<Plan> {
        if !allows_quantization(info) {
            return Ok(Plan::Keep);
        }
        let mut target = self.default_type;
        if target.is_quantized() {
            target = self.mix_type(info);
            target = fallback(info, target)?;
        }
        Ok(if target == info.ggml_type {
            Plan::Same
        } else if target.can_quantize() {
            Plan::Quantize(target)
        } else {
            Plan::Unwritable(target)
        })
    }

    /// The type the file type's mix gives `info` (llama.cpp's
    /// `llama_tensor_get_type_impl` for these file types, dense models;
    /// not its rules for Falcon, for 70B models or for 8 experts).
    fn mix_type(&mut self, info: &TensorInfo) -> GgmlType {
        let name = info.name.as_str();
        let is_output =
            name == "output.weight" || (!self.has_output && name == "token_embd.weight");
        let default = self.default_type;
        if is_output {
            return if !info.n_cols().is_multiple_of(default.block_size())
                || default == GgmlType::Q8_0
            {
                GgmlType::Q8_0
            } else {
                GgmlType::Q6_K
            };
        }
        if is_attn_v(name) {
            let i = self.i_attn_v;
            self.i_attn_v += 1;
            return match self.ty {
                QuantType::Q2K if self.n_gqa >= 4 => GgmlType::Q4_K,
                QuantType::Q2K => GgmlType::Q3_K,
                QuantType::Q3KM if i < 2 => GgmlType::Q5_K,
                QuantType::Q3KM => GgmlType::Q4_K,
                QuantType::Q3KL => GgmlType::Q5_K,
                QuantType::Iq4Nl | QuantType::Iq4Xs if self.n_gqa >= 4 => GgmlType::Q5_K,
                QuantType::Q4KM | QuantType::Q5KM if use_more_bits(i, self.n_attn_v) => {
                    GgmlType::Q6_K
                }
                QuantType::Q4KS if i < 4 => GgmlType::Q5_K,
                _ => default,
            };
        }
        if name.contains("attn_output.weight") {
            return match self.ty {
                QuantType::Q2K => GgmlType::Q3_K,
                QuantType::Q3KM => GgmlType::Q4_K,
                QuantType::Q3KL => GgmlType::Q5_K,
                _ => default,
            };
        }
        if name.contains("ffn_down") {
            let i = self.i_ffn_down;
            self.i_ffn_down += 1;
            return match self.ty {
                QuantType::Q2K => GgmlType::Q3_K,
                QuantType::Q3KM if i < self.n_layer / 16 => GgmlType::Q5_K,
                QuantType::Q3KM => GgmlType::Q4_K,
                QuantType::Q3KL => GgmlType::Q5_K,
                QuantType::Q4KM | QuantType::Q5KM if use_more_bits(i, self.n_layer) => {
                    GgmlType::Q6_K
                }
                QuantType::Q4KS | QuantType::Iq4Nl | QuantType::Iq4Xs if i < self.n_layer / 8 => {
                    GgmlType::Q5_K
                }
                _ => default,
            };
        }
        default
    }
}

/// llama.cpp's fallback for rows a type cannot hold (`tensor_type_fallback`):
/// a type of super-blocks to the 32-block type of about as many bits, then
/// F16 if even 32 does not divide the rows (a 32-block type goes to F16
/// directly).
fn fallback(info: &TensorInfo, target: GgmlType) -> Result<GgmlType> {
    let n_cols = info.n_cols();
    if n_cols.is_multiple_of(target.block_size()) {
        return Ok(target);
    }
    let fallback = match target {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        _ if target.block_size() <= 32 => target,
        _ => bail!(
            "{}: rows of {n_cols} are not a multiple of {} (required for {target}; llama.cpp has no fallback either)",
            info.name,
            target.block_size()
        ),
    };
    Ok(if n_cols.is_multiple_of(fallback.block_size()) {
        fallback
    } else {
        GgmlType::F16
    })
}

/// The rows of `matrix` dequantized to f32 and quantized to `ty`, in
/// parallel (each row alone, so the bytes do not depend on the threads).
fn requantize(matrix: &lm_model::QMatrix<'_>, ty: GgmlType) -> Result<Vec<u8>> {
    let n_cols = matrix.n_cols();
    let row_bytes = ty.row_bytes(n_cols)?;
    let mut out = vec![0u8; row_bytes * matrix.n_rows()];
    out.par_chunks_mut(row_bytes)
        .enumerate()
        .try_for_each_init(
            || vec![0f32; n_cols],
            |row, (idx, dst)| -> Result<(), QuantizeError> {
                matrix.dequantize_row(idx, row)?;
                ty.quantize_row(row, dst)
            },
        )?;
    Ok(out)
}

/// One line per kind of tensor (its name with the layer number as `*`):
/// how many, their types in and out, and what was done; then the sizes.
fn print_summary(inputs: &[&TensorInfo], plans: &[Plan], outputs: &[TensorInfo], path: &Path) {
    let mut kinds: BTreeMap<(String, String), (usize, GgmlType, GgmlType, Plan)> = BTreeMap::new();
    for ((info, plan), out) in inputs.iter().zip(plans).zip(outputs) {
        let kind = kind_of(&info.name);
        let key = (kind, format!("{}{}", info.ggml_type, out.ggml_type));
        let entry = kinds
            .entry(key)
            .or_insert((0, info.ggml_type, out.ggml_type, *plan));
        entry.0 += 1;
    }
    for ((kind, _), (count, from, to, plan)) in &kinds {
        let what = match plan {
            Plan::Keep => "copied (not quantized by llama.cpp's rules)".to_string(),
            Plan::Same => "copied (already the target type)".to_string(),
            Plan::Quantize(_) => "quantized".to_string(),
            Plan::Unwritable(ty) => {
                format!("copied (llama-quantize makes it {ty}, which cannot be written yet)")
            }
        };
        println!("{kind:<28} {count:>4} x {from:>5} -> {to:<5} {what}");
    }
    let size_in: usize = inputs.iter().map(|i| i.n_bytes).sum();
    let size_out: usize = outputs.iter().map(|i| i.n_bytes).sum();
    println!(
        "wrote {}: {} tensors, {} -> {} of weights",
        path.display(),
        outputs.len(),
        megabytes(size_in),
        megabytes(size_out)
    );
}

/// `n_bytes` in MB, or KB below one MB.
fn megabytes(n_bytes: usize) -> String {
    if n_bytes < 1_000_000 {
        format!("{:.1} KB", n_bytes as f64 / 1e3)
    } else {
        format!("{:.1} MB", n_bytes as f64 / 1e6)
    }
}

/// The block number of `blk.N.*` names, -1 for the others (sorted first).
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// `blk.12.attn_q.weight` -> `blk.*.attn_q.weight`.
fn kind_of(name: &str) -> String {
    name.split('.')
        .map(|part| {
            if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, dims: &[usize], ty: GgmlType) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type: ty,
            offset: 0,
            n_bytes: 0,
        }
    }

    /// One tensor planned alone under `ty`, the file having an output tensor
    /// when `has_output`.
    fn plan(info: &TensorInfo, ty: QuantType, has_output: bool) -> Result<Plan> {
        let output = TensorInfo {
            name: "output.weight".into(),
            ..info.clone()
        };
        let tensors: Vec<&TensorInfo> = if has_output { vec![&output] } else { vec![] };
        Rules::new(ty, &tensors, 16, 1).plan(info)
    }

    /// llama.cpp's choices (src/llama-quant.cpp) for the tensors of a llama
    /// file quantized to Q4_0 and Q8_0.
    #[test]
    fn plans_follow_llama_cpp() {
        let (f16, f32) = (GgmlType::F16, GgmlType::F32);
        let (q4_0, quantize) = (QuantType::Q4_0, Plan::Quantize);
        let (output, embd) = ("output.weight", "token_embd.weight");
        // (name, dims, stored type, quantized to, the file has an output
        // tensor, the plan)
        let attn_q = "blk.0.attn_q.weight";
        #[rustfmt::skip]
        let cases = [
            (attn_q, &[2048, 2048][..], f16, q4_0, true, quantize(GgmlType::Q4_0)),
            ("blk.0.attn_norm.weight", &[2048], f32, q4_0, true, Plan::Keep),
            ("blk.0.attn_q_norm.weight", &[64, 1], f32, q4_0, true, Plan::Keep),
            ("blk.0.ffn_gate_inp.weight", &[64, 8], f16, q4_0, true, Plan::Keep),
            ("blk.0.attn_q.bias", &[64, 2], f16, q4_0, true, Plan::Keep),
            // The output (or the tied embedding): Q6_K where rows are a multiple of 256.
            (output, &[2048, 32000], f16, q4_0, true, quantize(GgmlType::Q6_K)),
            (embd, &[2048, 32000], f16, q4_0, true, quantize(GgmlType::Q4_0)),
            (embd, &[2048, 32000], f16, q4_0, false, quantize(GgmlType::Q6_K)),
            (embd, &[576, 49152], f16, q4_0, false, quantize(GgmlType::Q8_0)),
            (embd, &[576, 49152], GgmlType::Q8_0, q4_0, false, Plan::Same),
            (output, &[2048, 32000], f16, QuantType::Q8_0, true, quantize(GgmlType::Q8_0)),
            (output, &[2048, 32000], f16, QuantType::F32, true, quantize(GgmlType::F32)),
            // K-quants fall back where rows are not a multiple of 256.
            (attn_q, &[576, 576], f16, QuantType::Q4KS, true, quantize(GgmlType::Q5_0)),
            (attn_q, &[576, 576], f16, QuantType::Q5KM, true, quantize(GgmlType::Q5_1)),
            (attn_q, &[576, 576], f16, QuantType::Q6K, true, quantize(GgmlType::Q8_0)),
        ];
        for (name, dims, ty, to, has_output, expected) in cases {
            let planned = plan(&info(name, dims, ty), to, has_output).unwrap();
            assert_eq!(
                planned, expected,
                "{name} {dims:?} {ty} to {to:?}, output {has_output}"
            );
        }
        // Rows that not even 32 divides: F16, as llama.cpp does.
        let odd = info("blk.0.ffn_down.weight", &[40, 8], f16);
        assert_eq!(plan(&odd, q4_0, true).unwrap(), Plan::Same);
        let odd = info("blk.0.ffn_down.weight", &[40, 8], f32);
        assert_eq!(plan(&odd, QuantType::Q4KM, true).unwrap(), quantize(f16));
    }

    /// The _M mixes give attn_v and ffn_down 6 bits on use_more_bits' layers
    /// (of 16: 0, 1, 4, 7, 10, 13, 14, 15), Q4_K_S 5 bits to the first four
    /// attn_v and the first two ffn_down.
    #[test]
    fn k_mixes_by_layer() {
        let names: Vec<String> = (0..16)
            .flat_map(|l| {
                [
                    format!("blk.{l}.attn_v.weight"),
                    format!("blk.{l}.ffn_down.weight"),
                ]
            })
            .collect();
        let infos: Vec<TensorInfo> = names
            .iter()
            .map(|n| info(n, &[2048, 2048], GgmlType::F16))
            .collect();
        let refs: Vec<&TensorInfo> = infos.iter().collect();
        let types = |ty: QuantType, kind: &str| -> Vec<GgmlType> {
            let mut rules = Rules::new(ty, &refs, 16, 1);
            let plans: Vec<(String, Plan)> = refs
                .iter()
                .map(|i| (i.name.clone(), rules.plan(i).unwrap()))
                .collect();
            plans
                .into_iter()
                .filter(|(n, _)| n.contains(kind))
                .map(|(_, p)| match p {
                    Plan::Quantize(t) => t,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let six_at = |types: &[GgmlType]| -> Vec<usize> {
            (0..types.len())
                .filter(|&i| types[i] == GgmlType::Q6_K)
                .collect()
        };
        let more = [0, 1, 4, 7, 10, 13, 14, 15];
        assert_eq!(six_at(&types(QuantType::Q4KM, "attn_v")), more);
        assert_eq!(six_at(&types(QuantType::Q5KM, "ffn_down")), more);
        let s = types(QuantType::Q4KS, "attn_v");
        assert!(s[..4].iter().all(|&t| t == GgmlType::Q5_K) && s[4] == GgmlType::Q4_K);
        let s = types(QuantType::Q4KS, "ffn_down");
        assert!(s[..2].iter().all(|&t| t == GgmlType::Q5_K) && s[2] == GgmlType::Q4_K);
        assert!(
            types(QuantType::Q5KS, "ffn_down")
                .iter()
                .all(|&t| t == GgmlType::Q5_K)
        );
        // Q3_K_M: the first two attn_v and the first sixteenth of ffn_down
        // 5-bit, the others 4-bit; Q3_K_L 5-bit; Q3_K_S the default.
        let (q3, q4, q5) = (GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K);
        let v = types(QuantType::Q3KM, "attn_v");
        assert!(
            v[..2] == [q5, q5] && v[2..].iter().all(|&t| t == q4),
            "{v:?}"
        );
        let down = types(QuantType::Q3KM, "ffn_down");
        assert!(
            down[0] == q5 && down[1..].iter().all(|&t| t == q4),
            "{down:?}"
        );
        assert!(types(QuantType::Q3KL, "attn_v").iter().all(|&t| t == q5));
        assert!(types(QuantType::Q3KS, "ffn_down").iter().all(|&t| t == q3));
        assert!(types(QuantType::Q2K, "ffn_down").iter().all(|&t| t == q3));
    }

    /// Q2_K's attn_v: 3-bit, 4-bit where four or more query heads share a
    /// key-value head; its attn_output 3-bit; its attn_q the default.
    #[test]
    fn q2_k_mix_by_gqa() {
        let v = info("blk.0.attn_v.weight", &[256, 64], GgmlType::F16);
        let out = info("blk.0.attn_output.weight", &[256, 256], GgmlType::F16);
        let q = info("blk.0.attn_q.weight", &[256, 256], GgmlType::F16);
        let planned = |info: &TensorInfo, n_gqa| {
            Rules::new(QuantType::Q2K, &[info], 1, n_gqa)
                .plan(info)
                .unwrap()
        };
        assert_eq!(planned(&v, 3), Plan::Quantize(GgmlType::Q3_K));
        assert_eq!(planned(&v, 4), Plan::Quantize(GgmlType::Q4_K));
        assert_eq!(planned(&out, 4), Plan::Quantize(GgmlType::Q3_K));
        assert_eq!(planned(&q, 4), Plan::Quantize(GgmlType::Q2_K));
        let odd = info("blk.0.attn_q.weight", &[576, 576], GgmlType::F16);
        assert_eq!(planned(&odd, 3), Plan::Quantize(GgmlType::Q4_0));
    }

    #[test]
    fn kinds_and_layers() {
        assert_eq!(kind_of("blk.12.attn_q.weight"), "blk.*.attn_q.weight");
        assert_eq!(kind_of("output.weight"), "output.weight");
        assert_eq!(layer_of("blk.12.attn_q.weight"), 12);
        assert_eq!(layer_of("token_embd.weight"), -1);
    }
}
