//! `lm-cli score`: the log-probability of each continuation token given
//! everything before it, the chain-rule total and the perplexity; or, for a
//! count model, a sentence scored as KenLM's `query` scores it.
//!
//! The scores come from [`lm_decode::score_continuation`], which reads each
//! position once, so a text costs one pass.

use anyhow::{Result, bail};
use lm_core::LanguageModel;
use lm_model::ngram::{UNK, Vocab, split_words};

use crate::cli::{ScoreArgs, UsageError};
use crate::output::Output;
use crate::report::json::{ScoreReport, SentenceScoreReport};
use crate::report::{number, printable};
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
        // The splitter `train` and generation use, so "mat." is "mat" and ".".
        let score = model.score_line(text);
        let mut words: Vec<String> = split_words(text).map(str::to_owned).collect();
        words.push(lm_model::ngram::EOS.to_owned());
        note_unknown_words(model.vocab(), &[text]);
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
        if let TextCodec::Words(vocab) = codec {
            note_unknown_words(vocab, &[&self.prompt, &self.continuation]);
        }
        let prompt_ids = codec.encode_prompt(&self.prompt)?;
        let ids = codec.encode(&self.continuation)?;
        let score = lm_decode::score_continuation(model, &prompt_ids, &ids)?;
        let perplexity = score.perplexity();
        let (sequence_logprob, logprobs) = (score.logprob, score.logprobs);
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
                "{id:>8}  {:<20}  {lp:>10.4}  {:>8}\n",
                printable(token),
                number(lp.exp(), 4)
            ));
        }
        text.push_str(&format!(
            "sequence ln p: {:.4} (p = {}), perplexity {}\n",
            report.sequence_logprob,
            number(report.sequence_logprob.exp(), 6),
            number(report.perplexity, 4)
        ));
        out.write_now(&text)?;
        Ok(())
    }
}

/// Says on stderr how many of the words of `texts` a count model does not
/// know (each is scored as `<unk>`), so a score of mostly unknown words is
/// not taken for a score of the text.
fn note_unknown_words(vocab: &Vocab, texts: &[&str]) {
    let (mut n_words, mut n_unknown) = (0, 0);
    for word in texts.iter().flat_map(|text| split_words(text)) {
        n_words += 1;
        n_unknown += usize::from(vocab.id(word).is_none());
    }
    if n_unknown > 0 {
        eprintln!(
            "note: {n_unknown} of {n_words} words not in the model's vocabulary, scored as {UNK}"
        );
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
        "total log10 p: {:.4}, perplexity {}\n",
        report.total_log10,
        number(report.perplexity, 4)
    ));
    out.write_now(&text)?;
    Ok(())
}
