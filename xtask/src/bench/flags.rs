//! The command-line walk the bench tasks share (`bench`, `bench --serve`,
//! `bench --speculative`): flags, their values, and positive counts, with
//! errors that name the flag and end with the task's usage line.

use anyhow::{Context, Result, anyhow};

/// The flags of one task's command line, read in order.
pub(crate) struct Flags<'a> {
    args: std::slice::Iter<'a, String>,
    usage: &'static str,
}

impl<'a> Flags<'a> {
    /// The walk over `args`; errors quote `usage`.
    pub(crate) fn new(args: &'a [String], usage: &'static str) -> Self {
        Self {
            args: args.iter(),
            usage,
        }
    }

    /// The next flag, if any.
    pub(crate) fn next_flag(&mut self) -> Option<&'a str> {
        self.args.next().map(String::as_str)
    }

    /// The value that follows `flag`.
    pub(crate) fn value(&mut self, flag: &str) -> Result<&'a str> {
        let usage = self.usage;
        self.args
            .next()
            .map(String::as_str)
            .with_context(|| format!("option `{flag}` needs a value; {usage}"))
    }

    /// The positive count that follows `flag`.
    pub(crate) fn count(&mut self, flag: &str) -> Result<usize> {
        let text = self.value(flag)?;
        text.parse()
            .ok()
            .filter(|&n: &usize| n > 0)
            .with_context(|| format!("{flag} needs a positive count, got `{text}`"))
    }

    /// The comma-separated positive counts (`1,2`) that follow `flag`.
    pub(crate) fn counts(&mut self, flag: &str) -> Result<Vec<usize>> {
        positive_list(self.value(flag)?, flag)
    }

    /// The error for a flag the task does not take.
    pub(crate) fn unknown(&self, flag: &str) -> anyhow::Error {
        anyhow!("unknown option `{flag}`; {}", self.usage)
    }
}

/// What every measuring task takes: how many rounds, at which thread
/// counts, and whether this process is the release worker that measures.
#[derive(Debug)]
pub(crate) struct Rounds {
    /// Rounds; figures are medians.
    pub(crate) runs: usize,
    /// Thread counts to measure.
    pub(crate) threads: Vec<usize>,
    /// Internal: run the measurements in this (release) process.
    pub(crate) worker: bool,
}

impl Rounds {
    /// `runs` rounds at one and two threads, from the task's own process.
    pub(crate) fn new(runs: usize) -> Self {
        Self {
            runs,
            threads: vec![1, 2],
            worker: false,
        }
    }

    /// Reads `flag` (and its value) when it is `--runs`, `--threads` or
    /// `--worker`; false when it is none of them.
    pub(crate) fn read(&mut self, flag: &str, flags: &mut Flags<'_>) -> Result<bool> {
        match flag {
            "--runs" => self.runs = flags.count(flag)?,
            "--threads" => self.threads = flags.counts(flag)?,
            "--worker" => self.worker = true,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A comma-separated list of positive counts (`1,2`).
pub(crate) fn positive_list(text: &str, flag: &str) -> Result<Vec<usize>> {
    text.split(',')
        .map(|part| part.trim().parse().ok().filter(|&n: &usize| n > 0))
        .collect::<Option<Vec<_>>>()
        .with_context(|| format!("{flag} needs positive counts like `1,2`, got `{text}`"))
}
