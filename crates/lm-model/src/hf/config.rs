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
//! rms_norm_eps                   attention.layer_norm_rms_epsilon   required (gemma3 1e-6)
//! rope_theta                     rope.freq_base                     10000 (gemma3 1e6)
//! vocab_size                     vocab_size                         required
//! head_dim                       attention.key_length, value_length width / heads (gemma3 256)
//! sliding_window (gemma3)        attention.sliding_window           required
//! rope_scaling linear            rope.scaling.type, .factor
//! rope_scaling llama3 (llama)    the tensor rope_freqs.weight, as the converter computes it
//! tie_word_embeddings            no output.weight                   llama, qwen: false; gemma3: true
//! ```

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::HfError;
use crate::gguf::MetadataValue;

/// The Hugging Face classes (`architectures[0]`) this loader maps.
pub(crate) const SUPPORTED_CLASSES: [&str; 4] = [
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma3ForCausalLM",
];

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

const LLAMA: HfArchitecture = HfArchitecture {
    class: "LlamaForCausalLM",
    gguf: "llama",
    permute_qk: true,
    norm_plus_one: false,
    tied_default: false,
    defaults: &[],
    extra: &[],
};

/// The supported classes, in the order of [`SUPPORTED_CLASSES`].
pub(crate) const ARCHITECTURES: [HfArchitecture; 4] = [
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
        extra: &[field(
            "sliding_window",
            "attention.sliding_window",
            Kind::U32,
            true,
        )],
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
    /// Llama 3's per-pair RoPE frequency factors (`rope_freqs.weight`).
    pub rope_freqs: Option<Vec<f32>>,
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
    let json = read_json_object(&path)?;
    Fields {
        path: path.clone(),
        json: &json,
    }
    .config()
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
        let mut values = std::collections::HashMap::new();
        for field in COMMON.iter().chain(arch.extra) {
            let default = arch
                .defaults
                .iter()
                .find(|(name, _)| *name == field.hf)
                .map(|&(_, v)| v);
            let value = match (self.number(field.hf)?.or(default), field.required) {
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
        };
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
        let rope_freqs = self.rope_scaling(&arch, &mut metadata, base, head_dim)?;
        Ok(HfConfig {
            arch,
            metadata,
            dims,
            tied,
            rope_freqs,
        })
    }

    /// `rope_scaling`: none, `default`, `linear` (GGUF keys) or `llama3`
    /// (llama only: the factors tensor); anything else is refused by name.
    fn rope_scaling(
        &self,
        arch: &HfArchitecture,
        metadata: &mut Vec<(String, MetadataValue)>,
        base: f64,
        head_dim: usize,
    ) -> Result<Option<Vec<f32>>, HfError> {
        let Some(value) = self.present("rope_scaling") else {
            return Ok(None);
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
        match kind {
            "default" => Ok(None),
            "linear" => {
                let key = |suffix: &str| format!("{}.rope.scaling.{suffix}", arch.gguf);
                metadata.push((key("type"), MetadataValue::String("linear".into())));
                let factor = number("factor", None)?;
                metadata.push((key("factor"), MetadataValue::F32(factor as f32)));
                Ok(None)
            }
            "llama3" if arch.gguf == "llama" => {
                let factors = Llama3Scaling {
                    factor: number("factor", Some(8.0))?,
                    low_freq_factor: number("low_freq_factor", Some(1.0))?,
                    high_freq_factor: number("high_freq_factor", Some(4.0))?,
                    original_context: number("original_max_position_embeddings", Some(8192.0))?,
                }
                .factors(base, head_dim);
                if factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
                    return Err(self.bad("rope_scaling", "gives non-finite frequency factors"));
                }
                Ok(Some(factors))
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
