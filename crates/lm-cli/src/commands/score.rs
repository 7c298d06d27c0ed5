//! `lm-cli score`: the log-probability of each continuation token given
//! everything before it, the chain-rule total and the perplexity; or, for a
//! count model, a sentence scored as KenLM's `query` scores it.
//!
//! The scores come from [`lm_decode::score_continuation`], which reads each
//! position once, so a text costs one pass.

use std::io::IsTerminal;
use std::num::NonZeroUsize;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use lm_core::LanguageModel;
use lm_core::TokenId;
use lm_model::ngram::{CorpusScore, NgramModel, UNK, Vocab, split_words};
use serde::Serialize;

use crate::cli::{ScoreArgs, UsageError};
use crate::output::Output;
use crate::report::json::{ScoreReport, SentenceScoreReport};
use crate::report::{number, printable, token_label};
use crate::spec::{Backend, ModelTask};
use crate::text::TextCodec;

/// Runs `lm-cli score`.
pub fn run(args: ScoreArgs) -> Result<()> {
    let file = match &args.file {
        Some(path) => Some(crate::files::read_text(path).context("reading the text to score")?),
        None => None,
    };
    let (loaded, options) = crate::commands::load_model(&args.model)?;
    if let (Some(text), Some(path)) = (file, &args.file) {
        let path = path.display().to_string();
        if let Backend::Count(model) = &loaded.backend {
            return score_lines(model, &text, path, args.json);
        }
        return loaded.run(
            options,
            ScoreFile {
                text,
                path,
                json: args.json,
            },
        );
    }
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
    let Some(continuation) = args.continuation.clone() else {
        bail!("give --continuation (and --prompt), or --text for a count model");
    };
    let prompt = args.prompt.clone();
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
    /// The context; none (or empty) scores the continuation from the
    /// document start.
    prompt: Option<String>,
    continuation: String,
    json: bool,
}

