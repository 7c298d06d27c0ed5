//! The `--trace` table: one row per step, the way lesson 001 prints its runs
//! (step, prefix read, selected token, selection probability), with the
//! model's own probability and the running chain-rule log-probability beside
//! the policy's, then why the loop stopped. Each row also gives the uniform
//! draw `u` (`-` when greedy) and how many candidates each stage of the
//! chain left, so a sampled step can be replayed by hand as lesson 000 does:
//! walk the policy's candidates in id order (`#id` in the candidate lines of
//! `--top-logprobs`) and take the first whose running total exceeds `u`.
//!
//! ```text
//! step  prefix read      selected token  policy p   model p  running ln p       u  candidates
//!    1  <start> the cat  slept             0.2858    0.2189       -1.5190  0.5384  7>7>7>3
//! candidates: vocabulary>penalties>temperature>top_k (tokens left after each stage)
//! ```
//!
//! With `--mirostat`, a `mu` column before the candidates gives the bound on
//! the surprise (bits) each step truncated at.

use std::fmt::Write as _;

use lm_core::TokenId;
use lm_decode::{Candidate, DraftMark, Generation, Hypothesis, StageCounts, StopReason};

use super::{printable, tail, token_label};
use crate::text::TextCodec;

/// The widest the prefix column gets; longer prefixes show their end.
const MAX_PREFIX_CHARS: usize = 48;
/// The widest the token column gets.
const MAX_TOKEN_CHARS: usize = 24;

/// The header line of the table.
pub const HEADER: [&str; 8] = [
    "step",
    "prefix read",
    "selected token",
    "policy p",
    "model p",
    "running ln p",
    "u",
    "candidates",
];

/// The trace of one generation as text: the table, then the stop reason,
/// the sequence probability and the text.
pub fn render_generation(generation: &Generation, text: &str, codec: &TextCodec) -> String {
    let mut rows = Vec::with_capacity(generation.steps.len());
    let mut prefix_ids: Vec<TokenId> = generation.prompt.clone();
    for step in &generation.steps {
        rows.push(Row {
            step: step.index + 1,
            prefix: tail(&printable(&codec.decode_ids(&prefix_ids)), MAX_PREFIX_CHARS),
            token: match step.draft {
                DraftMark::NotDrafted => token_cell(codec, step.token),
                DraftMark::Accepted => format!("{} [draft]", token_cell(codec, step.token)),
                DraftMark::Replaced { draft } => format!(
                    "{} [not {}]",
                    token_cell(codec, step.token),
                    token_cell(codec, draft)
                ),
            },
            policy_prob: f64::from(step.policy_prob),
            model_prob: f64::from(step.model_prob),
            running: step.running_logprob.ln(),
            u: step.u,
            mu: step.mirostat_mu,
            n_candidates: counts_cell(&step.n_candidates),
            candidates: candidates_line(codec, &step.model_top, &step.policy_top),
        });
        prefix_ids.push(step.token);
    }
    let mut out = table(&rows);
    if let Some(step) = generation.steps.first() {
        let stages: Vec<&str> = step.n_candidates.iter().map(|(s, _)| s.name()).collect();
        let _ = writeln!(
            out,
            "candidates: {} (tokens left after each stage)",
            stages.join(">")
        );
    }
    if generation
        .steps
        .iter()
        .any(|step| step.mirostat_mu.is_some())
    {
        let _ = writeln!(
            out,
            "mu: mirostat's bound on the surprise (bits); a token more surprising than mu was out"
        );
    }
    if generation.steps.iter().any(|step| step.u.is_some()) {
        let _ = writeln!(
            out,
            "u: the uniform draw; walk the policy's candidates in id order to the first whose running total exceeds u"
        );
    }
    if generation
        .steps
        .iter()
        .any(|step| step.draft != DraftMark::NotDrafted)
    {
        let _ = writeln!(
            out,
            "[draft]: a drafted token the model accepted; [not X]: the model rejected the draft X and chose this token"
        );
    }
    let n = generation.tokens.len();
    let _ = writeln!(out, "stop: {}", describe_stop(&generation.stop_reason, n));
    let logprob = generation.logprob();
    let _ = writeln!(
        out,
        "sequence ln p: {:.4} under the model (p = {:.6}), {:.4} under the policy",
        logprob.ln(),
        logprob.prob(),
        generation.policy_logprob().ln(),
    );
    let _ = writeln!(out, "text: {}", printable(text));
    out
}

