//! `lm-cli serve --draft prompt-lookup`: the binary drafts for every request
//! (greedy answers unchanged, the drafting counters in `/metrics`) and
//! refuses a draft model, naming what it supports.

use crate::common::{Cli, assert_contains};
use crate::serve::{get, post, start_with};

/// A prompt whose greedy continuation the toy may copy, and one it may not
/// (within its context of 16 tokens).
const BODIES: [&str; 2] = [
    r#"{"prompt": "<start> the cat sat the cat sat", "max_tokens": 8, "temperature": 0}"#,
    r#"{"prompt": "<start> the dog", "max_tokens": 8, "temperature": 0}"#,
];

/// Each body's completion text from a server started with `cli`, and its
/// metrics afterwards.
fn answers(cli: Cli) -> (Vec<String>, String) {
    let (_served, addr) = start_with(cli);
    let texts = BODIES
        .iter()
        .map(|body| {
            let (status, answer) = post(&addr, "/v1/completions", body);
            assert_eq!(status, 200, "{answer}");
            answer["choices"][0]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    (texts, get(&addr, "/metrics"))
}

#[test]
fn serve_with_prompt_lookup_answers_greedy_requests_as_without_it() {
    let (plain, plain_metrics) = answers(Cli::new("serve").model("toy"));
    let (drafted, drafted_metrics) = answers(
        Cli::new("serve")
            .model("toy")
            .opt("--draft", "prompt-lookup")
            .opt("--draft-tokens", 4),
    );
    assert_eq!(drafted, plain);
    assert!(plain.iter().all(|text| !text.is_empty()), "{plain:?}");
    for name in [
        "lm_spec_decode_draft_tokens_total",
        "lm_spec_decode_accepted_tokens_total",
    ] {
        assert_contains(&drafted_metrics, name);
    }
    assert_contains(&plain_metrics, "lm_spec_decode_draft_tokens_total 0\n");
}

#[test]
fn serve_refuses_a_draft_model_naming_prompt_lookup() {
    let run = Cli::new("serve")
        .model("toy")
        .opt("--draft", "toy")
        .opt("--port", 0)
        .run();
    assert_ne!(run.code, Some(0), "{}", run.stderr);
    assert_contains(
        &run.stderr,
        "--draft toy: serve drafts with prompt-lookup only",
    );
}
