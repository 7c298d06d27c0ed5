//! What the user types in `chat`, read as whole messages and commands.
//!
//! Lines come from a [`LineSource`]: the terminal through rustyline (line
//! editing, history, and a pasted paragraph arriving as one line with its
//! newlines, by bracketed paste), or piped stdin, one line at a time. The
//! rules that join lines into a message are the same for both:
//!
//! ```text
//! text\        a line ending in a backslash continues on the next line
//! """          a line of three quotes opens a block; the lines up to the next
//! ...          such line are one message, blank lines included
//! """
//! (empty)      ignored: it never ends the chat
//! /command     a command (see ChatCommand); //text sends "/text"
//! ```

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{Context, Result};

/// One line read, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// The text, without its line end.
    Text(String),
    /// Ctrl-C at the prompt (terminal only).
    Interrupted,
    /// End of input (Ctrl-D, or the end of the pipe).
    End,
}

/// Where lines come from.
pub trait LineSource {
    /// Reads one line, showing `prompt` when interactive.
    fn read_line(&mut self, prompt: &str) -> Result<Line>;
}

/// A message, a command, or the end of the chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A user message.
    Message(String),
    /// A slash command.
    Command(ChatCommand),
    /// The chat is over.
    End,
}

/// The slash commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatCommand {
    /// `/clear`: forget the turns, keep the system message.
    Clear,
    /// `/system TEXT` sets the system message; `/system` alone removes it.
    System(Option<String>),
    /// `/regen`: generate the last reply again.
    Regen,
    /// `/save FILE`.
    Save(PathBuf),
    /// `/load FILE`.
    Load(PathBuf),
    /// `/help`.
    Help,
    /// `/exit` or `/quit`.
    Exit,
}

/// The one-line summary of the commands, for `/help` and mistakes.
pub const COMMANDS_HELP: &str = "commands: /clear, /system [TEXT], /regen, /save FILE, /load FILE, /help, /exit \
     (a line ending in \\ continues; \"\"\" opens and closes a block; //TEXT sends /TEXT)";

/// Parses a line that starts with `/` (and not `//`): a command, or a
/// message for the user saying what is wrong.
pub fn parse_command(line: &str) -> Result<ChatCommand, String> {
    let body = line.trim().trim_start_matches('/');
    let (name, argument) = match body.split_once(char::is_whitespace) {
        Some((name, rest)) => (name, rest.trim()),
        None => (body, ""),
    };
    let file = |command: fn(PathBuf) -> ChatCommand| {
        if argument.is_empty() {
            Err(format!("/{name} needs a file name: /{name} FILE"))
        } else {
            Ok(command(PathBuf::from(argument)))
        }
    };
    match name {
        "clear" => Ok(ChatCommand::Clear),
        "system" => Ok(ChatCommand::System(
            (!argument.is_empty()).then(|| argument.to_owned()),
        )),
        "regen" => Ok(ChatCommand::Regen),
        "save" => file(ChatCommand::Save),
        "load" => file(ChatCommand::Load),
        "help" | "?" => Ok(ChatCommand::Help),
        "exit" | "quit" | "bye" => Ok(ChatCommand::Exit),
        _ => Err(format!("unknown command /{name}; {COMMANDS_HELP}")),
    }
}

/// Reads [`Entry`]s from a [`LineSource`].
#[derive(Debug)]
pub struct MessageReader<S> {
    lines: S,
}

impl<S: LineSource> MessageReader<S> {
    /// Reads from `lines`.
    pub fn new(lines: S) -> Self {
        Self { lines }
    }

    /// The next message or command; mistakes (an unknown command) are told
    /// on stderr and reading goes on. Two Ctrl-C in a row at the prompt end
    /// the chat.
    pub fn next_entry(&mut self) -> Result<Entry> {
        let mut interrupted = false;
        loop {
            let text = match self.lines.read_line("> ")? {
                Line::End => return Ok(Entry::End),
                Line::Interrupted if interrupted => return Ok(Entry::End),
                Line::Interrupted => {
                    interrupted = true;
                    eprintln!("(Ctrl-C again, Ctrl-D or /exit ends the chat)");
                    continue;
                }
                Line::Text(text) => text,
            };
            interrupted = false;
            let message = if text.trim() == "\"\"\"" {
                self.read_block()?
            } else {
                self.read_continued(text)?
            };
            let message = message.trim();
            if message.is_empty() {
                continue;
            }
            if let Some(literal) = message.strip_prefix("//") {
                return Ok(Entry::Message(format!("/{literal}")));
            }
            if message.starts_with('/') {
                match parse_command(message) {
                    Ok(command) => return Ok(Entry::Command(command)),
                    Err(mistake) => {
                        eprintln!("note: {mistake}");
                        continue;
                    }
                }
            }
            return Ok(Entry::Message(message.to_owned()));
        }
    }

    /// The lines up to a closing `"""` (or the end of input), joined.
    fn read_block(&mut self) -> Result<String> {
        let mut lines = Vec::new();
        loop {
            match self.lines.read_line("... ")? {
                Line::Text(text) if text.trim() == "\"\"\"" => break,
                Line::Text(text) => lines.push(text),
                Line::Interrupted | Line::End => break,
            }
        }
        Ok(lines.join("\n"))
    }

