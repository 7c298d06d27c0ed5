//! Fitting a prompt into the model's context (lesson 001, "Dropping old
//! tokens changes the available evidence").
//!
//! A prompt fits when it leaves room for at least one new token:
//! `len + 1 <= context_length`. A prompt that does not leave room for the
//! new tokens asked for is refused (only when it leaves none: the run then
//! stops at the context bound), or shortened to a pinned head
//! (instructions) and the most recent tokens, leaving room for
//! `max_new_tokens` as llama.cpp and Hugging Face do
//! (`max_length - max_new_tokens`), but for at most half of what the head
//! leaves, so a huge `max_new_tokens` still keeps a real prompt:
//!
//! ```text
//! prompt:  h h h | x x x x x x x x x | r r r r      (context 10, 3 new tokens asked for)
//! kept:    h h h |                   | r r r r  + new new new
//! ```

use crate::error::{Error, Result};
use lm_core::TokenId;

/// What to do with a prompt that leaves no room for the new tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Truncation {
    /// Refuse with [`Error::PromptExceedsContext`].
    #[default]
    Refuse,
    /// Keep the first `n_head` tokens and the most recent ones, so that
    /// prompt plus the new tokens asked for fill the context (the new
    /// tokens at most half of what the head leaves, and at least one).
    KeepHead {
        /// Tokens pinned at the start (0 keeps only the most recent tokens).
        n_head: usize,
    },
}

/// A prompt as the model will read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FittedPrompt {
    /// The tokens kept, in order.
    pub tokens: Vec<TokenId>,
    /// How many tokens were dropped from the middle (0 when it fitted).
    pub n_dropped: usize,
}

/// Fits `prompt` into `context_length` (no bound: always fits) by
/// `truncation`, leaving room for `max_new_tokens` when it truncates.
///
/// ```
/// use lm_decode::{fit_prompt, Truncation};
/// let keep_head = Truncation::KeepHead { n_head: 1 };
/// // Room for 2 new tokens in a context of 6: the head and 3 recent tokens.
/// let fitted = fit_prompt(&[1, 2, 3, 4, 5, 6], Some(6), keep_head, 2).unwrap();
/// assert_eq!(fitted.tokens, vec![1, 4, 5, 6]);
/// assert_eq!(fitted.n_dropped, 2);
/// assert!(fit_prompt(&[1, 2, 3, 4, 5], Some(5), Truncation::Refuse, 2).is_err());
/// ```
pub fn fit_prompt(
    prompt: &[TokenId],
    context_length: Option<usize>,
    truncation: Truncation,
    max_new_tokens: usize,
) -> Result<FittedPrompt> {
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    let whole = || FittedPrompt {
        tokens: prompt.to_vec(),
        n_dropped: 0,
    };
    let Some(max) = context_length else {
        return Ok(whole());
    };
    let len = prompt.len();
    match truncation {
        Truncation::Refuse if len < max => Ok(whole()),
        Truncation::Refuse => Err(Error::PromptExceedsContext { len, max }),
        Truncation::KeepHead { n_head } => {
            // Room for the head, at least one recent token, and the new
            // tokens: as many as asked, at most half of what the head leaves.
            let after_head = max
                .checked_sub(n_head)
                .ok_or(Error::PinnedHeadTooLong { n_head, max })?;
            let room = room_for_new_tokens(max_new_tokens, after_head);
            if len + room <= max {
                return Ok(whole());
            }
            let n_recent = after_head
                .checked_sub(room)
                .filter(|&n| n > 0)
                .ok_or(Error::PinnedHeadTooLong { n_head, max })?;
            let mut tokens = Vec::with_capacity(n_head + n_recent);
            tokens.extend_from_slice(&prompt[..n_head]);
            tokens.extend_from_slice(&prompt[len - n_recent..]);
            Ok(FittedPrompt {
                n_dropped: len - tokens.len(),
                tokens,
            })
        }
    }
}

/// How many of `available` context positions a prompt that must be
/// shortened leaves for the new tokens: `max_new_tokens`, but at most half
/// (so a huge `max_new_tokens` still keeps a real prompt) and at least one.
/// [`fit_prompt`] and lm-cli's chat, which drops whole turns, both use it.
///
/// ```
/// use lm_decode::room_for_new_tokens;
/// assert_eq!(room_for_new_tokens(20, 2048), 20);
/// assert_eq!(room_for_new_tokens(5000, 2048), 1024);
/// assert_eq!(room_for_new_tokens(0, 2048), 1);
/// ```
pub fn room_for_new_tokens(max_new_tokens: usize, available: usize) -> usize {
    max_new_tokens.min(available / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        (prompt_len, max, n_head, max_new_tokens): (u32, usize, usize, usize),
        expected: Result<Vec<TokenId>>,
    ) {
        let prompt: Vec<TokenId> = (0..prompt_len).collect();
        let keep_head = Truncation::KeepHead { n_head };
        let got = fit_prompt(&prompt, Some(max), keep_head, max_new_tokens).map(|f| f.tokens);
        assert_eq!(
            got, expected,
            "len {prompt_len}, max {max}, head {n_head}, new {max_new_tokens}"
        );
    }

    #[test]
    fn keep_head_keeps_head_and_tail() {
        check((3, 5, 2, 1), Ok(vec![0, 1, 2]));
        check((5, 5, 2, 1), Ok(vec![0, 1, 3, 4]));
        check((10, 5, 0, 1), Ok(vec![6, 7, 8, 9]));
        check((10, 5, 3, 1), Ok(vec![0, 1, 2, 9]));
        check((10, 5, 0, 0), Ok(vec![6, 7, 8, 9]));
        let too_long = |n_head| Err(Error::PinnedHeadTooLong { n_head, max: 5 });
        check((10, 5, 4, 1), too_long(4));
        check((10, 5, 9, 1), too_long(9));
        check(
            (10, 1, 0, 1),
            Err(Error::PinnedHeadTooLong { n_head: 0, max: 1 }),
        );
    }

    #[test]
    fn keep_head_leaves_room_for_the_new_tokens() {
        // Regression (issue 33): room for max_new_tokens, not for one token.
        check((10, 10, 1, 3), Ok(vec![0, 4, 5, 6, 7, 8, 9]));
        // A prompt that fits but leaves too little room is truncated too.
        check((8, 10, 1, 3), Ok(vec![0, 2, 3, 4, 5, 6, 7]));
        check((7, 10, 1, 3), Ok(vec![0, 1, 2, 3, 4, 5, 6]));
        // A huge request leaves room for half of what the head leaves.
        check((10, 10, 1, usize::MAX), Ok(vec![0, 5, 6, 7, 8, 9]));
        check((20, 10, 0, 1000), Ok(vec![15, 16, 17, 18, 19]));
    }

    #[test]
    fn refuse_names_the_lengths() {
        assert_eq!(
            fit_prompt(&[0; 7], Some(7), Truncation::Refuse, 1),
            Err(Error::PromptExceedsContext { len: 7, max: 7 })
        );
        // Refusing only a prompt that leaves no room: a shorter one runs to
        // the context bound.
        assert_eq!(
            fit_prompt(&[0; 6], Some(7), Truncation::Refuse, 20).map(|f| f.n_dropped),
            Ok(0)
        );
        assert_eq!(
            fit_prompt(&[0; 6], None, Truncation::Refuse, 20).map(|f| f.n_dropped),
            Ok(0)
        );
        assert_eq!(
            fit_prompt(&[], None, Truncation::Refuse, 1),
            Err(Error::EmptyPrompt)
        );
    }
}
