//! The constraint fields vLLM and llama-server take besides OpenAI's
//! `response_format`: `guided_regex` (or `regex`), `guided_choice`,
//! `guided_grammar` (or `grammar`), and llama-server's top-level
//! `json_schema`. Each becomes the same [`OutputFormat`] `lm-cli generate`
//! enforces (`--regex`, `--choice`, `--grammar`, `--json-schema`), compiled
//! through the same cache as `response_format`. At most one constraint per
//! request: two is a 400 naming the second.
//!
//! A grammar is GBNF (llama.cpp's format, what llama-server's `grammar`
//! takes) when its first rule is `name ::=`, and Lark (llguidance's
//! dialect, as vLLM's `guided_grammar`) otherwise
//! ([`OutputFormat::from_grammar`]); GBNF is translated into Lark by the
//! facade. A grammar that does not parse or compile is a 400 naming the
//! field, with the translator's or the engine's message.

use lm::OutputFormat;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// The fields, in the order they are looked for, and what each holds.
const FIELDS: [(&str, Kind); 6] = [
    ("guided_regex", Kind::Regex),
    ("regex", Kind::Regex),
    ("guided_choice", Kind::Choice),
    ("guided_grammar", Kind::Grammar),
    ("grammar", Kind::Grammar),
    ("json_schema", Kind::Schema),
];

#[derive(Debug, Clone, Copy)]
enum Kind {
    Regex,
    Choice,
    Grammar,
    Schema,
}

/// The most strings `guided_choice` may list.
const MAX_CHOICES: usize = 1024;

/// The output format of `body`'s constraint fields and the field that
/// gave it, with `response_format`'s (`from_response_format`) counted as
/// one of them; `None` when no field constrains the output.
pub(crate) fn read(
    body: &Map<String, Value>,
    from_response_format: Option<OutputFormat>,
) -> Result<Option<(OutputFormat, &'static str)>, ApiError> {
    let mut found = from_response_format.map(|format| (format, "response_format"));
    for (name, kind) in FIELDS {
        let Some(value) = body.get(name).filter(|v| !v.is_null()) else {
            continue;
        };
        let format = format_of(name, kind, value)?;
        if let Some((_, first)) = &found {
            return Err(ApiError::invalid(
                name,
                format!("'{name}' and '{first}' both constrain the output; a request may give one"),
            ));
        }
        found = Some((format, name));
    }
    Ok(found)
}

fn format_of(name: &str, kind: Kind, value: &Value) -> Result<OutputFormat, ApiError> {
    let text = || {
        value
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| ApiError::invalid(name, format!("'{name}' must be a string")))
    };
    Ok(match kind {
        Kind::Regex => OutputFormat::Regex(text()?),
        Kind::Grammar => OutputFormat::from_grammar(text()?),
        Kind::Choice => {
            let options: Option<Vec<String>> = value
                .as_array()
                .filter(|items| !items.is_empty() && items.len() <= MAX_CHOICES)
                .and_then(|items| {
                    items
                        .iter()
                        .map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
                        .collect()
                });
            OutputFormat::Choice(options.ok_or_else(|| {
                ApiError::invalid(
                    name,
                    format!("'{name}' must be an array of 1 to {MAX_CHOICES} non-empty strings"),
                )
            })?)
        }
        Kind::Schema => match value {
            Value::Object(_) | Value::Bool(_) => OutputFormat::JsonSchema(value.clone()),
            _ => {
                return Err(ApiError::invalid(
                    name,
                    format!("'{name}' must be a JSON Schema object"),
                ));
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_body(body: Value) -> Result<Option<(OutputFormat, &'static str)>, ApiError> {
        read(body.as_object().unwrap(), None)
    }

    #[test]
    fn each_field_is_read_as_its_format() {
        // Each body holds one field; the format must come back named by it.
        let schema = json!({"type": "integer"});
        for (body, format) in [
            (
                json!({"guided_regex": "[0-9]+"}),
                OutputFormat::Regex("[0-9]+".into()),
            ),
            (json!({"regex": "a|b"}), OutputFormat::Regex("a|b".into())),
            (
                json!({"guided_choice": ["yes", "no"]}),
                OutputFormat::Choice(vec!["yes".into(), "no".into()]),
            ),
            (
                json!({"guided_grammar": "start: \"a\""}),
                OutputFormat::Lark("start: \"a\"".into()),
            ),
            (
                json!({"grammar": "start: \"a\""}),
                OutputFormat::Lark("start: \"a\"".into()),
            ),
            (
                json!({"grammar": "# a GBNF grammar\nroot ::= \"a\""}),
                OutputFormat::Gbnf("# a GBNF grammar\nroot ::= \"a\"".into()),
            ),
            (
                json!({"guided_grammar": "root ::= [0-9]+"}),
                OutputFormat::Gbnf("root ::= [0-9]+".into()),
            ),
            (
                json!({"json_schema": schema}),
                OutputFormat::JsonSchema(schema.clone()),
            ),
        ] {
            let field = body.as_object().unwrap().keys().next().unwrap().clone();
            let (read, named) = read_body(body.clone()).unwrap().unwrap();
            assert_eq!((read, named), (format, field.as_str()), "{body}");
        }
        assert_eq!(read_body(json!({})).unwrap(), None);
    }

    #[test]
    fn bad_and_doubled_fields_are_400s_naming_the_field() {
        for (body, param) in [
            (json!({"guided_regex": 1}), "guided_regex"),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice"),
            (json!({"grammar": 7}), "grammar"),
            (json!({"json_schema": "object"}), "json_schema"),
            (
                json!({"regex": "a", "guided_choice": ["a"]}),
                "guided_choice",
            ),
        ] {
            let error = read_body(body.clone()).unwrap_err();
            assert_eq!(error.param.as_deref(), Some(param), "{body}");
        }
        let error = read(
            json!({"regex": "a"}).as_object().unwrap(),
            Some(OutputFormat::JsonObject),
        )
        .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("regex"));
        assert!(
            error.message.contains("'response_format'"),
            "{}",
            error.message
        );
    }
}
