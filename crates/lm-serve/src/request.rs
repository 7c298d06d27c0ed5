//! Request bodies in OpenAI's wire format, read from JSON by hand so each
//! error names its field: a wrong type or a value out of range is a 400
//! with `param` set; fields this server does not know are ignored, as
//! OpenAI's servers do.

use lm::OutputFormat;
use lm_core::TokenId;
use lm_tokenize::Message;
use serde_json::{Map, Value};

use crate::error::ApiError;
use lm_decode::{SamplerOrder, SamplingConfig};

/// What to continue: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Prompt {
    Text(String),
    Tokens(Vec<TokenId>),
}

/// The sampling and stopping fields both endpoints share.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sampling {
    pub(crate) max_tokens: Option<u64>,
    /// The policy's fields (lm-decode's [`SamplingConfig::FIELDS`]), read
    /// and validated here; its seed is `seed`'s or a fresh one, its bans the
    /// served text's.
    pub(crate) policy: SamplingConfig,
    /// `seed`, if given (without one each request draws a fresh seed).
    pub(crate) seed: Option<u64>,
    pub(crate) stop: Vec<String>,
    pub(crate) n: usize,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// What the output must be (`response_format`, or one of the guided
    /// fields: see `guided.rs`); `None` for free text.
    pub(crate) response_format: Option<OutputFormat>,
    /// The field that gave `response_format`, named by its errors.
    pub(crate) format_param: &'static str,
    /// The model the request names (`model`), if it names one.
    pub(crate) model: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CompletionRequest {
    pub(crate) prompt: Prompt,
    pub(crate) sampling: Sampling,
    /// How many top tokens to report per position (`logprobs`), if any.
    pub(crate) logprobs: Option<usize>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatRequest {
    pub(crate) messages: Vec<Message>,
    pub(crate) sampling: Sampling,
    /// `logprobs: true`, with `top_logprobs` alternatives per position.
    pub(crate) logprobs: Option<usize>,
    /// `tools`, `tool_choice`, `parallel_tool_calls` (see `tools.rs`).
    pub(crate) tools: Option<crate::tools::ToolRequest>,
}

/// The roles a chat message may have; `developer` (OpenAI's newer name
/// for the system role) is read as `system`, which templates know.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The most stop strings a request may give.
const MAX_STOP_STRINGS: usize = 16;
/// The most alternatives per position `logprobs`/`top_logprobs` may ask.
pub(crate) const MAX_TOP_LOGPROBS: usize = 20;
/// The most DRY sequence breakers a request may give.
const MAX_DRY_BREAKERS: usize = 32;
/// The longest DRY sequence breaker, in bytes (llama.cpp cuts longer ones
/// to this length; here they are refused).
const MAX_DRY_BREAKER_BYTES: usize = 40;
/// The most names `samplers` may hold.
const MAX_SAMPLERS: usize = 16;
/// The longest name in `samplers`, in bytes.
const MAX_SAMPLER_NAME_BYTES: usize = 32;
/// The longest `samplers` string, in bytes.
const MAX_SAMPLERS_BYTES: usize = 512;
/// The largest token count `dry_penalty_last_n`, `dry_allowed_length` and
/// `no_repeat_ngram_size` may give (2^20: beyond any served context).
const MAX_TOKEN_SPAN: i64 = 1 << 20;
/// llama-server's one-letter stage names (`"samplers": "edkypmxt"`, what
/// its web UI sends), and the stage each names.
const SAMPLER_LETTERS: [(char, &str); 9] = [
    ('e', "penalties"),
    ('d', "dry"),
    ('k', "top_k"),
    ('y', "typ_p"),
    ('p', "top_p"),
    ('s', "top_n_sigma"),
    ('m', "min_p"),
    ('x', "xtc"),
    ('t', "temperature"),
];

/// A request body's fields, each read with its type checked.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn of(body: &'a Value) -> Result<Self, ApiError> {
        body.as_object()
            .map(Fields)
            .ok_or_else(|| ApiError::invalid("body", "the request body must be a JSON object"))
    }

    /// The field, absent or `null` as `None`.
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn number(&self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                ApiError::invalid(name, format!("'{name}' must be a number, got {v}"))
            }),
        }
    }

    /// A number in `[lo, hi]`.
    fn f32_in(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        match self.number(name)? {
            Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::invalid(
                name,
                format!("'{name}' must be between {lo} and {hi}, got {x}"),
            )),
            x => Ok(x.map(|x| x as f32)),
        }
    }

    /// A whole number in `[lo, hi]`.
    fn integer_in(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => {
                let x = v.as_i64().ok_or_else(|| {
                    ApiError::invalid(name, format!("'{name}' must be an integer, got {v}"))
                })?;
                if (lo..=hi).contains(&x) {
                    Ok(Some(x))
                } else {
                    Err(ApiError::invalid(
                        name,
                        format!("'{name}' must be between {lo} and {hi}, got {x}"),
                    ))
                }
            }
        }
    }

    /// A number in `[0, 1)` (HF's cutoffs; 0 is off).
    fn f32_below_one(&self, name: &str) -> Result<Option<f32>, ApiError> {
        match self.f32_in(name, 0.0, 1.0)? {
            Some(x) if x >= 1.0 => Err(ApiError::invalid(
                name,
                format!("'{name}' must be at least 0 and less than 1, got {x}"),
            )),
            x => Ok(x),
        }
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                ApiError::invalid(name, format!("'{name}' must be a boolean, got {v}"))
            }),
        }
    }
}

