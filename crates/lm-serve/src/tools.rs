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
//! tool_choice ──> a Lark grammar, enforced by llguidance:
//!   required / named: from the first token, the format's wrapper text
//!           around {"name": <const>, "arguments": %json{parameters}}
//!           (an alternative per tool)
//!   auto:   text without the format's opening text, or text up to it
//!           (a lazy lexeme, llama.cpp's "lazy grammar" trigger) followed
//!           by enforced calls; for the formats without one, a reply that
//!           starts with `{` (or `<|python_tag|>`) is a call
//! reply text ──> ToolFormat::parse ──> content + tool calls (arguments as
//!           the model wrote them); CallSplitter streams the same calls
//!           as they are written
//! ```
//!
//! The formats are those llama.cpp's common/chat.cpp recognises (Hermes and
//! Qwen 2.5/3's `<tool_call>` JSON, Llama 3.x's JSON with `"parameters"`,
//! Mistral's `[TOOL_CALLS]` list), and its generic fallback: a JSON object
//! `{"name", "arguments"}` as the whole reply. The openings are matched as
//! text: a vocabulary whose marker is a control token (Llama's
//! `<|python_tag|>`) writes its calls without it.

use std::sync::atomic::{AtomicU64, Ordering};

use lm::OutputFormat;
use lm_core::{TokenId, error_chain};
use lm_tokenize::Message;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::request::Sampling;
use crate::text::{ServedText, TemplateVariables, TextFailure};

mod stream;

