//! Why a generation ended, and the stop-string search.
//!
//! Lesson 001, "Give the loop explicit limits": the loop stops at an end
//! token, the requested number of new tokens, or the context bound. Only the
//! first two kinds of ending (the model's end token, or a caller's stop
//! string) mean the response is finished; reaching a limit means truncated.

use lm_core::TokenId;
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
}

impl StopReason {
    /// True when the response ended on its own (end token or stop string);
    /// false when a limit cut it off.
    ///
    /// ```
    /// use lm_decode::StopReason;
    /// assert!(StopReason::EndToken(6).is_finished());
    /// assert!(!StopReason::MaxNewTokens.is_finished());
    /// ```
    pub fn is_finished(&self) -> bool {
        matches!(self, Self::EndToken(_) | Self::StopString(_))
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
