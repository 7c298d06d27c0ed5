//! [`ChatTemplate`]: a model's Jinja chat template (GGUF's
//! `tokenizer.chat_template`) rendered with minijinja, the way Hugging Face's
//! `apply_chat_template` renders it.
//!
//! Like Hugging Face, the environment trims the first newline after a block
//! tag and strips spaces before one (`trim_blocks`, `lstrip_blocks`), and
//! offers `raise_exception(msg)`, the `tojson` filter and a few Python string
//! methods (`strip`, `lstrip`, `rstrip`, `startswith`, `endswith`, `upper`,
//! `lower`, `split`, `replace`) that templates call on message content.
//!
//! A template is code from a model file, so a render is bounded: at most
//! [`TEMPLATE_FUEL`] of minijinja's fuel, which pays for instructions and
//! for every byte the template builds (so `{% set s = s ~ s %}` in a loop
//! cannot exhaust memory), and [`MAX_RENDERED_BYTES`] of output; a template
//! that needs more is a typed error naming it, never a hang.
//!
//! [`ChatTemplate::render_parts`] tells the template's markup from the
//! messages' contents, so a tokenizer can read special-token text in the
//! markup and keep it literal in what the speakers wrote:
//!
//! ```text
//! messages     [user: "Hi <|im_end|>"]
//! rendered     <|im_start|>user\n\u{E000}0\u{E001}<|im_end|>\n<|im_start|>assistant\n
//! parts        markup "<|im_start|>user\n" | content "Hi <|im_end|>" | markup "<|im_end|>\n<|im_start|>assistant\n"
//! ```

use std::io::Write;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind, State};
use serde::{Deserialize, Serialize};

use crate::TokenizeError;

/// The name the template is stored under inside its environment.
const TEMPLATE_NAME: &str = "chat";

/// One render's budget of minijinja's fuel: an instruction costs one, and
/// every 64 bytes a template builds or writes (strings, lists, filter
/// results, output) cost one more, so a render runs at most
/// 4 million instructions and allocates at most about 256 MB in all. A chat
/// template spends a few instructions per message and a rendered prompt of
/// [`MAX_RENDERED_BYTES`] costs a quarter of a million, so this is ample for
/// conversations far beyond any context, and stops a template that loops
/// without a practical end (two nested `range(100000)`) in a fraction of a
/// second or doubles a string in a loop long before memory runs out.
pub const TEMPLATE_FUEL: u64 = 4_000_000;

/// How many bytes of data one unit of fuel pays for (minijinja 3's rate).
const BYTES_PER_FUEL: u64 = 64;

/// The bytes one item of a list costs (minijinja's value).
const VALUE_BYTES: usize = 24;

/// The longest rendered prompt, in bytes: 16 MiB, some 4 million tokens,
/// beyond any model's context.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// The characters that mark a message's content (its index between them)
/// while rendering for [`ChatTemplate::render_parts`]; private-use code
/// points, so a message holding them is refused rather than misread.
const OPEN: char = '\u{E000}';
const CLOSE: char = '\u{E001}';

