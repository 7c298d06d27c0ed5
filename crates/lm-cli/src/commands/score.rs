//! `lm-cli score`: the log-probability of each continuation token given
//! everything before it, the chain-rule total and the perplexity; or, for a
//! count model, a sentence scored as KenLM's `query` scores it.
//!
//! The prompt is read once ([`Rows::Last`]: the distribution of the first
//! continuation token), then the continuation but its last token in one pass
//! ([`Rows::All`]: one row per later token), so a text costs one pass.

use anyhow::{Result, bail};
use lm_core::{LanguageModel, Rows};

use crate::cli::{ScoreArgs, UsageError};
use crate::output::Output;
use crate::report::json::{ScoreReport, SentenceScoreReport};
use crate::report::printable;
use crate::spec::{Backend, ModelTask};
use crate::text::TextCodec;

/// Runs `lm-cli score`.
pub fn run(args: ScoreArgs) -> Result<()> {
    let (loaded, options) = crate::commands::load_model(&args.model)?;
    if let Some(text) = &args.text {
        let Backend::Count(model) = &loaded.backend else {
            return Err(UsageError::TextNeedsCountModel {
                model: loaded.codec.kind(),
            }
            .into());
        };
        let score = model.score_line(text);
        let mut words: Vec<String> = text.split_ascii_whitespace().map(str::to_owned).collect();
        words.push(lm_model::ngram::EOS.to_owned());
        let report = SentenceScoreReport {
            words,
            log10probs: score.words.iter().map(|w| w.log10_prob).collect(),
            ngram_lengths: score.words.iter().map(|w| w.ngram_length).collect(),
            oov: score.words.iter().map(|w| w.oov).collect(),
            total_log10: score.total_log10(),
            perplexity: score.perplexity(),
        };
        return print_sentence(&report, args.json);
    }
    let (Some(prompt), Some(continuation)) = (args.prompt.clone(), args.continuation.clone())
    else {
        bail!("give --prompt and --continuation, or --text for a count model");
    };
    loaded.run(
        options,
        Score {
            prompt,
            continuation,
            json: args.json,
        },
    )
}

struct Score {
    prompt: String,
    continuation: String,
    json: bool,
}

impl ModelTask for Score {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        let prompt_ids = codec.encode_prompt(&self.prompt)?;
        let ids = codec.encode(&self.continuation)?;
        if prompt_ids.is_empty() {
            bail!("the prompt is empty: there is nothing to condition on");
        }
        let Some((_, all_but_last)) = ids.split_last() else {
            bail!("the continuation is empty: there is nothing to score");
        };
        let vocab_size = model.vocab_size();
        let mut state = model.new_state();
        let mut rows = Vec::new();
        model.forward(&mut state, &prompt_ids, Rows::Last, &mut rows)?;
        if !all_but_last.is_empty() {
            let mut later = Vec::new();
            model.forward(&mut state, all_but_last, Rows::All, &mut later)?;
            rows.extend_from_slice(&later);
        }
        let mut logprobs = Vec::with_capacity(ids.len());
        for (row, &id) in rows.chunks_exact(vocab_size).zip(&ids) {
            let log_p = lm_core::log_softmax(row, 1.0)?;
            logprobs.push(f64::from(log_p[id as usize]));
        }
        let sequence_logprob: f64 = logprobs.iter().sum();
        let perplexity = lm_core::perplexity(&logprobs)?;
        let tokens = ids.iter().map(|&id| codec.token_text(id)).collect();
        let report = ScoreReport {
            prompt_ids,
            ids,
            tokens,
            logprobs,
            sequence_logprob,
            perplexity,
        };
        let mut out = Output::stdout();
        if self.json {
            return out.write_json(&report);
        }
        let mut text = format!("{:>8}  {:<20}  {:>10}  {:>8}\n", "id", "token", "ln p", "p");
        for ((id, token), lp) in report.ids.iter().zip(&report.tokens).zip(&report.logprobs) {
            text.push_str(&format!(
                "{id:>8}  {:<20}  {lp:>10.4}  {:>8.4}\n",
                printable(token),
                lp.exp()
            ));
        }
        text.push_str(&format!(
            "sequence ln p: {:.4} (p = {:.6}), perplexity {:.4}\n",
            report.sequence_logprob,
            report.sequence_logprob.exp(),
            report.perplexity
        ));
        out.write_now(&text)?;
        Ok(())
    }
}

fn print_sentence(report: &SentenceScoreReport, json: bool) -> Result<()> {
    let mut out = Output::stdout();
    if json {
        return out.write_json(report);
    }
    let mut text = format!("{:<20}  {:>10}  {:>6}\n", "word", "log10 p", "n-gram");
    for ((word, lp), (n, oov)) in report
        .words
        .iter()
        .zip(&report.log10probs)
        .zip(report.ngram_lengths.iter().zip(&report.oov))
    {
        let oov = if *oov { "  (unknown word)" } else { "" };
        text.push_str(&format!(
            "{:<20}  {lp:>10.4}  {n:>6}{oov}\n",
            printable(word)
        ));
    }
    text.push_str(&format!(
        "total log10 p: {:.4}, perplexity {:.4}\n",
        report.total_log10, report.perplexity
    ));
    out.write_now(&text)?;
    Ok(())
}
