//! Reading a reply as it is written: how far a JSON value has gone
//! ([`value_len`], [`scan_object`]: the calls' arguments are the text the
//! model wrote, so a stream can send them piece by piece), and the
//! [`CallSplitter`] a streamed choice sends its content and call pieces by.

use super::{CallText, ToolFormat};

/// One JSON value of an object being read: its text so far, and whether
/// it is complete.
#[derive(Debug, Clone, Copy)]
pub(super) struct FieldText<'a> {
    pub(super) text: &'a str,
    pub(super) complete: bool,
}

/// What [`scan_object`] read.
#[derive(Debug, Default)]
pub(super) struct ObjectText<'a> {
    /// The keys and values read, the last one possibly incomplete.
    pub(super) fields: Vec<(String, FieldText<'a>)>,
    /// The object's length once it is closed.
    pub(super) len: Option<usize>,
    /// The text stopped being a JSON object.
    pub(super) invalid: bool,
}

/// Reads the JSON object `text` starts with as far as it is written.
pub(super) fn scan_object(text: &str) -> ObjectText<'_> {
    let mut object = ObjectText::default();
    let bytes = text.as_bytes();
    let skip = |mut i: usize| {
        while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    if bytes.first() != Some(&b'{') {
        object.invalid = !text.is_empty();
        return object;
    }
    let mut i = skip(1);
    loop {
        match bytes.get(i) {
            None => return object,
            Some(b'}') if object.fields.is_empty() => {
                object.len = Some(i + 1);
                return object;
            }
            Some(b'"') => {}
            Some(_) => {
                object.invalid = true;
                return object;
            }
        }
        let Some(key_len) = value_len(&text[i..]) else {
            return object;
        };
        let Ok(key) = serde_json::from_str::<String>(&text[i..i + key_len]) else {
            object.invalid = true;
            return object;
        };
        i = skip(i + key_len);
        match bytes.get(i) {
            None => return object,
            Some(b':') => i = skip(i + 1),
            Some(_) => {
                object.invalid = true;
                return object;
            }
        }
        if i == bytes.len() {
            return object;
        }
        let len = value_len(&text[i..]);
        let end = len.map_or(text.len(), |n| i + n);
        let field = FieldText {
            text: &text[i..end],
            complete: len.is_some(),
        };
        object.fields.push((key, field));
        if len.is_none() {
            return object;
        }
        i = skip(end);
        match bytes.get(i) {
            None => return object,
            Some(b',') => i = skip(i + 1),
            Some(b'}') => {
                object.len = Some(i + 1);
                return object;
            }
            Some(_) => {
                object.invalid = true;
                return object;
            }
        }
    }
}

/// The length of the JSON value `text` starts with once it is complete
/// (an object, array or string to its close; a number or literal to the
/// character after it); `None` while it may go on. Whether it is valid
/// JSON is for the caller to check.
pub(super) fn value_len(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let first = *bytes.first()?;
    if !matches!(first, b'{' | b'[' | b'"') {
        return bytes
            .iter()
            .position(|b| b.is_ascii_whitespace() || b",}]".contains(b));
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// A streamed piece of a call: its opening (`name`, on the first piece of
/// a call), then its arguments' text as it is written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallDelta {
    /// The call's place among the reply's calls.
    pub(crate) index: usize,
    pub(crate) name: Option<String>,
    pub(crate) arguments: String,
}

/// What a streamed choice sends for new text: content, and pieces of
/// calls.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Split {
    pub(crate) content: String,
    pub(crate) calls: Vec<CallDelta>,
}

/// One streamed choice's text while tools may be called: content is sent
/// as it comes until it may be the start of a call; from there it is
/// held. When the calls are enforced (so what is written is the start of
/// a call), each call is sent once its name is written, then its
/// arguments as they are written; otherwise the calls are read when the
/// choice ends. Either way the pieces assemble to the calls
/// [`ToolFormat::parse`] reads from the whole text, except a call cut
/// short (by `max_tokens` or a stop string), which was sent in part and
/// is not a call of the whole answer.
#[derive(Debug)]
pub(crate) struct CallSplitter {
    format: &'static ToolFormat,
    /// Everything generated.
    text: String,
    /// How much of `text` was sent as content.
    sent: usize,
    /// Where the calls start in `text`, once they do.
    start: Option<usize>,
    /// Send calls as they are written (they are enforced).
    incremental: bool,
    /// Per call sent (in part): its arguments' text sent so far.
    streamed: Vec<String>,
}

