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
    let ModelSpec::Gguf(path) = spec else {
        return Ok(None);
    };
    if !path.is_dir() {
        return Ok(None);
    }
    let defaults = lm::HfGeneration::read(path)?;
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
