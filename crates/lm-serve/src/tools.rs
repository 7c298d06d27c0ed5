//! Tool calling in OpenAI's chat format: the request's `tools`,
//! `tool_choice` and `parallel_tool_calls`, the tool calls and results in
//! the history, the calls' wire format per chat template, the grammar that
//! enforces a call, and the reply read back into `message.tool_calls`.
//!
//! ```text
//! tools ──> the model's chat template, with `tools` (as Hugging Face's
//!           apply_chat_template passes it), when the template reads it;
//!           else GENERIC: a system block listing the tools as JSON
//! template source ──> FORMATS (the first whose marker it contains) ──> ToolFormat
//! tool_choice required / named ──> a Lark grammar: the format's wrapper
//!           text around {"name": <const>, "arguments": %json{parameters}}
//!           (an alternative per tool), enforced by llguidance from the
//!           first token
//! reply text ──> ToolFormat::parse ──> content + tool calls
//! ```
//!
//! The formats are those llama.cpp's common/chat.cpp recognises (Hermes and
//! Qwen 2.5/3's `<tool_call>` JSON, Llama 3.x's JSON with `"parameters"`,
//! Mistral's `[TOOL_CALLS]` list), and its generic fallback: a JSON object
//! `{"name", "arguments"}` as the whole reply. Under `tool_choice: "auto"`
//! the model may answer in text and nothing is enforced; a call it starts
//! is parsed but not held to its schema.

use std::sync::atomic::{AtomicU64, Ordering};

use lm::OutputFormat;
use lm_core::TokenId;
use lm_tokenize::Message;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::request::Sampling;
use crate::text::{ServedText, TextFailure, error_chain};

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tool {
    pub(crate) name: String,
    /// Its arguments' JSON Schema (`{"type": "object"}` when not given).
    pub(crate) parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolChoice {
    /// Tools are not rendered; the model answers in text.
    None,
    /// The model chooses between text and calls; nothing is enforced.
    Auto,
    /// At least one call (one, without `parallel_tool_calls`), enforced.
    Required,
    /// A call of this function, enforced.
    Named(String),
}

/// The tool fields of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolRequest {
    /// `tools` as sent: what the template's `tools` variable holds.
    pub(crate) raw: Value,
    pub(crate) tools: Vec<Tool>,
    pub(crate) choice: ToolChoice,
    /// `parallel_tool_calls` (OpenAI's default: true).
    pub(crate) parallel: bool,
}

/// The most tools a request may list.
const MAX_TOOLS: usize = 128;

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`. `None` when the
/// request lists no tools (a `tool_choice` of `none` or `auto` is then
/// accepted and means nothing; `required` or a name is a 400).
pub(crate) fn read(body: &Map<String, Value>) -> Result<Option<ToolRequest>, ApiError> {
    let field = |name: &str| body.get(name).filter(|v| !v.is_null());
    let tools = match field("tools") {
        None => Vec::new(),
        Some(Value::Array(items)) if items.len() <= MAX_TOOLS => items
            .iter()
            .enumerate()
            .map(|(i, item)| tool(item, i))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "tools",
                format!("'tools' must be an array of at most {MAX_TOOLS} function tools"),
            ));
        }
    };
    if let Some(i) = (1..tools.len()).find(|&i| tools[..i].iter().any(|t| t.name == tools[i].name))
    {
        return Err(ApiError::invalid(
            "tools",
            format!("'tools' names the function '{}' twice", tools[i].name),
        ));
    }
    let choice = tool_choice(field("tool_choice"), &tools)?;
    let parallel = match field("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                format!("'parallel_tool_calls' must be a boolean, got {v}"),
            ));
        }
    };
    if tools.is_empty() {
        return Ok(None);
    }
    Ok(Some(ToolRequest {
        raw: field("tools").cloned().unwrap_or(Value::Null),
        tools,
        choice,
        parallel,
    }))
}

/// `tools[i]`: `{"type": "function", "function": {"name", "description"?,
/// "parameters"?}}`.
fn tool(item: &Value, i: usize) -> Result<Tool, ApiError> {
    let param = format!("tools[{i}]");
    let bad = |what: &str| ApiError::invalid(&param, format!("'{param}' {what}"));
    if item.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad(
            "must have \"type\": \"function\" (the only tool type served)",
        ));
    }
    let Some(function) = item.get("function").and_then(Value::as_object) else {
        return Err(bad("must have a 'function' object"));
    };
    let name = match function.get("name").and_then(Value::as_str) {
        Some(name)
            if !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            name.to_owned()
        }
        _ => {
            return Err(bad(
                "'function.name' must be 1 to 64 letters, digits, '_' or '-'",
            ));
        }
    };
    if function
        .get("description")
        .is_some_and(|d| !d.is_string() && !d.is_null())
    {
        return Err(bad("'function.description' must be a string"));
    }
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object"}),
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => schema.clone(),
        Some(_) => return Err(bad("'function.parameters' must be a JSON Schema object")),
    };
    Ok(Tool { name, parameters })
}

