//! The `--json` shapes, one serde struct per object. Field names are the
//! documented interface (tests and scripts read them); numbers are written
//! as serde_json writes `f32`/`f64` (shortest round-trip form), so the same
//! run prints the same bytes.
//!
//! The prompt's ids are given once (`prompt_ids`); a step gives the length
//! of the prefix it read (`prefix_len`: the prompt and the generated tokens
//! before it), not the prefix itself, so a report grows linearly with the
//! run (`--trace-prefixes` adds each step's full `prefix`). `--json-lines`
//! writes one [`StepReport`] line per step as it is chosen (a
//! [`JsonLine`] with `"event": "step"`), then the report without its steps
//! (`"event": "summary"`).
//!
//! A sampled step gives its uniform draw `u` and how many candidates each
//! stage of the chain left (`n_candidates`, in the chain's order), so it
//! can be replayed by hand: walk `policy_top` (with `--top-logprobs` at least
//! the last count) in id order and take the first token whose running total
//! exceeds `u`. A greedy step's `u` is null. With `--mirostat`, a step also
//! gives `mirostat_mu`, the bound on the surprise it truncated at.

use lm_core::TokenId;
use lm_decode::{
    Candidate, DraftMark, Generation, Hypothesis, SamplingConfig, StageCounts, Step, StopReason,
};
use serde::{Serialize, Serializer, ser::SerializeMap};

use crate::text::TextCodec;

/// `lm-cli generate --json`.
#[derive(Debug, Serialize)]
pub struct GenerateReport {
    /// The model spec.
    pub model: String,
    /// The prompt text as given (or as rendered by the chat template).
    pub prompt: String,
    /// The prompt ids the model read (after any truncation).
    pub prompt_ids: Vec<TokenId>,
    /// Prompt tokens dropped by `--truncate keep-head:N`.
    #[serde(skip_serializing_if = "is_zero")]
    pub n_prompt_dropped: usize,
    /// The first (or best) sequence, flattened into the top level.
    #[serde(flatten)]
    pub best: SequenceReport,
    /// Every sequence when `--num-return-sequences` is above 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequences: Option<Vec<SequenceReport>>,
    /// Every beam, best first, with `--num-beams`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beams: Option<Vec<BeamReport>>,
    /// The decoding settings.
    pub settings: Settings,
    /// How long the model took (left out with `--no-timing`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
}

/// One generated sequence.
#[derive(Debug, Serialize)]
pub struct SequenceReport {
    /// The generated ids (an end token that stopped the run is the last).
    pub ids: Vec<TokenId>,
    /// The generated text (without a final end token; cut at a stop string).
    pub text: String,
    /// `end_token`, `stop_string`, `max_new_tokens` or `context_bound`.
    pub stop_reason: &'static str,
    /// The end token that stopped the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_token: Option<TokenId>,
    /// The stop string that stopped the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_string: Option<String>,
    /// One entry per generated token (left out of a `--json-lines` summary,
    /// whose steps came before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepReport>>,
    /// The model's chain-rule log-probability of `ids` (natural log).
    pub sequence_logprob: f64,
    /// The same under the decoding policy: the probability of the run as drawn.
    pub policy_sequence_logprob: f64,
}

/// One step of the loop.
#[derive(Debug, Serialize)]
pub struct StepReport {
    /// How many ids were read before choosing: the prompt and the earlier
    /// generated tokens.
    pub prefix_len: usize,
    /// Those ids (`--trace-prefixes` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<Vec<TokenId>>,
    /// The chosen id.
    pub token: TokenId,
    /// Its text.
    pub token_text: String,
    /// Its probability under the policy (1 for greedy).
    pub prob: f32,
    /// Its probability under the model (softmax of the raw logits, T = 1).
    pub model_prob: f32,
    /// The model's natural-log probability of the token.
    pub logprob: f64,
    /// The model's log-probability of the generated tokens so far.
    pub running_logprob: f64,
    /// The uniform draw in [0, 1) the token was sampled with (null when
    /// greedy and in beam search).
    pub u: Option<f64>,
    /// The candidates each stage of the chain left, by stage name in the
    /// chain's order (`vocabulary`, `penalties`, `temperature`, then `top_k`,
    /// `top_p`, `min_p` as set; left out in beam search).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_candidates: Option<StageCountsReport>,
    /// Mirostat's bound on the surprise (bits) this step truncated at (only
    /// with `--mirostat`): a token more surprising than mu was out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat_mu: Option<f32>,
    /// The most probable tokens under the model (`--top-logprobs N`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_logprobs: Vec<CandidateReport>,
    /// The most probable tokens under the policy (`--top-logprobs N`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policy_top: Vec<CandidateReport>,
    /// With `--draft`, when a drafter proposed this position: `accepted`
    /// (the step's token is the draft) or `replaced` (the model chose
    /// another token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft: Option<&'static str>,
    /// The drafted token a `replaced` step rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_draft: Option<TokenId>,
}

