//! The messages of a chat: the system message, then user and assistant
//! turns; fitting them to the context by leaving the oldest turns out of the
//! prompt (they stay in the conversation); and the `/save` file.
//!
//! ```text
//! messages: [system] [turn 1] [turn 2] [turn 3] [turn 4] [last message]
//!                    └── n_dropped ──┘ └──── the prompt's window ─────┘
//! ```

use std::path::Path;

use anyhow::{Context, Result};
use lm_core::TokenId;
use lm_tokenize::Message;
use serde::{Deserialize, Serialize};

use crate::files::{self, OutputFile};

/// The largest conversation file `/load` reads: far more text than any
/// model's context holds, and a bound on what a wrong path can make it read.
pub const MAX_CONVERSATION_BYTES: u64 = 16 << 20;

/// A conversation: an optional system message, then the turns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    /// Every message, a system message first if there is one, including the
    /// turns left out of the prompt (so `/save` and `--json` keep them).
    pub messages: Vec<Message>,
    /// How many messages after the system message the prompt leaves out.
    #[serde(skip)]
    n_dropped: usize,
}

/// The conversation does not fit even with every earlier turn dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the message does not fit: the prompt would be {n_tokens} tokens, and {budget} fit \
     (the context of {context_length} less room for the reply); write a shorter message \
     or raise --context-length"
)]
pub struct MessageTooLong {
    /// The prompt's length with only the system message and the last message.
    pub n_tokens: usize,
    /// The most prompt tokens allowed.
    pub budget: usize,
    /// The model's context length.
    pub context_length: usize,
}

impl Conversation {
    /// A conversation that starts with `system`, if given.
    pub fn new(system: Option<String>) -> Self {
        let mut conversation = Self::default();
        conversation.set_system(system);
        conversation
    }

    /// Whether the first message is the system message.
    fn has_system(&self) -> bool {
        self.messages.first().is_some_and(|m| m.role == "system")
    }

    /// Sets (or, with `None`, removes) the system message.
    pub fn set_system(&mut self, system: Option<String>) {
        if self.has_system() {
            self.messages.remove(0);
        }
        if let Some(text) = system {
            self.messages.insert(0, Message::new("system", text));
        }
    }

    /// Forgets every turn; the system message stays.
    pub fn clear(&mut self) {
        let n_system = usize::from(self.has_system());
        self.messages.truncate(n_system);
        self.n_dropped = 0;
    }

    /// The messages the prompt holds: the system message and the turns
    /// after the dropped ones.
    pub fn in_context(&self) -> Vec<Message> {
        let first_turn = usize::from(self.has_system());
        let start = (first_turn + self.n_dropped).min(self.messages.len());
        self.messages[..first_turn]
            .iter()
            .chain(&self.messages[start..])
            .cloned()
            .collect()
    }

    /// Appends a message.
    pub fn push(&mut self, role: &str, content: impl Into<String>) {
        self.messages.push(Message::new(role, content));
    }

    /// Removes the last reply, so `/regen` can generate it again; false when
    /// the last message is not a reply.
    pub fn pop_reply(&mut self) -> bool {
        if self.messages.last().is_some_and(|m| m.role == "assistant") {
            self.messages.pop();
            true
        } else {
            false
        }
    }

    /// The prompt ids of the conversation (`render` turns messages into
    /// ids), after leaving out the oldest turns after the system message
    /// until the prompt has at most `budget` tokens. Returns the ids and how
    /// many more messages were left out; the last message never is. When
    /// even that does not fit, nothing more is left out.
    pub fn fit(
        &mut self,
        budget: usize,
        context_length: usize,
        render: impl Fn(&[Message]) -> Result<Vec<TokenId>>,
    ) -> Result<(Vec<TokenId>, usize)> {
        let first_turn = usize::from(self.has_system());
        let n_dropped_before = self.n_dropped;
        loop {
            let ids = render(&self.in_context())?;
            if ids.len() <= budget {
                return Ok((ids, self.n_dropped - n_dropped_before));
            }
            let start = first_turn + self.n_dropped;
            if self.messages.len() <= start + 1 {
                self.n_dropped = n_dropped_before;
                return Err(MessageTooLong {
                    n_tokens: ids.len(),
                    budget,
                    context_length,
                }
                .into());
            }
            // The oldest turn: a message and the replies after it, up to the
            // next user message (or the last message, which stays).
            let mut end = start + 1;
            while end < self.messages.len() - 1 && self.messages[end].role != "user" {
                end += 1;
            }
            self.n_dropped = end - first_turn;
        }
    }

