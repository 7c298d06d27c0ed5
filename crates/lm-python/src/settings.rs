//! Keyword arguments to the facade's `lm::Options`: the one reader of the
//! generation settings that `generate`, `chat`, `create_completion` and
//! `create_chat_completion` all take (each method has its own defaults:
//! llama-cpp-python's for the `create_*` pair, so code written for it gets
//! the same settings).
//!
//! A keyword the engine does not know is refused, never ignored; `None`
//! means "not given" (llama-cpp-python passes `seed=None`). The ranges are
//! checked once, by lm-decode (`SamplingConfig::validate`, through the
//! facade), and a format compiled once, by the facade.

use lm::{Options, OutputFormat};
use lm_decode::SamplingConfig;
use pyo3::conversion::FromPyObjectOwned;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyDictMethods, PyList, PyString};

use crate::errors::invalid;

/// The settings a method starts from.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// `None`: until an end token or the context is full.
    pub max_new_tokens: Option<usize>,
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
}

/// `generate` and `chat`: lm-decode's own defaults (temperature 1, no
/// filter) and HF's 20 new tokens.
pub const GENERATE: Defaults = Defaults {
    max_new_tokens: Some(20),
    temperature: 1.0,
    top_k: None,
    top_p: None,
    min_p: None,
};

/// llama-cpp-python's `create_completion` defaults.
pub const COMPLETION: Defaults = Defaults {
    max_new_tokens: Some(16),
    temperature: 0.8,
    top_k: Some(40),
    top_p: Some(0.95),
    min_p: Some(0.05),
};

/// llama-cpp-python's `create_chat_completion` defaults.
pub const CHAT_COMPLETION: Defaults = Defaults {
    max_new_tokens: None,
    temperature: 0.2,
    top_k: Some(40),
    top_p: Some(0.95),
    min_p: Some(0.05),
};

/// The keywords [`parse`] reads, for the error that names an unknown one.
const KNOWN: &str = "max_new_tokens (max_tokens), temperature, top_k, top_p, min_p, \
     typical_p, seed, stop, repeat_penalty (repetition_penalty), presence_penalty, \
     frequency_penalty, mirostat_mode, mirostat_tau, mirostat_eta, logit_bias, json_schema, \
     regex, grammar, choice, response_format, logprobs, top_logprobs, draft, num_beams, \
     length_penalty, echo";

/// The most top alternatives per token `logprobs` / `top_logprobs` may ask
/// (OpenAI's and lm-serve's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// What one call asks: the facade's options and the keywords that pick
/// the result's shape or the loop.
#[derive(Debug)]
pub struct Request<'py> {
    /// The generation settings (`n_top_candidates` from `logprobs`).
    pub options: Options,
    /// `Some(n)` when log-probabilities were asked, with `n` top
    /// alternatives per token.
    pub logprobs: Option<usize>,
    /// Beam search with this many beams.
    pub num_beams: Option<usize>,
    /// Beam search's length penalty (HF's default, 1).
    pub length_penalty: f32,
    /// `draft=`: "prompt-lookup", a path or a `Model`.
    pub draft: Option<Bound<'py, PyAny>>,
    /// `echo=True`: the prompt's text leads the completion's.
    pub echo: bool,
}

/// The keyword arguments, taken one by one; what is left is unknown.
struct Kwargs<'py> {
    dict: Option<Bound<'py, PyDict>>,
}

impl<'py> Kwargs<'py> {
    /// The value of `key` (removed), `None` when absent or `None`.
    fn take<T: FromPyObjectOwned<'py>>(&mut self, key: &str) -> PyResult<Option<T>> {
        let Some(dict) = &self.dict else {
            return Ok(None);
        };
        let Some(value) = dict.get_item(key)? else {
            return Ok(None);
        };
        dict.del_item(key)?;
        if value.is_none() {
            return Ok(None);
        }
        value.extract::<T>().map(Some).map_err(|error| {
            let error: PyErr = error.into();
            invalid(format!("{key}: {error}"))
        })
    }

    /// The value under either of two names (both given: refused).
    fn take_either<T: FromPyObjectOwned<'py>>(&mut self, a: &str, b: &str) -> PyResult<Option<T>> {
        match (self.take(a)?, self.take(b)?) {
            (Some(_), Some(_)) => Err(invalid(format!("give {a} or {b}, not both"))),
            (x, y) => Ok(x.or(y)),
        }
    }

    /// The raw object under `key` (removed), `None` when absent or `None`.
    fn take_object(&mut self, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.take::<Bound<'py, PyAny>>(key)
    }

    /// Refuses whatever keyword is left.
    fn finish(self) -> PyResult<()> {
        if let Some(dict) = self.dict
            && let Some((key, _)) = dict.iter().next()
        {
            return Err(invalid(format!(
                "unknown keyword argument {key} (accepted: {KNOWN})"
            )));
        }
        Ok(())
    }
}

