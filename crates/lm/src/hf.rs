//! Hugging Face model directories: [`load`] chooses by what the path is,
//! [`load_hf_dir`] reads a directory into the same [`GgufModel`] a GGUF
//! file gives.
//!
//! ```text
//! dir/config.json, *.safetensors ── lm_model::open_hf_dir ─> GgufFile ─> Llama::from_file ─> Decoder
//! dir/tokenizer.json ───────────── Tokenizer::from_json_str ─┐
//! dir/tokenizer_config.json ─ bos_token, eos_token,          ├─ with_hf_config ─> Tokenizer
//!     add_bos_token, added_tokens_decoder, chat_template ────┤
//!     (or dir/chat_template.jinja)                           │
//! dir/generation_config.json ─ eos_token_id (one or a list) ─┘  (+ sampling defaults: HfGeneration)
//! ```
//!
//! `transformers` reads these files so (`PreTrainedTokenizerFast`,
//! `GenerationConfig`); a chat template given as a list of named templates
//! contributes the one named "default".

use std::path::{Path, PathBuf};

use lm_core::TokenId;
use lm_model::{HfError, Llama};
use lm_tokenize::{HfTokenizerConfig, Tokenizer};
use serde_json::{Map, Value};

use crate::error::Error;
use crate::gguf::{GgufModel, GgufText, load_gguf};

/// Loads the model at `path`: a Hugging Face directory (`config.json`,
/// safetensors, `tokenizer.json`) when it is a directory, else a GGUF file.
pub fn load(path: impl AsRef<Path>) -> Result<GgufModel, Error> {
    let path = path.as_ref();
    if path.is_dir() {
        load_hf_dir(path)
    } else {
        load_gguf(path)
    }
}

/// Loads a Hugging Face model directory: the weights first (checked
/// against `config.json`), then the text side.
///
/// A failure is [`Error::Hf`] (the weights or config.json) or
/// [`Error::HfTokenizer`] (the tokenizer files), each naming the file and the
/// field.
pub fn load_hf_dir(dir: impl AsRef<Path>) -> Result<GgufModel, Error> {
    load_hf_dir_with(dir.as_ref(), None)
}

/// Loads a Hugging Face model directory as [`load_hf_dir`] does, its
/// matrices quantized to `ty` while loading
/// ([`lm_model::open_hf_dir_quantized`]: in-situ quantization).
pub fn load_hf_dir_quantized(
    dir: impl AsRef<Path>,
    ty: lm_model::GgmlType,
) -> Result<GgufModel, Error> {
    load_hf_dir_with(dir.as_ref(), Some(ty))
}

fn load_hf_dir_with(dir: &Path, quantize: Option<lm_model::GgmlType>) -> Result<GgufModel, Error> {
    if !dir.exists() {
        return Err(Error::FileMissing {
            path: dir.to_path_buf(),
        });
    }
    let file = match quantize {
        Some(ty) => lm_model::open_hf_dir_quantized(dir, ty),
        None => lm_model::open_hf_dir(dir),
    }
    .map_err(|source| Error::Hf { source })?;
    let decoder = Llama::from_file(file).map_err(|source| Error::Model {
        path: dir.to_path_buf(),
        source: Box::new(source.into()),
    })?;
    let text = GgufText::from_hf_dir(dir)?;
    Ok(GgufModel { decoder, text })
}

/// `generation_config.json`'s sampling defaults, for a caller to use when
/// the user gives none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HfGeneration {
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `top_k`.
    pub top_k: Option<u32>,
    /// `eos_token_id` (one id or a list).
    pub end_ids: Vec<TokenId>,
}

impl HfGeneration {
    /// Reads `dir/generation_config.json`; all defaults when it is absent.
    pub fn read(dir: impl AsRef<Path>) -> Result<Self, Error> {
        let path = dir.as_ref().join("generation_config.json");
        if !path.exists() {
            return Ok(Self::default());
        }
        let json = Json::read(&path)?;
        Ok(Self {
            temperature: json.number("temperature")?.map(|v| v as f32),
            top_p: json.number("top_p")?.map(|v| v as f32),
            top_k: json
                .number("top_k")?
                .map(|v| json.id("top_k", v))
                .transpose()?,
            end_ids: json.ids("eos_token_id")?,
        })
    }
}

impl GgufText {
    /// The text side of a Hugging Face directory: `tokenizer.json` (its
    /// normalizer, pre-tokenizer, model and post-processor as they are),
    /// completed by `tokenizer_config.json` and `generation_config.json`
    /// when present.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self, Error> {
        let dir = dir.as_ref();
        let path = dir.join("tokenizer.json");
        let tokenizer_error = |source| Error::HfTokenizer {
            path: path.clone(),
            source,
        };
        let tokenizer = Tokenizer::from_json_file(&path).map_err(tokenizer_error)?;
        let config_path = dir.join("tokenizer_config.json");
        let mut config = if config_path.exists() {
            Json::read(&config_path)?.tokenizer_config(&tokenizer)?
        } else {
            HfTokenizerConfig::default()
        };
        let jinja = dir.join("chat_template.jinja");
        if config.chat_template.is_none() && jinja.is_file() {
            let text = std::fs::read_to_string(&jinja).map_err(|source| Error::Hf {
                source: HfError::Io {
                    path: jinja.clone(),
                    source,
                },
            })?;
            config.chat_template = Some(text);
        }
        config.end_ids = HfGeneration::read(dir)?.end_ids;
        let tokenizer = tokenizer
            .with_hf_config(config)
            .map_err(|source| Error::HfTokenizer {
                path: config_path.clone(),
                source,
            })?;
        let end_ids = tokenizer.end_ids().to_vec();
        Ok(Self { tokenizer, end_ids })
    }
}

