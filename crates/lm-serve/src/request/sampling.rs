//! The sampling and stopping fields `/v1/completions` and
//! `/v1/chat/completions` share: the policy (lm-decode's
//! `SamplingConfig`, by OpenAI's and llama-server's names), the seed,
//! `stop`, `n`, streaming and the output format, each bounded so no value
//! allocates without limit.

use lm::OutputFormat;
use lm_core::TokenId;
use lm_decode::{SamplerOrder, SamplingConfig};
use serde_json::Value;

use super::Fields;
use crate::error::ApiError;

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
    /// `lm_trace` (a project extension): each token also reports its step
    /// of lm-decode's trace (see `trace.rs`).
    pub(crate) trace: bool,
}

/// The most stop strings a request may give.
const MAX_STOP_STRINGS: usize = 16;
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

/// `Sampling` reads as its policy, so a policy field is `sampling.top_p`.
impl std::ops::Deref for Sampling {
    type Target = SamplingConfig;

    fn deref(&self) -> &SamplingConfig {
        &self.policy
    }
}

/// Reads the fields both endpoints share.
pub(super) fn read(f: &Fields<'_>) -> Result<Sampling, ApiError> {
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
        trace: f.boolean("lm_trace")?.unwrap_or(false),
        format_param: format
            .as_ref()
            .map_or("response_format", |(_, field)| field),
        response_format: format.map(|(format, _)| format),
        model: f.string("model")?.map(str::to_owned),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{CompletionRequest, completion};
    use serde_json::json;

    fn param_of(result: Result<CompletionRequest, ApiError>) -> String {
        result.unwrap_err().param.unwrap()
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
}