/// `Sampling` reads as its policy, so a policy field is `sampling.top_p`.
impl std::ops::Deref for Sampling {
    type Target = SamplingConfig;

    fn deref(&self) -> &SamplingConfig {
        &self.policy
    }
}

fn sampling(f: &Fields<'_>) -> Result<Sampling, ApiError> {
    // OpenAI names the limit `max_completion_tokens` in chat; either works.
    let max_tokens = match f.integer_in("max_completion_tokens", 0, i64::MAX)? {
        Some(n) => Some(n),
        None => f.integer_in("max_tokens", 0, i64::MAX)?,
    };
    let stop = stop_strings(f)?;
    let include_usage = include_usage(f)?;
    let format = crate::guided::read(f.0, response_format(f.get("response_format"))?)?;
    Ok(Sampling {
        max_tokens: max_tokens.map(|n| n as u64),
        policy: policy(f)?,
        seed: f.integer_in("seed", i64::MIN, i64::MAX)?.map(|s| s as u64),
        stop,
        n: f.integer_in("n", 1, 128)?.unwrap_or(1) as usize,
        stream: f.boolean("stream")?.unwrap_or(false),
        include_usage,
        format_param: format
            .as_ref()
            .map_or("response_format", |(_, field)| field),
        response_format: format.map(|(format, _)| format),
        model: match f.get("model") {
            None => None,
            Some(Value::String(name)) => Some(name.clone()),
            Some(v) => {
                return Err(ApiError::invalid(
                    "model",
                    format!("'model' must be a string, got {v}"),
                ));
            }
        },
    })
}

/// The policy's fields, in OpenAI's ranges (wider ones where OpenAI has
/// none), then checked as lm-decode checks them.
fn policy(f: &Fields<'_>) -> Result<SamplingConfig, ApiError> {
    let logit_bias = logit_bias(f)?;
    let top_p = f.f32_in("top_p", 0.0, 1.0)?;
    if top_p == Some(0.0) {
        return Err(ApiError::invalid("top_p", "'top_p' must be greater than 0"));
    }
    let repetition_penalty = f.f32_in("repetition_penalty", 0.0, 10.0)?;
    if repetition_penalty == Some(0.0) {
        return Err(ApiError::invalid(
            "repetition_penalty",
            "'repetition_penalty' must be greater than 0",
        ));
    }
    let policy = SamplingConfig {
        temperature: f.f32_in("temperature", 0.0, 2.0)?.unwrap_or(1.0),
        top_p,
        // 0 turns top-k off, as in llama.cpp's server.
        top_k: f
            .integer_in("top_k", 0, i64::from(u32::MAX))?
            .filter(|&k| k > 0)
            .map(|k| k as usize),
        min_p: f.f32_in("min_p", 0.0, 1.0)?,
        // llama-server's names; its defaults (typical_p 1, top_n_sigma -1,
        // xtc_probability 0, min_keep 0) are read as off, as is any
        // top_n_sigma <= 0 there.
        typical_p: f.f32_in("typical_p", 0.0, 1.0)?,
        top_n_sigma: f
            .number("top_n_sigma")?
            .filter(|&n| n > 0.0)
            .map(|n| n as f32),
        xtc_probability: f.f32_in("xtc_probability", 0.0, 1.0)?,
        xtc_threshold: f.f32_in("xtc_threshold", 0.0, 1.0)?,
        min_keep: f
            .integer_in("min_keep", 0, i64::MAX)?
            .and_then(|n| usize::try_from(n).ok()),
        presence_penalty: f.f32_in("presence_penalty", -2.0, 2.0)?,
        frequency_penalty: f.f32_in("frequency_penalty", -2.0, 2.0)?,
        repetition_penalty,
        // llama.cpp's server's name; -1 is the whole text, as on the command line.
        penalty_last_n: f
            .integer_in("repeat_last_n", -1, i64::MAX)?
            .and_then(|n| usize::try_from(n).ok()),
        logit_bias,
        ..later_stages(f)?
    };
    policy.validate()?;
    Ok(policy)
}

/// The settings of DRY, `no_repeat_ngram_size`, dynamic temperature,
/// mirostat, the epsilon and eta cutoffs and the stage order, by
/// llama-server's names (HF's for the cutoffs and `no_repeat_ngram_size`).
/// llama-server's defaults (`dry_multiplier` 0, `mirostat` 0,
/// `dynatemp_range` 0, `dry_penalty_last_n` -1, ...) read as off. Each is
/// bounded here, so no value allocates without limit; lm-decode then checks
/// them as it checks every setting.
fn later_stages(f: &Fields<'_>) -> Result<SamplingConfig, ApiError> {
    Ok(SamplingConfig {
        dry_multiplier: f.f32_in("dry_multiplier", 0.0, 100.0)?,
        dry_base: f.f32_in("dry_base", 1.0, 100.0)?,
        dry_allowed_length: f
            .integer_in("dry_allowed_length", 0, MAX_TOKEN_SPAN)?
            .map(|n| n as usize),
        dry_penalty_last_n: f.integer_in("dry_penalty_last_n", -1, MAX_TOKEN_SPAN)?,
        dry_sequence_breakers: dry_sequence_breakers(f)?,
        no_repeat_ngram_size: f
            .integer_in("no_repeat_ngram_size", 0, MAX_TOKEN_SPAN)?
            .map(|n| n as usize),
        dynatemp_range: f.f32_in("dynatemp_range", 0.0, 2.0)?,
        dynatemp_exponent: f.f32_in("dynatemp_exponent", 0.0, 100.0)?,
        mirostat: f.integer_in("mirostat", 0, 2)?.map(|v| v as u8),
        mirostat_tau: f.f32_in("mirostat_tau", 0.0, 100.0)?,
        mirostat_eta: f.f32_in("mirostat_eta", 0.0, 1.0)?,
        epsilon_cutoff: f.f32_below_one("epsilon_cutoff")?,
        eta_cutoff: f.f32_below_one("eta_cutoff")?,
        order: sampler_order(f)?,
        ..SamplingConfig::default()
    })
}

