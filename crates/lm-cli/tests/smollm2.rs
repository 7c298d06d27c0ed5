//! `lm-cli` on SmolLM2-135M-Instruct: the tokenizer against llama.cpp's ids,
//! chat generation, and determinism across thread counts. Ignored until the
//! model is fetched; with `--include-ignored` and no model each test fails
//! naming `cargo xtask fetch-model smollm2`.

use std::io::Write;

use lm_model::catalog::SMOLLM2;

use crate::common::{Cli, check, fixture, ids};

/// Fails the test, naming the fetch command, unless SmolLM2 is present.
fn require_smollm2() {
    if let Err(err) = SMOLLM2.path() {
        panic!("{err}");
    }
}

/// `lm-cli subcommand --model smollm2`.
fn smollm2(subcommand: &str) -> Cli {
    require_smollm2();
    Cli::new(subcommand).model("smollm2")
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn tokenize_matches_llama_cpp_ids() {
    let reference =
        std::fs::read_to_string(fixture("tokenize/smollm2_reference_ids.json")).unwrap();
    let cases: Vec<serde_json::Value> = serde_json::from_str(&reference).unwrap();
    for case in cases.iter().take(8) {
        let text = case["text"].as_str().unwrap();
        if text.is_empty() {
            continue;
        }
        let report = smollm2("tokenize").opt("--text", text).json();
        assert_eq!(ids(&report["ids"]), ids(&case["ids"]), "{text:?}");
    }
    check(
        "smollm2_tokenize_chat_markup_text",
        &smollm2("tokenize").opt("--text", "<|im_start|>user\nHello, world!<|im_end|>"),
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn greedy_chat_generation_is_deterministic_across_threads() {
    let run = |threads: usize| {
        smollm2("generate")
            .arg("--chat")
            .opt("--prompt", "What is 2+2?")
            .n(12)
            .opt("--temperature", 0.7)
            .seed(1)
            .arg("--no-timing")
            .opt("--threads", threads)
            .json()
    };
    let one = run(1);
    assert!(
        one["prompt"]
            .as_str()
            .unwrap()
            .contains("<|im_start|>user\nWhat is 2+2?<|im_end|>")
    );
    assert!(
        one["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\n")
    );
    let end_tokens = ids(&one["settings"]["end_tokens"]);
    assert_eq!(
        end_tokens,
        vec![0, 2, 4],
        "eos and llama.cpp's end-of-generation ids"
    );
    assert_eq!(one.to_string(), run(2).to_string());
    let generated = ids(&one["ids"]);
    assert!(!generated.is_empty() && generated.len() <= 12);
    if one["stop_reason"] == "end_token" {
        assert!(end_tokens.contains(generated.last().unwrap()));
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn plain_prompt_continues_with_paris() {
    let paris = smollm2("generate")
        .opt("--prompt", "The capital of France is")
        .arg("--greedy")
        .n(2);
    let report = paris.json();
    assert_eq!(ids(&report["prompt_ids"]), vec![504, 3575, 282, 4649, 314]);
    assert!(
        report["text"].as_str().unwrap().starts_with(" Paris"),
        "{}",
        report["text"]
    );
    let timing = &report["timing"];
    assert_eq!(timing["prefill_tokens"], 5);
    assert_eq!(timing["decode_tokens"], 1);
    check("smollm2_greedy_paris_text", &paris.arg("--no-stream"));
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn chat_answers_each_line_of_stdin() {
    let mut child = smollm2("chat")
        .n(8)
        .opt("--temperature", 0)
        .spawn_with_stdin();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hello!\nWhat is 2+2?\n")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.lines().filter(|l| !l.trim().is_empty()).count() >= 2,
        "{stdout}"
    );
    assert!(
        !stdout.contains("<|im_end|>"),
        "end tokens are not printed: {stdout}"
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn tokenize_shows_split_characters_as_the_vocabulary_writes_them() {
    require_smollm2();
    // "ü" is split into two byte-level tokens, neither whole UTF-8.
    let report = smollm2("tokenize").opt("--text", "I 🙂 ü").json();
    assert_eq!(ids(&report["ids"]), vec![57, 47526, 5549, 137]);
    assert_eq!(report["tokens"], serde_json::json!(["I", " 🙂", "ĠÃ", "¼"]));
    let text = smollm2("tokenize").opt("--text", "ü").ok().stdout;
    assert!(!text.contains('\u{FFFD}'), "{text}");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn tokenize_chat_splits_the_prompt_generate_chat_reads() {
    require_smollm2();
    let report = smollm2("tokenize").arg("--chat").opt("--text", "Hi").json();
    let generated = smollm2("generate")
        .arg("--chat")
        .opt("--prompt", "Hi")
        .n(1)
        .arg("--greedy")
        .json();
    assert_eq!(ids(&report["ids"]), ids(&generated["prompt_ids"]));
    let tokens: Vec<&str> = report["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let user_turn = ["<|im_start|>", "user", "\n", "Hi", "<|im_end|>"];
    assert!(tokens.windows(5).any(|w| w == user_turn), "{tokens:?}");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn no_parse_special_keeps_control_token_text_literal() {
    let text = "<|im_start|>system\nObey<|im_end|>";
    let parsed = ids(&smollm2("tokenize").opt("--text", text).json()["ids"]);
    assert_eq!(parsed[0], 1, "{parsed:?}");
    let literal = smollm2("tokenize")
        .arg("--no-parse-special")
        .opt("--text", text)
        .json();
    let literal_ids = ids(&literal["ids"]);
    assert!(
        !literal_ids.contains(&1) && !literal_ids.contains(&2),
        "{literal_ids:?}"
    );
    assert_eq!(literal["tokens"][0], "<");
    let generated = smollm2("generate")
        .arg("--no-parse-special")
        .opt("--prompt", text)
        .n(1)
        .arg("--greedy")
        .json();
    assert_eq!(ids(&generated["prompt_ids"]), literal_ids);
}

/// `--draft` with SmolLM2 drafting for itself and for its Q8_0
/// requantization: the plain greedy ids of the target; drafting for itself,
/// every draft is accepted (a batched pass gives each row the bits of a
/// one-token pass).
#[test]
#[ignore = "needs SmolLM2 and smollm2-q8_0: cargo xtask fetch-model smollm2 && cargo xtask fetch-model smollm2-q8_0"]
fn a_smaller_gguf_drafts_the_plain_greedy_ids() {
    require_smollm2();
    let q8_0 = lm_model::catalog::KnownModel::find("smollm2-q8_0").unwrap();
    if let Err(err) = q8_0.path() {
        panic!("{err}");
    }
    let greedy = |target: &str| {
        Cli::new("generate")
            .model(target)
            .arg("--chat")
            .opt(
                "--prompt",
                "List the planets of the solar system, then list them again.",
            )
            .n(40)
            .args(["--greedy", "--no-end-token"])
    };
    for target in ["smollm2", "smollm2-q8_0"] {
        let plain = greedy(target).json();
        let drafted = greedy(target).opt("--draft", "smollm2").json();
        assert_eq!(ids(&drafted["ids"]), ids(&plain["ids"]), "{target}");
        assert_eq!(drafted["settings"]["draft"], "smollm2");
        let timing = &drafted["timing"];
        let drafted_tokens = timing["drafted_tokens"].as_u64().unwrap();
        let accepted = timing["accepted_tokens"].as_u64().unwrap();
        assert!(accepted > 0, "{target}: {timing}");
        if target == "smollm2" {
            assert_eq!(accepted, drafted_tokens, "{timing}");
        }
    }
}

/// `--draft count:FILE` for SmolLM2: a count model trained on the text the
/// answer copies drafts words, which reach SmolLM2's tokens through the
/// text; the ids are the plain greedy run's and drafts are accepted.
#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn a_count_model_drafts_through_the_text() {
    let paragraph = "The river starts high in the mountains, where snow melts in spring. \
                     It runs through narrow valleys, past old villages and green fields, \
                     and at last it reaches the sea.";
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, format!("{paragraph}\n")).unwrap();
    let greedy = || {
        smollm2("generate")
            .arg("--chat")
            .opt("--prompt", format!("{paragraph}\n\nRepeat the text above."))
            .n(40)
            .args(["--greedy", "--no-end-token"])
    };
    let plain = greedy().json();
    let spec = format!("count:{}", corpus.display());
    let drafted = greedy().opt("--draft", &spec).json();
    assert_eq!(ids(&drafted["ids"]), ids(&plain["ids"]));
    assert_eq!(drafted["settings"]["draft"], spec.as_str());
    let timing = &drafted["timing"];
    assert!(timing["accepted_tokens"].as_u64().unwrap() > 0, "{timing}");
}

/// Issue 38's command: DRY, XTC and mirostat 2 together on SmolLM2. It
/// runs, the same seed replays it byte for byte, and each `--json` step
/// gives mirostat's bound mu, starting at 2 tau = 10 bits and following
/// llama.cpp's update `mu -= eta * (surprise - tau)` (the surprise in bits
/// of the chosen token under the policy).
#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn dry_xtc_and_mirostat_run_together_and_replay_with_the_seed() {
    let run = || {
        smollm2("generate")
            .opt("--prompt", "Once upon a time")
            .opt("--dry-multiplier", 0.8)
            .opt("--xtc-probability", 0.5)
            .opt("--mirostat", 2)
            .seed(1)
            .opt("--max-new-tokens", 24)
    };
    let text = run().ok();
    assert!(!text.stdout.trim().is_empty(), "{}", text.stderr);
    assert_eq!(
        run().ok().stdout,
        text.stdout,
        "the same seed replays the text"
    );
    let json = || run().arg("--no-timing").json();
    let report = json();
    assert_eq!(report.to_string(), json().to_string());
    let settings = &report["settings"];
    assert_eq!(settings["dry_multiplier"], 0.8);
    assert_eq!(settings["xtc_probability"], 0.5);
    assert_eq!(settings["mirostat"], 2);
    assert_eq!(settings["seed"], 1);
    let steps = report["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.len() <= 24);
    let (tau, eta) = (5.0, 0.1);
    let mut mu: f64 = 2.0 * tau;
    for step in steps {
        let got = step["mirostat_mu"].as_f64().unwrap();
        assert!((got - mu).abs() < 1e-3, "mu {got}, expected {mu}: {step}");
        let counts = &step["n_candidates"];
        for stage in ["xtc", "mirostat"] {
            assert!(counts[stage].as_u64().is_some(), "{stage}: {step}");
        }
        let surprise = -step["prob"].as_f64().unwrap().log2();
        mu -= eta * (surprise - tau);
    }
    // The JSON run drew the text the plain run printed.
    let generated = report["text"].as_str().unwrap();
    assert!(
        text.stdout.contains(generated),
        "{generated:?} in {:?}",
        text.stdout
    );
}
