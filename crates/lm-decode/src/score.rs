//! Scoring a given continuation (teacher forcing): the model's
//! log-probability of each token given the prompt and the tokens before it,
//! and their chain-rule sum (lesson 001, "The probability of a sequence").
//!
//! Every position is read once, in two calls: the prompt with [`Rows::Last`]
//! (the distribution of the first continuation token), then the continuation
//! but its last token with [`Rows::All`] (one row per later token). The last
//! token is never fed: nothing would read its row.
//!
//! ```text
//! prompt  p1 p2 p3 | c1 c2 c3
//! rows          r0 | r1 r2        ln p(c1) = ln softmax(r0)[c1], ...
//! ```

use std::num::NonZeroUsize;

use crate::error::{Error, Result};
use lm_core::{LanguageModel, Rows, TokenId};

/// The score of a continuation: one natural-log probability per token.
#[derive(Debug, Clone, PartialEq)]
pub struct ContinuationScore {
    /// The scored tokens (the continuation, never empty).
    pub tokens: Vec<TokenId>,
    /// `ln p(tokens[i] | prompt, tokens[..i])`, one per token.
    pub logprobs: Vec<f64>,
    /// Their sum: the chain-rule `ln p(tokens | prompt)`.
    pub logprob: f64,
}

impl ContinuationScore {
    /// `exp(-logprob / n)`: the geometric mean of the inverse token
    /// probabilities (1 when every token was certain).
    pub fn perplexity(&self) -> f64 {
        (-self.logprob / self.tokens.len() as f64).exp()
    }
}

/// Scores `continuation` after `prompt` under `model` (softmax at T = 1 of
/// the raw logits; no sampling policy applies).
///
/// Errors: an empty prompt or continuation, a token beyond the vocabulary,
/// a context too short for the prompt and all but the last continuation
/// token (the model's error), or a model that returns the wrong number of
/// logits.
///
/// ```
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// use lm_decode::score_continuation;
///
/// /// Two tokens; after token 0 it gives 1 the logit 2, after 1 it gives 0 the logit 2.
/// struct Flip;
/// impl LanguageModel for Flip {
///     type State = Prefix;
///     fn vocab_size(&self) -> usize { 2 }
///     fn context_length(&self) -> Option<usize> { None }
///     fn new_state(&self) -> Prefix { Prefix::default() }
///     fn forward(&self, state: &mut Prefix, tokens: &[TokenId], rows: Rows,
///                logits: &mut Vec<f32>) -> lm_core::Result<()> {
///         self.check_input(state.tokens.len(), tokens)?;
///         logits.clear();
///         for &t in tokens {
///             state.tokens.push(t);
///             logits.extend(if t == 0 { [0.0, 2.0] } else { [2.0, 0.0] });
///         }
///         if rows == Rows::Last {
///             logits.drain(..logits.len() - 2);
///         }
///         Ok(())
///     }
/// }
///
/// let score = score_continuation(&Flip, &[0], &[1, 0]).unwrap();
/// // Both tokens follow the preferred flip: p = e^2 / (1 + e^2) = 0.881 each.
/// assert_eq!(format!("{:.3}", score.logprobs[0].exp()), "0.881");
/// assert_eq!(score.logprob, score.logprobs[0] + score.logprobs[1]);
/// assert_eq!(format!("{:.3}", score.perplexity()), "1.135");
/// assert!(score_continuation(&Flip, &[0], &[]).is_err());
/// ```
pub fn score_continuation<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    continuation: &[TokenId],
) -> Result<ContinuationScore> {
    let whole = NonZeroUsize::new(continuation.len()).unwrap_or(NonZeroUsize::MIN);
    score_continuation_in_chunks(model, prompt, continuation, whole, |_| {})
}

/// [`score_continuation`] reading the continuation in chunks of at most
/// `chunk_len` tokens, so the rows of one chunk are held at a time (a long
/// text times a large vocabulary does not fit in memory at once), and
/// `after_chunk(n_scored)` reports progress after each chunk. Each position
/// is still read once, and the scores are those of one pass.
pub fn score_continuation_in_chunks<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    continuation: &[TokenId],
    chunk_len: NonZeroUsize,
    mut after_chunk: impl FnMut(usize),
) -> Result<ContinuationScore> {
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    let Some((_, all_but_last)) = continuation.split_last() else {
        return Err(Error::EmptyContinuation);
    };
    let vocab_size = model.vocab_size();
    // The last token is never fed, so the model cannot check it.
    lm_core::check_token_ids(continuation.iter().copied(), vocab_size)?;
    let mut state = model.new_state();
    let mut rows = Vec::new();
    model.forward(&mut state, prompt, Rows::Last, &mut rows)?;
    check_rows(&rows, 1, vocab_size)?;
    let mut row_logprobs = vec![0.0f32; vocab_size];
    let mut logprobs = Vec::with_capacity(continuation.len());
    // Row i predicts continuation[i]: the prompt's last row, then one row
    // per continuation token fed (all but the last).
    let mut next = 0;
    loop {
        for row in rows.chunks_exact(vocab_size) {
            lm_core::log_softmax_into(row, 1.0, &mut row_logprobs)?;
            logprobs.push(f64::from(row_logprobs[continuation[next] as usize]));
            next += 1;
        }
        after_chunk(next);
        if next == continuation.len() {
            break;
        }
        let fed = next - 1;
        let chunk = &all_but_last[fed..all_but_last.len().min(fed + chunk_len.get())];
        model.forward(&mut state, chunk, Rows::All, &mut rows)?;
        check_rows(&rows, chunk.len(), vocab_size)?;
    }
    Ok(ContinuationScore {
        tokens: continuation.to_vec(),
        logprob: logprobs.iter().sum(),
        logprobs,
    })
}

/// The model returned `n_rows` rows of `vocab_size` logits, as asked.
fn check_rows(logits: &[f32], n_rows: usize, vocab_size: usize) -> Result<()> {
    if logits.len() == n_rows * vocab_size {
        Ok(())
    } else {
        Err(Error::LogitsRows {
            len: logits.len(),
            n_rows,
            vocab_size,
        })
    }
}
