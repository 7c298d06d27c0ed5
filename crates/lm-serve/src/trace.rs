//! The opt-in `lm_trace` request field (issue 41): per generated token,
//! what the OpenAI API's `logprobs` cannot say and the chat page shows:
//! the policy's probabilities after the sampling stages, the uniform draw
//! `u`, how many candidates each stage left, and the raw logits of the
//! model's top candidates (lm-decode's [`Step`], what `lm-cli generate
//! --trace` prints). A project extension: without the field no answer
//! carries it, so the OpenAI endpoints stay as they were.
//!
//! Each entry (one per generated token, an end token that stopped the run
//! included, so entry `i` is `logprobs`' entry `i`):
//!
//! ```text
//! {"index": 0, "id": 504, "token": " Paris",
//!  "u": 0.42 | null (greedy),
//!  "logprob": -0.12,          the model's (T = 1, before any stage)
//!  "policy_logprob": -0.03,   the policy's (after every stage: drawn from)
//!  "n_candidates": [{"stage": "vocabulary", "n": 49152}, ...],
//!  "model_top": [{"id", "token", "logit", "logprob"}, ...],   before
//!  "policy_top": [{"id", "token", "logprob"}, ...]}            after
//! ```

use lm_core::TokenId;
use lm_decode::{Candidate, StageCounts, Step};
use serde_json::{Value, json};

use crate::text::ServedText;

/// How many candidates each list of a trace holds at least (more when
/// `logprobs`/`top_logprobs` asks for more).
pub(crate) const TRACE_TOP: usize = 10;

/// What a token's event carries besides its `logprobs` entry when the
/// request asked for `lm_trace`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepTrace {
    /// The step's index (0 for the first generated token).
    pub(crate) index: usize,
    /// The uniform draw; `None` when greedy.
    pub(crate) u: Option<f64>,
    /// The candidates each stage of the chain left.
    pub(crate) n_candidates: StageCounts,
    /// The policy's natural-log probability of the chosen token.
    pub(crate) policy_logprob: f64,
    /// The policy's most probable tokens (after every stage).
    pub(crate) policy_top: Vec<Candidate>,
}

impl StepTrace {
    /// The trace of one step of lm-decode's loop.
    pub(crate) fn of(step: &Step) -> Self {
        Self {
            index: step.index,
            u: step.u,
            n_candidates: step.n_candidates,
            policy_logprob: step.policy_logprob,
            policy_top: step.policy_top.clone(),
        }
    }

    /// The entry of this step in a response's `lm_trace` list, for the
    /// chosen `token` of model log-probability `logprob` and the model's
    /// top candidates `model_top`.
    pub(crate) fn to_json(
        &self,
        text: &dyn ServedText,
        token: TokenId,
        logprob: f64,
        model_top: &[Candidate],
    ) -> Value {
        let stages: Vec<Value> = self
            .n_candidates
            .iter()
            .map(|(stage, n)| json!({"stage": stage.name(), "n": n}))
            .collect();
        let model_top: Vec<Value> = model_top
            .iter()
            .map(|c| {
                json!({"id": c.token, "token": text.token_text(c.token),
                       "logit": c.logit, "logprob": c.logprob})
            })
            .collect();
        let policy_top: Vec<Value> = self
            .policy_top
            .iter()
            .map(
                |c| json!({"id": c.token, "token": text.token_text(c.token), "logprob": c.logprob}),
            )
            .collect();
        json!({
            "index": self.index,
            "id": token,
            "token": text.token_text(token),
            "u": self.u,
            "logprob": logprob,
            "policy_logprob": self.policy_logprob,
            "n_candidates": stages,
            "model_top": model_top,
            "policy_top": policy_top,
        })
    }
}

/// How many top candidates the loop records: what `logprobs` asks, and at
/// least [`TRACE_TOP`] with `lm_trace`.
pub(crate) fn n_top_candidates(logprobs: Option<usize>, trace: bool) -> usize {
    let asked = logprobs.unwrap_or(0);
    if trace { asked.max(TRACE_TOP) } else { asked }
}