fn tool_choice(value: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    const PARAM: &str = "tool_choice";
    let choice = match value {
        // OpenAI: "auto" when tools are given, "none" when not.
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    PARAM,
                    format!(
                        "'{PARAM}' must be \"none\", \"auto\", \"required\" or \
                         {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got \"{other}\""
                    ),
                ));
            }
        },
        Some(v) => {
            let name = (v.get("type").and_then(Value::as_str) == Some("function"))
                .then(|| v.pointer("/function/name").and_then(Value::as_str))
                .flatten();
            let Some(name) = name else {
                return Err(ApiError::invalid(
                    PARAM,
                    format!(
                        "'{PARAM}' must be a string or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ),
                ));
            };
            ToolChoice::Named(name.to_owned())
        }
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(ApiError::invalid(
            PARAM,
            "'tool_choice' is \"required\" but the request lists no 'tools'",
        )),
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => {
            Err(ApiError::invalid(
                PARAM,
                format!("'tool_choice' names the function '{name}', which 'tools' does not list"),
            ))
        }
        _ => Ok(choice),
    }
}

/// A history message of `role` with `content`, with the tool fields of
/// its JSON `m` (`messages[i]` is `param`): an assistant's `tool_calls`
/// (their `arguments`, a JSON string on the wire, given to the template
/// parsed, as llama.cpp and vLLM do), a tool's `tool_call_id`.
pub(crate) fn history_message(
    role: &str,
    content: String,
    m: &Map<String, Value>,
    param: &str,
) -> Result<Message, ApiError> {
    let mut message = Message::new(role, content);
    if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
        let p = format!("{param}.tool_calls");
        let bad = || {
            ApiError::invalid(
                &p,
                format!(
                    "'{p}' must be an array of {{\"id\", \"type\": \"function\", \
                     \"function\": {{\"name\", \"arguments\"}}}}, on an assistant message"
                ),
            )
        };
        let items = calls
            .as_array()
            .filter(|_| role == "assistant")
            .ok_or_else(bad)?;
        let mut parsed = Vec::with_capacity(items.len());
        for call in items {
            let name = call.pointer("/function/name").and_then(Value::as_str);
            let arguments = call.pointer("/function/arguments");
            let (Some(name), Some(arguments)) = (name, arguments) else {
                return Err(bad());
            };
            let arguments = match arguments {
                Value::String(text) => {
                    serde_json::from_str(text).unwrap_or_else(|_| arguments.clone())
                }
                other => other.clone(),
            };
            parsed.push(json!({
                "id": call.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }));
        }
        message.tool_calls = Some(Value::Array(parsed));
    }
    match m.get("tool_call_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) => message.tool_call_id = Some(id.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                &format!("{param}.tool_call_id"),
                format!("'{param}.tool_call_id' must be a string"),
            ));
        }
    }
    Ok(message)
}

