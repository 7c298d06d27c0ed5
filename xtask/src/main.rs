//! Project tasks, run with `cargo xtask <task> [args]`.
//!
//! A small dispatcher in rust-analyzer's shape: one module per task, each with a
//! `run(args)` function; `project_root()` locates the workspace from
//! `CARGO_MANIFEST_DIR`.
#![forbid(unsafe_code)]

mod bench;
mod bench_speculative;
mod check_lessons;
mod examples;
mod fetch_hf;
mod fetch_model;
mod fuzz_serve;
mod make_model;
mod reference;
mod serve_cluster;
mod soak;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The tasks and what they do, printed by `cargo xtask help`.
const USAGE: &str = "\
usage: cargo xtask <task> [args]

tasks:
  bench                 decode and prefill speed of SmolLM2, ours and llama.cpp's, side by side;
                        with --speculative, decode with and without prompt lookup
  check-lessons         check every worked example and numeric claim of ../shared/lessons
  examples              run every example of the workspace (as listed by cargo metadata)
  fetch-model <name>    download (or derive with llama.cpp) a known model into the
                        models folder ($LM_MODELS_DIR, default $HOME/.cache/lm/models)
  fuzz-serve            send 100,000 fuzzed requests (OpenAI's schema, mutated) to a toy-model
                        server; fail on a 5xx, a panic or RSS above twice idle
  make-model <shape>    write a random-weight GGUF file in a real model's shape (Llama 3.2
                        1B, Qwen 2.5 1.5B, Llama 3.2 3B, ...) with SmolLM2's vocabulary,
                        quantized by llama.cpp (--type Q4_K_M), for speed at real scale
  reference-fixtures    regenerate the llama.cpp fixtures (smollm2, smollm2-requant,
                        gemma3; needs python3; builds llama-cpp-python once, which
                        takes several minutes, unless LM_REFERENCE_PYTHON is set);
                        with --arch, fixtures/arch (random-weight files per architecture);
                        with --samplers, fixtures/samplers (llama.cpp's samplers on logits)
  serve-cluster         N `lm-cli serve` replicas behind nginx, routed by X-Session-Id, until Ctrl-C
  soak                  drive `lm-cli serve` on SmolLM2 with 32 clients for M minutes, then SIGTERM it;
                        fail on a 5xx, RSS growth, a slow first token or a broken drain
  tidy                  check the dependency arrows, docs/ARCHITECTURE.md and file headers";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let task = args.next();
    let task_args: Vec<String> = args.collect();
    if task_args.iter().any(|arg| arg == "--help" || arg == "-h") {
        let task = task.unwrap_or_default();
        match task_usage(&task) {
            Some(usage) => println!("{usage}"),
            None => bail!("unknown task `{task}`\n\n{USAGE}"),
        }
        return Ok(());
    }
    match task.as_deref() {
        Some("bench") => bench::run(&task_args),
        Some("check-lessons") => check_lessons::run(&task_args),
        Some("examples") => examples::run(&task_args),
        Some("fetch-model") => fetch_model::run(&task_args),
        Some("fuzz-serve") => fuzz_serve::run(&task_args),
        Some("make-model") => make_model::run(&task_args),
        Some("reference-fixtures") => reference::run(&task_args),
        Some("serve-cluster") => serve_cluster::run(&task_args),
        Some("soak") => soak::run(&task_args),
        Some("tidy") => tidy::run(&task_args),
        Some("help" | "-h" | "--help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(unknown) => bail!("unknown task `{unknown}`\n\n{USAGE}"),
    }
}

/// What `cargo xtask <task> --help` prints: the task's usage.
fn task_usage(task: &str) -> Option<String> {
    Some(match task {
        "bench" => format!("{}\n{}", bench::USAGE, bench_speculative::USAGE),
        "check-lessons" => check_lessons::USAGE.to_owned(),
        "examples" | "tidy" => format!("usage: cargo xtask {task}"),
        "fetch-model" => fetch_model::usage(),
        "fuzz-serve" => fuzz_serve::USAGE.to_owned(),
        "make-model" => make_model::usage(),
        "reference-fixtures" => format!("{}\n{}", reference::USAGE, reference::ARCH_USAGE),
        "serve-cluster" => serve_cluster::USAGE.to_owned(),
        "soak" => soak::USAGE.to_owned(),
        _ => return None,
    })
}

/// The workspace root: the parent of the `xtask` package directory.
pub(crate) fn project_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// `cargo build ARGS --message-format=json-render-diagnostics` at the
/// project root, with the cargo that runs this task: cargo's JSON messages
/// (one per line; its diagnostics go to stderr as cargo renders them), or
/// an error when the build fails.
pub(crate) fn cargo_build(args: &[&str]) -> Result<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let command = format!("cargo build {}", args.join(" "));
    let output = Command::new(cargo)
        .current_dir(project_root())
        .arg("build")
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {command}"))?;
    if !output.status.success() {
        bail!("{command} failed ({})", output.status);
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `list` as the owned arguments a task's `run` or `parse` takes (tests).
#[cfg(test)]
pub(crate) fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Asserts that `parse` (a task's `run` or its parser) refuses each of
/// `cases` before doing any work (tests).
#[cfg(test)]
#[track_caller]
pub(crate) fn assert_refused<T>(parse: impl Fn(&[String]) -> Result<T>, cases: &[&[&str]]) {
    for case in cases {
        assert!(parse(&args(case)).is_err(), "{case:?} was accepted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build cargo refuses is an error that names the command (cargo
    /// stops at the package name, before compiling anything).
    #[test]
    fn a_failed_cargo_build_is_an_error_naming_it() {
        let error = cargo_build(&["--package", "no-such-package"]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cargo build --package no-such-package failed (exit status: 101)"),
            "{error}"
        );
    }

    #[test]
    fn every_listed_task_has_a_usage_for_help() {
        let listed: Vec<&str> = USAGE
            .lines()
            .skip_while(|line| *line != "tasks:")
            .skip(1)
            .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
            .filter_map(|line| line.split_whitespace().next())
            .collect();
        assert_eq!(listed.len(), 10, "{listed:?}");
        for task in listed {
            let usage = task_usage(task).unwrap_or_else(|| panic!("no usage for `{task}`"));
            assert!(
                usage.starts_with(&format!("usage: cargo xtask {task}")),
                "{task}: {usage}"
            );
        }
        assert_eq!(task_usage("nope"), None);
    }
}
