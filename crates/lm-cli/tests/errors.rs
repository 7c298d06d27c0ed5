//! Hostile and mistaken input: every bad argument ends with a one-line
//! message naming it, exit code 2 (usage) or 1 (runtime), and never a panic;
//! a closed output pipe ends quietly.

mod common;

use std::io::Read;
use std::process::Stdio;

use common::{command, lm_cli};

#[test]
fn bad_arguments_name_themselves() {
    let toy = ["generate", "--model", "toy", "--prompt", "<start> the cat"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        toy.iter().chain(extra).copied().collect()
    };
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            with(&["--temperature", "-1"]),
            2,
            "temperature must be >= 0",
        ),
        (with(&["--temperature", "hot"]), 2, "'hot' is not a number"),
        (with(&["--top-p", "0"]), 2, "top_p must be in (0, 1], got 0"),
        (
            with(&["--top-p", "1.5"]),
            2,
            "top_p must be in (0, 1], got 1.5",
        ),
        (with(&["--top-k", "0"]), 2, "top_k must be at least 1"),
        (with(&["--min-p", "2"]), 2, "min_p must be in [0, 1]"),
        (
            with(&["--repetition-penalty", "0"]),
            2,
            "repetition_penalty",
        ),
        (with(&["--truncate", "drop"]), 2, "not a truncation policy"),
        (
            with(&["--num-beams", "2", "--stop", "x"]),
            2,
            "--stop does not work with --num-beams",
        ),
        (with(&["--end-token", "cow"]), 1, "end token 'cow'"),
        (
            vec!["generate", "--model", "gpt5", "--prompt", "x"],
            2,
            "unknown model spec 'gpt5'",
        ),
        (
            vec!["generate", "--model", "count:", "--prompt", "x"],
            2,
            "needs a file",
        ),
        (vec!["generate", "--model", "toy"], 2, "--prompt"),
        (
            vec![
                "generate",
                "--model",
                "count:/no/such.arpa",
                "--prompt",
                "x",
            ],
            1,
            "/no/such.arpa not found",
        ),
        (
            vec!["generate", "--model", "/no/such.gguf", "--prompt", "x"],
            1,
            "/no/such.gguf not found",
        ),
        (
            vec![
                "generate",
                "--model",
                "toy",
                "--prompt",
                "<start> the zebra",
            ],
            1,
            "unknown word 'zebra'",
        ),
        (
            vec!["generate", "--model", "toy", "--prompt", ""],
            1,
            "the prompt is empty",
        ),
        (
            vec!["generate", "--model", "toy", "--prompt", "the", "--chat"],
            1,
            "no chat template",
        ),
        (
            vec![
                "enumerate",
                "--model",
                "toy",
                "--prompt",
                "<start>",
                "--steps",
                "9",
            ],
            1,
            "7^9 continuations exceed",
        ),
        (
            vec![
                "enumerate",
                "--model",
                "toy",
                "--prompt",
                "<start>",
                "--steps",
                "x",
            ],
            2,
            "--steps",
        ),
        (vec!["probs", "--logits", "2,x"], 2, "logit 2 is 'x'"),
        (
            vec!["probs", "--logits", "1,nan"],
            2,
            "logits must be finite",
        ),
        (
            vec!["probs", "--logits", "1,2", "--top-p", "1.5"],
            2,
            "top_p",
        ),
        (
            vec!["score", "--model", "toy", "--text", "the cat"],
            2,
            "--text scores a sentence with a count model",
        ),
        (
            vec![
                "score",
                "--model",
                "toy",
                "--prompt",
                "<start>",
                "--continuation",
                "",
            ],
            1,
            "continuation is empty",
        ),
        (
            vec![
                "train",
                "--corpus",
                "/no/such.txt",
                "--out",
                "/tmp/never.arpa",
            ],
            1,
            "/no/such.txt",
        ),
        (
            vec!["train", "--corpus", "x", "--order", "0", "--out", "y"],
            2,
            "--order must be between 1",
        ),
        (
            vec![
                "train",
                "--corpus",
                "x",
                "--smoothing",
                "magic",
                "--out",
                "y",
            ],
            2,
            "magic",
        ),
        (vec!["completions", "tcsh"], 2, "tcsh"),
        (vec!["frobnicate"], 2, "frobnicate"),
    ];
    for (args, code, message) in cases {
        let run = lm_cli(&args);
        assert_eq!(run.code, Some(code), "lm-cli {args:?}: {}", run.stderr);
        let first = run.stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: "),
            "lm-cli {args:?}: {}",
            run.stderr
        );
        assert!(
            first.contains(message),
            "lm-cli {args:?}: {first:?} lacks {message:?}"
        );
        assert!(
            run.stderr.lines().count() <= 2,
            "lm-cli {args:?}: {}",
            run.stderr
        );
        assert!(
            !run.stderr.contains("panicked"),
            "lm-cli {args:?}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("RUST_BACKTRACE"), "lm-cli {args:?}");
        assert!(
            run.stdout.is_empty(),
            "lm-cli {args:?} printed {}",
            run.stdout
        );
    }
}

#[test]
fn smollm2_missing_says_how_to_fetch_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = command(&["generate", "--model", "smollm2", "--prompt", "hi"])
        .env("LM_MODELS_DIR", dir.path())
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("cargo xtask fetch-model smollm2"),
        "{stderr}"
    );
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let mut child = command(&[
        "generate",
        "--prompt",
        "And God said",
        "-n",
        "400",
        "--stream",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn help_is_written_for_newcomers() {
    let run = lm_cli(&["--help"]);
    assert_eq!(run.code, Some(0));
    assert!(run.stdout.contains("what comes next"), "{}", run.stdout);
    assert!(run.stdout.contains("cargo xtask fetch-model smollm2"));
    let generate = lm_cli(&["generate", "--help"]);
    assert!(generate.stdout.contains("EXAMPLES:"));
    assert!(generate.stdout.contains("context_bound"));
}

#[test]
fn completions_are_scripts_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete"),
        ("zsh", "#compdef lm-cli"),
        ("fish", "complete -c lm-cli"),
    ] {
        let run = lm_cli(&["completions", shell]);
        assert_eq!(run.code, Some(0), "{shell}: {}", run.stderr);
        assert!(run.stdout.contains(marker), "{shell}");
        assert!(run.stdout.contains("generate"), "{shell}");
    }
}