/// How a chat request that offers tools is answered.
#[derive(Debug)]
pub(crate) struct ToolMode {
    /// How the reply writes calls.
    pub(crate) format: &'static ToolFormat,
    /// The grammar enforcing a call (`tool_choice` required or named).
    pub(crate) grammar: Option<OutputFormat>,
}

/// The prompt ids of a chat request, and how its tools are answered
/// (`None` without tools, or with `tool_choice: "none"`, which renders
/// none). A template that reads `tools` gets them; another gets
/// [`generic_messages`]. A required call cannot be combined with another
/// output constraint (`response_format`, `guided_*`): a 400.
pub(crate) fn encode_chat(
    text: &dyn ServedText,
    messages: &[Message],
    tools: Option<&ToolRequest>,
    sampling: &Sampling,
    parse_special: bool,
) -> Result<(Vec<TokenId>, Option<ToolMode>), ApiError> {
    let failed = |e: TextFailure| ApiError::invalid("messages", error_chain(e.as_ref()));
    let Some(request) = tools.filter(|r| r.choice != ToolChoice::None) else {
        let ids = text.encode_chat(messages, parse_special).map_err(failed)?;
        return Ok((ids, None));
    };
    let reads = text.chat_reads_tools();
    let format = format_for(text.chat_template_source().as_deref(), reads);
    let ids = if reads {
        text.encode_chat_with_tools(messages, &request.raw, parse_special)
    } else {
        text.encode_chat(&generic_messages(messages, request), parse_special)
    }
    .map_err(failed)?;
    let grammar = format.grammar(request);
    if grammar.is_some() && sampling.response_format.is_some() {
        let param = sampling.format_param;
        return Err(ApiError::invalid(
            param,
            format!("'{param}' cannot be combined with the tool call 'tool_choice' requires"),
        ));
    }
    Ok((ids, Some(ToolMode { format, grammar })))
}

/// How one chat template writes tool calls.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ToolFormat {
    /// What the template source contains when it uses this format.
    marker: &'static str,
    /// Text before the calls (before each call unless `list`).
    open: &'static str,
    /// Text after each call (after the list when `list`).
    close: &'static str,
    /// Between calls.
    separator: &'static str,
    /// The key of a call's arguments.
    arguments_key: &'static str,
    /// The calls are one JSON array after `open` (Mistral).
    list: bool,
}

/// The formats, tried in order against the template source; a template
/// that reads `tools` but matches none, and one that does not read `tools`
/// at all, use [`GENERIC`].
const FORMATS: [ToolFormat; 3] = [
    // Hermes 2 Pro, Qwen 2.5 and Qwen 3.
    ToolFormat {
        marker: "<tool_call>",
        open: "<tool_call>\n",
        close: "\n</tool_call>",
        separator: "\n",
        arguments_key: "arguments",
        list: false,
    },
    // Mistral (v0.3, Nemo, Small): [TOOL_CALLS][{...}, {...}].
    ToolFormat {
        marker: "[TOOL_CALLS]",
        open: "[TOOL_CALLS]",
        close: "",
        separator: ", ",
        arguments_key: "arguments",
        list: true,
    },
    // Llama 3.1 to 3.3: {"name": ..., "parameters": {...}}, the whole reply.
    ToolFormat {
        marker: "\"parameters\"",
        open: "",
        close: "",
        separator: "\n",
        arguments_key: "parameters",
        list: false,
    },
];

/// A JSON object `{"name", "arguments"}` as the whole reply.
pub(crate) const GENERIC: ToolFormat = ToolFormat {
    marker: "",
    open: "",
    close: "",
    separator: "\n",
    arguments_key: "arguments",
    list: false,
};

/// Text a Llama 3.x reply may start its call with.
const PYTHON_TAG: &str = "<|python_tag|>";

/// The format of a template that renders `tools` (its source), else
/// [`GENERIC`].
pub(crate) fn format_for(source: Option<&str>, reads_tools: bool) -> &'static ToolFormat {
    match source {
        Some(source) if reads_tools => FORMATS
            .iter()
            .find(|f| source.contains(f.marker))
            .unwrap_or(&GENERIC),
        _ => &GENERIC,
    }
}