impl CallSplitter {
    pub(crate) fn new(format: &'static ToolFormat, incremental: bool) -> Self {
        Self {
            format,
            text: String::new(),
            sent: 0,
            start: None,
            incremental,
            streamed: Vec::new(),
        }
    }

    /// Adds `piece`; returns what may be sent now.
    pub(crate) fn push(&mut self, piece: &str) -> Split {
        self.text.push_str(piece);
        let content = self.content();
        let calls = match self.start {
            Some(start) if self.incremental => {
                let text = std::mem::take(&mut self.text);
                let calls = self.deltas(&self.format.scan_calls(&text[start..]));
                self.text = text;
                calls
            }
            _ => Vec::new(),
        };
        Split { content, calls }
    }

    /// The content that may be sent now.
    fn content(&mut self) -> String {
        if self.start.is_some() {
            return String::new();
        }
        if let Some(start) = self.format.call_start(&self.text) {
            self.start = Some(start);
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

    /// The pieces of `calls` (read so far) not sent yet: a call is opened
    /// once its name is complete; its arguments are sent as written when
    /// they are an object (one JSON string is sent whole, decoded).
    fn deltas(&mut self, calls: &[CallText<'_>]) -> Vec<CallDelta> {
        let mut deltas = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let Some(name) = &call.name else { break };
            let opening = index == self.streamed.len();
            if opening {
                self.streamed.push(String::new());
            }
            let sent = &mut self.streamed[index];
            // Arguments written as a JSON string are sent whole in `finish`.
            let written = if call.arguments.starts_with('{') {
                call.arguments
            } else {
                ""
            };
            let arguments = written.strip_prefix(sent.as_str()).unwrap_or("").to_owned();
            sent.push_str(&arguments);
            if opening || !arguments.is_empty() {
                deltas.push(CallDelta {
                    index,
                    name: opening.then(|| name.clone()),
                    arguments,
                });
            }
        }
        deltas
    }

    /// At the end: the content not yet sent, the call pieces not yet sent,
    /// and whether the reply made calls (when it made none, all of its
    /// text is content, unless a call cut short was sent in part).
    pub(crate) fn finish(mut self) -> (Split, bool) {
        let Some((content, calls)) = self.format.parse(&self.text) else {
            let content = if self.streamed.is_empty() {
                self.take_to(self.text.len())
            } else {
                String::new()
            };
            return (
                Split {
                    content,
                    calls: Vec::new(),
                },
                false,
            );
        };
        let unsent = content.get(self.sent..).unwrap_or("").to_owned();
        let mut deltas = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let sent = self.streamed.get(index);
            let arguments = match sent {
                Some(sent) => call.arguments.strip_prefix(sent.as_str()).unwrap_or(""),
                None => &call.arguments,
            };
            if sent.is_none() || !arguments.is_empty() {
                deltas.push(CallDelta {
                    index,
                    name: sent.is_none().then(|| call.name.clone()),
                    arguments: arguments.to_owned(),
                });
            }
        }
        (
            Split {
                content: unsent,
                calls: deltas,
            },
            true,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{FORMATS, GENERIC};
    use super::*;

    /// Everything a splitter sends for `pieces`, then at the end: the
    /// content, the calls (name and arguments) assembled, how many
    /// argument pieces came, and whether the reply made calls.
    fn stream(
        format: &'static ToolFormat,
        incremental: bool,
        pieces: &[&str],
    ) -> (String, Vec<(String, String)>, usize, bool) {
        let mut splitter = CallSplitter::new(format, incremental);
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        let mut n_pieces = 0;
        let mut absorb = |split: Split| {
            content.push_str(&split.content);
            for delta in split.calls {
                if let Some(name) = delta.name {
                    assert_eq!(delta.index, calls.len(), "calls open in order");
                    calls.push((name, String::new()));
                }
                n_pieces += usize::from(!delta.arguments.is_empty());
                calls[delta.index].1.push_str(&delta.arguments);
            }
        };
        for piece in pieces {
            absorb(splitter.push(piece));
        }
        let (split, made) = splitter.finish();
        absorb(split);
        (content, calls, n_pieces, made)
    }

    /// `text` in pieces of `n` bytes (ASCII).
    fn pieces(text: &str, n: usize) -> Vec<&str> {
        (0..text.len())
            .step_by(n)
            .map(|i| &text[i..(i + n).min(text.len())])
            .collect()
    }

    #[test]
    fn streamed_calls_assemble_to_the_parsed_ones_arguments_as_written() {
        let replies: [(&'static ToolFormat, &str); 4] = [
            (
                &FORMATS[0],
                "Let me see.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"timezone\": \"Europe/Paris\"}}\n</tool_call>",
            ),
            (
                &FORMATS[1],
                "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Saint-Rémy-de-Provence\"}}, {\"name\": \"g\", \"arguments\": {}}]",
            ),
            (
                &FORMATS[2],
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris \\\"}\\\" Texas\"}}",
            ),
            (
                &GENERIC,
                " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            ),
        ];
        for (format, reply) in replies {
            let (content, calls) = format.parse(reply).unwrap();
            let whole: Vec<(String, String)> =
                calls.into_iter().map(|c| (c.name, c.arguments)).collect();
            // Whole characters only: "é" is two bytes.
            let chars: Vec<String> = reply.chars().map(String::from).collect();
            let by_char: Vec<&str> = chars.iter().map(String::as_str).collect();
            for split in [by_char, pieces(reply, reply.len())] {
                let (streamed, calls, n_pieces, made) = stream(format, true, &split);
                assert_eq!(
                    (streamed.as_str(), &calls, made),
                    (content.as_str(), &whole, true)
                );
                if split.len() > 1 {
                    // Arguments come as they are written: several pieces per call.
                    assert!(n_pieces > 2 * whole.len(), "{n_pieces} pieces: {reply}");
                }
                // Held to the end when the calls are not enforced: one piece each.
                let (streamed, calls, n_pieces, _) = stream(format, false, &split);
                assert_eq!((streamed.as_str(), &calls), (content.as_str(), &whole));
                assert_eq!(n_pieces, whole.len());
            }
        }
        // A call cut short was sent in part; it is not content.
        let (content, calls, _, made) = stream(
            &FORMATS[0],
            true,
            &[
                "Hi <tool",
                "_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ",
            ],
        );
        assert_eq!(content, "Hi");
        assert_eq!(calls, [("f".to_owned(), "{\"a\": ".to_owned())]);
        assert!(!made);
    }

    #[test]
    fn a_stream_holds_back_what_may_open_a_call() {
        let content = |split: Split| split.content;
        let mut s = CallSplitter::new(&FORMATS[0], false);
        assert_eq!(content(s.push("Hi <tool")), "Hi");
        assert_eq!(content(s.push("_call>\n{\"name\": \"f\", ")), "");
        assert_eq!(content(s.push("\"arguments\": {}}\n</tool_call>")), "");
        let (rest, made) = s.finish();
        assert_eq!(
            (rest.content.as_str(), rest.calls.len(), made),
            ("", 1, true)
        );
        let mut s = CallSplitter::new(&FORMATS[0], true);
        assert_eq!(content(s.push("a <b")), "a <b");
        assert_eq!(content(s.push(" c ")), " c");
        assert_eq!(
            s.finish(),
            (
                Split {
                    content: " ".into(),
                    calls: Vec::new()
                },
                false
            )
        );
        let mut s = CallSplitter::new(&GENERIC, true);
        assert_eq!(content(s.push("  ")), "");
        assert_eq!(content(s.push("Sure")), "  Sure");
    }
}
