//! [`TextPrinter`]: the generated text, printed as it grows (streaming) or
//! at the end, the same bytes either way.
//!
//! The continuation is what decoding prompt + generated ids adds to the
//! decoded prompt, so word models get their spacing and punctuation right
//! at the seam. It is decoded incrementally and searched for stop strings
//! only in its tail (lm-decode's [`StopSearch`]), so a token costs the same
//! at the end of a long run as at its start. While streaming, text is held
//! back when it could still change: a trailing incomplete UTF-8 character
//! (U+FFFD), and the last `longest stop string - 1` bytes, which could be
//! the start of a stop string. End tokens are never printed. The first
//! failed write (a reader that closed the pipe) ends the printing, and the
//! caller stops generating ([`TextPrinter::write_failed`]).

use std::io;

use lm_core::TokenId;
use lm_decode::StopSearch;

use crate::output::Output;
use crate::text::TextCodec;

/// Prints one continuation.
#[derive(Debug)]
pub struct TextPrinter<'a> {
    end_tokens: &'a [TokenId],
    /// The continuation (without end tokens) and its stop strings.
    search: StopSearch<'a>,
    /// Bytes of text that may still turn out to start a stop string.
    n_hold: usize,
    /// Bytes of the continuation already written.
    n_emitted: usize,
    /// Whether to write as tokens arrive.
    live: bool,
    /// The first write error; nothing more is written after it.
    error: Option<io::Error>,
}

impl<'a> TextPrinter<'a> {
    /// A printer for the continuation of `prompt`; `live` streams.
    pub fn new(
        codec: &'a TextCodec,
        prompt: &[TokenId],
        end_tokens: &'a [TokenId],
        stop_strings: &'a [String],
        live: bool,
    ) -> Self {
        let longest_stop = stop_strings.iter().map(String::len).max().unwrap_or(0);
        Self {
            end_tokens,
            search: StopSearch::new(codec, stop_strings, prompt),
            n_hold: longest_stop.saturating_sub(1),
            n_emitted: 0,
            live,
            error: None,
        }
    }

    /// Adds a chosen token, writing what has become safe to show when live.
    pub fn push(&mut self, token: TokenId, out: &mut Output) {
        if self.end_tokens.contains(&token) {
            return;
        }
        let stop = self.search.push(token).map(|(byte, _)| byte);
        if !self.live || self.error.is_some() {
            return;
        }
        let text = self.search.text();
        let safe = stop.unwrap_or_else(|| text.len().saturating_sub(self.n_hold));
        if safe <= self.n_emitted {
            return;
        }
        // What was written is a prefix of the text, so the tail from there
        // is the unwritten text; show it up to `safe`, on a character
        // boundary, without a trailing incomplete character.
        let tail = text.tail(self.n_emitted);
        let mut end = safe - (text.len() - tail.len());
        while end > 0 && !tail.is_char_boundary(end) {
            end -= 1;
        }
        let mut shown = &tail[..end];
        while let Some(rest) = shown.strip_suffix(char::REPLACEMENT_CHARACTER) {
            shown = rest;
        }
        let n_before = text.len() - tail.len();
        self.write(n_before, shown, out);
    }

    /// Whether a write failed: nobody reads what follows, so stop.
    pub fn write_failed(&self) -> bool {
        self.error.is_some()
    }

    /// The whole continuation: without end tokens, cut at a stop string.
    pub fn text(&self) -> String {
        self.search.text_before_stop()
    }

    /// Writes whatever has not been written (when live) and returns the
    /// first write error, if any.
    pub fn finish(mut self, out: &mut Output) -> io::Result<String> {
        let text = self.text();
        if let Some(new) = text.get(self.n_emitted..) {
            let new = new.to_owned();
            self.write(self.n_emitted, &new, out);
        }
        match self.error {
            Some(error) => Err(error),
            None => Ok(text),
        }
    }

    /// Writes `new`, the text from byte `start`, when it extends what was
    /// written.
    fn write(&mut self, start: usize, new: &str, out: &mut Output) {
        let Some(unwritten) = new.get(self.n_emitted.saturating_sub(start)..) else {
            return;
        };
        if self.error.is_some() || unwritten.is_empty() || start > self.n_emitted {
            return;
        }
        match out.write_now(unwritten) {
            Ok(()) => self.n_emitted = start + new.len(),
            Err(error) => self.error = Some(error),
        }
    }
}