/// `dry_sequence_breakers`: up to [`MAX_DRY_BREAKERS`] strings of 1 to
/// [`MAX_DRY_BREAKER_BYTES`] bytes (an empty list: no breakers).
fn dry_sequence_breakers(f: &Fields<'_>) -> Result<Option<Vec<String>>, ApiError> {
    const PARAM: &str = "dry_sequence_breakers";
    let Some(value) = f.get(PARAM) else {
        return Ok(None);
    };
    let Some(items) = value.as_array() else {
        return Err(ApiError::invalid(
            PARAM,
            format!("'{PARAM}' must be an array of strings, got {value}"),
        ));
    };
    if items.len() > MAX_DRY_BREAKERS {
        return Err(ApiError::invalid(
            PARAM,
            format!(
                "'{PARAM}' may hold at most {MAX_DRY_BREAKERS} strings, got {}",
                items.len()
            ),
        ));
    }
    let mut breakers = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item.as_str() {
            Some(s) if !s.is_empty() && s.len() <= MAX_DRY_BREAKER_BYTES => {
                breakers.push(s.to_owned());
            }
            _ => {
                return Err(ApiError::invalid(
                    PARAM,
                    format!(
                        "'{PARAM}[{i}]' must be a string of 1 to {MAX_DRY_BREAKER_BYTES} bytes"
                    ),
                ));
            }
        }
    }
    Ok(Some(breakers))
}

/// `samplers`: the stage order, as an array of llama.cpp's names or one
/// string of them separated by `;` or `,` (lm-decode checks the names), or
/// llama-server's letters (`"edkypmxt"`). At most [`MAX_SAMPLERS`] names
/// of at most [`MAX_SAMPLER_NAME_BYTES`] bytes, so an error that quotes a
/// name stays short.
fn sampler_order(f: &Fields<'_>) -> Result<Option<SamplerOrder>, ApiError> {
    const PARAM: &str = "samplers";
    let too_long = || {
        ApiError::invalid(
            PARAM,
            format!(
                "'{PARAM}' may name at most {MAX_SAMPLERS} stages of at most \
                 {MAX_SAMPLER_NAME_BYTES} bytes each"
            ),
        )
    };
    let order = match f.get(PARAM) {
        None => return Ok(None),
        Some(Value::String(text)) if text.len() > MAX_SAMPLERS_BYTES => return Err(too_long()),
        Some(Value::String(text)) => sampler_letters(text).unwrap_or_else(|| {
            text.parse()
                .unwrap_or_else(|never: std::convert::Infallible| match never {})
        }),
        Some(Value::Array(items)) if items.len() > MAX_SAMPLERS => return Err(too_long()),
        Some(Value::Array(items)) => {
            let names: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            SamplerOrder::new(names.ok_or_else(|| {
                ApiError::invalid(
                    PARAM,
                    format!("'{PARAM}' must be a string or an array of strings"),
                )
            })?)
        }
        Some(v) => {
            return Err(ApiError::invalid(
                PARAM,
                format!("'{PARAM}' must be a string or an array of strings, got {v}"),
            ));
        }
    };
    let names = order.names();
    if names.len() > MAX_SAMPLERS || names.iter().any(|n| n.len() > MAX_SAMPLER_NAME_BYTES) {
        return Err(too_long());
    }
    Ok(Some(order))
}

/// The order a string of llama-server's stage letters spells, when `text`
/// is one: every character a letter of [`SAMPLER_LETTERS`], and `text` not
/// `"temp"` (temperature's alias, the one name spelled in letters alone).
fn sampler_letters(text: &str) -> Option<SamplerOrder> {
    let is_name = text == "temp";
    let names: Option<Vec<&str>> = text
        .chars()
        .map(|c| {
            SAMPLER_LETTERS
                .iter()
                .find(|&&(letter, _)| letter == c)
                .map(|&(_, name)| name)
        })
        .collect();
    names
        .filter(|names| !is_name && !names.is_empty())
        .map(SamplerOrder::new)
}

/// `stop`: a string or up to [`MAX_STOP_STRINGS`] of them, none empty.
fn stop_strings(f: &Fields<'_>) -> Result<Vec<String>, ApiError> {
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            let strings: Option<Vec<String>> = items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect();
            strings.ok_or_else(|| {
                ApiError::invalid("stop", "'stop' must be a string or an array of strings")
            })?
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!("'stop' must be a string or an array of strings, got {v}"),
            ));
        }
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "'stop' may hold at most {MAX_STOP_STRINGS} strings, got {}",
                stop.len()
            ),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "'stop' strings must not be empty",
        ));
    }
    Ok(stop)
}