use stream::scan_object;
pub(crate) use stream::{CallDelta, CallSplitter};

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
    /// The model chooses between text and calls; a call it starts is
    /// enforced.
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
    /// The grammar enforcing the calls (none under `auto` with another
    /// output constraint).
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
    variables: &TemplateVariables,
    tools: Option<&ToolRequest>,
    sampling: &Sampling,
    parse_special: bool,
) -> Result<(Vec<TokenId>, Option<ToolMode>), ApiError> {
    let failed = |e: TextFailure| ApiError::invalid("messages", error_chain(e.as_ref()));
    // The template renders `variables` and `tools` when there are any; with
    // neither, a text side without a template serves the request too.
    let encode = |messages: &[Message], tools: Option<&Value>| {
        if tools.is_none() && variables.is_empty() {
            text.encode_chat(messages, parse_special)
        } else {
            text.encode_chat_with_variables(messages, tools, variables, parse_special)
        }
    };
    let Some(request) = tools.filter(|r| r.choice != ToolChoice::None) else {
        let ids = encode(messages, None).map_err(failed)?;
        return Ok((ids, None));
    };
    let reads = text.chat_reads_tools();
    let format = format_for(text.chat_template_source().as_deref(), reads);
    let ids = if reads {
        encode(messages, Some(&request.raw))
    } else {
        encode(&generic_messages(messages, request), None)
    }
    .map_err(failed)?;
    // Under "auto" another constraint wins (a call then is not enforced);
    // a call that is required cannot be combined with one.
    let grammar = match (&request.choice, &sampling.response_format) {
        (ToolChoice::Auto, Some(_)) => None,
        (_, Some(_)) => {
            let param = sampling.format_param;
            return Err(ApiError::invalid(
                param,
                format!("'{param}' cannot be combined with the tool call 'tool_choice' requires"),
            ));
        }
        (_, None) => format.grammar(request),
    };
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
    /// Call ids are 9 letters and digits (Mistral's templates check
    /// that), not OpenAI's `call_...`.
    short_ids: bool,
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
        short_ids: false,
    },
    // Mistral (v0.3, Nemo, Small): [TOOL_CALLS][{...}, {...}].
    ToolFormat {
        marker: "[TOOL_CALLS]",
        open: "[TOOL_CALLS]",
        close: "",
        separator: ", ",
        arguments_key: "arguments",
        list: true,
        short_ids: true,
    },
    // Llama 3.1 to 3.3: {"name": ..., "parameters": {...}}, the whole reply.
    ToolFormat {
        marker: "\"parameters\"",
        open: "",
        close: "",
        separator: "\n",
        arguments_key: "parameters",
        list: false,
        short_ids: false,
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
    short_ids: false,
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

/// Any text (valid UTF-8), as a Lark regex.
const ANY_TEXT: &str = "/(?s:.*)/";

impl ToolFormat {
    /// The grammar that enforces `request`'s calls: the format's wrapper
    /// around `{"name": <const>, "<arguments_key>": <the tool's schema>}`,
    /// one alternative per tool allowed, several calls when
    /// `parallel_tool_calls` allows them (not for a named function).
    /// `required` and a named function hold the reply to calls from its
    /// first token; `auto` lets it be text that does not open a call, or
    /// text up to the opening followed by calls (a lazy lexeme ending at
    /// the first opening). Without an opening text, a reply that starts
    /// with `{` (or `<|python_tag|>`), after spaces, is a call, as
    /// [`ToolFormat::parse`] reads it.
    pub(crate) fn grammar(&self, request: &ToolRequest) -> Option<OutputFormat> {
        let allowed: Vec<&Tool> = match &request.choice {
            ToolChoice::Required | ToolChoice::Auto => request.tools.iter().collect(),
            ToolChoice::Named(name) => request.tools.iter().filter(|t| &t.name == name).collect(),
            ToolChoice::None => return None,
        };
        let mut rules = Vec::with_capacity(allowed.len() + 5);
        let names: Vec<String> = (0..allowed.len()).map(|i| format!("call_{i}")).collect();
        for (tool, rule) in allowed.iter().zip(&names) {
            let head = format!(
                "{{\"name\": \"{}\", \"{}\": ",
                tool.name, self.arguments_key
            );
            rules.push(format!(
                "{rule}: {} args_{rule} \"}}\"\nargs_{rule}: %json {}",
                literal(&head),
                lm::bounded_json_whitespace(&tool.parameters)
            ));
        }
        rules.push(format!("call: {}", names.join(" | ")));
        let several = request.parallel && !matches!(request.choice, ToolChoice::Named(_));
        let more = |item: &str| {
            if several {
                format!("({} {item})*", literal(self.separator))
            } else {
                String::new()
            }
        };
        let auto = request.choice == ToolChoice::Auto;
        let start = match (self.list, self.open.is_empty()) {
            // [TOOL_CALLS][call, call]
            (true, _) => {
                let calls = format!("\"[\" call {} \"]\"", more("call"));
                if auto {
                    rules.push(format!("opening[lazy]: TEXT {}", literal(self.open)));
                    format!(
                        "TEXT | {}",
                        sequence(&[], &format!("opening {calls}"), &[self.close])
                    )
                } else {
                    sequence(&[self.open], &calls, &[self.close])
                }
            }
            // <tool_call>\ncall\n</tool_call>, repeated
            (false, false) => {
                rules.push(format!(
                    "wrapped: {}",
                    sequence(&[self.open], "call", &[self.close])
                ));
                if auto {
                    rules.push(format!("opening[lazy]: TEXT {}", literal(self.open)));
                    let first = sequence(&[], "opening call", &[self.close]);
                    format!("TEXT | {first} {}", more("wrapped"))
                } else {
                    format!("wrapped {}", more("wrapped"))
                }
            }
            // the reply is the call(s)
            (false, true) => {
                if auto {
                    rules.push(format!(
                        "LEAD: /\\s+/ | /\\s*/ {} /\\s*/",
                        literal(PYTHON_TAG)
                    ));
                    format!("TEXT | LEAD? call {}", more("call"))
                } else {
                    format!("call {}", more("call"))
                }
            }
        };
        if auto {
            // Text that opens no call: without the opening text anywhere
            // or, for the formats without one, not starting like a call.
            let opens = if self.open.is_empty() {
                format!("/\\s*/ (\"{{\" | {}) {ANY_TEXT}", literal(PYTHON_TAG))
            } else {
                format!("{ANY_TEXT} {} {ANY_TEXT}", literal(self.open.trim()))
            };
            rules.push(format!("TEXT: {ANY_TEXT} & ~({opens})"));
        }
        rules.insert(0, format!("start: {}", start.trim_end()));
        Some(OutputFormat::Lark(rules.join("\n")))
    }

    /// Where the calls start in `text`, if they do: at the first `open`,
    /// or, for a format without one, at the first non-space character
    /// when it is `{` (or Llama's `<|python_tag|>`).
    fn call_start(&self, text: &str) -> Option<usize> {
        if !self.open.is_empty() {
            return text.find(self.open);
        }
        let start = text.len() - text.trim_start().len();
        let rest = &text[start..];
        (rest.starts_with('{') || rest.starts_with(PYTHON_TAG)).then_some(start)
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
        let calls: Vec<Call> = self
            .scan_calls(&text[start..])
            .into_iter()
            .filter_map(CallText::complete)
            .collect();
        (!calls.is_empty()).then_some((content, calls))
    }

    /// The calls `region` (the text from the first call on) holds so far:
    /// the complete ones, then at most one still being written; reading
    /// stops at the first that cannot be a call.
    fn scan_calls<'a>(&self, region: &'a str) -> Vec<CallText<'a>> {
        let mut calls = Vec::new();
        let mut rest = region;
        let mut in_list = false;
        loop {
            rest = rest.trim_start();
            if !in_list {
                if let Some(after) = rest.strip_prefix(PYTHON_TAG) {
                    rest = after;
                }
                if !self.open.is_empty() {
                    let Some(after) = rest.strip_prefix(self.open) else {
                        return calls;
                    };
                    rest = after;
                }
                rest = rest.trim_start();
                if let Some(after) = rest.strip_prefix('[') {
                    in_list = true;
                    rest = after.trim_start();
                }
            }
            let (call, len) = self.scan_call(rest);
            let Some(call) = call else {
                return calls;
            };
            let done = call.done;
            if done && call.clone().complete().is_none() {
                return calls;
            }
            calls.push(call);
            let Some(len) = len.filter(|_| done) else {
                return calls;
            };
            rest = rest[len..].trim_start();
            if in_list {
                if let Some(after) = rest.strip_prefix(',') {
                    rest = after;
                    continue;
                }
                let Some(after) = rest.strip_prefix(']') else {
                    return calls;
                };
                in_list = false;
                rest = after.trim_start();
            }
            rest = rest.strip_prefix(self.close.trim()).unwrap_or(rest);
            rest = rest
                .trim_start()
                .strip_prefix(self.separator.trim())
                .unwrap_or(rest);
        }
    }

    /// The call `text` starts with, as far as it is written, and its
    /// length once its object is closed. `None` for text that is not a
    /// call (or not yet readable as one).
    fn scan_call<'a>(&self, text: &'a str) -> (Option<CallText<'a>>, Option<usize>) {
        let object = scan_object(text);
        let value = |key: &str| object.fields.iter().find(|(k, _)| k == key).map(|f| f.1);
        let name = value("name")
            .and_then(|v| v.complete.then_some(v.text))
            .and_then(|v| serde_json::from_str::<String>(v).ok());
        let arguments = value(self.arguments_key)
            .or_else(|| value("arguments"))
            .or_else(|| value("parameters"));
        if object.invalid {
            return (None, None);
        }
        let call = CallText {
            name,
            arguments: arguments.map_or("", |a| a.text),
            done: object.len.is_some(),
        };
        (Some(call), object.len)
    }

    /// A new id for a call: OpenAI's `call_` and 16 hex digits, or for
    /// Mistral 9 letters and digits. Unique among the ids this server
    /// makes (a count, offset by `salt`).
    pub(crate) fn call_id(&self, salt: u64) -> String {
        let n = NEXT_CALL.fetch_add(1, Ordering::Relaxed);
        if !self.short_ids {
            return format!("call_{:08x}{n:08x}", salt as u32);
        }
        const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        const SPAN: u64 = 62u64.pow(9);
        let mut value = (salt % SPAN + n % SPAN) % SPAN;
        let mut id = [0u8; 9];
        for digit in id.iter_mut().rev() {
            *digit = DIGITS[(value % 62) as usize];
            value /= 62;
        }
        String::from_utf8_lossy(&id).into_owned()
    }
}

