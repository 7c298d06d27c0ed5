//! The toy decoder's own versions of lesson 001's tables: the default run,
//! the greedy run, the four-run stop table, the seeds that stop early, and
//! where greedy ranks among all continuations. Lesson 001's SDK decoder is not
//! available, so these numbers replace its numbers; the insta snapshots at
//! the end of this file pin them, so any change to them shows in review.
//!
//! Every run is `lm_decode::generate` on `lm_model::Toy`
//! from the prompt `<start> the cat` with `<end>` (id 6) as the end token,
//! sampling at T = 1 or greedy, exactly the settings of the lesson's code.

use anyhow::{Context, Result, anyhow};
use lm_core::{TokenId, log_softmax};
use lm_decode::{
    Enumeration, Generation, GenerationConfig, SamplingConfig, StopReason, enumerate_continuations,
    generate,
};
use lm_model::{Decoder, Toy};

/// The lesson's prompt.
pub(crate) const PROMPT: &str = "<start> the cat";
/// The seeds the lesson's control offers: 0 to 100.
pub(crate) const SEEDS: std::ops::RangeInclusive<u64> = 0..=100;

/// The prompt's token ids (0, 1, 2).
pub(crate) fn prompt() -> Result<Vec<TokenId>> {
    Toy::encode(PROMPT).map_err(|word| anyhow!("`{word}` is not in the toy vocabulary"))
}

/// Sampling at T = 1 with `seed`, `max_new_tokens` new tokens, `<end>` ending.
pub(crate) fn sampling(seed: u64, max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        sampling: SamplingConfig {
            seed,
            ..SamplingConfig::default()
        },
        end_tokens: vec![Toy::END],
        n_top_candidates: 1,
        ..GenerationConfig::default()
    }
}

/// Greedy decoding with `seed` (which it must ignore), `<end>` ending.
pub(crate) fn greedy(seed: u64, max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        sampling: SamplingConfig {
            seed,
            ..SamplingConfig::greedy()
        },
        ..sampling(seed, max_new_tokens)
    }
}

/// One run of the toy from the prompt.
pub(crate) fn run(toy: &Decoder, config: &GenerationConfig) -> Result<Generation> {
    Ok(generate(toy, &prompt()?, config, None)?)
}

