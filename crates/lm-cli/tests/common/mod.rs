//! Running the built `lm-cli` binary and reading what it printed.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// What one run printed and how it ended.
#[derive(Debug)]
pub struct Run {
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// A command for the binary, with stdin closed.
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lm-cli"));
    command.args(args).stdin(Stdio::null());
    command
}

/// Runs `lm-cli args` to completion.
pub fn lm_cli(args: &[&str]) -> Run {
    let output = command(args).output().expect("the lm-cli binary runs");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `lm-cli args`, expects success, and parses stdout as JSON.
pub fn json(args: &[&str]) -> Value {
    let run = lm_cli(args);
    assert_eq!(run.code, Some(0), "lm-cli {args:?} failed: {}", run.stderr);
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("lm-cli {args:?} printed no JSON ({e}): {}", run.stdout))
}

/// A JSON array of numbers as f64.
pub fn floats(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .expect("an array")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect()
}

/// A JSON array of ids.
pub fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an array")
        .iter()
        .map(|v| v.as_u64().expect("an id") as u32)
        .collect()
}

/// A file under the workspace's `fixtures/`.
pub fn fixture(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(relative)
}

/// The SmolLM2 file when it is present, else `None` after a skip message.
pub fn smollm2_or_skip(test: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("LM_MODELS_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/lm/models"),
    };
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "SKIPPED {test}: {} not found; run `cargo xtask fetch-model smollm2`",
            path.display()
        );
        None
    }
}