/// `logit_bias`: token id to a bias in [-100, 100], as OpenAI's.
fn logit_bias(f: &Fields<'_>) -> Result<Vec<(TokenId, f32)>, ApiError> {
    match f.get("logit_bias") {
        None => Ok(Vec::new()),
        Some(Value::Object(map)) => {
            let mut bias = Vec::with_capacity(map.len());
            for (key, value) in map {
                let token: TokenId = key.parse().map_err(|_| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("'logit_bias' keys must be token ids, got \"{key}\""),
                    )
                })?;
                let b = value.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("'logit_bias' values must be numbers between -100 and 100, got {value} for token {token}"),
                    )
                })?;
                bias.push((token, b as f32));
            }
            Ok(bias)
        }
        Some(v) => Err(ApiError::invalid(
            "logit_bias",
            format!("'logit_bias' must be an object of token id to bias, got {v}"),
        )),
    }
}

/// `stream_options.include_usage`.
fn include_usage(f: &Fields<'_>) -> Result<bool, ApiError> {
    match f.get("stream_options") {
        None => Ok(false),
        Some(Value::Object(options)) => Ok(Fields(options)
            .boolean("include_usage")
            .map_err(|_| {
                ApiError::invalid(
                    "stream_options",
                    "'stream_options.include_usage' must be a boolean",
                )
            })?
            .unwrap_or(false)),
        Some(v) => Err(ApiError::invalid(
            "stream_options",
            format!("'stream_options' must be an object, got {v}"),
        )),
    }
}

/// OpenAI's `response_format`: `{"type": "text"}` (free text, as when
/// absent), `{"type": "json_object"}` (any JSON object), or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`
/// (JSON valid under `schema`; enforced whatever `strict` says).
fn response_format(value: Option<&Value>) -> Result<Option<OutputFormat>, ApiError> {
    const PARAM: &str = "response_format";
    let Some(value) = value else {
        return Ok(None);
    };
    let Some(fields) = value.as_object() else {
        return Err(ApiError::invalid(
            PARAM,
            format!("'{PARAM}' must be an object with a 'type', got {value}"),
        ));
    };
    match fields.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputFormat::JsonObject)),
        Some("json_schema") => {
            let Some(spec) = fields.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::invalid(
                    PARAM,
                    format!(
                        "'{PARAM}.json_schema' is required for type 'json_schema' and must be an object"
                    ),
                ));
            };
            let spec = Fields(spec);
            if spec.get("name").is_some_and(|name| !name.is_string()) {
                return Err(ApiError::invalid(
                    PARAM,
                    format!("'{PARAM}.json_schema.name' must be a string"),
                ));
            }
            spec.boolean("strict").map_err(|_| {
                ApiError::invalid(
                    PARAM,
                    format!("'{PARAM}.json_schema.strict' must be a boolean"),
                )
            })?;
            match spec.get("schema") {
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(OutputFormat::JsonSchema(schema.clone())))
                }
                _ => Err(ApiError::invalid(
                    PARAM,
                    format!(
                        "'{PARAM}.json_schema.schema' is required and must be a JSON Schema object"
                    ),
                )),
            }
        }
        _ => Err(ApiError::invalid(
            PARAM,
            format!(
                "'{PARAM}.type' must be \"text\", \"json_object\" or \"json_schema\", got {}",
                fields.get("type").unwrap_or(&Value::Null)
            ),
        )),
    }
}

/// Checks the request's `model` against the one served (`served`): another
/// name is a 404 `model_not_found`, as OpenAI answers, unless `any_model`.
/// A request without `model` is served.
pub(crate) fn check_model(
    requested: Option<&str>,
    served: &str,
    any_model: bool,
) -> Result<(), ApiError> {
    match requested {
        Some(name) if name != served && !any_model => {
            let mut error = ApiError::status(
                axum::http::StatusCode::NOT_FOUND,
                format!(
                    "the model '{name}' does not exist: this server serves '{served}' \
                     (lm-cli serve --any-model answers whatever 'model' says)"
                ),
            )
            .with_code("model_not_found");
            error.param = Some("model".to_owned());
            Err(error)
        }
        _ => Ok(()),
    }
}

/// Reads a `/v1/completions` body.
pub(crate) fn completion(body: &Value) -> Result<CompletionRequest, ApiError> {
    let f = Fields::of(body)?;
    let prompt = match f.get("prompt") {
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            Prompt::Text(items[0].as_str().unwrap_or_default().to_owned())
        }
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_number) => {
            let ids: Option<Vec<TokenId>> = items
                .iter()
                .map(|v| v.as_u64().and_then(|id| TokenId::try_from(id).ok()))
                .collect();
            Prompt::Tokens(ids.ok_or_else(|| {
                ApiError::invalid("prompt", "'prompt' token ids must be non-negative integers")
            })?)
        }
        None => return Err(ApiError::invalid("prompt", "'prompt' is required")),
        Some(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "'prompt' must be a string, a one-string array or a non-empty array of token ids \
                 (several prompts in one request are not supported: send one request each)",
            ));
        }
    };
    Ok(CompletionRequest {
        prompt,
        sampling: sampling(&f)?,
        logprobs: f
            .integer_in("logprobs", 0, MAX_TOP_LOGPROBS as i64)?
            .map(|n| n as usize),
    })
}