    /// `first` and, while a line ends in a backslash, the lines after it.
    fn read_continued(&mut self, first: String) -> Result<String> {
        let mut message = first;
        while let Some(stripped) = message.strip_suffix('\\') {
            message = format!("{stripped}\n");
            match self.lines.read_line("... ")? {
                Line::Text(text) => message.push_str(&text),
                Line::Interrupted | Line::End => break,
            }
        }
        Ok(message)
    }
}

/// Lines from piped input (no prompt is shown).
#[derive(Debug)]
pub struct PipedLines<R> {
    reader: R,
}

impl<R: BufRead> PipedLines<R> {
    /// Reads lines from `reader`.
    pub fn new(reader: R) -> Self {
        Self { reader }
    }
}

impl<R: BufRead> LineSource for PipedLines<R> {
    fn read_line(&mut self, _prompt: &str) -> Result<Line> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).context("reading stdin")? == 0 {
            return Ok(Line::End);
        }
        let line = line.strip_suffix('\n').unwrap_or(&line);
        Ok(Line::Text(
            line.strip_suffix('\r').unwrap_or(line).to_owned(),
        ))
    }
}

/// Lines typed on a terminal, with rustyline's editing and history.
pub struct TerminalLines {
    editor: rustyline::DefaultEditor,
}

impl std::fmt::Debug for TerminalLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TerminalLines")
    }
}

impl TerminalLines {
    /// A line editor on the terminal.
    pub fn new() -> Result<Self> {
        let editor = rustyline::DefaultEditor::new().context("starting the line editor")?;
        Ok(Self { editor })
    }
}

impl LineSource for TerminalLines {
    fn read_line(&mut self, prompt: &str) -> Result<Line> {
        use rustyline::error::ReadlineError;
        match self.editor.readline(prompt) {
            Ok(line) => {
                if !line.trim().is_empty() {
                    // History is a convenience: failing to keep it is no error.
                    let _ = self.editor.add_history_entry(line.as_str());
                }
                Ok(Line::Text(line))
            }
            Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
            Err(ReadlineError::Eof) => Ok(Line::End),
            Err(error) => Err(error).context("reading the terminal"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines typed in advance.
    struct Typed(std::vec::IntoIter<Line>);

    impl LineSource for Typed {
        fn read_line(&mut self, _prompt: &str) -> Result<Line> {
            Ok(self.0.next().unwrap_or(Line::End))
        }
    }

    fn entries(lines: &[&str]) -> Vec<Entry> {
        let typed = lines
            .iter()
            .map(|&line| match line {
                "^C" => Line::Interrupted,
                _ => Line::Text(line.to_owned()),
            })
            .collect::<Vec<_>>();
        let mut reader = MessageReader::new(Typed(typed.into_iter()));
        let mut entries = Vec::new();
        loop {
            let entry = reader.next_entry().unwrap();
            let end = entry == Entry::End;
            entries.push(entry);
            if end {
                return entries;
            }
        }
    }

    fn message(text: &str) -> Entry {
        Entry::Message(text.to_owned())
    }

    #[test]
    fn each_line_is_a_message_and_empty_lines_are_skipped() {
        assert_eq!(
            entries(&["Hello", "", "   ", "How are you?"]),
            [message("Hello"), message("How are you?"), Entry::End]
        );
    }

    #[test]
    fn a_backslash_continues_the_message_on_the_next_line() {
        assert_eq!(
            entries(&["first\\", "\\", "third", "next"]),
            [message("first\n\nthird"), message("next"), Entry::End]
        );
        // A backslash on the last line of input ends the message there.
        assert_eq!(entries(&["dangling\\"]), [message("dangling"), Entry::End]);
    }

    #[test]
    fn a_block_between_triple_quotes_is_one_message_with_its_blank_lines() {
        assert_eq!(
            entries(&["\"\"\"", "para one", "", "para two", "\"\"\"", "after"]),
            [
                message("para one\n\npara two"),
                message("after"),
                Entry::End
            ]
        );
        // A pasted paragraph arrives from the terminal as one line.
        assert_eq!(
            entries(&["para one\n\npara two"]),
            [message("para one\n\npara two"), Entry::End]
        );
    }

    #[test]
    fn commands_parse_and_mistakes_are_not_sent() {
        assert_eq!(
            entries(&[
                "/clear",
                "/system Be brief.",
                "/system",
                "/regen",
                "/save chat.json",
                "/load  saved chat.json ",
                "/save",
                "/bogus",
                "//etc/passwd is a path",
                "/exit",
            ]),
            [
                Entry::Command(ChatCommand::Clear),
                Entry::Command(ChatCommand::System(Some("Be brief.".to_owned()))),
                Entry::Command(ChatCommand::System(None)),
                Entry::Command(ChatCommand::Regen),
                Entry::Command(ChatCommand::Save(PathBuf::from("chat.json"))),
                Entry::Command(ChatCommand::Load(PathBuf::from("saved chat.json"))),
                message("/etc/passwd is a path"),
                Entry::Command(ChatCommand::Exit),
                Entry::End,
            ]
        );
    }

    #[test]
    fn one_ctrl_c_at_the_prompt_is_forgiven_two_in_a_row_end_the_chat() {
        assert_eq!(
            entries(&["^C", "Hi", "^C", "^C", "never read"]),
            [message("Hi"), Entry::End]
        );
    }
}
