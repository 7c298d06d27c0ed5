//! Running the built `lm-cli` binary and reading what it printed: a command
//! line builder ([`Cli`]), JSON accessors, and [`check`], which pins what a
//! command prints with an insta snapshot.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// The lessons' toy prompt.
pub const PROMPT: &str = "<start> the cat";

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

impl Run {
    /// Asserts a usage error: exit code 2 and `message` in stderr.
    #[track_caller]
    pub fn assert_usage_error(&self, message: &str) {
        self.assert_exit(2, message);
    }

    /// Asserts exit code `code` and `message` in stderr.
    #[track_caller]
    pub fn assert_exit(&self, code: i32, message: &str) {
        assert_eq!(self.code, Some(code), "{}", self.stderr);
        assert_contains(&self.stderr, message);
    }

    /// Parses stdout as one JSON value.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not one JSON value ({e}): {}", self.stdout))
    }
}

/// Asserts that `text` (what a run printed) contains `part`, showing all
/// of `text` when it does not.
#[track_caller]
pub fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "{text}");
}

/// An `lm-cli` command line, built one argument at a time, with the
/// environment variables it runs under.
#[derive(Debug, Clone)]
pub struct Cli {
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Cli {
    /// `lm-cli subcommand`.
    pub fn new(subcommand: &str) -> Self {
        Self {
            args: vec![subcommand.to_owned()],
            env: Vec::new(),
        }
    }

    /// `lm-cli` with no arguments at all.
    pub fn bare() -> Self {
        Self {
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// `lm-cli generate --prompt PROMPT` on the embedded default model.
    pub fn generate(prompt: &str) -> Self {
        Self::new("generate").opt("--prompt", prompt)
    }

    /// `lm-cli subcommand --model toy --prompt "<start> the cat"`.
    pub fn toy(subcommand: &str) -> Self {
        Self::new(subcommand)
            .opt("--model", "toy")
            .opt("--prompt", PROMPT)
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl ToString) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// Adds arguments.
    pub fn args<T: ToString>(self, args: impl IntoIterator<Item = T>) -> Self {
        args.into_iter().fold(self, Self::arg)
    }

    /// Adds an option and its value.
    pub fn opt(self, name: &str, value: impl ToString) -> Self {
        self.arg(name).arg(value)
    }

    /// `--model spec`.
    pub fn model(self, spec: impl ToString) -> Self {
        self.opt("--model", spec)
    }

    /// `-n max_new_tokens`.
    pub fn n(self, max_new_tokens: usize) -> Self {
        self.opt("-n", max_new_tokens)
    }

    /// `--seed seed`.
    pub fn seed(self, seed: u64) -> Self {
        self.opt("--seed", seed)
    }

    /// Runs with the environment variable `name` set to `value`.
    pub fn env(mut self, name: &str, value: impl ToString) -> Self {
        self.env.push((name.to_owned(), value.to_string()));
        self
    }

    /// The command line after `lm-cli`, as typed in a shell from the
    /// workspace root (for messages and snapshot descriptions).
    pub fn line(&self) -> String {
        self.args
            .iter()
            .map(|arg| from_workspace(arg))
            .map(|arg| {
                let plain = !arg.is_empty()
                    && arg
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_:./,=".contains(c));
                if plain {
                    arg.clone()
                } else {
                    format!("{arg:?}")
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The command for the binary, with stdin closed.
    pub fn command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lm-cli"));
        command.args(&self.args).stdin(Stdio::null());
        for (name, value) in &self.env {
            command.env(name, value);
        }
        command
    }

    /// Starts the command with stdout and stderr piped, stdin closed.
    pub fn spawn(&self) -> Child {
        self.spawn_with(Stdio::null())
    }

    /// Starts the command with stdin, stdout and stderr piped, for a test
    /// that writes the input and reads the output itself.
    pub fn spawn_with_stdin(&self) -> Child {
        self.spawn_with(Stdio::piped())
    }

    /// Starts an `lm-cli serve` command line on a free port and returns the
    /// child with the address it listens on (read from the line it prints
    /// first on stderr); the rest of stderr is drained on a thread, so the
    /// server never blocks on it.
    pub fn spawn_server(self) -> (Child, String) {
        let (child, addr, _rest) = self.spawn_server_reading_stderr();
        (child, addr)
    }

    /// [`Cli::spawn_server`], with the thread that reads the rest of the
    /// server's standard error: joined once the server has exited, it gives
    /// what the server printed after its address line.
    pub fn spawn_server_reading_stderr(self) -> (Child, String, std::thread::JoinHandle<String>) {
        let mut child = self.opt("--port", 0).spawn();
        let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr is piped"));
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stderr, &mut line).expect("the server prints a line");
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        let rest = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
            rest
        });
        (child, addr, rest)
    }

    fn spawn_with(&self, stdin: Stdio) -> Child {
        self.command()
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the lm-cli binary starts")
    }

    /// Runs the command to completion.
    pub fn run(&self) -> Run {
        let output = self.command().output().expect("the lm-cli binary runs");
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs the command with `input` on its stdin (a pipe, not a terminal).
    pub fn run_with_stdin(&self, input: &str) -> Run {
        run_piped(self.command(), input)
    }

    /// Runs the command behind `wrapper`, a program and its first arguments
    /// that run what follows them ([`BOUNDED`], `["timeout", "60"]`), with
    /// `input` on its stdin.
    pub fn run_wrapped(&self, wrapper: &[&str], input: &str) -> Run {
        let mut command = Command::new(wrapper[0]);
        command
            .args(&wrapper[1..])
            .arg(env!("CARGO_BIN_EXE_lm-cli"))
            .args(&self.args);
        for (name, value) in &self.env {
            command.env(name, value);
        }
        run_piped(command, input)
    }

    /// Runs the command and expects it to succeed.
    pub fn ok(&self) -> Run {
        let run = self.run();
        assert_eq!(run.code, Some(0), "lm-cli {}: {}", self.line(), run.stderr);
        run
    }

    /// Runs the command with `--json` added, expects success, and parses
    /// what it printed.
    pub fn json(&self) -> Value {
        self.clone().arg("--json").ok().json()
    }
}

/// A wrapper for [`Cli::run_wrapped`] that bounds a run meant to refuse an
/// endless input: 1 GB of address space and 20 s, so a regression fails
/// the test instead of eating the machine.
pub const BOUNDED: [&str; 4] = [
    "sh",
    "-c",
    "ulimit -v 1000000; exec timeout 20 \"$@\"",
    "sh",
];

/// Runs `command` with `input` on its stdin and everything it prints read.
pub fn run_piped(mut command: Command, input: &str) -> Run {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // A command that ends before reading all of it closes the pipe early.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    let output = child.wait_with_output().expect("the command ends");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `sh -c script` with stdin closed; the script names the binary `$LM_CLI`.
pub fn shell(script: &str) -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(script)
        .env("LM_CLI", env!("CARGO_BIN_EXE_lm-cli"))
        .stdin(Stdio::null());
    command
}

/// [`shell`] started with stdout and stderr piped.
pub fn spawn_shell(script: &str) -> Child {
    shell(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh starts")
}

/// Reads the first `n_bytes` a running `lm-cli` writes, then closes the pipe
/// as `| head -c N` does, and expects the process to end quietly: exit 0,
/// nothing on stderr. Returns the bytes read.
pub fn close_stdout_after(mut child: Child, n_bytes: usize) -> Vec<u8> {
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut first = vec![0u8; n_bytes];
    stdout
        .read_exact(&mut first)
        .expect("the first bytes arrive");
    drop(stdout);
    let output = child.wait_with_output().expect("lm-cli ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    first
}

/// Runs `cli`, expects success, and pins its stdout with the insta snapshot
/// `tests/snapshots/{name}.snap` (its description is the command line).
/// Paths into `fixtures/` are written from the workspace root. With
/// `--json` the snapshot is the parsed JSON (with `--json-lines`, the list
/// of the lines parsed), its clock readings
/// (`timing.*_ms`) replaced by `"[ms]"` and its fractional numbers rounded
/// to 6 decimals, so it pins the fields and values the README and scripts
/// read without pinning the machine. Returns the run for further checks.
pub fn check(name: &str, cli: &Cli) -> Run {
    let run = cli.ok();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.set_description(format!("lm-cli {}", cli.line()));
    settings.set_omit_expression(true);
    let stdout = from_workspace(&run.stdout);
    settings.bind(|| {
        let json_lines = cli.args.iter().any(|arg| arg == "--json-lines");
        if json_lines || cli.args.iter().any(|arg| arg == "--json") {
            let mut report: Value = if json_lines {
                let lines = stdout
                    .lines()
                    .map(|line| serde_json::from_str(line).expect("one JSON value per line"));
                Value::Array(lines.collect())
            } else {
                serde_json::from_str(&stdout).expect("one JSON value")
            };
            redact_clock(&mut report);
            round_fractions(&mut report);
            insta::assert_json_snapshot!(name, report);
        } else {
            insta::assert_snapshot!(name, stdout);
        }
    });
    run
}

/// `text` with this checkout's `fixtures/` folder written as the workspace
/// root sees it, so snapshots do not depend on where the checkout is.
fn from_workspace(text: &str) -> String {
    text.replace(&fixture("").display().to_string(), "fixtures/")
}

/// Replaces every `*_ms` number (the clock readings of `timing`) by `"[ms]"`.
fn redact_clock(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields.iter_mut() {
                if key.ends_with("_ms") && field.is_number() {
                    *field = Value::from("[ms]");
                } else {
                    redact_clock(field);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_clock),
        _ => {}
    }
}

/// Rounds every non-integer number to 6 decimals.
fn round_fractions(value: &mut Value) {
    match value {
        Value::Number(number) if !number.is_i64() && !number.is_u64() => {
            let x = number.as_f64().expect("a finite number");
            *value = Value::from((x * 1e6).round() / 1e6);
        }
        Value::Object(fields) => fields.values_mut().for_each(round_fractions),
        Value::Array(items) => items.iter_mut().for_each(round_fractions),
        _ => {}
    }
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

/// The `count:` spec of a file under `fixtures/`.
pub fn count_fixture(relative: &str) -> String {
    format!("count:{}", fixture(relative).display())
}
