//! [`TextPrinter`]: the generated text, printed as it grows (streaming) or
//! at the end, the same bytes either way.
//!
//! The text comes decoded from lm-decode's loop, one final piece per step
//! ([`lm_decode::Step::text`]) and what was held back at the end
//! ([`lm_decode::Generation::held_back_text`]), so nothing is decoded twice.
//! It is what decoding prompt + generated ids adds to the decoded prompt
//! (word models get their spacing and punctuation right at the seam),
//! without end tokens, cut before a stop string; a piece appears once it
//! cannot change (a trailing incomplete UTF-8 character, or the start of a
//! stop string, waits), the rule lm-serve streams by. Beam search's tokens
//! come at the end, not from steps: [`continuation_text`] decodes them by
//! the same rule. The first failed write (a reader that closed the pipe)
//! ends the printing, and the caller stops generating
//! ([`TextPrinter::write_failed`]).

use std::io;

use lm_core::TokenId;
use lm_decode::TextDeltas;

use crate::output::Output;
use crate::text::TextCodec;

/// Prints one continuation.
#[derive(Debug, Default)]
pub struct TextPrinter {
    /// The continuation so far.
    text: String,
    /// Whether to write as the pieces arrive.
    live: bool,
    /// The first write error; nothing more is written after it.
    error: Option<io::Error>,
}

impl TextPrinter {
    /// A printer of one continuation; `live` streams.
    pub fn new(live: bool) -> Self {
        Self {
            live,
            ..Self::default()
        }
    }

    /// Adds a final piece of the text (a step's text), writing it when live.
    pub fn push(&mut self, piece: &str, out: &mut Output) {
        self.text.push_str(piece);
        if self.live {
            self.write(piece, out);
        }
    }

    /// Whether a write failed: nobody reads what follows, so stop.
    pub fn write_failed(&self) -> bool {
        self.error.is_some()
    }

    /// Adds `held_back`, the text the run held back to its end, writes
    /// whatever has not been written (all of it when not live) and returns
    /// the continuation, or the first write error.
    pub fn finish(mut self, held_back: &str, out: &mut Output) -> io::Result<String> {
        let unwritten_from = if self.live { self.text.len() } else { 0 };
        self.text.push_str(held_back);
        let text = std::mem::take(&mut self.text);
        self.write(&text[unwritten_from..], out);
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

/// The continuation `tokens` make after `prompt` (beam search's, which
/// come at the end rather than step by step), by the rule the loop's steps
/// follow: decoded in the prompt's context, without `end_tokens`.
pub fn continuation_text(
    codec: &TextCodec,
    prompt: &[TokenId],
    end_tokens: &[TokenId],
    tokens: &[TokenId],
) -> String {
    let mut deltas = TextDeltas::new(codec, prompt, end_tokens, &[]);
    for &token in tokens {
        deltas.push(token);
    }
    deltas.finish()
}
