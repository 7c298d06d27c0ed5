//! Hostile and mistaken input: every bad argument ends with a one-line
//! message naming it, exit code 2 (usage) or 1 (runtime), and never a panic;
//! a closed output pipe ends quietly.

use crate::common::{Cli, assert_contains, close_stdout_after};

#[test]
fn bad_arguments_name_themselves() {
    let toy = || Cli::toy("generate");
    let prompt = |subcommand: &str, model: &str, prompt: &str| {
        Cli::new(subcommand).model(model).opt("--prompt", prompt)
    };
    let x = |subcommand: &str, model: &str| prompt(subcommand, model, "x");
    let train = |options: &[&str]| Cli::new("train").args(options);
    let cases: Vec<(Cli, i32, &str)> = vec![
        (
            toy().opt("--temperature", -1),
            2,
            "temperature must be >= 0",
        ),
        (
            toy().opt("--temperature", "hot"),
            2,
            "'hot' is not a number",
        ),
        (toy().opt("--top-p", 0), 2, "top_p must be in (0, 1], got 0"),
        (
            toy().opt("--top-p", 1.5),
            2,
            "top_p must be in (0, 1], got 1.5",
        ),
        // `--top-k 0` is off (llama.cpp, HF): see `run_behaviour.rs`.
        (toy().opt("--top-k", "x"), 2, "'x' is not a number"),
        (toy().opt("--min-p", 2), 2, "min_p must be in [0, 1]"),
        (
            toy().opt("--repetition-penalty", 0),
            2,
            "repetition_penalty",
        ),
        (
            toy().opt("--truncate", "drop"),
            2,
            "not a truncation policy",
        ),
        (
            toy().opt("--num-beams", 2).opt("--stop", "x"),
            2,
            "--stop does not work with --num-beams",
        ),
        (toy().opt("--end-token", "cow"), 1, "end token 'cow'"),
        (
            toy().env("LM_KERNEL", "avx1024"),
            1,
            "LM_KERNEL: unknown kernel \"avx1024\"; kernels: portable, avx2, avxvnni, avx512",
        ),
        (
            toy().env("LM_PACK", "yes"),
            1,
            "LM_PACK: unknown packing \"yes\"; expected 0 (row-major), 1 (Q4_0, Q5_0 and Q8_0) or all",
        ),
        (
            toy().arg("--trace-prefixes"),
            2,
            "--trace-prefixes needs --json or --json-lines",
        ),
        // Refused before the prompt is echoed: nothing on stdout.
        (
            Cli::generate("And").opt("--stop", ""),
            2,
            "a stop string must not be empty",
        ),
        (x("generate", "gpt5"), 2, "unknown model spec 'gpt5'"),
        (x("generate", "count:"), 2, "needs a file"),
        (
            x("generate", "model.arpa"),
            2,
            "a count model is given as count:model.arpa",
        ),
        (Cli::new("generate").model("toy"), 2, "--prompt"),
        (
            x("generate", "count:/no/such.arpa"),
            1,
            "/no/such.arpa not found",
        ),
        (x("generate", "/no/such.gguf"), 1, "/no/such.gguf not found"),
        (
            prompt("generate", "toy", "<start> the zebra"),
            1,
            "unknown word 'zebra'",
        ),
        (prompt("generate", "toy", ""), 1, "the prompt is empty"),
        (
            prompt("generate", "toy", "the").arg("--chat"),
            1,
            "no chat template",
        ),
        (
            prompt("enumerate", "toy", "<start>").opt("--steps", 9),
            1,
            "7^9 continuations exceed",
        ),
        (
            prompt("enumerate", "toy", "<start>").opt("--steps", "x"),
            2,
            "--steps",
        ),
        (
            Cli::new("probs").opt("--logits", "2,x"),
            2,
            "logit 2 is 'x'",
        ),
        (
            Cli::new("probs").opt("--logits", "1,nan"),
            2,
            "logits must be finite",
        ),
        (
            Cli::new("probs").opt("--logits", "1,2").opt("--top-p", 1.5),
            2,
            "top_p",
        ),
        (
            Cli::new("score").model("toy").opt("--text", "the cat"),
            2,
            "--text scores a sentence with a count model",
        ),
        (
            prompt("score", "toy", "<start>").opt("--continuation", ""),
            1,
            "continuation is empty",
        ),
        (
            train(&["--corpus", "/no/such.txt", "--out", "/tmp/never.arpa"]),
            1,
            "/no/such.txt",
        ),
        (
            train(&["--corpus", "x", "--order", "0", "--out", "y"]),
            2,
            "--order must be between 1",
        ),
        (
            train(&["--corpus", "x", "--smoothing", "magic", "--out", "y"]),
            2,
            "magic",
        ),
        (
            toy().opt("--presence-penalty", "inf"),
            2,
            "--presence-penalty",
        ),
        (
            toy().opt("--frequency-penalty", "nan"),
            2,
            "--frequency-penalty",
        ),
        (toy().opt("--logit-bias", "3"), 2, "is not TOKEN=BIAS"),
        (toy().opt("--logit-bias", "3=inf"), 2, "finite or -inf"),
        (
            toy().opt("--logit-bias", "zebra=-1"),
            2,
            "--logit-bias: 'zebra' is not one token",
        ),
        (
            toy().opt("--logit-bias", "7=-1"),
            2,
            "--logit-bias: '7' is not one token",
        ),
        (
            Cli::new("generate")
                .model("toy")
                .opt("--file", "/no/such/prompt.txt"),
            1,
            "reading the prompt: /no/such/prompt.txt not found",
        ),
        (
            Cli::new("generate")
                .model("toy")
                .opt("--file", "x")
                .opt("--prompt", "y"),
            2,
            "--file",
        ),
        (
            Cli::new("tokenize")
                .model("toy")
                .opt("--text", "the")
                .arg("--chat"),
            1,
            "no chat template",
        ),
        (
            Cli::new("tokenize")
                .model("toy")
                .opt("--text", "the")
                .args(["--chat", "--no-parse-special"]),
            2,
            "--no-parse-special",
        ),
        (Cli::new("completions").arg("tcsh"), 2, "tcsh"),
        (Cli::new("frobnicate"), 2, "frobnicate"),
    ];
    for (cli, code, message) in cases {
        let run = cli.run();
        let args = cli.line();
        assert_eq!(run.code, Some(code), "lm-cli {args}: {}", run.stderr);
        let first = run.stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: "),
            "lm-cli {args}: {}",
            run.stderr
        );
        assert!(
            first.contains(message),
            "lm-cli {args}: {first:?} lacks {message:?}"
        );
        assert!(
            run.stderr.lines().count() <= 2,
            "lm-cli {args}: {}",
            run.stderr
        );
        assert!(
            !run.stderr.contains("panicked"),
            "lm-cli {args}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("RUST_BACKTRACE"), "lm-cli {args}");
        assert!(
            run.stdout.is_empty(),
            "lm-cli {args} printed {}",
            run.stdout
        );
    }
}