/// The messages with the tools put in for a template that does not read
/// `tools` (llama.cpp's generic format, reworded): a system block listing
/// them as JSON and asking for `{"name", "arguments"}` replies, appended to
/// the system message (or a new one first); an assistant's earlier calls
/// written as that JSON, and tool results as user messages
/// `{"tool_response": {"tool_call_id", "content"}}`, since such a template
/// may know no `tool` role.
pub(crate) fn generic_messages(messages: &[Message], request: &ToolRequest) -> Vec<Message> {
    let listing = request
        .raw
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default();
    let block = format!(
        "You can call the following tools, given as JSON:\n{listing}\n\n\
         To call a tool, reply with only a JSON object {{\"name\": <the tool's name>, \
         \"arguments\": <an object of its arguments>}}, and nothing else. \
         Otherwise, answer in plain text."
    );
    let mut out = Vec::with_capacity(messages.len() + 1);
    match messages.first() {
        Some(first) if first.role == "system" => {
            let content = if first.content.is_empty() {
                block
            } else {
                format!("{}\n\n{block}", first.content)
            };
            out.push(Message::new("system", content));
        }
        _ => out.push(Message::new("system", block)),
    }
    let skip = usize::from(messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        out.push(match (&m.tool_calls, m.role.as_str()) {
            (Some(Value::Array(calls)), _) => {
                let written: Vec<String> = calls
                    .iter()
                    .map(|c| {
                        json!({"name": c.pointer("/function/name"), "arguments": c.pointer("/function/arguments")})
                            .to_string()
                    })
                    .collect();
                let mut content = m.content.clone();
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&written.join("\n"));
                Message::new("assistant", content)
            }
            (_, "tool") => Message::new(
                "user",
                json!({"tool_response": {"tool_call_id": m.tool_call_id, "content": m.content}})
                    .to_string(),
            ),
            _ => m.clone(),
        });
    }
    out
}

/// A Lark string literal of `text` (Lark takes JSON's escapes).
fn literal(text: &str) -> String {
    Value::from(text).to_string()
}

/// The Lark sequence `before... item after...`, empty texts left out.
fn sequence(before: &[&str], item: &str, after: &[&str]) -> String {
    let texts = |texts: &[&str]| -> Vec<String> {
        texts
            .iter()
            .filter(|t| !t.is_empty())
            .map(|t| literal(t))
            .collect()
    };
    let mut parts = texts(before);
    parts.push(item.to_owned());
    parts.extend(texts(after));
    parts.join(" ")
}

impl ToolFormat {
    /// The grammar that enforces `request`'s choice (`Required` or
    /// `Named`): the format's wrapper around `{"name": <const>,
    /// "<arguments_key>": <the tool's schema>}`, one alternative per tool
    /// allowed, several calls when `parallel_tool_calls` allows them.
    pub(crate) fn grammar(&self, request: &ToolRequest) -> Option<OutputFormat> {
        let allowed: Vec<&Tool> = match &request.choice {
            ToolChoice::Required => request.tools.iter().collect(),
            ToolChoice::Named(name) => request.tools.iter().filter(|t| &t.name == name).collect(),
            ToolChoice::None | ToolChoice::Auto => return None,
        };
        let mut rules = Vec::with_capacity(allowed.len() + 3);
        let names: Vec<String> = (0..allowed.len()).map(|i| format!("call_{i}")).collect();
        for (tool, rule) in allowed.iter().zip(&names) {
            let head = format!(
                "{{\"name\": \"{}\", \"{}\": ",
                tool.name, self.arguments_key
            );
            rules.push(format!(
                "{rule}: {} args_{rule} \"}}\"\nargs_{rule}: %json {}",
                literal(&head),
                crate::guided::bounded_whitespace(&tool.parameters)
            ));
        }
        rules.push(format!("call: {}", names.join(" | ")));
        let several = request.parallel && matches!(request.choice, ToolChoice::Required);
        let repeat = |item: &str| {
            if several {
                format!("{item} ({} {item})*", literal(self.separator))
            } else {
                item.to_owned()
            }
        };
        let start = if self.list {
            sequence(&[self.open, "["], &repeat("call"), &["]", self.close])
        } else {
            rules.push(format!(
                "wrapped: {}",
                sequence(&[self.open], "call", &[self.close])
            ));
            repeat("wrapped")
        };
        rules.insert(0, format!("start: {start}"));
        Some(OutputFormat::Lark(rules.join("\n")))
    }