/// The words of `tokens`, space-separated.
pub(crate) fn words(tokens: &[TokenId]) -> String {
    tokens
        .iter()
        .map(|&id| Toy::word(id).unwrap_or("<unk>"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The lesson's trace table: step, prefix read, selected token, selection
/// probability (the model's share, 4 decimals), one row per forward pass.
pub(crate) fn trace_table(run: &Generation) -> String {
    let mut rows = vec![[
        "step".to_string(),
        "prefix read".to_string(),
        "selected token".to_string(),
        "selection probability".to_string(),
    ]];
    for (index, step) in run.steps.iter().enumerate() {
        let (prompt, generated) = run.prefix(index).unwrap_or_default();
        rows.push([
            (index + 1).to_string(),
            format!("{} {}", words(prompt), words(generated))
                .trim_end()
                .to_string(),
            words(&[step.token]),
            format!("{:.4}", step.model_prob),
        ]);
    }
    rows.push([
        String::new(),
        format!("stopped by {}", describe_stop(run)),
        String::new(),
        format!("product {:.6}", run.logprob().prob()),
    ]);
    aligned(&rows)
}

/// The lesson's words for a stop reason.
pub(crate) fn describe_stop(run: &Generation) -> String {
    match &run.stop_reason {
        StopReason::EndToken(_) => format!("the end token, at step {}", run.tokens.len()),
        StopReason::MaxNewTokens => "the length bound".to_string(),
        StopReason::ContextBound => "the context bound".to_string(),
        other => format!("{other:?}"),
    }
}

/// The lesson's four runs: sampling with seeds 0, 1, 4 for 5 tokens, greedy for 12.
pub(crate) fn four_runs(toy: &Decoder) -> Result<Vec<(String, usize, Generation)>> {
    let mut rows = Vec::new();
    for seed in [0, 1, 4] {
        rows.push((
            format!("sampling, seed {seed}"),
            5,
            run(toy, &sampling(seed, 5))?,
        ));
    }
    rows.push(("greedy".to_string(), 12, run(toy, &greedy(0, 12))?));
    Ok(rows)
}

/// The stop table in the lesson's columns.
pub(crate) fn stop_table(runs: &[(String, usize, Generation)]) -> String {
    let mut rows = vec![[
        "selection".to_string(),
        "new tokens requested".to_string(),
        "tokens selected".to_string(),
        "what stopped the loop".to_string(),
    ]];
    for (selection, requested, run) in runs {
        rows.push([
            selection.clone(),
            requested.to_string(),
            words(&run.tokens),
            describe_stop(run),
        ]);
    }
    aligned(&rows)
}

/// The 101 runs of five new tokens, seeds 0 to 100, at T = 1.
pub(crate) fn seed_runs(toy: &Decoder) -> Result<Vec<(u64, Generation)>> {
    SEEDS
        .map(|seed| run(toy, &sampling(seed, 5)).map(|g| (seed, g)))
        .collect()
}

/// How the 101 seed runs ended: the count per step at which `<end>` stopped
/// a run, and the seeds of those runs.
pub(crate) fn early_stop_summary(runs: &[(u64, Generation)]) -> String {
    let mut out = String::new();
    let ended: Vec<&(u64, Generation)> = runs
        .iter()
        .filter(|(_, g)| matches!(g.stop_reason, StopReason::EndToken(_)))
        .collect();
    out.push_str(&format!(
        "{} of {} runs (seeds {}..={}, 5 new tokens, T = 1) stop on <end>\n",
        ended.len(),
        runs.len(),
        SEEDS.start(),
        SEEDS.end()
    ));
    for step in 1..=5 {
        let seeds: Vec<String> = ended
            .iter()
            .filter(|(_, g)| g.tokens.len() == step)
            .map(|(seed, _)| seed.to_string())
            .collect();
        out.push_str(&format!(
            "at step {step}: {:>2}  seeds [{}]\n",
            seeds.len(),
            seeds.join(", ")
        ));
    }
    out
}

/// Enumerations of every continuation of 2, 3 and 4 tokens.
pub(crate) fn enumerations(toy: &Decoder) -> Result<Vec<Enumeration>> {
    let prompt = prompt()?;
    (2..=4)
        .map(|n| enumerate_continuations(toy, &prompt, n, 10_000).map_err(Into::into))
        .collect()
}

/// Where greedy ranks at each length, and the five best continuations.
pub(crate) fn rank_table(enumerations: &[Enumeration]) -> String {
    let mut out = String::new();
    for e in enumerations {
        let greedy_prob = e
            .continuations
            .iter()
            .find(|c| c.tokens == e.greedy)
            .map_or(0.0, |c| c.logprob.exp());
        out.push_str(&format!(
            "{} tokens: {} continuations; greedy `{}` ({:.6}) ranks {}\n",
            e.greedy.len(),
            e.continuations.len(),
            words(&e.greedy),
            greedy_prob,
            e.greedy_rank
        ));
        for (rank, c) in e.continuations.iter().take(5).enumerate() {
            out.push_str(&format!(
                "  {}. {:<32} {:.6}\n",
                rank + 1,
                words(&c.tokens),
                c.logprob.exp()
            ));
        }
    }
    out
}

/// Brute force, independent of [`enumerate_continuations`]: scores every
/// continuation of `n_steps` tokens with the toy's reference path (explicit
/// mask, no cache, the whole sequence in one pass) and returns the greedy
/// continuation (argmax of the reference rows) and its rank, counted from 1.
pub(crate) fn brute_force_greedy_rank(
    toy: &Decoder,
    n_steps: usize,
) -> Result<(Vec<TokenId>, usize, usize)> {
    let prompt = prompt()?;
    let vocab = lm_model::TOY_VOCAB.len();
    let mut greedy = Vec::new();
    for _ in 0..n_steps {
        let tokens: Vec<TokenId> = prompt.iter().chain(&greedy).copied().collect();
        let rows = toy.reference_logits(&tokens)?;
        let last = rows.row(tokens.len() - 1).to_vec();
        greedy.push(lm_core::argmax(&last)?);
    }
    let n_total = vocab.pow(u32::try_from(n_steps)?);
    let mut scores = Vec::with_capacity(n_total);
    for index in 0..n_total {
        let mut continuation = Vec::with_capacity(n_steps);
        let mut rest = index;
        for _ in 0..n_steps {
            continuation.push((rest % vocab) as TokenId);
            rest /= vocab;
        }
        continuation.reverse();
        scores.push((score(toy, &prompt, &continuation)?, continuation));
    }
    let greedy_score = scores
        .iter()
        .find(|(_, c)| *c == greedy)
        .map(|(s, _)| *s)
        .context("the greedy continuation is among all continuations")?;
    let rank = 1 + scores.iter().filter(|(s, _)| *s > greedy_score).count();
    Ok((greedy, rank, scores.len()))
}

/// `ln p(continuation | prompt)` from one reference pass over the whole text.
fn score(toy: &Decoder, prompt: &[TokenId], continuation: &[TokenId]) -> Result<f64> {
    let tokens: Vec<TokenId> = prompt.iter().chain(continuation).copied().collect();
    let rows = toy.reference_logits(&tokens)?;
    let mut total = 0.0;
    for (offset, &token) in continuation.iter().enumerate() {
        let row = rows.row(prompt.len() + offset - 1).to_vec();
        let logprobs = log_softmax(&row, 1.0)?;
        total += f64::from(*logprobs.get(token as usize).context("token in the row")?);
    }
    Ok(total)
}

/// Every toy table, titled, as `cargo xtask check-lessons` prints them under
/// the claims.
pub(crate) fn all_tables() -> Result<String> {
    let toy = Toy::decoder();
    Ok(format!(
        "Lesson 001 on the toy decoder (its numbers replace the SDK's):\n\n\
         default run (sampling, seed 0, 5 new tokens):\n{}\n\
         greedy run (5 new tokens):\n{}\n\
         four runs:\n{}\n\
         {}\n\
         greedy among all continuations:\n{}\n",
        trace_table(&run(&toy, &sampling(0, 5))?),
        trace_table(&run(&toy, &greedy(0, 5))?),
        stop_table(&four_runs(&toy)?),
        early_stop_summary(&seed_runs(&toy)?),
        rank_table(&enumerations(&toy)?),
    ))
}

/// Rows of cells as left-aligned columns, two spaces apart.
fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(widths) {
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 2));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    //! The toy's tables, pinned. Review a change with `cargo insta review`.
    use super::*;

    /// Each table under the name of its snapshot file.
    #[test]
    fn the_toy_tables_are_their_snapshots() {
        let toy = Toy::decoder();
        let tables = [
            (
                "default_run_seed_0_five_steps",
                trace_table(&run(&toy, &sampling(0, 5)).unwrap()),
            ),
            (
                "greedy_run_five_steps",
                trace_table(&run(&toy, &greedy(0, 5)).unwrap()),
            ),
            (
                "stop_table_seeds_0_1_4_and_greedy_12",
                stop_table(&four_runs(&toy).unwrap()),
            ),
            (
                "seeds_0_to_100_stopping_on_end",
                early_stop_summary(&seed_runs(&toy).unwrap()),
            ),
            (
                "greedy_rank_among_all_continuations",
                rank_table(&enumerations(&toy).unwrap()),
            ),
        ];
        for (name, table) in tables {
            insta::assert_snapshot!(name, table);
        }
    }

    #[test]
    fn brute_force_agrees_with_the_enumeration() {
        let toy = Toy::decoder();
        let e = enumerations(&toy).unwrap();
        for (n_steps, enumeration) in (2..=4).zip(&e) {
            let (greedy, rank, n_total) = brute_force_greedy_rank(&toy, n_steps).unwrap();
            assert_eq!(greedy, enumeration.greedy, "{n_steps} tokens");
            assert_eq!(rank, enumeration.greedy_rank, "{n_steps} tokens");
            assert_eq!(n_total, 7usize.pow(n_steps as u32));
        }
    }
}