/// Reads a `/v1/chat/completions` body.
pub(crate) fn chat(body: &Value) -> Result<ChatRequest, ApiError> {
    let f = Fields::of(body)?;
    let Some(Value::Array(items)) = f.get("messages") else {
        return Err(ApiError::invalid(
            "messages",
            "'messages' is required and must be an array of messages",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must not be empty",
        ));
    }
    let mut messages = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Some(m) = item.as_object() else {
            return Err(ApiError::invalid(
                &param,
                format!("'{param}' must be an object"),
            ));
        };
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(ApiError::invalid(
                &format!("{param}.role"),
                format!("'{param}.role' must be a string"),
            ));
        };
        let role = match role {
            "developer" => "system",
            known if ROLES.contains(&known) => known,
            unknown => {
                return Err(ApiError::invalid(
                    &format!("{param}.role"),
                    format!(
                        "'{param}.role' must be one of {}, got \"{unknown}\"",
                        ROLES.join(", ")
                    ),
                ));
            }
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            // Content parts: the text parts, joined.
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match part.get("text").and_then(Value::as_str) {
                        Some(t) if part.get("type").and_then(Value::as_str) == Some("text") => {
                            text.push_str(t);
                        }
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("{param}.content"),
                                format!(
                                    "'{param}.content' parts must be {{\"type\": \"text\", \"text\": ...}}"
                                ),
                            ));
                        }
                    }
                }
                text
            }
            Some(v) => {
                return Err(ApiError::invalid(
                    &format!("{param}.content"),
                    format!(
                        "'{param}.content' must be a string or an array of text parts, got {v}"
                    ),
                ));
            }
        };
        messages.push(crate::tools::history_message(role, content, m, &param)?);
    }
    let logprobs = f.boolean("logprobs")?.unwrap_or(false);
    let top = f.integer_in("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
    if top.is_some() && !logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "'top_logprobs' needs 'logprobs': true",
        ));
    }
    Ok(ChatRequest {
        messages,
        tools: crate::tools::read(f.0)?,
        sampling: sampling(&f)?,
        logprobs: logprobs.then(|| top.unwrap_or(0) as usize),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param_of(result: Result<CompletionRequest, ApiError>) -> String {
        result.unwrap_err().param.unwrap()
    }

    #[test]
    fn defaults_and_unknown_fields() {
        let r = completion(&json!({"prompt": "hi", "model": "x", "unknown": [1]})).unwrap();
        assert_eq!(r.prompt, Prompt::Text("hi".into()));
        assert_eq!(r.sampling.temperature, 1.0);
        assert_eq!(r.sampling.n, 1);
        assert_eq!(r.sampling.max_tokens, None);
        assert_eq!(r.logprobs, None);
    }

    #[test]
    fn every_field_is_read() {
        let r = completion(&json!({
            "prompt": [1, 2], "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
            "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.1, "logit_bias": {"7": -100}, "seed": 42,
            "stop": ["\n", "."], "n": 3, "stream": true,
            "stream_options": {"include_usage": true}, "logprobs": 2
        }))
        .unwrap();
        assert_eq!(r.prompt, Prompt::Tokens(vec![1, 2]));
        let s = r.sampling;
        assert_eq!(
            (s.max_tokens, s.temperature, s.top_p, s.top_k, s.min_p),
            (Some(5), 0.5, Some(0.9), Some(40), Some(0.05))
        );
        assert_eq!(
            (
                s.presence_penalty,
                s.frequency_penalty,
                s.repetition_penalty
            ),
            (Some(0.5), Some(-0.5), Some(1.1))
        );
        assert_eq!(s.logit_bias, vec![(7, -100.0)]);
        assert_eq!(
            (s.seed, s.n, s.stream, s.include_usage),
            (Some(42), 3, true, true)
        );
        assert_eq!(s.stop, vec!["\n".to_owned(), ".".to_owned()]);
        assert_eq!(r.logprobs, Some(2));
    }

    #[test]
    fn wrong_types_and_ranges_name_the_field() {
        let cases = [
            (json!({"prompt": 3}), "prompt"),
            (json!({}), "prompt"),
            (json!({"prompt": "a", "temperature": "hot"}), "temperature"),
            (json!({"prompt": "a", "temperature": 2.5}), "temperature"),
            (json!({"prompt": "a", "top_p": 0}), "top_p"),
            (json!({"prompt": "a", "n": 0}), "n"),
            (json!({"prompt": "a", "n": 1.5}), "n"),
            (json!({"prompt": "a", "max_tokens": -1}), "max_tokens"),
            (json!({"prompt": "a", "stop": 5}), "stop"),
            (json!({"prompt": "a", "stop": [""]}), "stop"),
            (json!({"prompt": "a", "logit_bias": {"x": 1}}), "logit_bias"),
            (
                json!({"prompt": "a", "logit_bias": {"1": 101}}),
                "logit_bias",
            ),
            (json!({"prompt": "a", "stream": "yes"}), "stream"),
            (json!({"prompt": "a", "logprobs": 21}), "logprobs"),
            (
                json!({"prompt": "a", "presence_penalty": 3}),
                "presence_penalty",
            ),
            (
                json!({"prompt": "a", "repetition_penalty": 0}),
                "repetition_penalty",
            ),
            (json!({"prompt": [-1]}), "prompt"),
            (json!({"prompt": "a", "typical_p": 0}), "typical_p"),
            (json!({"prompt": "a", "top_n_sigma": 1e39}), "top_n_sigma"),
            (
                json!({"prompt": "a", "dry_multiplier": -0.5}),
                "dry_multiplier",
            ),
            (
                json!({"prompt": "a", "dry_multiplier": 1e39}),
                "dry_multiplier",
            ),
            (json!({"prompt": "a", "dry_base": 0.5}), "dry_base"),
            (
                json!({"prompt": "a", "dry_allowed_length": -1}),
                "dry_allowed_length",
            ),
            (
                json!({"prompt": "a", "dry_penalty_last_n": -2}),
                "dry_penalty_last_n",
            ),
            (
                json!({"prompt": "a", "dry_penalty_last_n": 1u64 << 40}),
                "dry_penalty_last_n",
            ),
            (
                json!({"prompt": "a", "dry_sequence_breakers": "\n"}),
                "dry_sequence_breakers",
            ),
            (
                json!({"prompt": "a", "dry_sequence_breakers": [""]}),
                "dry_sequence_breakers",
            ),
            (
                json!({"prompt": "a", "dry_sequence_breakers": ["x".repeat(41)]}),
                "dry_sequence_breakers",
            ),
            (
                json!({"prompt": "a", "dry_sequence_breakers": vec![":"; 33]}),
                "dry_sequence_breakers",
            ),
            (
                json!({"prompt": "a", "no_repeat_ngram_size": -1}),
                "no_repeat_ngram_size",
            ),
            (
                json!({"prompt": "a", "dynatemp_range": -1}),
                "dynatemp_range",
            ),
            (
                json!({"prompt": "a", "dynatemp_exponent": -1}),
                "dynatemp_exponent",
            ),
            (json!({"prompt": "a", "mirostat": 3}), "mirostat"),
            (json!({"prompt": "a", "mirostat": 1.5}), "mirostat"),
            (json!({"prompt": "a", "mirostat_tau": -1}), "mirostat_tau"),
            (json!({"prompt": "a", "mirostat_eta": 2}), "mirostat_eta"),
            (
                json!({"prompt": "a", "epsilon_cutoff": 1.5}),
                "epsilon_cutoff",
            ),
            (
                json!({"prompt": "a", "epsilon_cutoff": 1}),
                "epsilon_cutoff",
            ),
            (json!({"prompt": "a", "eta_cutoff": -0.1}), "eta_cutoff"),
            (
                json!({"prompt": "a", "samplers": "top_k;top_q"}),
                "samplers",
            ),
            (
                json!({"prompt": "a", "samplers": ["top_k", "top-k"]}),
                "samplers",
            ),
            (json!({"prompt": "a", "samplers": [1]}), "samplers"),
            (json!({"prompt": "a", "samplers": 1}), "samplers"),
            (
                json!({"prompt": "a", "samplers": vec!["top_k"; 17]}),
                "samplers",
            ),
            (
                json!({"prompt": "a", "samplers": "top_k;".repeat(100)}),
                "samplers",
            ),
            (
                json!({"prompt": "a", "samplers": ["x".repeat(33)]}),
                "samplers",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(param_of(completion(&body)), param, "{body}");
        }
        assert_eq!(param_of(completion(&json!([1]))), "body");
    }

    /// Each setting of the policy with a value a request may give and one
    /// it may not; a new setting must be added here.
    fn api_examples(field: &str) -> Option<(Value, Value)> {
        Some(match field {
            "repetition_penalty" => (json!(1.1), json!(0)),
            "presence_penalty" => (json!(0.5), json!(3)),
            "frequency_penalty" => (json!(0.5), json!(-3)),
            "penalty_last_n" => (json!(16), json!(-2)),
            "logit_bias" => (json!({"1": 0.5}), json!({"1": 101})),
            "banned_tokens" => (json!({"1": -100}), json!({"x": -100})),
            "temperature" => (json!(0.7), json!(-1)),
            "top_k" => (json!(40), json!(-1)),
            "top_p" => (json!(0.9), json!(1.5)),
            "min_p" => (json!(0.05), json!(1.5)),
            "typical_p" => (json!(0.9), json!(1.5)),
            "top_n_sigma" => (json!(1.5), json!("wide")),
            "xtc_probability" => (json!(0.5), json!(1.5)),
            "xtc_threshold" => (json!(0.2), json!(-0.5)),
            "min_keep" => (json!(2), json!(-1)),
            "epsilon_cutoff" => (json!(3e-4), json!(1.5)),
            "eta_cutoff" => (json!(2e-3), json!(1)),
            "dynatemp_range" => (json!(0.5), json!(-0.5)),
            "dynatemp_exponent" => (json!(1.5), json!(-1)),
            "mirostat" => (json!(2), json!(3)),
            "mirostat_tau" => (json!(4.0), json!(-1)),
            "mirostat_eta" => (json!(0.2), json!(-0.1)),
            "dry_multiplier" => (json!(0.8), json!(-1)),
            "dry_base" => (json!(2.0), json!(0.5)),
            "dry_allowed_length" => (json!(3), json!(-1)),
            "dry_penalty_last_n" => (json!(64), json!(-2)),
            "dry_sequence_breakers" => (json!(["\n", "Bob:"]), json!([""])),
            "no_repeat_ngram_size" => (json!(3), json!(-1)),
            "order" => (json!("top_k;temperature"), json!("top_k;top_k")),
            "seed" => (json!(7), json!(1.5)),
            _ => return None,
        })
    }

    #[test]
    fn every_sampling_setting_is_a_request_field() {
        let read = |field: &str, value: &Value| {
            completion(&json!({"prompt": "a", field: value}))
                .map(|r| (r.sampling.policy, r.sampling.seed))
        };
        let plain = completion(&json!({"prompt": "a"})).unwrap().sampling;
        for field in SamplingConfig::FIELDS {
            let (good, bad) = api_examples(field.name)
                .unwrap_or_else(|| panic!("no request example for {}: add one", field.name));
            let read_good = read(field.api, &good).unwrap();
            assert_ne!(
                read_good,
                (plain.policy.clone(), plain.seed),
                "'{}' is not read",
                field.api
            );
            let refused = read(field.api, &bad).unwrap_err();
            assert_eq!(refused.status, axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(refused.param.as_deref(), Some(field.api), "{bad}");
        }
    }

    /// The llama.cpp web UI sends every sampler field at its default;
    /// those defaults are read as off, not refused.
    #[test]
    fn llama_server_defaults_are_read_as_off() {
        let defaults = json!({
            "prompt": "a", "typical_p": 1.0, "top_n_sigma": -1.0,
            "xtc_probability": 0.0, "xtc_threshold": 0.1, "min_keep": 0,
            "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "mirostat": 0,
            "mirostat_tau": 5.0, "mirostat_eta": 0.1, "dry_multiplier": 0.0,
            "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
            "dry_sequence_breakers": ["\n", ":", "\"", "*"]
        });
        let policy = completion(&defaults).unwrap().sampling.policy;
        assert_eq!(policy.top_n_sigma, None);
        assert_eq!(
            (policy.typical_p, policy.xtc_probability, policy.min_keep),
            (Some(1.0), Some(0.0), Some(0))
        );
        assert_eq!(
            (
                policy.dry_multiplier,
                policy.mirostat,
                policy.dynatemp_range
            ),
            (Some(0.0), Some(0), Some(0.0))
        );
        let sampler = lm_decode::Sampler::new(&policy).unwrap();
        assert_eq!(
            format!("{sampler:?}"),
            "Sampler { chain: [Temperature(1.0), Typical(1.0)], selector: Sample }"
        );
        // The web UI's order, in llama-server's letters: temperature last.
        let mut lettered = defaults;
        lettered["samplers"] = json!("edkypmxt");
        let policy = completion(&lettered).unwrap().sampling.policy;
        assert_eq!(
            policy.order.as_ref().map(SamplerOrder::names),
            Some(
                &[
                    "penalties",
                    "dry",
                    "top_k",
                    "typ_p",
                    "top_p",
                    "min_p",
                    "xtc",
                    "temperature"
                ]
                .map(str::to_owned)[..]
            )
        );
        let sampler = lm_decode::Sampler::new(&policy).unwrap();
        assert_eq!(
            format!("{sampler:?}"),
            "Sampler { chain: [Typical(1.0), Temperature(1.0)], selector: Sample }"
        );
    }

    /// `samplers` is a list of names, one string of them separated by `;`
    /// or `,`, or llama-server's letters; exactly the named stages run.
    #[test]
    fn samplers_is_read_as_a_list_a_string_or_letters() {
        let order = |samplers: Value| {
            let body = json!({"prompt": "a", "top_k": 40, "min_p": 0.05, "samplers": samplers});
            let policy = completion(&body).unwrap().sampling.policy;
            let names = policy.order.clone().unwrap().names().to_vec();
            (
                names,
                format!("{:?}", lm_decode::Sampler::new(&policy).unwrap()),
            )
        };
        let expected = (
            vec![
                "min_p".to_owned(),
                "top_k".to_owned(),
                "temperature".to_owned(),
            ],
            "Sampler { chain: [MinP(0.05), TopK(40), Temperature(1.0)], selector: Sample }"
                .to_owned(),
        );
        assert_eq!(order(json!("min_p;top_k;temperature")), expected);
        assert_eq!(order(json!("min_p, top_k, temperature")), expected);
        assert_eq!(order(json!(["min_p", "top_k", "temperature"])), expected);
        assert_eq!(order(json!("mkt")), expected);
        // "temp" is a name (temperature's), not four letters.
        assert_eq!(order(json!("temp")).0, vec!["temp".to_owned()]);
        // Top-k not named: it does not run, though set.
        assert_eq!(
            order(json!(["temperature", "min_p"])).1,
            "Sampler { chain: [Temperature(1.0), MinP(0.05)], selector: Sample }"
        );
        for (samplers, message) in [
            (
                json!("top_k;nucleus2"),
                "unknown sampler \"nucleus2\" in the sampler order",
            ),
            (
                json!(["top_p", "nucleus"]),
                "sampler \"nucleus\" is named twice in the sampler order",
            ),
        ] {
            let refused = completion(&json!({"prompt": "a", "samplers": samplers})).unwrap_err();
            assert_eq!(refused.param.as_deref(), Some("samplers"));
            assert!(refused.message.starts_with(message), "{}", refused.message);
        }
    }

    #[test]
    fn the_later_stages_are_read() {
        let r = completion(&json!({
            "prompt": "a", "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3,
            "dry_penalty_last_n": 64, "dry_sequence_breakers": ["\n", "Bob:"],
            "no_repeat_ngram_size": 3, "dynatemp_range": 0.5, "dynatemp_exponent": 1.5,
            "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
            "epsilon_cutoff": 3e-4, "eta_cutoff": 2e-3, "samplers": ["top_k", "temperature"]
        }))
        .unwrap();
        assert_eq!(
            r.sampling.policy,
            SamplingConfig {
                dry_multiplier: Some(0.8),
                dry_base: Some(2.0),
                dry_allowed_length: Some(3),
                dry_penalty_last_n: Some(64),
                dry_sequence_breakers: Some(vec!["\n".into(), "Bob:".into()]),
                no_repeat_ngram_size: Some(3),
                dynatemp_range: Some(0.5),
                dynatemp_exponent: Some(1.5),
                mirostat: Some(2),
                mirostat_tau: Some(4.0),
                mirostat_eta: Some(0.2),
                epsilon_cutoff: Some(3e-4),
                eta_cutoff: Some(2e-3),
                order: Some(SamplerOrder::new(["top_k", "temperature"])),
                ..SamplingConfig::default()
            }
        );
        // The caps' edges are accepted.
        let edges = completion(&json!({
            "prompt": "a", "dry_sequence_breakers": vec!["x".repeat(40); 32],
            "dry_penalty_last_n": 1 << 20, "samplers": vec!["top_k"; 1]
        }));
        assert!(edges.is_ok(), "{edges:?}");
    }

    #[test]
    fn response_format_is_read_and_checked() {
        let format = |value: Value| completion(&json!({"prompt": "a", "response_format": value}));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        for (value, expected) in [
            (json!({"type": "text"}), None),
            (
                json!({"type": "json_object"}),
                Some(OutputFormat::JsonObject),
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": true}}),
                Some(OutputFormat::JsonSchema(schema.clone())),
            ),
        ] {
            assert_eq!(
                format(value.clone()).unwrap().sampling.response_format,
                expected,
                "{value}"
            );
        }
        assert_eq!(
            completion(&json!({"prompt": "a"}))
                .unwrap()
                .sampling
                .response_format,
            None
        );
        for value in [
            json!("json"),
            json!({"type": "xml"}),
            json!({}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"name": "a"}}),
            json!({"type": "json_schema", "json_schema": {"schema": "object"}}),
            json!({"type": "json_schema", "json_schema": {"name": 1, "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
        ] {
            assert_eq!(
                param_of(format(value.clone())),
                "response_format",
                "{value}"
            );
        }
    }

    #[test]
    fn chat_messages_are_checked_and_read() {
        let r = chat(&json!({
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "logprobs": true, "top_logprobs": 3
        }))
        .unwrap();
        assert_eq!(r.messages, vec![Message::new("user", "hi")]);
        assert_eq!(r.logprobs, Some(3));
        for (body, param) in [
            (json!({"messages": []}), "messages"),
            (json!({"messages": "hi"}), "messages"),
            (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "user", "content": 1}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
                "top_logprobs",
            ),
            (
                json!({"messages": [{"role": "hacker", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "User", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "model": 3}),
                "model",
            ),
        ] {
            assert_eq!(chat(&body).unwrap_err().param.unwrap(), param, "{body}");
        }
    }

    /// Regression (issue 33): a role the templates do not know was passed
    /// on to them (rendered as a turn of that name, or failing inside the
    /// template); it is a 400 naming the field and the known roles.
    #[test]
    fn unknown_roles_are_refused_and_developer_is_system() {
        let error = chat(&json!({"messages": [{"role": "root", "content": "x"}]})).unwrap_err();
        assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(
            error.message,
            "'messages[0].role' must be one of system, developer, user, assistant, tool, got \"root\""
        );
        let r = chat(&json!({"messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "tool", "content": "42"},
            {"role": "user", "content": "Hi"},
        ]}))
        .unwrap();
        let roles: Vec<&str> = r.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "tool", "user"]);
    }

    /// Regression (issue 33): any `model` was answered by the one model
    /// served; another name is now a 404 `model_not_found`, as OpenAI
    /// answers, unless the server was started with `--any-model`.
    #[test]
    fn another_model_name_is_a_404_model_not_found() {
        let r = completion(&json!({"prompt": "a", "model": "gpt-4o"})).unwrap();
        assert_eq!(r.sampling.model.as_deref(), Some("gpt-4o"));
        let error = check_model(Some("gpt-4o"), "smollm2", false).unwrap_err();
        assert_eq!(error.status, axum::http::StatusCode::NOT_FOUND);
        assert_eq!(error.code, Some("model_not_found"));
        assert_eq!(error.param.as_deref(), Some("model"));
        assert!(
            error
                .message
                .starts_with("the model 'gpt-4o' does not exist")
        );
        assert_eq!(check_model(Some("smollm2"), "smollm2", false), Ok(()));
        assert_eq!(check_model(None, "smollm2", false), Ok(()));
        assert_eq!(check_model(Some("gpt-4o"), "smollm2", true), Ok(()));
    }
}