/// A step's [`StageCounts`] as a JSON object, stage name to count, in the
/// chain's order.
#[derive(Debug)]
pub struct StageCountsReport(pub StageCounts);

impl Serialize for StageCountsReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.iter().len()))?;
        for (stage, n) in self.0.iter() {
            map.serialize_entry(stage.name(), &n)?;
        }
        map.end()
    }
}

/// One entry of a top-N list.
#[derive(Debug, Serialize)]
pub struct CandidateReport {
    /// The id.
    pub token: TokenId,
    /// Its text.
    pub token_text: String,
    /// Its probability.
    pub prob: f32,
    /// Its natural-log probability.
    pub logprob: f64,
}

/// One beam-search hypothesis.
#[derive(Debug, Serialize)]
pub struct BeamReport {
    /// The generated ids.
    pub ids: Vec<TokenId>,
    /// Their text.
    pub text: String,
    /// The model's log-probability of `ids`.
    pub logprob: f64,
    /// `logprob / ((5 + len) / 6)^alpha`: the ranking key.
    pub score: f64,
    /// Why the hypothesis stopped growing.
    pub stop_reason: &'static str,
}

/// The decoding settings of a run.
#[derive(Debug, Default, Serialize)]
pub struct Settings {
    /// The most tokens to generate.
    pub max_new_tokens: usize,
    /// The policy, its fields at this level as lm-decode writes them, with
    /// only the tokens a `--logit-bias` of -inf banned as `banned_tokens`.
    #[serde(flatten)]
    pub policy: SamplingConfig,
    /// The seed of the random draws (given or fresh), so `--seed N` replays
    /// the run; null for greedy runs and beam search, which draw nothing.
    pub seed: Option<u64>,
    /// `--min-new-tokens`, if set.
    #[serde(skip_serializing_if = "is_zero")]
    pub min_new_tokens: usize,
    /// The end tokens.
    pub end_tokens: Vec<TokenId>,
    /// The stop strings.
    pub stop: Vec<String>,
    /// The beam count (1: no beam search).
    pub num_beams: usize,
    /// The context bound the loop ran under.
    pub context_length: Option<usize>,
    /// `--context-length` when it asked for more than the model's trained
    /// length: the loop ran under `context_length`, the model's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length_requested: Option<usize>,
    /// The `--draft` drafter (`prompt-lookup` or the draft model's spec), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft: Option<String>,
    /// The most tokens `--draft` proposed per pass (`--draft-tokens`), if drafting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_tokens: Option<usize>,
    /// The settings a Hugging Face directory's generation_config.json gave
    /// (the user set none of them), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub defaults: Option<crate::model_defaults::DefaultsSource>,
}

impl Settings {
    /// The settings of the policy `sampling` (with the tokens `--logit-bias`
    /// banned); the seed is named only when the run `draws`. The caller sets
    /// the rest.
    pub fn of_policy(sampling: &SamplingConfig, banned_by_bias: Vec<TokenId>, draws: bool) -> Self {
        Settings {
            policy: SamplingConfig {
                banned_tokens: banned_by_bias,
                ..sampling.clone()
            },
            seed: draws.then_some(sampling.seed),
            num_beams: 1,
            ..Settings::default()
        }
    }
}

