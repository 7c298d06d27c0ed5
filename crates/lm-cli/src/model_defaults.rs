//! A Hugging Face model directory's sampling defaults
//! (`generation_config.json`: temperature, top-p, top-k) for the flags the
//! user left unset, as `transformers`' `generate` takes them; the `--json`
//! settings name the file and the fields it set. Its end ids are the
//! tokenizer's already (`lm`'s `GgufText::from_hf_dir`).

use anyhow::Result;
use serde::Serialize;

use crate::cli::FilterArgs;
use crate::spec::ModelSpec;

/// Settings that came from the model's files rather than the flags, in
/// the `--json` settings as `"defaults": {"source": .., "fields": [..]}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DefaultsSource {
    /// The file they came from (`generation_config.json`).
    pub source: &'static str,
    /// The settings it gave (`temperature`, `top_p`, `top_k`).
    pub fields: Vec<&'static str>,
}

/// Fills `filters`' unset temperature, top-p and top-k from
/// `generation_config.json` when `spec` is a Hugging Face directory; says
/// which it filled (none for any other model, or a file without them).
pub fn apply(spec: &ModelSpec, filters: &mut FilterArgs) -> Result<Option<DefaultsSource>> {
    let Some(defaults) = generation_config(spec)? else {
        return Ok(None);
    };
    let mut fields = Vec::new();
    if filters.temperature.is_none()
        && let Some(t) = defaults.temperature
    {
        filters.temperature = Some(t);
        fields.push("temperature");
    }
    if filters.top_p.is_none()
        && let Some(p) = defaults.top_p
    {
        filters.top_p = Some(p);
        fields.push("top_p");
    }
    if filters.top_k.is_none()
        && let Some(k) = defaults.top_k
    {
        filters.top_k = Some(k as usize);
        fields.push("top_k");
    }
    Ok((!fields.is_empty()).then_some(DefaultsSource {
        source: "generation_config.json",
        fields,
    }))
}

/// What `lm-cli serve` gives lm-serve as request defaults
/// (`ServeConfig::request_defaults`): `generation_config.json`'s
/// temperature, top_p and top_k under their request field names; empty for
/// any model that is not a Hugging Face directory.
pub fn request_defaults(spec: &ModelSpec) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut fields = serde_json::Map::new();
    if let Some(defaults) = generation_config(spec)? {
        let given = [
            ("temperature", defaults.temperature.map(shortest)),
            ("top_p", defaults.top_p.map(shortest)),
            ("top_k", defaults.top_k.map(serde_json::Value::from)),
        ];
        for (name, value) in given {
            if let Some(value) = value {
                fields.insert(name.to_owned(), value);
            }
        }
    }
    Ok(fields)
}

/// A Hugging Face directory's `generation_config.json` (all `None` when
/// the file is absent); `None` for any other model.
fn generation_config(spec: &ModelSpec) -> Result<Option<lm::HfGeneration>> {
    match spec {
        ModelSpec::Gguf(path) if path.is_dir() => Ok(Some(lm::HfGeneration::read(path)?)),
        _ => Ok(None),
    }
}

/// `x` as JSON in its shortest decimal (0.2, not 0.20000000298023224: the
/// f32 read back is `x` itself).
fn shortest(x: f32) -> serde_json::Value {
    x.to_string()
        .parse::<f64>()
        .map_or(serde_json::Value::Null, serde_json::Value::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directorys_generation_config_becomes_request_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"temperature": 0.2, "top_p": 0.9, "top_k": 40, "eos_token_id": 2}"#,
        )
        .unwrap();
        let fields = request_defaults(&ModelSpec::Gguf(dir.path().to_owned())).unwrap();
        assert_eq!(
            serde_json::Value::Object(fields),
            serde_json::json!({"temperature": 0.2, "top_p": 0.9, "top_k": 40})
        );
        // A file, not a directory: OpenAI's defaults stand.
        let file = ModelSpec::Gguf(dir.path().join("model.gguf"));
        assert!(request_defaults(&file).unwrap().is_empty());
    }
}
