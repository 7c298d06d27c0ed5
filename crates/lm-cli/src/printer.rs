//! [`TextPrinter`]: the generated text, printed as it grows (streaming) or
//! at the end, the same bytes either way.
//!
//! The continuation is what decoding prompt + generated ids adds to the
//! decoded prompt, so word models get their spacing and punctuation right
//! at the seam. While streaming, text is held back when it could still
//! change: a trailing incomplete UTF-8 character (U+FFFD), and the last
//! `longest stop string - 1` bytes, which could be the start of a stop
//! string. End tokens are never printed.

use std::io;

use lm_core::TokenId;
use lm_decode::find_stop_string;

use crate::output::Output;
use crate::text::TextCodec;

/// Prints one continuation.
#[derive(Debug)]
pub struct TextPrinter<'a> {
    codec: &'a TextCodec,
    end_tokens: &'a [TokenId],
    stop_strings: &'a [String],
    /// Prompt followed by the generated tokens that are not end tokens.
    ids: Vec<TokenId>,
    n_prompt: usize,
    /// The decoded prompt.
    base: String,
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
            codec,
            end_tokens,
            stop_strings,
            ids: prompt.to_vec(),
            n_prompt: prompt.len(),
            base: codec.decode_ids(prompt),
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
        self.ids.push(token);
        if !self.live || self.error.is_some() {
            return;
        }
        let text = self.continuation();
        let stop = find_stop_string(&text, self.stop_strings).map(|(byte, _)| byte);
        let mut safe = stop.unwrap_or_else(|| text.len().saturating_sub(self.n_hold));
        while safe > 0 && !text.is_char_boundary(safe) {
            safe -= 1;
        }
        let mut shown = &text[..safe];
        while let Some(rest) = shown.strip_suffix(char::REPLACEMENT_CHARACTER) {
            shown = rest;
        }
        self.write_from(&text[..shown.len()], out);
    }

    /// The whole continuation: without end tokens, cut at a stop string.
    pub fn text(&self) -> String {
        let mut text = self.continuation();
        if let Some((byte, _)) = find_stop_string(&text, self.stop_strings) {
            text.truncate(byte);
        }
        text
    }

    /// Writes whatever has not been written (when live) and returns the
    /// first write error, if any.
    pub fn finish(mut self, out: &mut Output) -> io::Result<String> {
        let text = self.text();
        self.write_from(&text, out);
        match self.error {
            Some(error) => Err(error),
            None => Ok(text),
        }
    }

    /// Writes `text[n_emitted..]` when `text` extends what was written.
    fn write_from(&mut self, text: &str, out: &mut Output) {
        if self.error.is_some() || text.len() <= self.n_emitted {
            return;
        }
        let Some(new) = text.get(self.n_emitted..) else {
            return;
        };
        match out.write_now(new) {
            Ok(()) => self.n_emitted = text.len(),
            Err(error) => self.error = Some(error),
        }
    }

    fn continuation(&self) -> String {
        let full = self.codec.decode_ids(&self.ids);
        match full.strip_prefix(self.base.as_str()) {
            Some(rest) => rest.to_owned(),
            None => self
                .codec
                .decode_ids(self.ids.get(self.n_prompt..).unwrap_or_default()),
        }
    }
}
