//! `lm-cli` on SmolLM2-135M-Instruct, when the model file is present (else
//! each test prints a skip message and returns): the tokenizer against
//! llama.cpp's ids, chat generation, and determinism across thread counts.

mod common;

use common::{command, fixture, ids, json, smollm2_or_skip};

#[test]
fn tokenize_matches_llama_cpp_ids() {
    let Some(_) = smollm2_or_skip("tokenize_matches_llama_cpp_ids") else {
        return;
    };
    let reference =
        std::fs::read_to_string(fixture("tokenize/smollm2_reference_ids.json")).unwrap();
    let cases: Vec<serde_json::Value> = serde_json::from_str(&reference).unwrap();
    for case in cases.iter().take(8) {
        let text = case["text"].as_str().unwrap();
        if text.is_empty() {
            continue;
        }
        let report = json(&["tokenize", "--model", "smollm2", "--text", text, "--json"]);
        assert_eq!(ids(&report["ids"]), ids(&case["ids"]), "{text:?}");
    }
}

#[test]
fn greedy_chat_generation_is_deterministic_across_threads() {
    let Some(_) = smollm2_or_skip("greedy_chat_generation_is_deterministic_across_threads") else {
        return;
    };
    let run = |threads: &str| {
        json(&[
            "generate",
            "--model",
            "smollm2",
            "--chat",
            "--prompt",
            "What is 2+2?",
            "-n",
            "12",
            "--temperature",
            "0.7",
            "--seed",
            "1",
            "--json",
            "--no-timing",
            "--threads",
            threads,
        ])
    };
    let one = run("1");
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
    assert_eq!(one.to_string(), run("2").to_string());
    let generated = ids(&one["ids"]);
    assert!(!generated.is_empty() && generated.len() <= 12);
    if one["stop_reason"] == "end_token" {
        assert!(end_tokens.contains(generated.last().unwrap()));
    }
}

#[test]
fn plain_prompt_continues_with_paris() {
    let Some(_) = smollm2_or_skip("plain_prompt_continues_with_paris") else {
        return;
    };
    let report = json(&[
        "generate",
        "--model",
        "smollm2",
        "--prompt",
        "The capital of France is",
        "--greedy",
        "-n",
        "2",
        "--json",
    ]);
    assert_eq!(ids(&report["prompt_ids"]), vec![504, 3575, 282, 4649, 314]);
    assert!(
        report["text"].as_str().unwrap().starts_with(" Paris"),
        "{}",
        report["text"]
    );
    let timing = &report["timing"];
    assert_eq!(timing["prefill_tokens"], 5);
    assert_eq!(timing["decode_tokens"], 1);
}

#[test]
fn chat_answers_each_line_of_stdin() {
    let Some(_) = smollm2_or_skip("chat_answers_each_line_of_stdin") else {
        return;
    };
    use std::io::Write;
    let mut child = command(&[
        "chat",
        "--model",
        "smollm2",
        "-n",
        "8",
        "--temperature",
        "0",
    ])
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
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