/// How long the model took, prefill (reading the prompt) apart from decoding.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Timing {
    /// Prompt tokens read in the prefill pass (summed over sequences).
    pub prefill_tokens: usize,
    /// Milliseconds from the start to the first chosen token (null for beam search).
    pub prefill_ms: Option<f64>,
    /// Tokens fed one at a time after the prefill (the final token is never fed).
    pub decode_tokens: usize,
    /// Milliseconds from the first chosen token to the end (null for beam search).
    pub decode_ms: Option<f64>,
    /// Milliseconds in all.
    pub total_ms: f64,
    /// Tokens `--draft` proposed and the model verified (`--draft` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafted_tokens: Option<usize>,
    /// Drafted tokens the model accepted (`--draft` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_tokens: Option<usize>,
    /// Forward passes of the model after the prompt (`--draft` only; the
    /// plain loop makes `decode_tokens` of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_passes: Option<usize>,
    /// Milliseconds the structured-output engine took: compiling the format
    /// for the vocabulary, computing each step's mask and advancing
    /// (structured output only; part of the other times).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub constraint_ms: Option<f64>,
}

impl Timing {
    /// Adds another sequence's timing.
    pub fn add(&mut self, other: &Timing) {
        self.prefill_tokens += other.prefill_tokens;
        self.decode_tokens += other.decode_tokens;
        self.prefill_ms = sum_options(self.prefill_ms, other.prefill_ms);
        self.decode_ms = sum_options(self.decode_ms, other.decode_ms);
        self.total_ms += other.total_ms;
        self.drafted_tokens = sum_counts(self.drafted_tokens, other.drafted_tokens);
        self.accepted_tokens = sum_counts(self.accepted_tokens, other.accepted_tokens);
        self.target_passes = sum_counts(self.target_passes, other.target_passes);
        self.constraint_ms = sum_options(self.constraint_ms, other.constraint_ms);
    }
}

