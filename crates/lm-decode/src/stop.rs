//! Why a generation ended, and the stop-string search over text decoded
//! incrementally.
//!
//! Lesson 001, "Give the loop explicit limits": the loop stops at an end
//! token, the requested number of new tokens, or the context bound. Only the
//! first two kinds of ending (the model's end token, or a caller's stop
//! string) and a complete constrained output mean the response is finished;
//! reaching a limit means truncated.

use lm_core::{Detokenize, TokenId};
use std::fmt;

/// What stopped the loop. The checks run in this order after every chosen
/// token, and the first that holds is reported.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// One of the end tokens was chosen (it is the last generated token).
    EndToken(TokenId),
    /// The generated text came to contain this stop string.
    StopString(String),
    /// `max_new_tokens` tokens were generated: truncated.
    MaxNewTokens,
    /// Prompt plus generated tokens reached the model's context length:
    /// truncated (lesson 001: bound 5, a 3-token prompt gets 2 new tokens).
    ContextBound,
    /// The caller's step hook asked to stop (for example on Ctrl-C):
    /// truncated.
    Cancelled,
    /// The output constraint's language is complete and nothing more can
    /// follow (a JSON value closed, a choice written out): finished.
    ConstraintComplete,
}

impl StopReason {
    /// True when the response ended on its own (end token, stop string, or
    /// a complete constrained output); false when a limit cut it off.
    ///
    /// ```
    /// use lm_decode::StopReason;
    /// assert!(StopReason::EndToken(6).is_finished());
    /// assert!(!StopReason::MaxNewTokens.is_finished());
    /// ```
    pub fn is_finished(&self) -> bool {
        matches!(
            self,
            Self::EndToken(_) | Self::StopString(_) | Self::ConstraintComplete
        )
    }
}

/// The reason in words, as a front end shows it: what happened, and
/// "(truncated)" when a limit cut the response off.
///
/// ```
/// use lm_decode::StopReason;
/// assert_eq!(StopReason::EndToken(2).to_string(), "the end token (id 2) was chosen");
/// assert_eq!(
///     StopReason::MaxNewTokens.to_string(),
///     "the new-token limit was reached (truncated)"
/// );
/// ```
impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EndToken(id) => write!(f, "the end token (id {id}) was chosen"),
            Self::StopString(text) => write!(f, "the text reached the stop string {text:?}"),
            Self::MaxNewTokens => f.write_str("the new-token limit was reached (truncated)"),
            Self::ContextBound => {
                f.write_str("prompt and new tokens filled the context (truncated)")
            }
            Self::Cancelled => f.write_str("the run was interrupted (truncated)"),
            Self::ConstraintComplete => f.write_str("the constrained output is complete"),
        }
    }
}

/// The earliest occurrence of any of `stop_strings` in `text`: its byte
/// offset and the index of the string (the first listed wins a tie).
///
/// ```
/// use lm_decode::find_stop_string;
/// let stops = ["\n\n".to_owned(), "END".to_owned()];
/// assert_eq!(find_stop_string("one END two\n\n", &stops), Some((4, 1)));
/// assert_eq!(find_stop_string("nothing", &stops), None);
/// ```
pub fn find_stop_string(text: &str, stop_strings: &[String]) -> Option<(usize, usize)> {
    stop_strings
        .iter()
        .enumerate()
        .filter_map(|(index, stop)| text.find(stop.as_str()).map(|byte| (byte, index)))
        .min()
}

/// The text of a growing id sequence, decoded incrementally through any
/// [`Detokenize`]: each push decodes only a small window of recent ids (the
/// approach of lm-tokenize's `TextStream`), so a run of n tokens costs O(n),
/// not the O(n²) of decoding the whole sequence at every step.
///
/// The text is what decoding `context + pushed ids` adds to the decoded
/// `context` (word models get their spacing right at the seam). It is kept
/// as a settled part, which later ids no longer change, and a pending part:
/// the text of the ids after the last point where the decoded window ended
/// in a whole character (a byte-level token can hold half of one, decoded
/// as U+FFFD until the rest arrives).
///
/// ```text
/// window ids            decoded        settled    pending
/// [Hi]                  "Hi"           "Hi"       ""
/// [Hi, F0 9F 99]        "Hi\u{FFFD}"   "Hi"       "\u{FFFD}"
/// [Hi, F0 9F 99, 82]    "Hi🙂"         "Hi🙂"     ""    (window -> [F0 9F 99, 82])
/// ```
///
/// A detokenizer whose window text does not start with what it decoded
/// before (it rewrote earlier text) is met by decoding everything once more,
/// so the text always equals the whole decode.
pub struct IncrementalText<'a> {
    detokenizer: &'a dyn Detokenize,
    /// The context followed by every pushed id.
    ids: Vec<TokenId>,
    n_context: usize,
    /// `ids[window_idx..n_settled]` decode to `window_text`, the end of the
    /// text decoded so far; pending ids follow.
    window_idx: usize,
    n_settled: usize,
    window_text: String,
    settled: String,
    pending: String,
}

