//! [`ChatTemplate`]: a model's Jinja chat template (GGUF's
//! `tokenizer.chat_template`) rendered with minijinja, the way Hugging Face's
//! `apply_chat_template` renders it.
//!
//! Like Hugging Face, the environment trims the first newline after a block
//! tag and strips spaces before one (`trim_blocks`, `lstrip_blocks`), and
//! offers `raise_exception(msg)`, the `tojson` filter and a few Python string
//! methods (`strip`, `lstrip`, `rstrip`, `startswith`, `endswith`, `upper`,
//! `lower`, `split`, `replace`) that templates call on message content.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind, State};
use serde::{Deserialize, Serialize};

use crate::TokenizeError;

/// The name the template is stored under inside its environment.
const TEMPLATE_NAME: &str = "chat";

/// One chat message: who speaks (`"system"`, `"user"`, `"assistant"`) and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The speaker's role.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message from `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
///
/// ```
/// use lm_tokenize::{ChatTemplate, Message};
/// let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}\
///               {% if add_generation_prompt %}<assistant>{% endif %}";
/// let template = ChatTemplate::new(source, None, None).unwrap();
/// let text = template.render(&[Message::new("user", "Hi")], true).unwrap();
/// assert_eq!(text, "<user>Hi\n<assistant>");
/// ```
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` fill the template
    /// variables of the same names (empty when `None`).
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, TokenizeError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", to_json);
        env.set_unknown_method_callback(python_method);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|source| TokenizeError::TemplateSyntax { source })?;
        Ok(Self {
            env,
            bos_token: bos_token.unwrap_or_default().to_owned(),
            eos_token: eos_token.unwrap_or_default().to_owned(),
        })
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends
    /// with the opening of an assistant turn, ready for generation.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizeError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|source| TokenizeError::TemplateRender { source })?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|source| TokenizeError::TemplateRender { source })
    }
}

/// Hugging Face's `raise_exception(message)`: fails the render with `message`.
fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// Hugging Face's `tojson` filter (JSON text, `indent` optional).
fn to_json(value: Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = match indent {
        Some(width) => {
            let indent_text = " ".repeat(width);
            let formatter = serde_json::ser::PrettyFormatter::with_indent(indent_text.as_bytes());
            let mut bytes = Vec::new();
            let mut serializer = serde_json::Serializer::with_formatter(&mut bytes, formatter);
            value
                .serialize(&mut serializer)
                .map_err(|err| JinjaError::new(ErrorKind::BadSerialization, err.to_string()))?;
            String::from_utf8(bytes)
                .map_err(|err| JinjaError::new(ErrorKind::BadSerialization, err.to_string()))?
        }
        None => serde_json::to_string(&value)
            .map_err(|err| JinjaError::new(ErrorKind::BadSerialization, err.to_string()))?,
    };
    Ok(Value::from_safe_string(json))
}

/// The Python string methods chat templates call, on string values only.
fn python_method(
    _state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, JinjaError> {
    let Some(text) = value.as_str().filter(|_| value.kind() == ValueKind::String) else {
        return Err(JinjaError::from(ErrorKind::UnknownMethod));
    };
    let string_arg = |idx: usize| -> Result<Option<&str>, JinjaError> {
        match args.get(idx) {
            None => Ok(None),
            Some(arg) if arg.is_none() => Ok(None),
            Some(arg) => arg.as_str().map(Some).ok_or_else(|| {
                JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!("{method} expects a string argument"),
                )
            }),
        }
    };
    let trimmed = |chars: Option<&str>, left: bool, right: bool| -> String {
        let is_stripped = |c: char| chars.map_or(c.is_whitespace(), |set| set.contains(c));
        let mut rest = text;
        if left {
            rest = rest.trim_start_matches(is_stripped);
        }
        if right {
            rest = rest.trim_end_matches(is_stripped);
        }
        rest.to_owned()
    };
    Ok(match method {
        "strip" => Value::from(trimmed(string_arg(0)?, true, true)),
        "lstrip" => Value::from(trimmed(string_arg(0)?, true, false)),
        "rstrip" => Value::from(trimmed(string_arg(0)?, false, true)),
        "startswith" => Value::from(string_arg(0)?.is_some_and(|p| text.starts_with(p))),
        "endswith" => Value::from(string_arg(0)?.is_some_and(|p| text.ends_with(p))),
        "upper" => Value::from(text.to_uppercase()),
        "lower" => Value::from(text.to_lowercase()),
        "split" => match string_arg(0)? {
            Some(sep) if !sep.is_empty() => {
                Value::from(text.split(sep).map(Value::from).collect::<Vec<_>>())
            }
            Some(_) => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    "split separator is empty",
                ));
            }
            None => Value::from(text.split_whitespace().map(Value::from).collect::<Vec<_>>()),
        },
        "replace" => match (string_arg(0)?, string_arg(1)?) {
            (Some(old), Some(new)) => Value::from(text.replace(old, new)),
            _ => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    "replace expects two strings",
                ));
            }
        },
        _ => return Err(JinjaError::from(ErrorKind::UnknownMethod)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &[Message]) -> Result<String, TokenizeError> {
        ChatTemplate::new(source, Some("<s>"), Some("</s>"))?.render(messages, false)
    }

    #[test]
    fn blocks_trim_their_newline_like_hugging_face() {
        let source = "{% for m in messages %}\n  {% if true %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}";
        let text = render(
            source,
            &[Message::new("user", "a"), Message::new("user", "b")],
        )
        .unwrap();
        assert_eq!(text, "[a]\n[b]\n");
    }

    #[test]
    fn bos_and_eos_tokens_are_variables() {
        assert_eq!(
            render("{{ bos_token }}x{{ eos_token }}", &[]).unwrap(),
            "<s>x</s>"
        );
    }

    #[test]
    fn raise_exception_fails_the_render_with_its_message() {
        let err = render("{{ raise_exception('roles must alternate') }}", &[]).unwrap_err();
        assert!(
            matches!(err, TokenizeError::TemplateRender { .. }),
            "{err:?}"
        );
        let source = std::error::Error::source(&err)
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(source.contains("roles must alternate"), "{source}");
    }

    #[test]
    fn python_string_methods_work_on_content() {
        let messages = [Message::new("user", "  Hello World  ")];
        let source = "{% set c = messages[0].content %}[{{ c.strip() }}|{{ c.lstrip() }}|{{ c.rstrip() }}|\
                      {{ c.strip().startswith('Hello') }}|{{ c.strip().endswith('x') }}|{{ c.upper() }}|\
                      {{ c.split() | join(',') }}|{{ c.replace('World', 'you') }}|{{ 'xxaxx'.strip('x') }}]";
        assert_eq!(
            render(source, &messages).unwrap(),
            "[Hello World|Hello World  |  Hello World|True|False|  HELLO WORLD  |Hello,World|  Hello you  |a]"
        );
    }

    #[test]
    fn tojson_writes_json() {
        let messages = [Message::new("user", "say \"hi\"")];
        assert_eq!(
            render("{{ messages[0].content | tojson }}", &messages).unwrap(),
            r#""say \"hi\"""#
        );
    }

    #[test]
    fn syntax_error_is_typed() {
        let err = ChatTemplate::new("{% for %}", None, None).unwrap_err();
        assert!(
            matches!(err, TokenizeError::TemplateSyntax { .. }),
            "{err:?}"
        );
    }
}