/// The trace of a beam search: the best hypothesis step by step, then every
/// beam with its score.
pub fn render_beams(prompt: &[TokenId], beams: &[Hypothesis], codec: &TextCodec) -> String {
    let mut out = String::new();
    let Some(best) = beams.first() else {
        return out;
    };
    let mut rows = Vec::with_capacity(best.tokens.len());
    let mut prefix_ids = prompt.to_vec();
    let mut running = 0.0;
    for (index, (&token, &logprob)) in best.tokens.iter().zip(&best.step_logprobs).enumerate() {
        running += logprob;
        rows.push(Row {
            step: index + 1,
            prefix: tail(&printable(&codec.decode_ids(&prefix_ids)), MAX_PREFIX_CHARS),
            token: token_cell(codec, token),
            policy_prob: logprob.exp(),
            model_prob: logprob.exp(),
            running,
            u: None,
            mu: None,
            n_candidates: String::new(),
            candidates: None,
        });
        prefix_ids.push(token);
    }
    out.push_str(&table(&rows));
    let _ = writeln!(
        out,
        "stop: {}",
        describe_stop(&best.stop_reason, best.tokens.len())
    );
    let _ = writeln!(out, "beams (score = ln p / ((5 + len) / 6)^alpha):");
    for (rank, beam) in beams.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {:>2}. score {:>9.4}  ln p {:>9.4}  {}",
            rank + 1,
            beam.score,
            beam.logprob,
            printable(&codec.decode_ids(&beam.tokens)),
        );
    }
    out
}

/// A stop reason in words, for the line under the table.
pub fn describe_stop(reason: &StopReason, n_tokens: usize) -> String {
    let name = super::json::stop_reason_parts(reason).0;
    format!("{name} after {n_tokens} new tokens: {reason}")
}

struct Row {
    step: usize,
    prefix: String,
    token: String,
    policy_prob: f64,
    model_prob: f64,
    running: f64,
    u: Option<f64>,
    /// Mirostat's bound (`--mirostat` only).
    mu: Option<f32>,
    /// The candidates each stage left, `>`-separated.
    n_candidates: String,
    candidates: Option<String>,
}

fn token_cell(codec: &TextCodec, token: TokenId) -> String {
    tail(&token_label(&codec.token_text(token)), MAX_TOKEN_CHARS)
}

fn counts_cell(counts: &StageCounts) -> String {
    let counts: Vec<String> = counts.iter().map(|(_, n)| n.to_string()).collect();
    counts.join(">")
}

fn candidates_line(codec: &TextCodec, model: &[Candidate], policy: &[Candidate]) -> Option<String> {
    if model.is_empty() {
        return None;
    }
    let list = |candidates: &[Candidate]| {
        candidates
            .iter()
            .map(|c| {
                let text = token_label(&codec.token_text(c.token));
                format!("{text} #{} {:.4}", c.token, c.prob)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(format!(
        "model top: {}\n{:6}policy top: {}",
        list(model),
        "",
        list(policy)
    ))
}

fn table(rows: &[Row]) -> String {
    let width = |header: &str, cells: &mut dyn Iterator<Item = usize>| {
        cells.chain([header.chars().count()]).max().unwrap_or(0)
    };
    let prefix_width = width(
        HEADER[1],
        &mut rows.iter().map(|r| r.prefix.chars().count()),
    );
    let token_width = width(HEADER[2], &mut rows.iter().map(|r| r.token.chars().count()));
    // The mu column only when mirostat ran.
    let has_mu = rows.iter().any(|r| r.mu.is_some());
    let mu_cell = |cell: String| {
        if has_mu {
            format!("{cell:>7}  ")
        } else {
            String::new()
        }
    };
    let mut out = String::new();
    let header = format!(
        "{:>4}  {:<prefix_width$}  {:<token_width$}  {:>8}  {:>8}  {:>12}  {:>6}  {}{}",
        HEADER[0],
        HEADER[1],
        HEADER[2],
        HEADER[3],
        HEADER[4],
        HEADER[5],
        HEADER[6],
        mu_cell("mu".to_owned()),
        HEADER[7]
    );
    let _ = writeln!(out, "{}", header.trim_end());
    for row in rows {
        let u = row.u.map_or_else(|| "-".to_owned(), |u| format!("{u:.4}"));
        let mu = mu_cell(
            row.mu
                .map_or_else(|| "-".to_owned(), |mu| format!("{mu:.4}")),
        );
        let line = format!(
            "{:>4}  {:<prefix_width$}  {:<token_width$}  {:>8.4}  {:>8.4}  {:>12.4}  {u:>6}  {mu}{}",
            row.step,
            row.prefix,
            row.token,
            row.policy_prob,
            row.model_prob,
            row.running,
            row.n_candidates
        );
        let _ = writeln!(out, "{}", line.trim_end());
        if let Some(candidates) = &row.candidates {
            let _ = writeln!(out, "{:6}{candidates}", "");
        }
    }
    out
}