    /// Where the calls start in `text`, if they do: at the first `open`,
    /// or, for a format without one, at the first non-space character
    /// when it is `{` or `[` (or Llama's `<|python_tag|>`).
    fn call_start(&self, text: &str) -> Option<usize> {
        if !self.open.is_empty() {
            return text.find(self.open);
        }
        let start = text.len() - text.trim_start().len();
        let rest = &text[start..];
        (rest.starts_with(['{', '[']) || rest.starts_with(PYTHON_TAG)).then_some(start)
    }

    /// Whether `text` (no call found in it yet) may still become the start
    /// of calls, so a stream holds it back: its end is a prefix of `open`,
    /// or, without one, it is blank or a prefix of `<|python_tag|>`.
    fn may_start_call(&self, text: &str) -> bool {
        if self.open.is_empty() {
            let rest = text.trim_start();
            return rest.is_empty() || PYTHON_TAG.starts_with(rest);
        }
        (1..self.open.len())
            .filter(|&n| self.open.is_char_boundary(n))
            .any(|n| text.ends_with(&self.open[..n]))
    }

    /// The content and tool calls of a reply; `None` when it makes no
    /// complete call (then it is all content). What follows the last
    /// complete call and does not parse (a call cut by `max_tokens`) is
    /// dropped.
    pub(crate) fn parse(&self, text: &str) -> Option<(String, Vec<Call>)> {
        let start = self.call_start(text)?;
        let content = text[..start].trim_end().to_owned();
        let mut calls = Vec::new();
        self.read_calls(&text[start..], &mut calls);
        (!calls.is_empty()).then_some((content, calls))
    }

    /// Reads the calls `rest` starts with into `calls`, up to the first
    /// that does not parse.
    fn read_calls(&self, mut rest: &str, calls: &mut Vec<Call>) -> Option<()> {
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                return Some(());
            }
            if let Some(after) = rest.strip_prefix(PYTHON_TAG) {
                rest = after;
            }
            if !self.open.is_empty() {
                rest = rest.strip_prefix(self.open)?;
            }
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let value = values.next()?.ok()?;
            rest = rest[values.byte_offset()..].trim_start();
            match value {
                Value::Array(items) => {
                    let read: Option<Vec<Call>> =
                        items.iter().map(|item| self.call(item)).collect();
                    calls.extend(read?);
                }
                item => calls.push(self.call(&item)?),
            }
            rest = rest.strip_prefix(self.close.trim()).unwrap_or(rest);
            rest = rest
                .trim_start()
                .strip_prefix(self.separator.trim())
                .unwrap_or(rest);
        }
    }

    /// One call's JSON: `name`, and the arguments under this format's key
    /// (or the other usual one).
    fn call(&self, value: &Value) -> Option<Call> {
        let name = value.get("name")?.as_str()?.to_owned();
        let arguments = value
            .get(self.arguments_key)
            .or_else(|| value.get("arguments"))
            .or_else(|| value.get("parameters"))?;
        let arguments = match arguments {
            // Some models write the arguments as a JSON string already.
            Value::String(text) if serde_json::from_str::<Value>(text).is_ok() => text.clone(),
            Value::Object(_) => arguments.to_string(),
            _ => return None,
        };
        Some(Call { name, arguments })
    }
}

/// One tool call of a reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub(crate) name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub(crate) arguments: String,
}

/// Tool call ids made so far, so each is new.
static NEXT_CALL: AtomicU64 = AtomicU64::new(0);