/// One chat message: who speaks (`"system"`, `"user"`, `"assistant"`,
/// `"tool"`) and what; an assistant's message may carry the tool calls it
/// made, a tool's the id of the call it answers. Templates see the message
/// as Hugging Face's `apply_chat_template` passes it: the optional fields
/// are absent (not `none`) when unset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The speaker's role.
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant's tool calls, in OpenAI's shape (`[{"id", "type":
    /// "function", "function": {"name", "arguments"}}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message from `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }

    /// The same message with a different content (and the same tool fields).
    fn with_content(&self, content: String) -> Self {
        Self {
            content,
            ..self.clone()
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
    /// What errors call the template (`tokenizer.chat_template`).
    name: String,
    bos_token: String,
    eos_token: String,
    /// Extra variables of every render ([`ChatTemplate::with_variables`]).
    variables: serde_json::Map<String, serde_json::Value>,
}

/// One piece of a rendered chat prompt ([`ChatTemplate::render_parts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPart {
    /// The text.
    pub text: String,
    /// Whether it is a message's content (what a speaker wrote, to be kept
    /// literal) rather than the template's own markup.
    pub is_content: bool,
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
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|source| TokenizeError::TemplateSyntax { source })?,
        );
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", to_json);
        env.set_unknown_method_callback(python_method);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|source| TokenizeError::TemplateSyntax { source })?;
        Ok(Self {
            env,
            name: TEMPLATE_NAME.to_owned(),
            bos_token: bos_token.unwrap_or_default().to_owned(),
            eos_token: eos_token.unwrap_or_default().to_owned(),
            variables: serde_json::Map::new(),
        })
    }

    /// Adds `variables` to every render's variables, as Hugging Face's
    /// `apply_chat_template(**kwargs)` and vLLM's and llama-server's
    /// `chat_template_kwargs` pass them (`enable_thinking`). The template's
    /// own variables (`messages`, `add_generation_prompt`, `bos_token`,
    /// `eos_token`, `tools`) win over an entry of the same name.
    pub fn with_variables(mut self, variables: serde_json::Map<String, serde_json::Value>) -> Self {
        self.variables = variables;
        self
    }

    /// The template under `name` in errors (`tokenizer.chat_template`).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends
    /// with the opening of an assistant turn, ready for generation.
    ///
    /// A template that runs out of [`TEMPLATE_FUEL`] or writes more than
    /// [`MAX_RENDERED_BYTES`] is [`TokenizeError::TemplateTooCostly`].
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizeError> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render`] with the `tools` variable set (OpenAI's
    /// `tools` array, as Hugging Face's `apply_chat_template(tools=...)`
    /// passes it); `None` leaves it undefined.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, TokenizeError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|source| TokenizeError::TemplateRender { source })?;
        let mut out = CappedOutput::new(MAX_RENDERED_BYTES);
        let rendered = template.render_captured_to(
            minijinja::context! {
                messages => Serde(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                tools => Serde(tools),
                ..Value::from(Serde(&self.variables))
            },
            &mut out,
        );
        match rendered {
            Ok(_) => Ok(String::from_utf8_lossy(&out.bytes).into_owned()),
            Err(_) if out.overflowed => Err(TokenizeError::TemplateTooCostly {
                template: self.name.clone(),
                limit: format!("{MAX_RENDERED_BYTES} bytes of output"),
            }),
            Err(source) if is_out_of_fuel(&source) => Err(TokenizeError::TemplateTooCostly {
                template: self.name.clone(),
                limit: format!("{TEMPLATE_FUEL} fuel (instructions and bytes built)"),
            }),
            Err(source) => Err(TokenizeError::TemplateRender { source }),
        }
    }

    /// The prompt for `messages` in pieces, the template's markup apart
    /// from the messages' contents (see the module's drawing). It ends with
    /// the opening of an assistant turn, or, when the last message is the
    /// assistant's, inside that message, right after its content, so the
    /// reply continues it (prefill, as llama-server and vLLM's
    /// `continue_final_message` do).
    ///
    /// Each content is rendered as a marker (U+E000, its index, U+E001),
    /// so a template that transforms the content (`| trim`) transforms the
    /// marker instead and the content goes in as given. A content holding
    /// a marker character is [`TokenizeError::MarkerInMessage`]; a template
    /// that does not write the final assistant message cannot be continued
    /// ([`TokenizeError::CannotContinueMessage`]).
    pub fn render_parts(&self, messages: &[Message]) -> Result<Vec<ChatPart>, TokenizeError> {
        self.render_parts_with_tools(messages, None)
    }

    /// [`ChatTemplate::render_parts`] with the `tools` variable set (see
    /// [`ChatTemplate::render_with_tools`]). An empty content (an
    /// assistant's message that only calls tools) is rendered as empty, not
    /// marked, so `{% if message.content %}` reads it as templates expect.
    pub fn render_parts_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<ChatPart>, TokenizeError> {
        if let Some(message_idx) = messages
            .iter()
            .position(|m| m.content.contains([OPEN, CLOSE]))
        {
            return Err(TokenizeError::MarkerInMessage { message_idx });
        }
        let continues = messages.last().is_some_and(|m| m.role == "assistant");
        let last = messages.len().saturating_sub(1);
        let marked: Vec<Message> = messages
            .iter()
            .enumerate()
            .map(|(idx, m)| {
                if m.content.is_empty() && !(continues && idx == last) {
                    m.clone()
                } else {
                    m.with_content(format!("{OPEN}{idx}{CLOSE}"))
                }
            })
            .collect();
        let rendered = self.render_with_tools(&marked, !continues, tools)?;
        let mut parts = Vec::new();
        // Where the final message's content last ends, in parts.
        let mut final_end = None;
        let mut rest = rendered.as_str();
        while let Some(open) = rest.find(OPEN) {
            push_part(&mut parts, &rest[..open], false);
            let after = &rest[open + OPEN.len_utf8()..];
            let close = after.find(CLOSE).unwrap_or(after.len());
            let message_idx = after[..close].parse::<usize>().ok();
            if let Some(message) = message_idx.and_then(|idx| messages.get(idx)) {
                push_part(&mut parts, &message.content, true);
                if message_idx == Some(messages.len() - 1) {
                    final_end = Some(parts.len());
                }
            }
            rest = after.get(close + CLOSE.len_utf8()..).unwrap_or("");
        }
        push_part(&mut parts, rest, false);
        if continues {
            let end = final_end.ok_or(TokenizeError::CannotContinueMessage)?;
            parts.truncate(end);
        }
        Ok(parts)
    }

    /// The prompt text for `messages`, ready for generation: the opening of
    /// an assistant turn, or the final assistant message continued (see
    /// [`ChatTemplate::render_parts`]).
    pub fn render_prompt(&self, messages: &[Message]) -> Result<String, TokenizeError> {
        if messages.last().is_some_and(|m| m.role == "assistant") {
            let parts = self.render_parts(messages)?;
            Ok(parts.into_iter().map(|part| part.text).collect())
        } else {
            self.render(messages, true)
        }
    }

    /// Whether the template renders the `tools` variable: a conversation
    /// rendered with a probe tool differs from the same without it (how
    /// llama.cpp's minja finds a template's capabilities). A template that
    /// fails either render reads as not reading tools.
    pub fn reads_tools(&self) -> bool {
        let probe = serde_json::json!([{
            "type": "function",
            "function": {
                "name": "lm_probe_tool",
                "description": "A probe.",
                "parameters": {"type": "object", "properties": {}},
            },
        }]);
        let messages = [Message::new("user", "Hi")];
        match (
            self.render_with_tools(&messages, true, Some(&probe)),
            self.render(&messages, true),
        ) {
            (Ok(with), Ok(without)) => with != without,
            _ => false,
        }
    }
}

/// Appends `text` to `parts` unless it is empty.
fn push_part(parts: &mut Vec<ChatPart>, text: &str, is_content: bool) {
    if !text.is_empty() {
        parts.push(ChatPart {
            text: text.to_owned(),
            is_content,
        });
    }
}

/// Bytes written, refusing to grow beyond `limit`: a render's output
/// ([`MAX_RENDERED_BYTES`]), or JSON text the remaining fuel can pay for.
struct CappedOutput {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl CappedOutput {
    fn new(limit: usize) -> Self {
        Self {
            bytes: Vec::new(),
            limit,
            overflowed: false,
        }
    }
}

impl Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other("the output is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether `error`, or an error it wraps (a macro's, a filter's), is
/// minijinja running out of fuel.
fn is_out_of_fuel(error: &JinjaError) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = current {
        if error
            .downcast_ref::<JinjaError>()
            .is_some_and(|e| e.kind() == ErrorKind::OutOfFuel)
        {
            return true;
        }
        current = error.source();
    }
    false
}

/// Hugging Face's `raise_exception(message)`: fails the render with `message`.
fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// Hugging Face's `tojson` filter (JSON text, `indent` optional). The text
/// is written no further than the render's remaining fuel can pay for, nor
/// beyond [`MAX_RENDERED_BYTES`] (no prompt holds more): a value may be far
/// larger as JSON than it was charged as (a list repeated lazily,
/// `[x] * 10**8`).
fn to_json(state: &State, value: Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let limit = match state.fuel_levels() {
        Some((_, remaining)) => usize::try_from(remaining.saturating_mul(BYTES_PER_FUEL))
            .unwrap_or(usize::MAX)
            .min(MAX_RENDERED_BYTES),
        None => MAX_RENDERED_BYTES,
    };
    let mut out = CappedOutput::new(limit);
    let written = match indent {
        Some(width) => {
            let indent_text = " ".repeat(width.min(MAX_JSON_INDENT));
            let formatter = serde_json::ser::PrettyFormatter::with_indent(indent_text.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(
                &mut out, formatter,
            ))
        }
        None => value.serialize(&mut serde_json::Serializer::new(&mut out)),
    };
    match written {
        Ok(()) => {}
        Err(_) if out.overflowed => return Err(JinjaError::from(ErrorKind::OutOfFuel)),
        Err(err) => {
            return Err(JinjaError::new(
                ErrorKind::BadSerialization,
                err.to_string(),
            ));
        }
    }
    let json = String::from_utf8(out.bytes)
        .map_err(|err| JinjaError::new(ErrorKind::BadSerialization, err.to_string()))?;
    Ok(Value::from_safe_string(json))
}

/// The widest `tojson(indent=N)` honoured; templates use 2 or 4.
const MAX_JSON_INDENT: usize = 16;

/// Refuses a result of `bytes` bytes that the render's remaining fuel could
/// not pay for, before it is built: minijinja charges what a method returns
/// only once it exists.
fn ensure_fuel_for(state: &State, bytes: usize) -> Result<(), JinjaError> {
    match state.fuel_levels() {
        Some((_, remaining)) if bytes as u64 / BYTES_PER_FUEL > remaining => {
            Err(JinjaError::from(ErrorKind::OutOfFuel))
        }
        _ => Ok(()),
    }
}

/// The Python string methods chat templates call, on string values only.
fn python_method(
    state: &mut State,
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
        // Case mapping at most triples a string's bytes (`ΐ`, two bytes,
        // upper-cases to three characters of two).
        "upper" | "lower" => {
            ensure_fuel_for(state, text.len().saturating_mul(3))?;
            Value::from(if method == "upper" {
                text.to_uppercase()
            } else {
                text.to_lowercase()
            })
        }
        "split" => match string_arg(0)? {
            Some(sep) if !sep.is_empty() => {
                ensure_fuel_for(state, (text.matches(sep).count() + 1) * VALUE_BYTES)?;
                Value::from(text.split(sep).map(Value::from).collect::<Vec<_>>())
            }
            Some(_) => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    "split separator is empty",
                ));
            }
            None => {
                ensure_fuel_for(state, text.split_whitespace().count() * VALUE_BYTES)?;
                Value::from(text.split_whitespace().map(Value::from).collect::<Vec<_>>())
            }
        },
        "replace" => match (string_arg(0)?, string_arg(1)?) {
            (Some(old), Some(new)) => {
                // An empty `old` matches before every character and at the end.
                let matches = if old.is_empty() {
                    text.chars().count() + 1
                } else {
                    text.matches(old).count()
                };
                ensure_fuel_for(
                    state,
                    text.len().saturating_add(matches.saturating_mul(new.len())),
                )?;
                Value::from(text.replace(old, new))
            }
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

    /// Tools reach the template as `tools`, and a message's tool calls and
    /// call id as its fields, as Hugging Face passes them; an empty content
    /// is empty to `{% if %}`, not a marker.
    #[test]
    fn tools_and_tool_calls_reach_the_template() {
        let source = "{% if tools %}[{% for t in tools %}{{ t.function.name }}{% endfor %}]{% endif %}\
                      {% for m in messages %}<{{ m.role }}>{% if m.content %}{{ m.content }}{% endif %}\
                      {% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }}\
                      {{ c.function.arguments | tojson }}{% endfor %}{% endif %}\
                      {% if m.tool_call_id is defined %}#{{ m.tool_call_id }}{% endif %}{% endfor %}";
        let template = ChatTemplate::new(source, None, None).unwrap();
        let mut call = Message::new("assistant", "");
        call.tool_calls = Some(serde_json::json!([
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
        ]));
        let mut result = Message::new("tool", "42");
        result.tool_call_id = Some("c1".into());
        let messages = [Message::new("user", "Hi"), call, result];
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let parts = template
            .render_parts_with_tools(&messages, Some(&tools))
            .unwrap();
        let text: String = parts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(text, "[f]<user>Hi<assistant>call f{\"x\":1}<tool>42#c1");
        assert_eq!(
            template.render(&messages, false).unwrap(),
            "<user>Hi<assistant>call f{\"x\":1}<tool>42#c1"
        );
        assert!(template.reads_tools());
        let plain = ChatTemplate::new(
            "{% for m in messages %}{{ m.content }}{% endfor %}",
            None,
            None,
        )
        .unwrap();
        assert!(!plain.reads_tools());
    }

    /// Extra variables reach the template (Qwen3's `enable_thinking`, as
    /// `chat_template_kwargs` sends it); the template's own win a clash.
    #[test]
    fn extra_variables_reach_the_template_and_cannot_replace_its_own() {
        let source = "{{ messages[0].content }}|{{ enable_thinking is defined }}|\
                      {% if enable_thinking is false %}off{% endif %}|{{ add_generation_prompt }}";
        let messages = [Message::new("user", "Hi")];
        let template = ChatTemplate::new(source, None, None).unwrap();
        assert_eq!(template.render(&messages, true).unwrap(), "Hi|False||True");
        let variables = serde_json::json!({"enable_thinking": false, "add_generation_prompt": 7});
        let template = template.with_variables(variables.as_object().unwrap().clone());
        assert_eq!(
            template.render(&messages, true).unwrap(),
            "Hi|True|off|True"
        );
        let parts = template.render_parts(&messages).unwrap();
        let text: String = parts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(text, "Hi|True|off|True");
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