#[test]
fn smollm2_missing_says_how_to_fetch_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = Cli::new("generate")
        .model("smollm2")
        .opt("--prompt", "hi")
        .env("LM_MODELS_DIR", dir.path().display())
        .command()
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_contains(&stderr, "cargo xtask fetch-model smollm2");
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let child = Cli::generate("And God said")
        .seed(0)
        .n(400)
        .arg("--stream")
        .spawn();
    close_stdout_after(child, 1);
}

#[test]
fn no_arguments_print_the_help_on_stdout() {
    let run = Cli::bare().run();
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    assert!(run.stdout.starts_with("Autoregressive"), "{}", run.stdout);
    assert_contains(&run.stdout, "\nCommands:\n");
    assert_contains(&run.stdout, "MODELS (--model SPEC):");
}

#[test]
fn help_is_written_for_newcomers() {
    let run = Cli::new("--help").run();
    assert_eq!(run.code, Some(0));
    assert_contains(&run.stdout, "what comes next");
    assert!(run.stdout.contains("cargo xtask fetch-model NAME"));
    assert!(run.stdout.contains("gemma3-270m"));
    let generate = Cli::new("generate").arg("--help").run();
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
        let run = Cli::new("completions").arg(shell).run();
        assert_eq!(run.code, Some(0), "{shell}: {}", run.stderr);
        assert!(run.stdout.contains(marker), "{shell}");
        assert!(run.stdout.contains("generate"), "{shell}");
    }
}

#[test]
fn a_gguf_file_is_recognised_by_its_magic_bytes_not_its_name() {
    let fixture = crate::common::fixture("hostile/gguf/llama-missing-metadata.gguf");
    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("model.bin");
    std::fs::copy(&fixture, &renamed).unwrap();
    let run = |path: &std::path::Path| {
        let run = Cli::generate("x").model(path.display()).run();
        assert_eq!(run.code, Some(1), "{}", run.stderr);
        run.stderr.replace(&path.display().to_string(), "MODEL")
    };
    // The same GGUF error as under its .gguf name, not "unknown model spec".
    assert_eq!(run(&renamed), run(&fixture));
}