fn sum_options(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

fn sum_counts(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The JSON name of a stop reason, with its end token or stop string.
pub fn stop_reason_parts(reason: &StopReason) -> (&'static str, Option<TokenId>, Option<String>) {
    match reason {
        StopReason::EndToken(id) => ("end_token", Some(*id), None),
        StopReason::StopString(text) => ("stop_string", None, Some(text.clone())),
        StopReason::ContextBound => ("context_bound", None, None),
        StopReason::MaxNewTokens => ("max_new_tokens", None, None),
        StopReason::Cancelled => ("cancelled", None, None),
        StopReason::ConstraintComplete => ("constraint_complete", None, None),
        // Any reason a later lm-decode adds.
        _ => ("other", None, None),
    }
}

impl SequenceReport {
    /// The report of one generation; `text` is the text to show; `prefixes`
    /// adds each step's full prefix.
    pub fn from_generation(
        generation: &Generation,
        text: String,
        codec: &TextCodec,
        prefixes: bool,
    ) -> Self {
        let (stop_reason, stop_token, stop_string) = stop_reason_parts(&generation.stop_reason);
        let steps = generation
            .steps
            .iter()
            .map(|step| {
                let prefix = prefixes.then(|| {
                    let (prompt, generated) = generation.prefix(step.index).unwrap_or_default();
                    [prompt, generated].concat()
                });
                StepReport::new(step, prefix, codec)
            })
            .collect();
        Self {
            ids: generation.tokens.clone(),
            text,
            stop_reason,
            stop_token,
            stop_string,
            steps: Some(steps),
            sequence_logprob: generation.logprob().ln(),
            policy_sequence_logprob: generation.policy_logprob().ln(),
        }
    }

    /// The report of the best beam, its steps rebuilt from the per-token
    /// log-probabilities (the policy of a search is the model itself);
    /// `prefixes` adds each step's full prefix.
    pub fn from_hypothesis(
        prompt: &[TokenId],
        best: &Hypothesis,
        codec: &TextCodec,
        prefixes: bool,
    ) -> Self {
        let (stop_reason, stop_token, stop_string) = stop_reason_parts(&best.stop_reason);
        let mut running = 0.0;
        let steps = best
            .tokens
            .iter()
            .zip(best.step_logprobs.iter().zip(&best.adjusted_step_logprobs))
            .enumerate()
            .map(|(index, (&token, (&logprob, &adjusted)))| {
                running += logprob;
                StepReport {
                    prefix_len: prompt.len() + index,
                    prefix: prefixes.then(|| [prompt, &best.tokens[..index]].concat()),
                    token,
                    token_text: codec.token_text(token),
                    prob: adjusted.exp() as f32,
                    model_prob: logprob.exp() as f32,
                    logprob,
                    running_logprob: running,
                    u: None,
                    n_candidates: None,
                    mirostat_mu: None,
                    top_logprobs: best
                        .top_candidates
                        .get(index)
                        .map_or_else(Vec::new, |top| CandidateReport::list(top, codec)),
                    policy_top: Vec::new(),
                    draft: None,
                    rejected_draft: None,
                }
            })
            .collect();
        Self {
            ids: best.tokens.clone(),
            text: beam_text(best, codec),
            stop_reason,
            stop_token,
            stop_string,
            steps: Some(steps),
            sequence_logprob: best.logprob,
            policy_sequence_logprob: best.adjusted_step_logprobs.iter().sum(),
        }
    }
}

/// A hypothesis's text without a final end token.
pub fn beam_text(hypothesis: &Hypothesis, codec: &TextCodec) -> String {
    let shown = match hypothesis.stop_reason {
        StopReason::EndToken(_) => &hypothesis.tokens[..hypothesis.tokens.len().saturating_sub(1)],
        _ => &hypothesis.tokens[..],
    };
    codec.decode_ids(shown)
}

impl CandidateReport {
    /// The reports of a top-N list, in its order.
    pub fn list(list: &[Candidate], codec: &TextCodec) -> Vec<Self> {
        list.iter()
            .map(|c| Self {
                token: c.token,
                token_text: codec.token_text(c.token),
                prob: c.prob,
                logprob: c.logprob,
            })
            .collect()
    }
}

impl BeamReport {
    /// The report of one hypothesis.
    pub fn from_hypothesis(hypothesis: &Hypothesis, codec: &TextCodec) -> Self {
        Self {
            ids: hypothesis.tokens.clone(),
            text: beam_text(hypothesis, codec),
            logprob: hypothesis.logprob,
            score: hypothesis.score,
            stop_reason: stop_reason_parts(&hypothesis.stop_reason).0,
        }
    }
}

impl StepReport {
    /// The report of one step; `prefix` is given with `--trace-prefixes`.
    pub fn new(step: &Step, prefix: Option<Vec<TokenId>>, codec: &TextCodec) -> Self {
        Self {
            prefix_len: step.prefix_len,
            prefix,
            token: step.token,
            token_text: codec.token_text(step.token),
            prob: step.policy_prob,
            model_prob: step.model_prob,
            logprob: step.logprob,
            running_logprob: step.running_logprob.ln(),
            u: step.u,
            n_candidates: Some(StageCountsReport(step.n_candidates)),
            mirostat_mu: step.mirostat_mu,
            top_logprobs: CandidateReport::list(&step.model_top, codec),
            policy_top: CandidateReport::list(&step.policy_top, codec),
            draft: match step.draft {
                DraftMark::NotDrafted => None,
                DraftMark::Accepted => Some("accepted"),
                DraftMark::Replaced { .. } => Some("replaced"),
            },
            rejected_draft: match step.draft {
                DraftMark::Replaced { draft } => Some(draft),
                _ => None,
            },
        }
    }
}

/// One line of `--json-lines`: an object tagged with what it is.
#[derive(Debug, Serialize)]
pub struct JsonLine<'a, T> {
    /// `step` (one per chosen token, as it is chosen) or `summary` (last).
    pub event: &'static str,
    /// Which sequence a step belongs to (counted from 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<usize>,
    /// The step or the report.
    #[serde(flatten)]
    pub body: &'a T,
}

/// `lm-cli probs --json`.
#[derive(Debug, Serialize)]
pub struct ProbsReport {
    /// The logits as given (`"-inf"` for a masked one).
    #[serde(serialize_with = "extended_float::all")]
    pub logits: Vec<f32>,
    /// The policy's probability of each logit, in input order.
    pub probs: Vec<f32>,
    /// The policy chain, in the order it runs.
    pub policy: String,
}

/// A float that JSON can carry when it is not finite: serde_json writes
/// infinities as `null`, which reads as "missing", but a zero probability has
/// log-probability `-inf` and a perplexity can overflow to `inf`. Finite
/// values are numbers as before; the others the strings `"-inf"`, `"inf"`,
/// `"nan"` (what Python's `float()` reads).
pub(crate) mod extended_float {
    use serde::{Serialize, Serializer};

    struct Extended<T>(T);

    impl<T: Copy + Into<f64> + Serialize> Serialize for Extended<T> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let x: f64 = self.0.into();
            if x.is_finite() {
                self.0.serialize(serializer)
            } else {
                serializer.serialize_str(&x.to_string().to_lowercase())
            }
        }
    }

    pub fn one<T, S>(value: &T, serializer: S) -> Result<S::Ok, S::Error>
    where
        T: Copy + Into<f64> + Serialize,
        S: Serializer,
    {
        Extended(*value).serialize(serializer)
    }

    pub fn all<T, S>(values: &[T], serializer: S) -> Result<S::Ok, S::Error>
    where
        T: Copy + Into<f64> + Serialize,
        S: Serializer,
    {
        serializer.collect_seq(values.iter().map(|&x| Extended(x)))
    }
}