/// A JSON object read from a file, with errors naming the file and field.
struct Json {
    path: PathBuf,
    map: Map<String, Value>,
}

/// The largest JSON file read (tokenizer configs are kilobytes).
const MAX_JSON_BYTES: u64 = 64 << 20;

impl Json {
    fn read(path: &Path) -> Result<Self, Error> {
        let hf = |source| Error::Hf { source };
        let io = |source| {
            hf(HfError::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_JSON_BYTES {
            return Err(Self::bad_at(
                path,
                "(file)",
                format!("{len} bytes, more than {MAX_JSON_BYTES}"),
            ));
        }
        let bytes = std::fs::read(path).map_err(io)?;
        match serde_json::from_slice(&bytes) {
            Ok(Value::Object(map)) => Ok(Self {
                path: path.to_path_buf(),
                map,
            }),
            Ok(_) => Err(Self::bad_at(
                path,
                "(top level)",
                "not a JSON object".into(),
            )),
            Err(source) => Err(hf(HfError::Json {
                path: path.to_path_buf(),
                source,
            })),
        }
    }

    fn bad_at(path: &Path, field: &str, reason: String) -> Error {
        Error::Hf {
            source: HfError::BadField {
                path: path.to_path_buf(),
                field: field.to_owned(),
                reason,
            },
        }
    }

    fn bad(&self, field: &str, reason: impl Into<String>) -> Error {
        Self::bad_at(&self.path, field, reason.into())
    }

    fn get(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    fn number(&self, field: &str) -> Result<Option<f64>, Error> {
        self.get(field)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| self.bad(field, format!("expected a number, found {v}")))
            })
            .transpose()
    }

    /// A token id (or count): a non-negative integer that fits a u32.
    fn id(&self, field: &str, value: f64) -> Result<u32, Error> {
        if value.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&value) {
            return Err(self.bad(field, format!("expected a token id, found {value}")));
        }
        Ok(value as u32)
    }

    /// One id or a list of ids; none when absent.
    fn ids(&self, field: &str) -> Result<Vec<TokenId>, Error> {
        let as_id = |v: &Value| {
            let n = v
                .as_f64()
                .ok_or_else(|| self.bad(field, format!("expected a token id, found {v}")))?;
            self.id(field, n)
        };
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(as_id).collect(),
            Some(value) => Ok(vec![as_id(value)?]),
        }
    }

    /// A special token's text: a string, or an object with `content`.
    fn token_text(&self, field: &str) -> Result<Option<&str>, Error> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(Value::Object(object)) => object
                .get("content")
                .and_then(Value::as_str)
                .map(Some)
                .ok_or_else(|| self.bad(field, "an object without a `content` string")),
            Some(other) => Err(self.bad(field, format!("expected a token, found {other}"))),
        }
    }

    /// The id of the special token `field` names, which must be in the
    /// vocabulary.
    fn token_id(&self, tokenizer: &Tokenizer, field: &str) -> Result<Option<TokenId>, Error> {
        self.token_text(field)?
            .map(|text| {
                tokenizer
                    .token_id(text)
                    .ok_or_else(|| self.bad(field, format!("{text:?} is not in tokenizer.json")))
            })
            .transpose()
    }

    fn flag(&self, field: &str) -> Result<Option<bool>, Error> {
        self.get(field)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.bad(field, "expected true or false"))
            })
            .transpose()
    }

    /// `chat_template`: a string, or a list of `{name, template}` of which
    /// the one named "default" is taken.
    fn chat_template(&self) -> Result<Option<String>, Error> {
        const FIELD: &str = "chat_template";
        match self.get(FIELD) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(Value::Array(items)) => {
                for item in items {
                    let name = item.get("name").and_then(Value::as_str);
                    let template = item.get("template").and_then(Value::as_str);
                    match (name, template) {
                        (Some("default"), Some(template)) => return Ok(Some(template.to_owned())),
                        (Some(_), Some(_)) => {}
                        _ => {
                            return Err(self
                                .bad(FIELD, "a list item without `name` and `template` strings"));
                        }
                    }
                }
                Ok(None)
            }
            Some(_) => Err(self.bad(FIELD, "expected a string or a list of named templates")),
        }
    }

    /// `tokenizer_config.json`'s fields the tokenizer takes.
    fn tokenizer_config(&self, tokenizer: &Tokenizer) -> Result<HfTokenizerConfig, Error> {
        let mut special_ids = Vec::new();
        if let Some(decoder) = self.get("added_tokens_decoder") {
            let Some(decoder) = decoder.as_object() else {
                return Err(self.bad("added_tokens_decoder", "expected an object"));
            };
            for (id, token) in decoder {
                let field = format!("added_tokens_decoder.{id}");
                let id: TokenId = id
                    .parse()
                    .map_err(|_| self.bad(&field, "the key is not a token id"))?;
                if (id as usize) >= tokenizer.vocab_size() {
                    return Err(self.bad(
                        &field,
                        format!(
                            "id beyond tokenizer.json's {} tokens",
                            tokenizer.vocab_size()
                        ),
                    ));
                }
                if token.get("special").and_then(Value::as_bool) == Some(true) {
                    special_ids.push(id);
                }
            }
        }
        Ok(HfTokenizerConfig {
            bos_id: self.token_id(tokenizer, "bos_token")?,
            eos_id: self.token_id(tokenizer, "eos_token")?,
            add_bos: self.flag("add_bos_token")?,
            add_eos: self.flag("add_eos_token")?,
            end_ids: Vec::new(),
            special_ids,
            chat_template: self.chat_template()?,
        })
    }
}
