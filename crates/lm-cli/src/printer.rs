//! [`TextPrinter`]: the generated text, printed as it grows (streaming) or
//! at the end, the same bytes either way.
//!
//! The continuation is what decoding prompt + generated ids adds to the
//! decoded prompt, so word models get their spacing and punctuation right
//! at the seam. lm-decode's [`TextDeltas`] decodes it incrementally, finds
//! stop strings in its tail (a token costs the same at the end of a long
//! run as at its start) and applies the hold-back rule lm-serve streams by:
//! text that could still change (a trailing incomplete UTF-8 character, or
//! the start of a stop string) is held back until it cannot. End tokens are
//! never printed. The first failed write (a reader that closed the pipe)
//! ends the printing, and the caller stops generating
//! ([`TextPrinter::write_failed`]).

use std::io;

use lm_core::TokenId;
use lm_decode::TextDeltas;

use crate::output::Output;
use crate::text::TextCodec;

/// Prints one continuation.
#[derive(Debug)]
pub struct TextPrinter<'a> {
    /// The continuation (without end tokens, cut at a stop string), handed
    /// out as it becomes final.
    deltas: TextDeltas<'a>,
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
        Self {
            deltas: TextDeltas::new(codec, prompt, end_tokens, stop_strings),
            live,
            error: None,
        }
    }

    /// Adds a chosen token, writing what has become final when live.
    pub fn push(&mut self, token: TokenId, out: &mut Output) {
        self.deltas.push(token);
        if self.live && self.error.is_none() {
            let new = self.deltas.take_final();
            self.write(&new, out);
        }
    }

    /// Whether a write failed: nobody reads what follows, so stop.
    pub fn write_failed(&self) -> bool {
        self.error.is_some()
    }

    /// The whole continuation: without end tokens, cut at a stop string.
    pub fn text(&self) -> String {
        self.deltas.text()
    }

    /// Writes whatever has not been written (all of it when not live) and
    /// returns the continuation, or the first write error.
    pub fn finish(mut self, out: &mut Output) -> io::Result<String> {
        let text = self.text();
        let rest = self.deltas.finish();
        self.write(&rest, out);
        match self.error {
            Some(error) => Err(error),
            None => Ok(text),
        }
    }

    /// Writes `new` unless an earlier write failed.
    fn write(&mut self, new: &str, out: &mut Output) {
        if self.error.is_some() || new.is_empty() {
            return;
        }
        if let Err(error) = out.write_now(new) {
            self.error = Some(error);
        }
    }
}
