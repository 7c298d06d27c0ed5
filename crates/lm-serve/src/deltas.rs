//! [`TextDeltas`]: a response's text in pieces as its tokens arrive, the
//! same bytes whether streamed or sent whole.
//!
//! The text is what decoding prompt + generated ids adds to the decoded
//! prompt (lm-decode's [`StopSearch`], which also finds stop strings in the
//! tail a new token can change). A piece is held back while it could still
//! change: a trailing incomplete UTF-8 character (U+FFFD) and the last
//! `longest stop string - 1` bytes, which could start a stop string. End
//! tokens add no text. This is the rule lm-cli's printer streams by.

use lm_core::{Detokenize, TokenId};
use lm_decode::StopSearch;

/// The text of one response, handed out as deltas.
pub(crate) struct TextDeltas<'a> {
    end_tokens: &'a [TokenId],
    search: StopSearch<'a>,
    n_hold: usize,
    n_emitted: usize,
}

impl<'a> TextDeltas<'a> {
    pub(crate) fn new(
        detokenizer: &'a dyn Detokenize,
        prompt: &[TokenId],
        end_tokens: &'a [TokenId],
        stop_strings: &'a [String],
    ) -> Self {
        let longest_stop = stop_strings.iter().map(String::len).max().unwrap_or(0);
        Self {
            end_tokens,
            search: StopSearch::new(detokenizer, stop_strings, prompt),
            n_hold: longest_stop.saturating_sub(1),
            n_emitted: 0,
        }
    }

    /// Adds a generated token; returns the text that became final (often
    /// empty).
    pub(crate) fn push(&mut self, token: TokenId) -> String {
        if self.end_tokens.contains(&token) {
            return String::new();
        }
        let stop = self.search.push(token).map(|(byte, _)| byte);
        let text = self.search.text();
        let safe = stop.unwrap_or_else(|| text.len().saturating_sub(self.n_hold));
        if safe <= self.n_emitted {
            return String::new();
        }
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
        self.take(n_before, shown)
    }

    /// The rest of the text once the response has ended (cut before a stop
    /// string).
    pub(crate) fn finish(&mut self) -> String {
        let text = self.search.text_before_stop();
        match text.get(self.n_emitted..) {
            Some(rest) => {
                let rest = rest.to_owned();
                self.n_emitted = text.len();
                rest
            }
            None => String::new(),
        }
    }

    /// Hands out `shown`, which starts at byte `n_before` of the text (at or
    /// before what was handed out, when a character completed late).
    fn take(&mut self, n_before: usize, shown: &str) -> String {
        let skip = self.n_emitted - n_before;
        let Some(new) = shown.get(skip..) else {
            return String::new();
        };
        self.n_emitted += new.len();
        new.to_owned()
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

    fn deltas(tokens: &[TokenId], stop: &[String]) -> Vec<String> {
        let mut text = TextDeltas::new(&Pieces, &[], &[4], stop);
        let mut out: Vec<String> = tokens.iter().map(|&t| text.push(t)).collect();
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