impl Call {
    /// OpenAI's `tool_calls` entry, with a fresh `call_...` id.
    pub(crate) fn to_json(&self, salt: u64) -> Value {
        let n = NEXT_CALL.fetch_add(1, Ordering::Relaxed);
        json!({
            "id": format!("call_{:08x}{n:08x}", salt as u32),
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// One streamed choice's text while tools may be called: content is sent
/// as it comes until it may be the start of a call; from there the text is
/// held, and read into calls when the choice ends.
#[derive(Debug)]
pub(crate) struct CallSplitter {
    format: &'static ToolFormat,
    /// Everything generated.
    text: String,
    /// How much of `text` was sent as content.
    sent: usize,
    /// A call has started: nothing more is sent as content.
    in_call: bool,
}

impl CallSplitter {
    pub(crate) fn new(format: &'static ToolFormat) -> Self {
        Self {
            format,
            text: String::new(),
            sent: 0,
            in_call: false,
        }
    }

    /// Adds `piece`; returns the content that may be sent now.
    pub(crate) fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.in_call {
            return String::new();
        }
        if let Some(start) = self.format.call_start(&self.text) {
            self.in_call = true;
            // Space before a call is not content (as `parse` reads it).
            return self.take_to(self.text[..start].trim_end().len());
        }
        if self.format.open.is_empty() {
            // The call may only open the reply.
            if self.sent == 0 && self.format.may_start_call(&self.text) {
                return String::new();
            }
            return self.take_to(self.text.len());
        }
        let held = (1..self.format.open.len())
            .rev()
            .filter(|&n| self.format.open.is_char_boundary(n))
            .find(|&n| self.text.ends_with(&self.format.open[..n]))
            .unwrap_or(0);
        // Trailing space is held too: it is not content if a call follows.
        self.take_to(self.text[..self.text.len() - held].trim_end().len())
    }

    fn take_to(&mut self, end: usize) -> String {
        let end = end.max(self.sent);
        let out = self.text[self.sent..end].to_owned();
        self.sent = end;
        out
    }

    /// At the end: the content not yet sent and the calls (none when the
    /// text makes none: then all of it is content).
    pub(crate) fn finish(mut self) -> (String, Vec<Call>) {
        match self.format.parse(&self.text) {
            Some((content, calls)) => {
                let unsent = content.get(self.sent..).unwrap_or("").to_owned();
                (unsent, calls)
            }
            None => (self.take_to(self.text.len()), Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<Option<ToolRequest>, ApiError> {
        read(body.as_object().unwrap())
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}])
    }

    #[test]
    fn tool_fields_are_read_and_checked() {
        let r = request(json!({"tools": weather(), "tool_choice": "required"}))
            .unwrap()
            .unwrap();
        assert_eq!(r.choice, ToolChoice::Required);
        assert!(r.parallel);
        assert_eq!(r.tools[0].name, "get_weather");
        assert_eq!(request(json!({"tool_choice": "none"})).unwrap(), None);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let r = request(
            json!({"tools": weather(), "tool_choice": named, "parallel_tool_calls": false}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.choice, r.parallel),
            (ToolChoice::Named("get_weather".into()), false)
        );
        for (body, param) in [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0]"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0]",
            ),
            (
                json!({"tools": weather(), "tool_choice": "always"}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "x"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": weather(), "parallel_tool_calls": 1}),
                "parallel_tool_calls",
            ),
        ] {
            let error = request(body.clone()).unwrap_err();
            assert_eq!(error.param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn the_format_follows_the_template() {
        let qwen = "{% if tools %}<tools></tools> <tool_call>{% endif %}";
        assert_eq!(format_for(Some(qwen), true), &FORMATS[0]);
        assert_eq!(format_for(Some("[TOOL_CALLS]"), true), &FORMATS[1]);
        assert_eq!(
            format_for(Some("{\"name\": f, \"parameters\": x}"), true),
            &FORMATS[2]
        );
        assert_eq!(format_for(Some(qwen), false), &GENERIC);
        assert_eq!(format_for(Some("{{ tools }}"), true), &GENERIC);
    }

    #[test]
    fn replies_are_read_into_calls() {
        let call = |name: &str, arguments: &str| Call {
            name: name.into(),
            arguments: arguments.into(),
        };
        let (content, calls) = FORMATS[0]
            .parse("Let me see.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>")
            .unwrap();
        assert_eq!(content, "Let me see.");
        assert_eq!(calls, [call("f", "{\"a\":1}"), call("g", "{}")]);
        let (_, calls) = FORMATS[1]
            .parse("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]")
            .unwrap();
        assert_eq!(calls, [call("f", "{\"a\":1}"), call("g", "{}")]);
        let (_, calls) = FORMATS[2]
            .parse("<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": \"x\"}}")
            .unwrap();
        assert_eq!(calls, [call("f", "{\"a\":\"x\"}")]);
        let (content, calls) = GENERIC
            .parse(" {\"name\": \"f\", \"arguments\": {}}")
            .unwrap();
        assert_eq!((content.as_str(), calls), ("", vec![call("f", "{}")]));
        assert_eq!(GENERIC.parse("The answer is {x}."), None);
        assert_eq!(FORMATS[0].parse("<tool_call>\n{\"name\": \"f\""), None);
        // A call cut short after a complete one: the complete one.
        let (_, calls) = FORMATS[0]
            .parse("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"na")
            .unwrap();
        assert_eq!(calls, [call("f", "{}")]);
    }

    #[test]
    fn a_stream_holds_back_what_may_open_a_call() {
        let mut s = CallSplitter::new(&FORMATS[0]);
        assert_eq!(s.push("Hi <tool"), "Hi");
        assert_eq!(s.push("_call>\n{\"name\": \"f\", "), "");
        assert_eq!(s.push("\"arguments\": {}}\n</tool_call>"), "");
        let (rest, calls) = s.finish();
        assert_eq!((rest.as_str(), calls.len()), ("", 1));
        let mut s = CallSplitter::new(&FORMATS[0]);
        assert_eq!(s.push("a <b"), "a <b");
        assert_eq!(s.push(" c "), " c");
        assert_eq!(s.finish(), (" ".to_owned(), Vec::new()));
        let mut s = CallSplitter::new(&GENERIC);
        assert_eq!(s.push("  "), "");
        assert_eq!(s.push("Sure"), "  Sure");
        let mut s = CallSplitter::new(&GENERIC);
        assert_eq!(s.push(" {\"name\": \"f\", \"arguments\": {}}"), "");
        assert_eq!(s.finish().1.len(), 1);
    }

    #[test]
    fn the_grammar_wraps_each_tool_in_its_format() {
        let r = request(
            json!({"tools": weather(), "tool_choice": "required", "parallel_tool_calls": false}),
        )
        .unwrap()
        .unwrap();
        let Some(OutputFormat::Lark(grammar)) = FORMATS[0].grammar(&r) else {
            panic!("no grammar");
        };
        let schema = crate::guided::bounded_whitespace(&r.tools[0].parameters);
        assert_eq!(
            grammar,
            format!(
                "start: wrapped\n\
                 call_0: \"{{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" args_call_0 \"}}\"\n\
                 args_call_0: %json {schema}\n\
                 call: call_0\n\
                 wrapped: \"<tool_call>\\n\" call \"\\n</tool_call>\""
            )
        );
        assert!(OutputFormat::Lark(grammar).check().is_ok());
        let auto = ToolRequest {
            choice: ToolChoice::Auto,
            ..r.clone()
        };
        assert_eq!(GENERIC.grammar(&auto), None);
        let parallel = ToolRequest {
            parallel: true,
            ..r
        };
        for format in FORMATS.iter().chain([&GENERIC]) {
            let grammar = format.grammar(&parallel).unwrap();
            assert!(grammar.check().is_ok(), "{grammar:?}");
        }
    }
}