/// Reads the generation keywords of `kwargs` (a copy is consumed) for a
/// prompt of `n_prompt` tokens; `max_new_tokens=None` is the room left in
/// the context.
pub fn parse<'py>(
    kwargs: Option<&Bound<'py, PyDict>>,
    defaults: Defaults,
    context_length: Option<usize>,
    n_prompt: usize,
) -> PyResult<Request<'py>> {
    let mut args = Kwargs {
        dict: kwargs.map(|dict| dict.copy()).transpose()?,
    };
    let given = |key: &str| {
        args.dict
            .as_ref()
            .map_or(Ok(false), |dict| dict.contains(key))
    };
    // Given as None: until the context is full.
    let max_new_tokens = if given("max_new_tokens")? || given("max_tokens")? {
        args.take_either::<usize>("max_new_tokens", "max_tokens")?
    } else {
        defaults.max_new_tokens
    };
    let mut sampling = SamplingConfig {
        temperature: args.take("temperature")?.unwrap_or(defaults.temperature),
        top_k: args.take("top_k")?.or(defaults.top_k),
        top_p: args.take("top_p")?.or(defaults.top_p),
        min_p: args.take("min_p")?.or(defaults.min_p),
        typical_p: args.take("typical_p")?,
        mirostat: args.take("mirostat_mode")?,
        mirostat_tau: args.take("mirostat_tau")?,
        mirostat_eta: args.take("mirostat_eta")?,
        repetition_penalty: args.take_either("repeat_penalty", "repetition_penalty")?,
        presence_penalty: args.take("presence_penalty")?,
        frequency_penalty: args.take("frequency_penalty")?,
        seed: match args.take::<u64>("seed")? {
            Some(seed) => seed,
            None => SamplingConfig::fresh_seed(),
        },
        ..SamplingConfig::default()
    };
    if let Some(bias) = args.take::<Bound<'_, PyDict>>("logit_bias")? {
        for (token, value) in bias.iter() {
            // llama-cpp-python and OpenAI key the bias by the id's text.
            let token: u32 = match token.extract::<u32>() {
                Ok(id) => id,
                Err(_) => token
                    .extract::<String>()?
                    .parse()
                    .map_err(|_| invalid(format!("logit_bias: key {token} is not a token id")))?,
            };
            sampling.logit_bias.push((token, value.extract::<f32>()?));
        }
    }
    sampling
        .validate()
        .map_err(|error| invalid(error.to_string()))?;
    let stop_strings = match args.take_object("stop")? {
        None => Vec::new(),
        Some(stop) if stop.is_instance_of::<PyString>() => vec![stop.extract::<String>()?],
        Some(stop) => stop
            .extract::<Vec<String>>()
            .map_err(|_| invalid("stop: expected a string or a list of strings"))?,
    };
    let format = format(&mut args)?;
    let logprobs = logprobs(&mut args)?;
    refuse_unsupported(&mut args)?;
    let num_beams = args.take::<usize>("num_beams")?;
    if num_beams == Some(0) {
        return Err(invalid("num_beams must be at least 1"));
    }
    let length_penalty = args.take::<f32>("length_penalty")?.unwrap_or(1.0);
    let draft = args.take_object("draft")?;
    let echo = args.take::<bool>("echo")?.unwrap_or(false);
    args.finish()?;
    let max_new_tokens = match max_new_tokens {
        Some(n) => n,
        None => lm_decode::context_room(context_length, n_prompt)
            .ok_or_else(|| invalid("max_new_tokens=None needs a model with a context length"))?,
    };
    Ok(Request {
        options: Options {
            max_new_tokens,
            sampling,
            stop: stop_strings,
            format,
            n_top_candidates: logprobs.unwrap_or(0),
            draft: None,
        },
        logprobs,
        num_beams,
        length_penalty,
        draft,
        echo,
    })
}

/// `logprobs` as each API spells it: an int N (top alternatives: `generate`
/// and llama-cpp-python's `create_completion`) or `True` with
/// `top_logprobs=N` (OpenAI's chat). `None`: not asked.
fn logprobs(args: &mut Kwargs<'_>) -> PyResult<Option<usize>> {
    let top = args.take::<usize>("top_logprobs")?;
    let asked = match args.take_object("logprobs")? {
        None => None,
        Some(value) if value.is_instance_of::<pyo3::types::PyBool>() => {
            value.extract::<bool>()?.then(|| top.unwrap_or(0))
        }
        Some(value) => Some(value.extract::<usize>().map_err(|_| {
            invalid("logprobs: expected True, False or a count of top alternatives")
        })?),
    };
    if top.is_some() && asked.is_none() {
        return Err(invalid("top_logprobs needs logprobs=True"));
    }
    match asked {
        Some(n) if n > MAX_TOP_LOGPROBS => Err(invalid(format!(
            "logprobs: at most {MAX_TOP_LOGPROBS} top alternatives per token, not {n}"
        ))),
        asked => Ok(asked),
    }
}

