//! `lm-cli train`: count n-grams in a corpus, estimate a model, write it as
//! an ARPA file (`--out -`: to stdout). The output is checked before the
//! corpus is read and written through [`OutputFile`]: a regular file under a
//! temporary name beside it, renamed when complete (so an interrupted run
//! never leaves a half-written model behind), a device or FIFO written
//! through, the corpus itself refused. Progress goes to stderr, only on a
//! terminal.

use std::io::{self, BufReader};

use anyhow::{Context, Result};
use lm_model::ngram::{self, Discount, MAX_ORDER, NgramError, Smoothing, TrainOptions, Utf8Policy};

use crate::cli::{SmoothingArg, TrainArgs, UsageError};
use crate::files::{self, Input, OutputFile};
use crate::progress::terminal_bar;

/// Runs `lm-cli train`.
pub fn run(args: TrainArgs) -> Result<()> {
    if !(1..=MAX_ORDER).contains(&args.order) {
        return Err(UsageError::InvalidOrder {
            order: args.order,
            max: MAX_ORDER,
        }
        .into());
    }
    let smoothing = match args.smoothing {
        SmoothingArg::Mle => Smoothing::MaximumLikelihood,
        SmoothingArg::AddK => Smoothing::AddK { k: args.k },
        SmoothingArg::KneserNey => Smoothing::ModifiedKneserNey {
            fallback: args.discount_fallback.then_some(Discount::LMPLZ_FALLBACK),
        },
    };
    let options = TrainOptions {
        order: args.order,
        smoothing,
        utf8: Utf8Policy::Strict,
        prune: Vec::new(),
    };
    let corpus = &args.corpus;
    // The output is checked (and a FIFO's reader waited for) before the
    // corpus is read, so a path that cannot be written fails at once.
    let out = OutputFile::create(&args.out, true)?;
    let file = files::open_input(corpus, Input::FileOrPipe)
        .with_context(|| format!("opening the corpus {}", corpus.display()))?;
    let metadata = file
        .metadata()
        .with_context(|| format!("opening the corpus {}", corpus.display()))?;
    out.refuse_input(corpus, &metadata)?;
    let mut reader = BufReader::new(file);
    files::refuse_binary(&mut reader, corpus)?;
    let progress = terminal_bar(
        metadata.len(),
        "counting {bar:40} {bytes}/{total_bytes} ({eta})",
    );
    let model = ngram::train(reader, &options, |n_read| {
        if let Some(bar) = &progress {
            bar.set_position(n_read);
        }
    });
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }
    // The fallback hint only helps when the discounts could not be estimated.
    let discounts_failed = matches!(
        &model,
        Err(NgramError::DiscountUndefined { .. } | NgramError::DiscountOutOfRange { .. })
    );
    let model = model.with_context(|| {
        let hint = if discounts_failed && !args.discount_fallback {
            " (for a small corpus, try --discount-fallback)"
        } else {
            ""
        };
        format!("training on {}{hint}", corpus.display())
    })?;
    let to_stdout = out.is_stdout();
    out.write(|out| model.write_arpa(out).map_err(io::Error::other))?;
    for fallback in model.discount_fallbacks() {
        eprintln!("note: {fallback}");
    }
    let counts: Vec<String> = (1..=model.order())
        .map(|m| format!("{} {m}-grams", model.n_ngrams(m)))
        .collect();
    let written = if to_stdout {
        "the model to stdout".to_owned()
    } else {
        args.out.display().to_string()
    };
    eprintln!(
        "wrote {written}: order {}, {} words, {}",
        model.order(),
        model.vocab().len(),
        counts.join(", ")
    );
    Ok(())
}
