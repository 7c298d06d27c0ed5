//! Reasoning models' chat replies (Qwen3, DeepSeek-R1): what the model
//! writes between `<think>` and `</think>` goes to `reasoning_content`,
//! the rest to `content`, as vLLM's reasoning parsers split it (nothing
//! trimmed), whole and streamed alike.
//!
//! Only for a template that thinks (its source holds `<think>`), unless
//! the server runs with `--reasoning off` or the request sends
//! `chat_template_kwargs: {"enable_thinking": false}`. A reply starts
//! inside the block when the prompt ends with `<think>` (the template
//! opened it); otherwise a block counts only at the reply's start (after
//! whitespace). A reply cut before `</think>` is all reasoning.
//!
//! ```text
//! reply       <think>a</think>b            prompt ends "<think>\n":  a</think>b
//! reasoning   a                                                      a
//! content     b                                                      b
//! ```

use lm_core::TokenId;
use serde_json::{Value, json};

use crate::text::{ServedText, TemplateVariables};

/// Opens a reasoning block.
const OPEN: &str = "<think>";
/// Closes it.
const CLOSE: &str = "</think>";

/// How a chat request's reply is split: `Some` when it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Thinking {
    /// The prompt opened the block: the reply starts inside it.
    inside: bool,
}

/// Whether the reply to `prompt`, rendered by `text`'s template with
/// `kwargs`, is split (`on` is the server's `--reasoning`, not `off`).
pub(crate) fn thinking(
    text: &dyn ServedText,
    on: bool,
    kwargs: &TemplateVariables,
    prompt: &[TokenId],
) -> Option<Thinking> {
    let thinks = on
        && kwargs.get("enable_thinking") != Some(&Value::Bool(false))
        && text
            .chat_template_source()
            .is_some_and(|s| s.contains(OPEN));
    thinks.then(|| {
        // `<think>` is one token in Qwen3's vocabulary, a few in others'.
        let tail = text
            .detokenizer()
            .decode(&prompt[prompt.len().saturating_sub(8)..]);
        Thinking {
            inside: tail.trim_end().ends_with(OPEN),
        }
    })
}

/// Where a reply's text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before any text but whitespace: a block may open.
    Start,
    Reasoning,
    Content,
}

/// Splits one reply as it arrives: [`ThinkSplitter::push`] each piece,
/// holding back text that may be the start of a tag.
#[derive(Debug)]
pub(crate) struct ThinkSplitter {
    state: State,
    /// Text not yet placed (a tag's possible beginning).
    held: String,
    /// Every reasoning text so far, and the part not yet taken.
    reasoning: String,
    fresh: usize,
}

impl ThinkSplitter {
    pub(crate) fn new(thinking: Thinking) -> Self {
        Self {
            state: if thinking.inside {
                State::Reasoning
            } else {
                State::Start
            },
            held: String::new(),
            reasoning: String::new(),
            fresh: 0,
        }
    }

    /// The content in `piece` (the reasoning goes to
    /// [`ThinkSplitter::take_fresh`]); `end` places what is held.
    pub(crate) fn push(&mut self, piece: &str, end: bool) -> String {
        self.held.push_str(piece);
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::Reasoning;
                    } else if !end && OPEN.starts_with(trimmed) {
                        return String::new();
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => {
                    if let Some(at) = self.held.find(CLOSE) {
                        self.reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + CLOSE.len());
                        self.state = State::Content;
                        continue;
                    }
                    let keep = if end { 0 } else { partial_tag(&self.held) };
                    let cut = self.held.len() - keep;
                    self.reasoning.push_str(&self.held[..cut]);
                    self.held.drain(..cut);
                    return String::new();
                }
                State::Content => return std::mem::take(&mut self.held),
            }
        }
    }

    /// The reasoning text pushed since the last call.
    pub(crate) fn take_fresh(&mut self) -> String {
        let fresh = self.reasoning[self.fresh..].to_owned();
        self.fresh = self.reasoning.len();
        fresh
    }

    /// All the reasoning text, `None` when there is none.
    pub(crate) fn reasoning(&self) -> Option<&str> {
        Some(self.reasoning.as_str()).filter(|r| !r.is_empty())
    }
}

/// The length of the longest end of `text` that begins [`CLOSE`].
fn partial_tag(text: &str) -> usize {
    (1..CLOSE.len().min(text.len() + 1))
        .rev()
        .find(|&k| text.ends_with(&CLOSE[..k]))
        .unwrap_or(0)
}

/// Puts `reasoning` in a streamed chat chunk's delta as
/// `reasoning_content` (vLLM's and llama-server's name); an empty
/// `content` beside it is dropped.
pub(crate) fn add_to_chunk(chunk: &mut Value, reasoning: &str) {
    if reasoning.is_empty() {
        return;
    }
    let delta = &mut chunk["choices"][0]["delta"];
    if let Some(fields) = delta.as_object_mut()
        && fields.get("content") == Some(&json!(""))
    {
        fields.remove("content");
    }
    delta["reasoning_content"] = json!(reasoning);
}