    /// Writes the whole conversation as JSON (`{"messages": [...]}`), the
    /// turns left out of the prompt too, as [`OutputFile`] writes any file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)? + "\n";
        OutputFile::create(path, false)
            .and_then(|out| out.write(|out| out.write_all(json.as_bytes())))
            .with_context(|| format!("writing the conversation to {}", path.display()))
    }

    /// Reads a conversation written by [`Conversation::save`]: a regular
    /// file of at most [`MAX_CONVERSATION_BYTES`].
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = files::read_capped(path, files::Input::File, MAX_CONVERSATION_BYTES)
            .with_context(|| format!("reading a conversation from {}", path.display()))?;
        let conversation: Self = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is not a saved conversation ({{\"messages\": [{{\"role\": ..., \"content\": ...}}]}})",
                path.display()
            )
        })?;
        Ok(conversation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One id per word of each message, plus one per message for markup.
    fn render(messages: &[Message]) -> Result<Vec<TokenId>> {
        Ok(messages
            .iter()
            .flat_map(|m| std::iter::once(0).chain(m.content.split_whitespace().map(|_| 1)))
            .collect())
    }

    fn chat(n_turns: usize) -> Conversation {
        let mut conversation = Conversation::new(Some("be kind".into()));
        for turn in 0..n_turns {
            conversation.push("user", format!("question {turn}"));
            conversation.push("assistant", format!("answer {turn}"));
        }
        conversation.push("user", "last question");
        conversation
    }

    #[test]
    fn the_oldest_turns_after_the_system_message_are_dropped_until_it_fits() {
        // 3 ids per message: the system message, 3 turns and the question.
        let mut conversation = chat(3);
        assert_eq!(render(&conversation.messages).unwrap().len(), 24);
        // Two turns (4 messages) go: 24 -> 18 -> 12 ids.
        let (ids, n_dropped) = conversation.fit(15, 64, render).unwrap();
        assert_eq!((ids.len(), n_dropped), (12, 4));
        let contents: Vec<String> = conversation
            .in_context()
            .into_iter()
            .map(|m| m.content)
            .collect();
        assert_eq!(
            contents,
            ["be kind", "question 2", "answer 2", "last question"]
        );
        // The turns left out stay in the conversation (for /save, --json).
        assert_eq!(conversation.messages, chat(3).messages);
        // The next turn leaves out only what it must, from where it was.
        conversation.push("assistant", "last answer");
        conversation.push("user", "one more");
        let (ids, n_dropped) = conversation.fit(15, 64, render).unwrap();
        assert_eq!((ids.len(), n_dropped), (12, 2));
        assert_eq!(conversation.in_context()[1].content, "last question");
        // What fits is left alone.
        let mut fits = chat(1);
        assert_eq!(fits.fit(100, 128, render).unwrap().1, 0);
        assert_eq!(fits, chat(1));
    }

    #[test]
    fn a_message_that_cannot_fit_is_an_error_and_nothing_else_is_lost() {
        let mut conversation = chat(2);
        let error = conversation.fit(5, 16, render).unwrap_err();
        let too_long = error.downcast_ref::<MessageTooLong>().unwrap();
        assert_eq!(
            (too_long.n_tokens, too_long.budget, too_long.context_length),
            (6, 5, 16)
        );
        assert_eq!(conversation, chat(2), "nothing is left out for it");
    }

    #[test]
    fn system_messages_are_set_replaced_and_removed_and_survive_clear() {
        let mut conversation = chat(1);
        conversation.set_system(Some("be brief".into()));
        assert_eq!(conversation.messages[0], Message::new("system", "be brief"));
        assert_eq!(conversation.messages.len(), 4);
        conversation.clear();
        assert_eq!(conversation.messages, [Message::new("system", "be brief")]);
        conversation.set_system(None);
        assert!(conversation.messages.is_empty());
        conversation.push("user", "hi");
        assert!(!conversation.pop_reply());
        conversation.push("assistant", "hello");
        assert!(conversation.pop_reply());
        assert_eq!(conversation.messages, [Message::new("user", "hi")]);
    }

    #[test]
    fn a_saved_conversation_loads_back_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chat.json");
        let conversation = chat(2);
        conversation.save(&path).unwrap();
        assert_eq!(Conversation::load(&path).unwrap(), conversation);
        std::fs::write(&path, "[1, 2]").unwrap();
        let error = format!("{:#}", Conversation::load(&path).unwrap_err());
        assert!(error.contains("is not a saved conversation"), "{error}");
    }

    #[test]
    fn save_keeps_the_turns_left_out_of_the_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chat.json");
        let mut conversation = chat(3);
        let (_, n_dropped) = conversation.fit(15, 64, render).unwrap();
        assert_eq!(n_dropped, 4);
        conversation.save(&path).unwrap();
        assert_eq!(Conversation::load(&path).unwrap(), chat(3));
    }

    #[test]
    fn load_reads_only_a_regular_file_up_to_the_cap() {
        let error = format!(
            "{:#}",
            Conversation::load(Path::new("/dev/zero")).unwrap_err()
        );
        assert!(
            error.ends_with("/dev/zero is not a regular file (it is a character device)"),
            "{error}"
        );
        let dir = tempfile::tempdir().unwrap();
        let error = format!("{:#}", Conversation::load(dir.path()).unwrap_err());
        assert!(error.ends_with("is a directory"), "{error}");
        let big = dir.path().join("big.json");
        let file = std::fs::File::create(&big).unwrap();
        file.set_len(MAX_CONVERSATION_BYTES + 1).unwrap();
        let error = format!("{:#}", Conversation::load(&big).unwrap_err());
        assert!(
            error.ends_with(&format!(
                "is {} bytes, more than the 16777216 bytes read at most",
                MAX_CONVERSATION_BYTES + 1
            )),
            "{error}"
        );
    }
}
