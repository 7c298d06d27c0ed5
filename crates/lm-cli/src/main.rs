//! `lm-cli`: generate, score, enumerate, tokenize and train from the command
//! line. This file only parses, runs and maps failures to exit codes:
//!
//! ```text
//! 0  success (also when stdout is closed early, as by `| head -c 1`)
//! 1  runtime error: one line `error: <message>: <cause>: ...`
//! 2  usage error: a bad argument, named, with a hint line (`lm-cli` with
//!    no arguments prints the help on stdout)
//! 130 interrupted by Ctrl-C (generate): what was generated so far is
//!    printed in the mode asked for (text, --trace, --json), and a
//!    `note: interrupted ...` line on stderr (beam search prints nothing);
//!    in chat, Ctrl-C stops the reply and the chat goes on, and a second
//!    Ctrl-C during the same reply exits with 130
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod cli;
mod commands;
mod draft;
mod embed;
mod files;
mod interrupt;
mod logger;
mod model_defaults;
mod output;
mod printer;
mod progress;
mod report;
mod spec;
mod structured;
mod text;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, UsageError};

fn main() -> ExitCode {
    install_panic_hook();
    logger::install();
    // Freed KV caches and prefill buffers go back to the system instead of
    // staying in whichever thread's arena held them.
    lm_model::map_large_allocations();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return report_clap_error(&error),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if output::is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<interrupt::Interrupted>().is_some() => {
            eprintln!("note: {error}");
            ExitCode::from(interrupt::EXIT_CODE)
        }
        Err(error) => {
            eprintln!("error: {}", one_line(&format!("{error:#}")));
            if error.downcast_ref::<UsageError>().is_some() {
                eprintln!("hint: see `lm-cli help` and `lm-cli <command> --help`");
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // A misspelled `LM_KERNEL` or `LM_PACK`, or a kernel this CPU cannot run,
    // stops here instead of running another path (lm-model alone would warn
    // and fall back).
    lm_model::Kernel::from_env().map_err(|e| anyhow::anyhow!("{}: {e}", lm_model::KERNEL_ENV))?;
    lm_model::Packing::from_env().map_err(|e| anyhow::anyhow!("{}: {e}", lm_model::PACK_ENV))?;
    match cli.command {
        Command::Generate(args) => commands::generate::run(*args),
        Command::Probs(args) => commands::probs::run(args),
        Command::Score(args) => commands::score::run(args),
        Command::Quantize(args) => commands::quantize::run(args),
        Command::Enumerate(args) => commands::enumerate::run(args),
        Command::Tokenize(args) => commands::tokenize::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Chat(args) => commands::chat::run(*args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Embed(args) => embed::run(args),
        Command::Completions(args) => commands::completions::run(args),
    }
}

/// Prints a clap error as one `error:` line and one hint line (help and
/// `--version` print as clap writes them). Exit code 2, or 0 for help.
/// `lm-cli` alone prints the help on stdout and exits 2.
fn report_clap_error(error: &clap::Error) -> ExitCode {
    if error.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let mut stdout = std::io::stdout().lock();
        let _ = write!(stdout, "{}", error.render()).and_then(|()| stdout.flush());
        return ExitCode::from(2);
    }
    if !error.use_stderr() {
        let _ = error.print();
        return ExitCode::SUCCESS;
    }
    let rendered = error.render().to_string();
    let mut message = Vec::new();
    let mut hints = Vec::new();
    for line in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("Usage:") {
            continue;
        }
        if line.starts_with("tip:") || line.starts_with("For more information") {
            hints.push(line.trim_start_matches("tip:").trim().to_owned());
        } else {
            message.push(line.to_owned());
        }
    }
    let message = message.join(" ");
    let message = message.strip_prefix("error:").unwrap_or(&message).trim();
    eprintln!("error: {message}");
    if !hints.is_empty() {
        eprintln!("hint: {}", hints.join("; "));
    }
    ExitCode::from(2)
}

/// Joins the lines of a message with spaces.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A bug must still end with one readable line, not a backtrace.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal error{location}: {payload} (a bug in lm-cli; please report it)");
    }));
}
