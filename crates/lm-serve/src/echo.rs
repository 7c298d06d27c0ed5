//! `echo` on `/v1/completions`: the prompt returned before the completion,
//! and with `logprobs` its per-token log-probabilities, as the legacy
//! OpenAI API and vLLM give them (the first token's `null`: nothing comes
//! before it). The prompt is scored on the model directly, beside the
//! scheduler (one such request at a time, [`App::direct_lock`]), exactly
//! as `lm-cli score` scores a continuation (lm-decode's
//! `score_continuation`): its first token read for one row, then the rest
//! but the last in chunks with every row. Generation then reads the prompt
//! again through the scheduler (`max_tokens: 0` generates nothing).

use std::sync::Arc;

use axum::http::StatusCode;
use lm_core::{LanguageModel, Rows, TokenId};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::routes::App;
use crate::text::ServedText;

/// The most prompt positions scored per forward pass, so a pass's rows
/// (`SCORE_CHUNK * vocab_size` logits) stay a few MB on any vocabulary.
const SCORE_CHUNK: usize = 64;

/// One prompt token's score: its log-probability after the tokens before
/// it and the most likely tokens at its position, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PromptScore {
    pub(crate) logprob: f64,
    pub(crate) top: Vec<(TokenId, f64)>,
}

/// A model that scores a prompt (object-safe, so the routes need not know
/// the model's type).
pub(crate) trait ScorePrompt: Send + Sync {
    /// The scores of `prompt[1..]`, each with its `n_top` alternatives.
    fn score(&self, prompt: &[TokenId], n_top: usize) -> lm_core::Result<Vec<PromptScore>>;
}

/// The served model, scored directly (not through the scheduler).
pub(crate) struct Direct<M>(pub(crate) Arc<M>);

impl<M: LanguageModel + Send + Sync> ScorePrompt for Direct<M> {
    fn score(&self, prompt: &[TokenId], n_top: usize) -> lm_core::Result<Vec<PromptScore>> {
        let model = &*self.0;
        let vocab_size = model.vocab_size();
        let mut scores = Vec::with_capacity(prompt.len().saturating_sub(1));
        let Some((&first, rest)) = prompt.split_first() else {
            return Ok(scores);
        };
        let Some((_, fed)) = rest.split_last() else {
            return Ok(scores);
        };
        let mut state = model.new_state();
        let mut rows = Vec::new();
        let mut row_logprobs = vec![0.0f32; vocab_size];
        let mut order: Vec<TokenId> = Vec::new();
        model.forward(&mut state, &[first], Rows::Last, &mut rows)?;
        // Row i predicts rest[i]: the first token's row, then one row per
        // token fed (all of `rest` but its last).
        let mut chunks = fed.chunks(SCORE_CHUNK);
        loop {
            for row in rows.chunks_exact(vocab_size) {
                lm_core::log_softmax_into(row, 1.0, &mut row_logprobs)?;
                let token = rest[scores.len()];
                scores.push(PromptScore {
                    logprob: f64::from(row_logprobs[token as usize]),
                    top: top_n(&row_logprobs, n_top, &mut order),
                });
            }
            let Some(chunk) = chunks.next() else {
                break;
            };
            model.forward(&mut state, chunk, Rows::All, &mut rows)?;
        }
        Ok(scores)
    }
}

/// The `n` largest of `logprobs` with their ids, largest first (ties by
/// the smaller id), using `order` as scratch.
fn top_n(logprobs: &[f32], n: usize, order: &mut Vec<TokenId>) -> Vec<(TokenId, f64)> {
    if n == 0 {
        return Vec::new();
    }
    let by_logprob = |a: &TokenId, b: &TokenId| {
        logprobs[*b as usize]
            .total_cmp(&logprobs[*a as usize])
            .then(a.cmp(b))
    };
    order.clear();
    order.extend(0..logprobs.len() as TokenId);
    let n = n.min(order.len());
    if n < order.len() {
        order.select_nth_unstable_by(n - 1, by_logprob);
    }
    order[..n].sort_unstable_by(by_logprob);
    order[..n]
        .iter()
        .map(|&id| (id, f64::from(logprobs[id as usize])))
        .collect()
}

/// The prompt as the answer starts with it: its text and, with `logprobs`,
/// one completions-shaped logprob entry per prompt token.
#[derive(Debug, Clone, Default)]
pub(crate) struct Echo {
    pub(crate) text: String,
    pub(crate) entries: Vec<Value>,
}

/// The echo of `prompt` (whose text is `text`): with `logprobs` (the
/// alternatives per position), the prompt scored on the model under
/// [`App::direct_lock`], on a blocking thread.
pub(crate) async fn prepare(
    app: &Arc<App>,
    text: String,
    prompt: &[TokenId],
    logprobs: Option<usize>,
) -> Result<Echo, ApiError> {
    let Some(n_top) = logprobs else {
        return Ok(Echo {
            text,
            entries: Vec::new(),
        });
    };
    let _turn = app.direct_lock.lock().await;
    let (scorer, ids) = (Arc::clone(&app.scorer), prompt.to_vec());
    let scores = tokio::task::spawn_blocking(move || scorer.score(&ids, n_top))
        .await
        .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::invalid("prompt", format!("the prompt was not scored: {e}")))?;
    Ok(Echo {
        text,
        entries: entries(&*app.text, prompt, &scores),
    })
}

/// Completions' logprob entries of the prompt: the first token's logprob
/// and alternatives `null`, each offset the characters of the tokens before.
fn entries(text: &dyn ServedText, prompt: &[TokenId], scores: &[PromptScore]) -> Vec<Value> {
    let mut offset = 0;
    let mut entries = Vec::with_capacity(prompt.len());
    for (i, &token) in prompt.iter().enumerate() {
        let piece = text.token_text(token);
        let entry = match i.checked_sub(1).and_then(|j| scores.get(j)) {
            None => json!({"token": piece, "logprob": null, "top": null, "offset": offset}),
            Some(score) => {
                let top: serde_json::Map<String, Value> = score
                    .top
                    .iter()
                    .map(|&(id, logprob)| (text.token_text(id), json!(logprob)))
                    .collect();
                json!({"token": piece, "logprob": score.logprob, "top": top, "offset": offset})
            }
        };
        offset += piece.chars().count();
        entries.push(entry);
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::top_n;

    #[test]
    fn top_n_is_the_largest_first_ties_by_id() {
        let logprobs = [-3.0, -1.0, -2.0, -1.0, -5.0];
        let mut order = Vec::new();
        assert_eq!(
            top_n(&logprobs, 3, &mut order),
            vec![(1, -1.0), (3, -1.0), (2, -2.0)]
        );
        assert_eq!(top_n(&logprobs, 0, &mut order), vec![]);
        assert_eq!(top_n(&logprobs, 9, &mut order).len(), 5);
    }
}