impl std::fmt::Debug for IncrementalText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncrementalText")
            .field("settled", &self.settled)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl<'a> IncrementalText<'a> {
    /// An empty text after `context` (a prompt; or nothing).
    pub fn new(detokenizer: &'a dyn Detokenize, context: &[TokenId]) -> Self {
        let n_context = context.len();
        Self {
            detokenizer,
            ids: context.to_vec(),
            n_context,
            window_idx: n_context.saturating_sub(1),
            n_settled: n_context,
            window_text: detokenizer.decode(&context[n_context.saturating_sub(1)..]),
            settled: String::new(),
            pending: String::new(),
        }
    }

    /// Adds one id. Returns the byte offset from which the text may differ
    /// from before the push (the end of the settled text, or 0 when the
    /// detokenizer rewrote earlier text).
    pub fn push(&mut self, id: TokenId) -> usize {
        self.ids.push(id);
        let decoded = self.detokenizer.decode(&self.ids[self.window_idx..]);
        let Some(new) = decoded.strip_prefix(self.window_text.as_str()) else {
            self.decode_everything();
            return 0;
        };
        let changed_from = self.settled.len();
        self.pending.clear();
        self.pending.push_str(new);
        if !self.pending.is_empty() && !self.pending.ends_with(char::REPLACEMENT_CHARACTER) {
            // The ids just settled become the window of the next ones.
            self.settled.push_str(&self.pending);
            self.pending.clear();
            self.window_idx = self.n_settled;
            self.n_settled = self.ids.len();
            self.window_text = self
                .detokenizer
                .decode(&self.ids[self.window_idx..self.n_settled]);
        }
        changed_from
    }

    /// The length of the text in bytes.
    pub fn len(&self) -> usize {
        self.settled.len() + self.pending.len()
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The length in bytes of the settled text, the start that later ids
    /// cannot change (the rest ends in an incomplete character).
    pub fn settled_len(&self) -> usize {
        self.settled.len()
    }

    /// The text from byte `start` on (moved back to a character boundary).
    pub fn tail(&self, start: usize) -> String {
        let mut start = start.min(self.settled.len());
        while !self.settled.is_char_boundary(start) {
            start -= 1;
        }
        let mut tail = String::with_capacity(self.len() - start);
        tail.push_str(&self.settled[start..]);
        tail.push_str(&self.pending);
        tail
    }

    /// The whole text.
    pub fn text(&self) -> String {
        self.tail(0)
    }

    /// The fallback for a detokenizer that rewrote earlier text: decode all
    /// the ids, as the text is defined, and settle it.
    fn decode_everything(&mut self) {
        let full = self.detokenizer.decode(&self.ids);
        let base = self.detokenizer.decode(&self.ids[..self.n_context]);
        self.settled = match full.strip_prefix(base.as_str()) {
            Some(rest) => rest.to_owned(),
            None => self.detokenizer.decode(&self.ids[self.n_context..]),
        };
        self.pending.clear();
        self.window_idx = self.ids.len() - 1;
        self.n_settled = self.ids.len();
        self.window_text = self.detokenizer.decode(&self.ids[self.window_idx..]);
    }
}

/// The stop-string check of a growing text: after each id, only the tail a
/// new occurrence could span is searched (the text that may have changed,
/// plus the `longest stop string - 1` bytes before it), so the check costs
/// the same at token 20,000 as at token 1. It finds the same occurrence as
/// [`find_stop_string`] on the whole text after each id: an occurrence
/// wholly inside the text before it would have been found then.
#[derive(Debug)]
pub struct StopSearch<'a> {
    text: IncrementalText<'a>,
    stop_strings: &'a [String],
    longest: usize,
    found: Option<(usize, usize)>,
}

impl<'a> StopSearch<'a> {
    /// A search for `stop_strings` in the text decoded after `context`.
    pub fn new(
        detokenizer: &'a dyn Detokenize,
        stop_strings: &'a [String],
        context: &[TokenId],
    ) -> Self {
        Self {
            text: IncrementalText::new(detokenizer, context),
            stop_strings,
            longest: stop_strings.iter().map(String::len).max().unwrap_or(0),
            found: None,
        }
    }

    /// Adds one id; returns the earliest stop string in the text (its byte
    /// offset and index in `stop_strings`), once one occurs. Ids pushed after
    /// that change nothing.
    pub fn push(&mut self, id: TokenId) -> Option<(usize, usize)> {
        if self.found.is_some() {
            return self.found;
        }
        let changed_from = self.text.push(id);
        if self.longest > 0 {
            let start = changed_from.saturating_sub(self.longest - 1);
            let tail = self.text.tail(start);
            let start = self.text.len() - tail.len();
            self.found = find_stop_string(&tail, self.stop_strings)
                .map(|(byte, index)| (start + byte, index));
        }
        self.found
    }

    /// The stop string found, as from [`StopSearch::push`].
    pub fn found(&self) -> Option<(usize, usize)> {
        self.found
    }

    /// The text so far, stop string and all.
    pub fn text(&self) -> &IncrementalText<'a> {
        &self.text
    }

    /// The text cut before the stop string found (all of it when none was).
    pub fn text_before_stop(&self) -> String {
        let mut text = self.text.text();
        if let Some((byte, _)) = self.found {
            text.truncate(byte);
        }
        text
    }
}
