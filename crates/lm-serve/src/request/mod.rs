//! Request bodies in OpenAI's wire format, read from JSON by hand so each
//! error names its field: a wrong type or a value out of range is a 400
//! with `param` set; fields this server does not know are ignored, as
//! OpenAI's servers do. This module reads what each endpoint asks for
//! (the prompt, the chat history, `logprobs`) and checks `model`;
//! `sampling.rs` reads the fields both endpoints share and `fields.rs`
//! the typed reader they all use.

mod fields;
mod sampling;

use lm_core::TokenId;
use lm_tokenize::Message;
use serde_json::Value;

use crate::error::ApiError;
pub(crate) use fields::Fields;
pub(crate) use sampling::Sampling;

/// What to continue: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Prompt {
    Text(String),
    Tokens(Vec<TokenId>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CompletionRequest {
    pub(crate) prompt: Prompt,
    pub(crate) sampling: Sampling,
    /// How many top tokens to report per position (`logprobs`), if any.
    pub(crate) logprobs: Option<usize>,
    /// `echo`: the answer's text starts with the prompt (and, with
    /// `logprobs`, its logprobs with the prompt's; see `echo.rs`).
    pub(crate) echo: bool,
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
    /// `chat_template_kwargs`: extra variables of the chat template's
    /// render (`enable_thinking`), as vLLM and llama-server take them.
    pub(crate) template_kwargs: crate::TemplateVariables,
}

/// The roles a chat message may have; `developer` (OpenAI's newer name
/// for the system role) is read as `system`, which templates know.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The most alternatives per position `logprobs`/`top_logprobs` may ask.
pub(crate) const MAX_TOP_LOGPROBS: usize = 20;

/// Checks the request's `model` against the one served (`served`): another
/// name is a 404 `model_not_found`, as OpenAI answers, unless `any_model`.
/// A request without `model` is served.
pub(crate) fn check_model(
    requested: Option<&str>,
    served: &str,
    any_model: bool,
) -> Result<(), ApiError> {
    match requested {
        Some(name) if name != served && !any_model => Err(model_not_found(name, &[served])),
        _ => Ok(()),
    }
}

/// The 404 `model_not_found` for a request naming `name`, which is none of
/// the `served` ids.
pub(crate) fn model_not_found(name: &str, served: &[&str]) -> ApiError {
    let served = served
        .iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut error = ApiError::status(
        axum::http::StatusCode::NOT_FOUND,
        format!(
            "the model '{name}' does not exist: this server serves {served} \
             (lm-cli serve --any-model answers whatever 'model' says)"
        ),
    )
    .with_code("model_not_found");
    error.param = Some("model".to_owned());
    error
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
    let sampling = sampling::read(&f)?;
    refuse_unsupported(&f, &COMPLETION_UNSUPPORTED)?;
    if let Some(best_of) = f.integer_in("best_of", 1, 128)?
        && best_of as usize != sampling.n
    {
        return Err(ApiError::invalid(
            "best_of",
            format!(
                "'best_of' {best_of} is not supported: this server does not rank candidates                  server-side (send 'n' {best_of} and rank by the choices' logprobs)"
            ),
        ));
    }
    Ok(CompletionRequest {
        prompt,
        sampling,
        logprobs: f
            .integer_in("logprobs", 0, MAX_TOP_LOGPROBS as i64)?
            .map(|n| n as usize),
        echo: f.boolean("echo")?.unwrap_or(false),
    })
}

/// Fields OpenAI's APIs define that would change the answer and that this
/// server does not implement, with what to do instead: a 400 naming the
/// field, never silence (unknown fields are ignored; these are not
/// unknown).
type Unsupported = [(&'static str, &'static str)];

const COMPLETION_UNSUPPORTED: [(&str, &str); 1] = [(
    "suffix",
    "fill-in-the-middle is not supported: send the whole prompt",
)];

const CHAT_UNSUPPORTED: [(&str, &str); 2] = [
    (
        "functions",
        "the legacy function-calling fields are not supported: send 'tools'",
    ),
    (
        "function_call",
        "the legacy function-calling fields are not supported: send 'tool_choice'",
    ),
];

/// A 400 for the first field of `unsupported` the body sets (`null`, and
/// an empty `suffix`, are not set).
fn refuse_unsupported(f: &Fields<'_>, unsupported: &Unsupported) -> Result<(), ApiError> {
    for &(name, why) in unsupported {
        match f.get(name) {
            None => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(_) => return Err(ApiError::invalid(name, format!("'{name}': {why}"))),
        }
    }
    Ok(())
}

/// Reads a `/v1/chat/completions` body.
pub(crate) fn chat(body: &Value) -> Result<ChatRequest, ApiError> {
    let f = Fields::of(body)?;
    refuse_unsupported(&f, &CHAT_UNSUPPORTED)?;
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
    let template_kwargs = match f.get("chat_template_kwargs") {
        None => crate::TemplateVariables::new(),
        Some(Value::Object(kwargs)) => kwargs.clone(),
        Some(v) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                format!("'chat_template_kwargs' must be an object, got {v}"),
            ));
        }
    };
    Ok(ChatRequest {
        messages,
        template_kwargs,
        tools: crate::tools::read(f.0)?,
        sampling: sampling::read(&f)?,
        logprobs: logprobs.then(|| top.unwrap_or(0) as usize),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_unknown_fields() {
        let r = completion(&json!({"prompt": "hi", "model": "x", "unknown": [1]})).unwrap();
        assert_eq!(r.prompt, Prompt::Text("hi".into()));
        assert_eq!(r.sampling.temperature, 1.0);
        assert_eq!(r.sampling.n, 1);
        assert_eq!(r.sampling.max_tokens, None);
        assert_eq!(r.logprobs, None);
        assert!(!r.echo);
    }

    #[test]
    fn every_field_is_read() {
        let r = completion(&json!({
            "prompt": [1, 2], "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
            "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.1, "logit_bias": {"7": -100}, "seed": 42,
            "stop": ["\n", "."], "n": 3, "stream": true,
            "stream_options": {"include_usage": true}, "logprobs": 2, "echo": true
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
        assert!(r.echo);
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
            (
                json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]}),
                "chat_template_kwargs",
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

    #[test]
    fn fields_that_change_the_answer_are_400s_when_unsupported() {
        for (body, param) in [
            (json!({"prompt": "a", "suffix": "b"}), "suffix"),
            (json!({"prompt": "a", "best_of": 3}), "best_of"),
            (json!({"prompt": "a", "n": 2, "best_of": 3}), "best_of"),
        ] {
            let error = completion(&body).unwrap_err();
            assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(error.param.as_deref(), Some(param), "{body}");
        }
        for field in ["functions", "function_call"] {
            let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
            body[field] = json!([{"name": "f"}]);
            assert_eq!(chat(&body).unwrap_err().param.as_deref(), Some(field));
        }
        // What asks for nothing different is served: no suffix, an empty
        // or null one, and best_of equal to n.
        for body in [
            json!({"prompt": "a", "suffix": ""}),
            json!({"prompt": "a", "suffix": null}),
            json!({"prompt": "a", "n": 2, "best_of": 2}),
            json!({"prompt": "a", "best_of": 1}),
        ] {
            assert!(completion(&body).is_ok(), "{body}");
        }
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
