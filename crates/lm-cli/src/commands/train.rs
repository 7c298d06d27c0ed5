//! `lm-cli train`: count n-grams in a corpus, estimate a model, write it as
//! an ARPA file. The file is written under a temporary name in the target
//! folder and renamed when complete, so an interrupted run never leaves a
//! half-written model behind. Progress goes to stderr, only on a terminal.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use lm_model::ngram::{self, Discount, MAX_ORDER, NgramError, Smoothing, TrainOptions, Utf8Policy};

use crate::cli::{SmoothingArg, TrainArgs, UsageError};
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
    let file =
        File::open(corpus).with_context(|| format!("opening the corpus {}", corpus.display()))?;
    let n_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let progress = terminal_bar(n_bytes, "counting {bar:40} {bytes}/{total_bytes} ({eta})");
    let model = ngram::train(BufReader::new(file), &options, |n_read| {
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
    write_atomically(&args.out, |out| Ok(model.write_arpa(out)?))?;
    for fallback in model.discount_fallbacks() {
        eprintln!("note: {fallback}");
    }
    let counts: Vec<String> = (1..=model.order())
        .map(|m| format!("{} {m}-grams", model.n_ngrams(m)))
        .collect();
    eprintln!(
        "wrote {}: order {}, {} words, {}",
        args.out.display(),
        model.order(),
        model.vocab().len(),
        counts.join(", ")
    );
    Ok(())
}

/// Writes `path` through a temporary file in the same folder, renamed into
/// place only after `write` succeeded and the data reached the disk.
fn write_atomically(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    // Temporary files are private (0600); the model file is an ordinary
    // readable file like any other output (0644 on Unix).
    let mut builder = tempfile::Builder::new();
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let temp = builder
        .tempfile_in(folder)
        .with_context(|| format!("creating a temporary file in {}", folder.display()))?;
    let mut out = BufWriter::new(temp);
    write(&mut out).with_context(|| format!("writing {}", path.display()))?;
    let temp = out
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", path.display()))?;
    temp.as_file()
        .sync_all()
        .with_context(|| format!("writing {}", path.display()))?;
    temp.persist(path)
        .with_context(|| format!("renaming the temporary file to {}", path.display()))?;
    Ok(())
}
