//! [`TextDeltas`]: a run's text handed out in pieces as its tokens arrive,
//! each piece final, so a front end that streams them (lm-cli's printer,
//! lm-serve's server-sent events) shows the same bytes as one that waits for
//! the end. The loop's row owns one and puts each piece in its step
//! ([`crate::Step::text`]), so the front ends print the pieces without
//! decoding again; it is public for text that comes from elsewhere (a beam
//! search's tokens).
//!
//! The text is the one [`StopSearch`] decodes: what decoding context +
//! generated ids adds to the decoded context, searched for stop strings.
//! The hold-back rule: a piece is held back while it could still change,
//!
//! - a trailing incomplete UTF-8 character (decoded as U+FFFD until its
//!   last byte arrives), and
//! - the last `longest stop string - 1` bytes, which could be the start of
//!   a stop string (a stop string that does occur is cut, never shown).
//!
//! ```text
//! stop "</s>", 3 bytes held:   pushed "Hi <"   shown "H"    held "i <"
//!                              pushed "/s>"    stop found at byte 3: shown "i "
//! ```
//!
//! End tokens add no text. [`TextDeltas::finish`] hands out what is still
//! held once the run has ended.

use lm_core::{Detokenize, TokenId};

use crate::stop::StopSearch;

/// The text of one run, handed out in final pieces.
///
/// ```
/// use lm_core::{Detokenize, TokenId};
/// use lm_decode::TextDeltas;
/// struct Words;
/// impl Detokenize for Words {
///     fn decode(&self, ids: &[TokenId]) -> String {
///         ids.iter().map(|&id| ["Hi", " <", "/s>", " more"][id as usize]).collect()
///     }
/// }
/// let stops = ["</s>".to_owned()];
/// let mut text = TextDeltas::new(&Words, &[], &[], &stops);
/// text.push(0);
/// assert_eq!(text.take_final(), ""); // 3 bytes are held: "</s>" is 4 long
/// text.push(1);
/// assert_eq!(text.take_final(), "H"); // "i <" could start "</s>"
/// text.push(2);
/// assert_eq!(text.take_final(), "i "); // the stop string is cut
/// text.push(3);
/// assert_eq!(text.finish(), ""); // after the stop, nothing more
/// ```
#[derive(Debug)]
pub struct TextDeltas<'a> {
    end_tokens: &'a [TokenId],
    search: StopSearch<'a>,
    /// Bytes at the end that could be the start of a stop string.
    n_hold: usize,
    /// Bytes of the text already handed out.
    n_emitted: usize,
}

impl<'a> TextDeltas<'a> {
    /// The text generated after `context` (the prompt), decoded by
    /// `detokenizer`, without `end_tokens`, cut before the first of
    /// `stop_strings`.
    pub fn new(
        detokenizer: &'a dyn Detokenize,
        context: &[TokenId],
        end_tokens: &'a [TokenId],
        stop_strings: &'a [String],
    ) -> Self {
        let longest_stop = stop_strings.iter().map(String::len).max().unwrap_or(0);
        Self {
            end_tokens,
            search: StopSearch::new(detokenizer, stop_strings, context),
            n_hold: longest_stop.saturating_sub(1),
            n_emitted: 0,
        }
    }

    /// Adds a generated token (an end token adds nothing). Returns the stop
    /// string found so far, as [`StopSearch::push`] does.
    pub fn push(&mut self, token: TokenId) -> Option<(usize, usize)> {
        if self.end_tokens.contains(&token) {
            return self.search.found();
        }
        self.search.push(token)
    }

    /// The text that has become final since the last call (often empty):
    /// up to a stop string found, or else all but the held-back end.
    pub fn take_final(&mut self) -> String {
        let text = self.search.text();
        let safe = match self.search.found() {
            Some((stop_byte, _)) => stop_byte,
            // A trailing incomplete character may yet become a longer one
            // ("\u{FFFD}", 3 bytes, becomes "é", 2): hold back from the
            // end of the settled text.
            None => text.settled_len().saturating_sub(self.n_hold),
        };
        if safe <= self.n_emitted {
            return String::new();
        }
        // What was handed out is a prefix of the text, so the tail from
        // there (or from the character boundary before) is the rest; show
        // it up to `safe`, on a character boundary, without a trailing
        // incomplete character.
        let tail = text.tail(self.n_emitted);
        let n_before = text.len() - tail.len();
        let mut end = safe - n_before;
        while end > 0 && !tail.is_char_boundary(end) {
            end -= 1;
        }
        let mut shown = &tail[..end];
        while let Some(rest) = shown.strip_suffix(char::REPLACEMENT_CHARACTER) {
            shown = rest;
        }
        let Some(new) = shown.get(self.n_emitted - n_before..) else {
            return String::new();
        };
        self.n_emitted += new.len();
        new.to_owned()
    }

    /// The rest of the text once the run has ended: everything not handed
    /// out, held-back bytes included, cut before a stop string.
    pub fn finish(&mut self) -> String {
        let text = self.search.text_before_stop();
        match text.get(self.n_emitted..) {
            Some(rest) => {
                self.n_emitted = text.len();
                rest.to_owned()
            }
            None => String::new(),
        }
    }

    /// The whole text so far, cut before a stop string (handed out or not).
    pub fn text(&self) -> String {
        self.search.text_before_stop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token i is the text of `PIECES[i]`.
    struct Pieces;
    const PIECES: [&str; 5] = ["Hel", "lo", " wor", "ld", "!"];
    impl Detokenize for Pieces {
        fn decode(&self, ids: &[TokenId]) -> String {
            ids.iter().map(|&i| PIECES[i as usize]).collect()
        }
    }

    /// The pieces handed out after each token, then by `finish`.
    fn deltas(tokens: &[TokenId], stop: &[String]) -> Vec<String> {
        let mut text = TextDeltas::new(&Pieces, &[], &[4], stop);
        let mut out: Vec<String> = tokens
            .iter()
            .map(|&t| {
                text.push(t);
                text.take_final()
            })
            .collect();
        out.push(text.finish());
        out
    }

    #[test]
    fn deltas_join_to_the_text_and_end_tokens_add_nothing() {
        assert_eq!(
            deltas(&[0, 1, 2, 3, 4], &[]),
            ["Hel", "lo", " wor", "ld", "", ""]
        );
    }

    #[test]
    fn text_that_could_start_a_stop_string_is_held_back_and_the_stop_string_cut() {
        let stop = vec!["wor".to_owned()];
        assert_eq!(deltas(&[0, 1, 2, 3], &stop), ["H", "el", "lo ", "", ""]);
        let stop = vec!["xyz".to_owned()];
        let all = deltas(&[0, 1, 2, 3], &stop);
        assert_eq!(all.concat(), "Hello world");
        assert_eq!(all[0], "H");
    }
}
