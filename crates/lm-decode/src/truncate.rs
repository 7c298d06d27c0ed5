//! Fitting a prompt into the model's context (lesson 001, "Dropping old
//! tokens changes the available evidence").
//!
//! A prompt fits when it leaves room for at least one new token:
//! `len + 1 <= context_length`. A prompt that does not fit is refused, or
//! shortened to a pinned head (instructions) and the most recent tokens:
//!
//! ```text
//! prompt:  h h h | x x x x x x x x x | r r r r      (context 8: 1 slot for the new token)
//! kept:    h h h |                   | r r r r  + new
//! ```

use crate::{Error, Result};
use lm_core::TokenId;

/// What to do with a prompt that leaves no room for a new token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Truncation {
    /// Refuse with [`Error::PromptExceedsContext`].
    #[default]
    Refuse,
    /// Keep the first `n_head` tokens and the most recent ones, so that
    /// prompt plus one new token fill the context exactly.
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

/// Fits `prompt` into `context_length` (no bound: always fits) by `truncation`.
///
/// ```
/// use lm_decode::{fit_prompt, Truncation};
/// let fitted = fit_prompt(&[1, 2, 3, 4, 5, 6], Some(5), Truncation::KeepHead { n_head: 1 }).unwrap();
/// assert_eq!(fitted.tokens, vec![1, 4, 5, 6]);
/// assert_eq!(fitted.n_dropped, 2);
/// assert!(fit_prompt(&[1, 2, 3, 4, 5], Some(5), Truncation::Refuse).is_err());
/// ```
pub fn fit_prompt(
    prompt: &[TokenId],
    context_length: Option<usize>,
    truncation: Truncation,
) -> Result<FittedPrompt> {
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    let Some(max) = context_length else {
        return Ok(FittedPrompt {
            tokens: prompt.to_vec(),
            n_dropped: 0,
        });
    };
    let len = prompt.len();
    if len < max {
        return Ok(FittedPrompt {
            tokens: prompt.to_vec(),
            n_dropped: 0,
        });
    }
    match truncation {
        Truncation::Refuse => Err(Error::PromptExceedsContext { len, max }),
        Truncation::KeepHead { n_head } => {
            // Room for the head, at least one recent token, and the new token.
            let n_recent = max
                .checked_sub(1)
                .and_then(|room| room.checked_sub(n_head))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(prompt_len: u32, max: usize, n_head: usize, expected: Result<Vec<TokenId>>) {
        let prompt: Vec<TokenId> = (0..prompt_len).collect();
        let got = fit_prompt(&prompt, Some(max), Truncation::KeepHead { n_head }).map(|f| f.tokens);
        assert_eq!(got, expected, "len {prompt_len}, max {max}, head {n_head}");
    }

    #[test]
    fn keep_head_keeps_head_and_tail() {
        check(3, 5, 2, Ok(vec![0, 1, 2]));
        check(5, 5, 2, Ok(vec![0, 1, 3, 4]));
        check(10, 5, 0, Ok(vec![6, 7, 8, 9]));
        check(10, 5, 3, Ok(vec![0, 1, 2, 9]));
        check(
            10,
            5,
            4,
            Err(Error::PinnedHeadTooLong { n_head: 4, max: 5 }),
        );
        check(
            10,
            5,
            9,
            Err(Error::PinnedHeadTooLong { n_head: 9, max: 5 }),
        );
        check(
            10,
            1,
            0,
            Err(Error::PinnedHeadTooLong { n_head: 0, max: 1 }),
        );
    }

    #[test]
    fn refuse_names_the_lengths() {
        assert_eq!(
            fit_prompt(&[0; 7], Some(7), Truncation::Refuse),
            Err(Error::PromptExceedsContext { len: 7, max: 7 })
        );
        assert_eq!(
            fit_prompt(&[0; 6], Some(7), Truncation::Refuse).map(|f| f.n_dropped),
            Ok(0)
        );
        assert_eq!(
            fit_prompt(&[0; 6], None, Truncation::Refuse).map(|f| f.n_dropped),
            Ok(0)
        );
        assert_eq!(
            fit_prompt(&[], None, Truncation::Refuse),
            Err(Error::EmptyPrompt)
        );
    }
}