/// `lm-cli score --prompt --continuation --json`.
#[derive(Debug, Serialize)]
pub struct ScoreReport {
    /// The prompt ids.
    pub prompt_ids: Vec<TokenId>,
    /// The continuation ids scored.
    pub ids: Vec<TokenId>,
    /// Their texts.
    pub tokens: Vec<String>,
    /// ln p(token | everything before it), one per id.
    #[serde(serialize_with = "extended_float::all")]
    pub logprobs: Vec<f64>,
    /// Their sum: the chain-rule log-probability of the continuation.
    #[serde(serialize_with = "extended_float::one")]
    pub sequence_logprob: f64,
    /// exp(-sequence_logprob / n).
    #[serde(serialize_with = "extended_float::one")]
    pub perplexity: f64,
}

/// `lm-cli score --text --json` (count models, KenLM's query).
#[derive(Debug, Serialize)]
pub struct SentenceScoreReport {
    /// The words scored, `</s>` last.
    pub words: Vec<String>,
    /// log10 p(word | context), one per word and one for `</s>`.
    #[serde(serialize_with = "extended_float::all")]
    pub log10probs: Vec<f32>,
    /// The longest stored n-gram ending in each word (KenLM's ngram_length).
    pub ngram_lengths: Vec<usize>,
    /// Whether each word is outside the vocabulary.
    pub oov: Vec<bool>,
    /// Their sum.
    #[serde(serialize_with = "extended_float::one")]
    pub total_log10: f64,
    /// 10^(-total_log10 / tokens), tokens counting `</s>`.
    #[serde(serialize_with = "extended_float::one")]
    pub perplexity: f64,
}

/// `lm-cli enumerate --json`.
#[derive(Debug, Serialize)]
pub struct EnumerateReport {
    /// The prompt ids.
    pub prompt_ids: Vec<TokenId>,
    /// Tokens per continuation.
    pub steps: usize,
    /// How many continuations were scored (vocab^steps).
    pub total: usize,
    /// The best continuations, most probable first.
    pub continuations: Vec<ContinuationReport>,
    /// The greedy continuation.
    pub greedy: Vec<TokenId>,
    /// Its rank among all continuations, counted from 1.
    pub greedy_rank: usize,
    /// Its probability.
    pub greedy_prob: f64,
}

/// One enumerated continuation.
#[derive(Debug, Serialize)]
pub struct ContinuationReport {
    /// Its rank, counted from 1.
    pub rank: usize,
    /// The ids.
    pub ids: Vec<TokenId>,
    /// Their text.
    pub text: String,
    /// The chain-rule probability.
    pub prob: f64,
    /// Its natural log.
    pub logprob: f64,
}

/// `lm-cli tokenize --json`.
#[derive(Debug, Serialize)]
pub struct TokenizeReport {
    /// The ids.
    pub ids: Vec<TokenId>,
    /// The text of each id.
    pub tokens: Vec<String>,
}
