//! `cargo xtask fuzz-serve [--requests 100000] [--seed 33] [--clients 4]`:
//! the server fuzz run at full size (lm-serve's fuzz test runs 2,000).
//!
//! The generator, the checks and the report are lm-serve's `fuzz` module,
//! shared with the test; this task starts the server as a child process
//! (this binary again, with `--server-role`) so the RSS it reads is the
//! server's alone, then prints the report and fails if any request got a
//! 5xx or no answer, the server panicked, or its RSS ended above twice its
//! idle size. A failure names its seed and case index, which replay it.

use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};
use lm_serve::fuzz::{self, ServerProcess};

pub(crate) const USAGE: &str =
    "usage: cargo xtask fuzz-serve [--requests N (100000)] [--seed S (33)] [--clients C (4)]";

/// Runs the task (or, with `--server-role`, the server it fuzzes).
pub(crate) fn run(args: &[String]) -> Result<()> {
    if args.iter().any(|arg| arg == "--server-role") {
        return fuzz::serve_toy(
            |addr| println!("{}{addr}", fuzz::LISTENING),
            || {
                let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            },
        )
        .context("serving the toy model");
    }
    let (mut n_requests, mut seed, mut n_clients) = (100_000u64, 33u64, 4u64);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let target = match flag.as_str() {
            "--requests" => &mut n_requests,
            "--seed" => &mut seed,
            "--clients" => &mut n_clients,
            other => bail!("unknown option `{other}`\n{USAGE}"),
        };
        let text = args
            .next()
            .with_context(|| format!("{flag} needs a number"))?;
        *target = text
            .parse()
            .with_context(|| format!("{flag} needs a number, got `{text}`"))?;
    }
    if n_clients == 0 {
        bail!("--clients must be at least 1");
    }
    let mut command = Command::new(std::env::current_exe().context("finding xtask's executable")?);
    command.args(["fuzz-serve", "--server-role"]);
    let server = ServerProcess::spawn(command).map_err(|e| anyhow!(e))?;
    println!(
        "fuzzing the toy server at {} (pid {}): {n_requests} requests, seed {seed}, {n_clients} clients",
        server.addr,
        server.pid()
    );
    let report = fuzz::run(server.addr, server.pid(), n_requests, seed, n_clients);
    println!("{report}");
    server.stop().map_err(|e| anyhow!(e))?;
    report.check().map_err(|e| anyhow!(e))
}

#[cfg(test)]
mod tests {
    use super::run;

    #[test]
    fn bad_options_are_refused() {
        crate::assert_refused(
            run,
            &[
                &["--requests"],
                &["--requests", "many"],
                &["--clients", "0"],
                &["--fast"],
            ],
        );
    }
}