/// A chunk of `reasoning` alone (before a reply's tool calls), built
/// from `chunk`, an empty one; none when there is no reasoning.
pub(crate) fn alone(mut chunk: Value, reasoning: &str) -> Option<Value> {
    add_to_chunk(&mut chunk, reasoning);
    (!reasoning.is_empty()).then_some(chunk)
}

/// `text`'s content when the reply is split (its reasoning kept in
/// `thinking`), else `text`; `end` places what the splitter holds.
pub(crate) fn content(thinking: &mut Option<ThinkSplitter>, text: String, end: bool) -> String {
    match thinking {
        Some(splitter) => splitter.push(&text, end),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits `pieces` as a stream does; returns (reasoning, content).
    fn split(inside: bool, pieces: &[&str]) -> (String, String) {
        let mut splitter = ThinkSplitter::new(Thinking { inside });
        let mut content = String::new();
        let mut reasoning = String::new();
        for (i, piece) in pieces.iter().enumerate() {
            content.push_str(&splitter.push(piece, i + 1 == pieces.len()));
            reasoning.push_str(&splitter.take_fresh());
        }
        assert_eq!(splitter.reasoning().unwrap_or(""), reasoning);
        (reasoning, content)
    }

    #[test]
    fn a_block_at_the_start_is_reasoning_in_any_pieces() {
        let whole = "\n<think>\nwhy 1<2</think>\n\nso </think> stays";
        let expected = ("\nwhy 1<2".to_owned(), "\n\nso </think> stays".to_owned());
        assert_eq!(split(false, &[whole, ""]), expected);
        // Every cut into three pieces gives the same split.
        for i in 0..=whole.len() {
            for j in i..=whole.len() {
                let pieces = [&whole[..i], &whole[i..j], &whole[j..]];
                assert_eq!(split(false, &pieces), expected, "{pieces:?}");
            }
        }
    }

    #[test]
    fn a_prompt_that_opened_the_block_starts_inside_it() {
        assert_eq!(split(true, &["a</th", "ink>b"]), ("a".into(), "b".into()));
        assert_eq!(split(true, &["cut </thi"]), ("cut </thi".into(), "".into()));
    }

    #[test]
    fn text_before_a_block_is_all_content() {
        let text = "hi <think>a</think>b";
        assert_eq!(
            split(false, &["hi <th", "ink>a</think>b"]),
            ("".into(), text.into())
        );
        assert_eq!(split(false, &["<thi", "nk"]), ("".into(), "<think".into()));
        assert_eq!(split(false, &["  "]), ("".into(), "  ".into()));
    }

    /// A text side of four pieces and a template `source`.
    struct Pieces(&'static str);

    const PIECES: [&str; 4] = ["Hi", "<think>", "\n", "</think>"];

    impl lm_core::Detokenize for Pieces {
        fn decode(&self, ids: &[TokenId]) -> String {
            ids.iter().map(|&id| PIECES[id as usize]).collect()
        }
    }

    impl ServedText for Pieces {
        fn detokenizer(&self) -> &dyn lm_core::Detokenize {
            self
        }
        fn encode(&self, _: &str) -> Result<Vec<TokenId>, crate::TextFailure> {
            Ok(Vec::new())
        }
        fn chat_prompt(&self, _: &[lm_tokenize::Message]) -> Result<String, crate::TextFailure> {
            Ok(String::new())
        }
        fn chat_template_source(&self) -> Option<String> {
            Some(self.0.to_owned())
        }
        fn end_tokens(&self) -> Vec<TokenId> {
            Vec::new()
        }
    }

    #[test]
    fn only_a_thinking_template_splits_unless_switched_off() {
        let thinks = Pieces("{{ messages }}<think>");
        let none = TemplateVariables::new();
        let off = json!({"enable_thinking": false})
            .as_object()
            .unwrap()
            .clone();
        let on = json!({"enable_thinking": true})
            .as_object()
            .unwrap()
            .clone();
        let outside = Some(Thinking { inside: false });
        let inside = Some(Thinking { inside: true });
        assert_eq!(thinking(&thinks, true, &none, &[0]), outside);
        assert_eq!(thinking(&thinks, true, &on, &[0, 1, 2]), inside);
        assert_eq!(thinking(&thinks, true, &none, &[1, 2, 3, 2]), outside);
        // `--reasoning off`, `enable_thinking: false`, a template without
        // `<think>`: no split.
        assert_eq!(thinking(&thinks, false, &none, &[0, 1]), None);
        assert_eq!(thinking(&thinks, true, &off, &[0, 1]), None);
        assert_eq!(
            thinking(&Pieces("{{ messages }}"), true, &none, &[0, 1]),
            None
        );
    }

    #[test]
    fn reasoning_replaces_an_empty_content_in_a_delta() {
        let mut chunk = json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]});
        add_to_chunk(&mut chunk, "a");
        assert_eq!(
            chunk["choices"][0]["delta"],
            json!({"role": "assistant", "reasoning_content": "a"})
        );
        let mut chunk = json!({"choices": [{"delta": {"content": "b"}}]});
        add_to_chunk(&mut chunk, "a");
        assert_eq!(
            chunk["choices"][0]["delta"],
            json!({"content": "b", "reasoning_content": "a"})
        );
    }
}
