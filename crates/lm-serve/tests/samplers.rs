//! The samplers beyond OpenAI's (issue 38) in requests: llama-server's
//! names (`dry_*`, `mirostat*`, `dynatemp_*`, `samplers`) and HF's
//! (`epsilon_cutoff`, `eta_cutoff`, `no_repeat_ngram_size`) are read, a
//! value out of range is a 400 naming its field, and every request kind
//! (completion, chat, streamed, `n` > 1) gives lm-decode's loop the
//! detokenizer DRY matches its sequence breakers in. The toy decoder
//! needs no download; the SmolLM2 tests are ignored without it.

use lm_serve::ServeConfig;
use serde_json::{Value, json};

use crate::common::{TestServer, assert_error_message, post_body};

fn toy() -> TestServer {
    TestServer::toy(ServeConfig::default())
}

/// `fields` added to a completion request's body.
fn completion(prompt: &str, fields: Value) -> Value {
    let mut body = json!({"prompt": prompt, "max_tokens": 12});
    for (key, value) in fields.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

#[test]
fn out_of_range_settings_are_400s_naming_the_field() {
    let s = toy();
    let cases = [
        (
            json!({"samplers": "top_k;nucleus2"}),
            "samplers",
            "nucleus2",
        ),
        (
            json!({"samplers": ["top_k", "temperature", "top_k"]}),
            "samplers",
            "named twice",
        ),
        (json!({"mirostat": 3}), "mirostat", "between 0 and 2"),
        (json!({"dry_base": 0.5}), "dry_base", "between 1 and 100"),
        (json!({"epsilon_cutoff": 1.5}), "epsilon_cutoff", "got 1.5"),
        (
            json!({"dry_multiplier": 0.8, "dry_sequence_breakers": vec!["\n"; 33]}),
            "dry_sequence_breakers",
            "at most 32",
        ),
        (
            json!({"dry_sequence_breakers": ["x".repeat(41)]}),
            "dry_sequence_breakers",
            "1 to 40 bytes",
        ),
        (
            json!({"samplers": vec!["top_k"; 10_000]}),
            "samplers",
            "at most 16",
        ),
    ];
    for (fields, param, part) in cases {
        let (status, body) = s.post(
            "/v1/completions",
            &completion("<start> the", fields.clone()),
        );
        assert_eq!(status, 400, "{fields}: {body}");
        assert_eq!(body["error"]["param"], param, "{body}");
        assert_error_message(&body, part);
        let mut chat = fields.clone();
        chat["messages"] = json!([{"role": "user", "content": "the"}]);
        let (status, body) = s.post("/v1/chat/completions", &chat);
        assert_eq!(
            (status, &body["error"]["param"]),
            (400, &json!(param)),
            "{body}"
        );
    }
    // Still serving.
    let (status, _) = s.post("/v1/completions", &completion("<start>", json!({})));
    assert_eq!(status, 200);
}

#[test]
fn samplers_as_a_string_and_as_an_array_give_the_same_text() {
    let s = toy();
    let run = |samplers: Value| {
        let fields = json!({"samplers": samplers, "top_k": 3, "min_p": 0.1,
                            "temperature": 1.5, "seed": 4});
        let (status, body) = s.post("/v1/completions", &completion("<start> the", fields));
        assert_eq!(status, 200, "{body}");
        body["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    let text = run(json!("top_k;min_p;temperature"));
    assert_eq!(run(json!(["top_k", "min_p", "temperature"])), text);
    assert_eq!(run(json!("top_k, min_p, temperature")), text);
    // llama-server's letters (its web UI sends "edkypmxt").
    assert_eq!(run(json!("kmt")), text);
    run(json!("edkypmxt"));
}

/// On the toy decoder: every request kind takes DRY (with its default
/// breakers, matched in the toy's text) and the other new stages.
#[test]
fn every_request_kind_takes_the_new_stages_on_the_toy() {
    let s = toy();
    let fields = json!({"dry_multiplier": 0.8, "mirostat": 2, "xtc_probability": 0.5,
                        "no_repeat_ngram_size": 3, "seed": 1});
    every_request_kind(&s, "<start> the", "the", fields);
}

/// Completion, chat, streamed chat and `n: 2` with `fields`: each a 200
/// with text.
fn every_request_kind(s: &TestServer, prompt: &str, message: &str, fields: Value) {
    let (status, body) = s.post("/v1/completions", &completion(prompt, fields.clone()));
    assert_eq!(status, 200, "{body}");
    let mut many = completion(prompt, fields.clone());
    many["n"] = json!(2);
    let (status, body) = s.post("/v1/completions", &many);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"].as_array().unwrap().len(), 2);
    let mut chat = fields;
    chat["messages"] = json!([{"role": "user", "content": message}]);
    chat["max_tokens"] = json!(12);
    let (status, body) = s.post("/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{body}");
    chat["stream"] = json!(true);
    let response = post_body(s.addr, "/v1/chat/completions", &chat.to_string());
    assert_eq!(response.status, 200);
    assert_eq!(response.events().last().unwrap(), "[DONE]");
    assert!(
        response.chunks().iter().all(|c| c.get("error").is_none()),
        "{:?}",
        response.chunks()
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn dry_mirostat_and_xtc_with_a_seed_give_the_same_text_twice_on_smollm2() {
    let s = TestServer::smollm2(4);
    let body = completion(
        "The best thing about summer is",
        json!({"dry_multiplier": 0.8, "mirostat": 2, "xtc_probability": 0.5, "seed": 1,
               "max_tokens": 24}),
    );
    let (status, first) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{first}");
    let (status, second) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{second}");
    let text = first["choices"][0]["text"].as_str().unwrap();
    assert!(!text.is_empty(), "{first}");
    assert_eq!(second["choices"][0]["text"], text);
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn every_request_kind_takes_dry_on_smollm2() {
    let s = TestServer::smollm2(4);
    let fields = json!({"dry_multiplier": 0.8, "dry_sequence_breakers": ["\n", "Bob:"],
                        "mirostat": 2, "samplers": "penalties;dry;top_k;temperature", "seed": 3});
    every_request_kind(&s, "Once upon a time", "Name a color.", fields.clone());
    let mut defaults = fields;
    defaults
        .as_object_mut()
        .unwrap()
        .remove("dry_sequence_breakers");
    every_request_kind(&s, "Once upon a time", "Name a color.", defaults);
}

/// DRY is applied, not only accepted: greedy decoding of a text that
/// repeats continues the repeat (", 3, 1, 2, 3, 1,"), and DRY's penalty on
/// the token that would extend it changes the answer.
#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn dry_changes_the_greedy_continuation_of_a_repeat_on_smollm2() {
    let s = TestServer::smollm2(2);
    let prompt = "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2";
    let run = |fields: Value| {
        let mut body = completion(prompt, fields);
        body["temperature"] = json!(0);
        body["max_tokens"] = json!(16);
        let (status, body) = s.post("/v1/completions", &body);
        assert_eq!(status, 200, "{body}");
        body["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    let plain = run(json!({}));
    assert!(
        plain.starts_with(", 3, 1, 2"),
        "greedy continues the repeat: {plain:?}"
    );
    // llama.cpp's DRY with these settings (llama-cpp-python 0.3.36, Q8_0,
    // greedy) answers "\n\nThe result is:\n\n(1, 1, 1".
    let dry = run(json!({"dry_multiplier": 2.0, "dry_allowed_length": 2,
                         "dry_penalty_last_n": 64}));
    assert_ne!(dry, plain, "DRY left the repeat alone");
}