/// llama-cpp-python keywords this engine does not implement, each refused
/// by name rather than ignored (`None` is "not given" and passes).
fn refuse_unsupported(args: &mut Kwargs<'_>) -> PyResult<()> {
    const UNSUPPORTED: [(&str, &str); 5] = [
        ("suffix", "fill-in-the-middle"),
        (
            "tools",
            "tool calling (lm-serve's /v1/chat/completions renders tools)",
        ),
        (
            "tool_choice",
            "tool calling (lm-serve's /v1/chat/completions renders tools)",
        ),
        ("functions", "function calling"),
        ("function_call", "function calling"),
    ];
    for (key, what) in UNSUPPORTED {
        if args.take_object(key)?.is_some() {
            return Err(invalid(format!(
                "{key}: {what} is not supported by the Python API"
            )));
        }
    }
    Ok(())
}

/// The structured-output keywords: at most one of `json_schema`, `regex`,
/// `grammar` (GBNF or Lark, told apart as the facade's
/// `OutputFormat::from_grammar` does), `choice` and `response_format` (OpenAI's and
/// llama-cpp-python's shapes), compiled by the facade.
fn format(args: &mut Kwargs<'_>) -> PyResult<Option<OutputFormat>> {
    let mut formats = Vec::new();
    if let Some(schema) = args.take_object("json_schema")? {
        formats.push(OutputFormat::JsonSchema(to_json(&schema)?));
    }
    if let Some(pattern) = args.take::<String>("regex")? {
        formats.push(OutputFormat::Regex(pattern));
    }
    if let Some(grammar) = args.take::<String>("grammar")? {
        formats.push(OutputFormat::from_grammar(grammar));
    }
    if let Some(choice) = args.take::<Vec<String>>("choice")? {
        formats.push(OutputFormat::Choice(choice));
    }
    if let Some(response_format) = args.take_object("response_format")?
        && let Some(format) = response_format_of(&to_json(&response_format)?)?
    {
        formats.push(format);
    }
    if formats.len() > 1 {
        return Err(invalid(
            "give at most one of json_schema, regex, grammar, choice and response_format",
        ));
    }
    Ok(formats.pop())
}

/// `{"type": "text"}`, `{"type": "json_object"[, "schema": ...]}`
/// (llama-cpp-python) or `{"type": "json_schema", "json_schema": {"schema": ...}}`
/// (OpenAI).
fn response_format_of(value: &serde_json::Value) -> PyResult<Option<OutputFormat>> {
    let kind = value.get("type").and_then(serde_json::Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(match value.get("schema") {
            Some(schema) => OutputFormat::JsonSchema(schema.clone()),
            None => OutputFormat::JsonObject,
        })),
        Some("json_schema") => value
            .get("json_schema")
            .and_then(|inner| inner.get("schema"))
            .map(|schema| Some(OutputFormat::JsonSchema(schema.clone())))
            .ok_or_else(|| invalid("response_format: json_schema needs json_schema.schema")),
        _ => Err(invalid(format!(
            "response_format: type must be \"text\", \"json_object\" or \"json_schema\", not {}",
            value.get("type").unwrap_or(&serde_json::Value::Null)
        ))),
    }
}

/// A Python value (a dict, or a JSON string) as JSON, through Python's own
/// `json` module so every JSON-able value converts the way Python writes it.
pub fn to_json(value: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    let text = if value.is_instance_of::<PyString>() {
        value.extract::<String>()?
    } else {
        let json = value.py().import("json")?;
        json.call_method1("dumps", (value,))?.extract::<String>()?
    };
    serde_json::from_str(&text).map_err(|error| invalid(format!("not JSON: {error}")))
}

/// Chat messages (a list of `{"role", "content"}` dicts) as lm-tokenize's.
pub fn messages(value: &Bound<'_, PyAny>) -> PyResult<Vec<lm_tokenize::Message>> {
    if !value.is_instance_of::<PyList>() {
        return Err(invalid(
            "messages: expected a list of {\"role\": ..., \"content\": ...} dicts",
        ));
    }
    serde_json::from_value(to_json(value)?).map_err(|error| invalid(format!("messages: {error}")))
}