/// One call of a reply as far as it is written.
#[derive(Debug, Clone, PartialEq)]
struct CallText<'a> {
    /// Its function's name, once complete.
    name: Option<String>,
    /// Its arguments' JSON text so far, as the model writes it.
    arguments: &'a str,
    /// The call's object is closed.
    done: bool,
}

impl CallText<'_> {
    /// The call, when it is complete: a name, and arguments that are a
    /// JSON object (or a string holding one, as some models write them).
    fn complete(self) -> Option<Call> {
        let name = self.name.filter(|_| self.done)?;
        let arguments = match serde_json::from_str::<Value>(self.arguments).ok()? {
            Value::Object(_) => self.arguments.to_owned(),
            Value::String(text) if serde_json::from_str::<Value>(&text).is_ok() => text,
            _ => return None,
        };
        Some(Call { name, arguments })
    }
}

/// One tool call of a reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub(crate) name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`), as the
    /// model wrote them.
    pub(crate) arguments: String,
}

/// Tool call ids made so far, so each is new.
static NEXT_CALL: AtomicU64 = AtomicU64::new(0);

impl Call {
    /// OpenAI's `tool_calls` entry, with the id `id`.
    pub(crate) fn to_json(&self, id: String) -> Value {
        json!({
            "id": id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::stream::value_len;
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
        // The arguments are the text the model wrote, spaces and all.
        let (content, calls) = FORMATS[0]
            .parse("Let me see.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>")
            .unwrap();
        assert_eq!(content, "Let me see.");
        assert_eq!(calls, [call("f", "{\"a\": 1}"), call("g", "{}")]);
        let (_, calls) = FORMATS[1]
            .parse("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": [1, \"]\"]}}, {\"name\": \"g\", \"arguments\": {}}]")
            .unwrap();
        assert_eq!(calls, [call("f", "{\"a\": [1, \"]\"]}"), call("g", "{}")]);
        let (_, calls) = FORMATS[2]
            .parse("<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": \"x\\\"}\"}}")
            .unwrap();
        assert_eq!(calls, [call("f", "{\"a\": \"x\\\"}\"}")]);
        // Keys in another order; arguments written as a JSON string.
        let (content, calls) = GENERIC
            .parse(" {\"arguments\": \"{\\\"b\\\": 2}\", \"name\": \"f\"}")
            .unwrap();
        assert_eq!(
            (content.as_str(), calls),
            ("", vec![call("f", "{\"b\": 2}")])
        );
        assert_eq!(GENERIC.parse("The answer is {x}."), None);
        assert_eq!(GENERIC.parse("{\"city\": \"Paris\"}"), None);
        assert_eq!(FORMATS[0].parse("<tool_call>\n{\"name\": \"f\""), None);
        // A call cut short after a complete one: the complete one.
        let (_, calls) = FORMATS[0]
            .parse("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"na")
            .unwrap();
        assert_eq!(calls, [call("f", "{}")]);
        // Each value's extent, as the scanner reads it.
        for (text, len) in [
            ("{\"a\": \"}\"} x", Some(10)),
            ("[1, [2]],", Some(8)),
            ("\"a\\\"b\" ", Some(6)),
            ("12}", Some(2)),
            ("12", None),
            ("{\"a\": [", None),
        ] {
            assert_eq!(value_len(text), len, "{text}");
        }
    }

    #[test]
    fn mistral_call_ids_are_nine_letters_and_digits() {
        let ids: std::collections::HashSet<String> = (0..1000)
            .map(|_| FORMATS[1].call_id(u64::MAX - 3))
            .collect();
        assert_eq!(ids.len(), 1000);
        assert!(
            ids.iter()
                .all(|id| id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
        );
        for format in [&FORMATS[0], &FORMATS[2], &GENERIC] {
            let id = format.call_id(7);
            assert!(id.starts_with("call_") && id.len() == 21, "{id}");
        }
    }

    /// Whether the grammar `format` lets a model write `text` and stop:
    /// `Err(at)`, the byte it refuses (the length when it may not stop).
    /// The vocabulary is one token per byte and an end token.
    fn allows(format: &OutputFormat, text: &str) -> Result<(), usize> {
        use lm_core::{Constraint, TokenMask};
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| lm_tokenize::byte_level_char(b).to_string())
            .collect();
        tokens.push("<|end|>".into());
        let mut token_types = vec![1; 256];
        token_types.push(3);
        let tokenizer = lm_tokenize::Tokenizer::from_bpe_vocab(lm_tokenize::BpeVocab {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens,
            token_types,
            eos_id: Some(256),
            ..lm_tokenize::BpeVocab::default()
        })
        .unwrap();
        let constraint = lm::StructuredOutput::new(format, &tokenizer, 257, &[256]).unwrap();
        let mut state = constraint.start().unwrap();
        let mut mask = TokenMask::new(257);
        for (at, byte) in text.bytes().enumerate() {
            state.fill_allowed(&mut mask).unwrap();
            if !mask.is_allowed(TokenId::from(byte)) {
                return Err(at);
            }
            state.advance(TokenId::from(byte)).unwrap();
        }
        if state.is_accepting().unwrap() {
            Ok(())
        } else {
            Err(text.len())
        }
    }

    #[test]
    fn under_auto_text_is_free_and_a_call_once_opened_is_enforced() {
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "get_time"}},
        ]);
        let auto = request(json!({"tools": tools})).unwrap().unwrap();
        let call = |key: &str| {
            format!("{{\"name\": \"get_weather\", \"{key}\": {{\"city\": \"Paris\"}}}}")
        };
        let qwen = |inner: &str| format!("<tool_call>\n{inner}\n</tool_call>");
        let cases: [(&ToolFormat, String, Result<(), usize>); 16] = [
            (&FORMATS[0], "It is sunny in Paris {today}.".into(), Ok(())),
            (&FORMATS[0], String::new(), Ok(())),
            (
                &FORMATS[0],
                format!("Let me look.\n{}", qwen(&call("arguments"))),
                Ok(()),
            ),
            (
                &FORMATS[0],
                format!(
                    "{}\n{}",
                    qwen(&call("arguments")),
                    qwen("{\"name\": \"get_time\", \"arguments\": {}}")
                ),
                Ok(()),
            ),
            // The opening must be followed by a call of a listed tool with
            // valid arguments.
            (&FORMATS[0], "a <tool_call> b".into(), Err(13)),
            (&FORMATS[0], qwen("{\"name\": \"get_news\""), Err(26)),
            (
                &FORMATS[0],
                qwen("{\"name\": \"get_weather\", \"arguments\": {\"town\""),
                Err(51),
            ),
            (
                &FORMATS[0],
                qwen("{\"name\": \"get_weather\", \"arguments\": {}"),
                Err(50),
            ),
            (&FORMATS[1], "Hello.".into(), Ok(())),
            (
                &FORMATS[1],
                format!("[TOOL_CALLS][{}]", call("arguments")),
                Ok(()),
            ),
            (&FORMATS[1], "[TOOL_CALLS]{".into(), Err(12)),
            (
                &FORMATS[2],
                format!("<|python_tag|>{}", call("parameters")),
                Ok(()),
            ),
            (&FORMATS[2], call("arguments"), Err(25)),
            (&GENERIC, "Paris: {sunny}".into(), Ok(())),
            (&GENERIC, format!("\n {}", call("arguments")), Ok(())),
            (&GENERIC, " {\"city\": \"Paris\"}".into(), Err(3)),
        ];
        for (format, text, expected) in cases {
            let grammar = format.grammar(&auto).unwrap();
            assert_eq!(
                allows(&grammar, &text),
                expected,
                "{format:?}: {text:?}\n{grammar:?}"
            );
            // What the grammar lets through as a call is read as one.
            if expected.is_ok() && format.call_start(&text).is_some() {
                assert!(format.parse(&text).is_some(), "{text:?}");
            }
        }
        // Required: a call from the first token.
        let required = ToolRequest {
            choice: ToolChoice::Required,
            ..auto
        };
        let grammar = FORMATS[0].grammar(&required).unwrap();
        assert_eq!(allows(&grammar, "Hi"), Err(0));
        assert_eq!(allows(&grammar, &qwen(&call("arguments"))), Ok(()));
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
        let schema = lm::bounded_json_whitespace(&r.tools[0].parameters);
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
        for choice in [ToolChoice::Auto, ToolChoice::Required] {
            for parallel in [false, true] {
                let request = ToolRequest {
                    choice: choice.clone(),
                    parallel,
                    ..r.clone()
                };
                for format in FORMATS.iter().chain([&GENERIC]) {
                    let grammar = format.grammar(&request).unwrap();
                    assert!(grammar.check().is_ok(), "{grammar:?}");
                }
            }
        }
        let none = ToolRequest {
            choice: ToolChoice::None,
            ..r
        };
        assert_eq!(GENERIC.grammar(&none), None);
    }
}
