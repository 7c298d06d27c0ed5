//! `lm-cli completions SHELL`: a completion script from clap_complete.

use anyhow::Result;
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs};
use crate::output::Output;

/// Runs `lm-cli completions`.
pub fn run(args: CompletionsArgs) -> Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "lm-cli", &mut script);
    let mut out = Output::stdout();
    out.write_now(&String::from_utf8_lossy(&script))?;
    Ok(())
}