impl ModelTask for Score {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        let prompt = self.prompt.as_deref().unwrap_or_default();
        if let TextCodec::Words(vocab) = codec {
            note_unknown_words(vocab, &[prompt, &self.continuation]);
        }
        let mut prompt_ids = codec.encode_prompt(prompt)?;
        let mut ids = codec.encode(&self.continuation)?;
        if prompt_ids.is_empty() {
            // No context: from the document start, as `score --file` and the
            // facade's `score` read; without one the first token is the
            // context of the rest.
            prompt_ids = match codec.document_start() {
                Some(bos) => {
                    if ids.first() == Some(&bos) {
                        ids.remove(0);
                    }
                    vec![bos]
                }
                None if ids.len() > 1 => {
                    eprintln!(
                        "note: no prompt and the model has no BOS token: the first token is the context of the rest and is not scored"
                    );
                    vec![ids.remove(0)]
                }
                None => bail!(
                    "no prompt, no BOS token, and one token: there is nothing to score it after"
                ),
            };
        }
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
                token_label(token),
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

/// `score --file` for a count model: each line a sentence, summed as
/// KenLM's `query` sums a file (perplexity with and without unknown words).
fn score_lines(model: &NgramModel, text: &str, path: String, json: bool) -> Result<()> {
    let lines: Vec<&str> = text.lines().collect();
    note_unknown_words(model.vocab(), &lines);
    let mut corpus = CorpusScore::default();
    for line in &lines {
        corpus.add(&model.score_line(line));
    }
    let report = FileScoreReport {
        file: path,
        n_tokens: corpus.n_tokens as usize,
        n_sentences: Some(corpus.n_sentences as usize),
        n_oov: Some(corpus.n_oov as usize),
        total_log10: Some(corpus.total_log10),
        logprob: corpus.total_log10 * std::f64::consts::LN_10,
        perplexity: corpus.perplexity(),
        perplexity_excluding_oov: Some(corpus.perplexity_excluding_oov()),
        from_bos: None,
        n_windows: None,
    };
    print_file_score(&report, json)
}

/// `score --file`: the perplexity of a whole text.
#[derive(Debug, Serialize)]
struct FileScoreReport {
    /// The file scored.
    file: String,
    /// Tokens scored (for a count model: words and `</s>`).
    n_tokens: usize,
    /// Count models: the lines scored, each a sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    n_sentences: Option<usize>,
    /// Count models: the unknown words.
    #[serde(skip_serializing_if = "Option::is_none")]
    n_oov: Option<usize>,
    /// Count models: the sum of log10 p (KenLM's "Total").
    #[serde(skip_serializing_if = "Option::is_none")]
    total_log10: Option<f64>,
    /// The sum of ln p over the tokens scored.
    #[serde(serialize_with = "crate::report::json::extended_float::one")]
    logprob: f64,
    /// exp(-logprob / n_tokens).
    #[serde(serialize_with = "crate::report::json::extended_float::one")]
    perplexity: f64,
    /// Count models: the perplexity over known words only.
    #[serde(skip_serializing_if = "Option::is_none")]
    perplexity_excluding_oov: Option<f64>,
    /// Other models: whether the first token was scored after the document
    /// start (else it has no context and is not scored).
    #[serde(skip_serializing_if = "Option::is_none")]
    from_bos: Option<bool>,
    /// Other models: the context windows the text was scored in.
    #[serde(skip_serializing_if = "Option::is_none")]
    n_windows: Option<usize>,
}

fn print_file_score(report: &FileScoreReport, json: bool) -> Result<()> {
    let mut out = Output::stdout();
    if json {
        return out.write_json(report);
    }
    let mut text = format!(
        "file: {}
",
        report.file
    );
    if let Some(n_sentences) = report.n_sentences {
        text.push_str(&format!(
            "sentences: {n_sentences}, tokens: {} (with </s>), unknown words: {}
",
            report.n_tokens,
            report.n_oov.unwrap_or(0)
        ));
    } else {
        text.push_str(&format!(
            "tokens scored: {}
",
            report.n_tokens
        ));
    }
    if let Some(total) = report.total_log10 {
        text.push_str(&format!(
            "total log10 p: {total:.4}
"
        ));
    }
    text.push_str(&format!(
        "total ln p: {:.4}
perplexity: {}
",
        report.logprob,
        number(report.perplexity, 4)
    ));
    if let Some(excluding) = report.perplexity_excluding_oov {
        text.push_str(&format!(
            "perplexity excluding unknown words: {}
",
            number(excluding, 4)
        ));
    }
    out.write_now(&text)?;
    Ok(())
}

/// `score --file` for a model behind the trait.
struct ScoreFile {
    text: String,
    path: String,
    json: bool,
}

/// Tokens scored per forward pass: bounds the rows held at once.
const SCORE_CHUNK_LEN: NonZeroUsize = NonZeroUsize::new(256).expect("not zero");

impl ModelTask for ScoreFile {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        let mut ids = codec.encode(&self.text)?;
        // The first token is scored after the document start (BOS where
        // every text gets one, llama-perplexity's first position); without
        // one it is the context of the rest.
        let bos = codec.document_start();
        if let Some(bos) = bos
            && ids.first() == Some(&bos)
        {
            ids.remove(0);
        }
        let n_context_tokens = usize::from(bos.is_none());
        if ids.len() <= n_context_tokens {
            bail!("{} has no token to score", self.path);
        }
        if bos.is_none() {
            eprintln!(
                "note: the model has no BOS token: the first token is the context of the rest and is not scored"
            );
        }
        // A text longer than the context is scored in windows, each read
        // from the document start (or from the token before it), as
        // llama-perplexity does from BOS.
        let window = model
            .context_length()
            .map_or(usize::MAX, |n| n.saturating_sub(1).max(1));
        let windows: Vec<(Vec<TokenId>, &[TokenId])> = {
            let scored = &ids[n_context_tokens..];
            scored
                .chunks(window)
                .enumerate()
                .map(|(index, chunk)| {
                    let start = n_context_tokens + index * window;
                    let context = bos.unwrap_or_else(|| ids[start - 1]);
                    (vec![context], chunk)
                })
                .collect()
        };
        if windows.len() > 1 {
            eprintln!(
                "note: {} tokens are more than the context holds: scored in {} windows of up to {window} tokens, each from {}",
                ids.len(),
                windows.len(),
                if bos.is_some() {
                    "the document start"
                } else {
                    "the token before it"
                }
            );
        }
        let n_scored = ids.len() - n_context_tokens;
        let bar = progress_bar(n_scored as u64);
        let mut logprob = 0.0;
        let mut n_done = 0;
        for (context, chunk) in &windows {
            let score = lm_decode::score_continuation_in_chunks(
                model,
                context,
                chunk,
                SCORE_CHUNK_LEN,
                |n| {
                    if let Some(bar) = &bar {
                        bar.set_position((n_done + n) as u64);
                    }
                },
            )?;
            logprob += score.logprob;
            n_done += chunk.len();
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let report = FileScoreReport {
            file: self.path,
            n_tokens: n_scored,
            n_sentences: None,
            n_oov: None,
            total_log10: None,
            logprob,
            perplexity: (-logprob / n_scored as f64).exp(),
            perplexity_excluding_oov: None,
            from_bos: Some(bos.is_some()),
            n_windows: Some(windows.len()),
        };
        print_file_score(&report, self.json)
    }
}

/// A progress bar on stderr when it is a terminal.
fn progress_bar(n_tokens: u64) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(n_tokens);
    if let Ok(style) = ProgressStyle::with_template("scoring {bar:40} {pos}/{len} tokens ({eta})") {
        bar.set_style(style);
    }
    Some(bar)
}
