//! `lm-cli` on Gemma 3 270M's SentencePiece tokenizer (read without its
//! weights): `tokenize` gives llama.cpp's ids, and `chat` refuses the base
//! model, naming the file and `generate`. Ignored until the model is
//! fetched; with `--include-ignored` and no model each test fails naming
//! `cargo xtask fetch-model gemma3-270m`.

use lm_model::catalog::GEMMA3_270M;

use crate::common::{Cli, assert_contains, ids};

/// `lm-cli subcommand --model <the Gemma 3 file>` (panics with the fetch
/// command when the file is missing).
fn gemma3(subcommand: &str) -> (Cli, String) {
    let path = GEMMA3_270M.path().unwrap_or_else(|err| panic!("{err}"));
    let path = path.display().to_string();
    (Cli::new(subcommand).model(&path), path)
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn tokenize_gives_llama_cpps_ids_with_bos() {
    let (cli, _) = gemma3("tokenize");
    let report = cli
        .opt("--text", "<start_of_turn>user\nThe capital of France is")
        .json();
    // llama.cpp: [2, 105, 2364, 107] then "The capital of France is".
    assert_eq!(
        ids(&report["ids"]),
        [2, 105, 2364, 107, 818, 5279, 529, 7001, 563]
    );
    // Each token's text, '▁' read as a space.
    assert_eq!(report["tokens"][1], "<start_of_turn>");
    assert_eq!(report["tokens"][5], " capital");
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn chat_refuses_a_base_model_naming_the_file_and_generate() {
    let (cli, path) = gemma3("chat");
    let run = cli.run_with_stdin("hello\n");
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let message = run.stderr.trim();
    assert!(message.starts_with("error: "), "{message}");
    assert_contains(message, &format!("{path} has no chat template"));
    assert_contains(message, &format!("lm-cli generate --model {path}"));
}

/// The README's Gemma 3 command, by name: llama.cpp's greedy continuation
/// (the greedy ids of `fixtures/gemma3/conformance.json`) up to its twelfth
/// token, where the exact model's top two are 0.014 apart
/// (`conformance.exact.json`) and rounding picks " largest" (llama.cpp, the
/// row-major kernels) or " capital" (the K-quant panels).
#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn the_readme_command_continues_as_llama_cpp_does() {
    GEMMA3_270M.path().unwrap_or_else(|err| panic!("{err}"));
    let run = Cli::new("generate")
        .model("gemma3-270m")
        .opt("--prompt", "The capital of France is")
        .arg("--greedy")
        .n(16)
        .run();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.starts_with(
            "The capital of France is the capital of the country of France. It is the"
        ),
        "{}",
        run.stdout
    );
}
