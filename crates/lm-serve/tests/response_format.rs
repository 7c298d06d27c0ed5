//! OpenAI's `response_format` on SmolLM2 (ignored without it): a
//! `json_schema` answer parses and validates (checked with the `jsonschema`
//! crate, not the engine that enforced it), whole, streamed and sampled;
//! `json_object` gives an object; a schema the engine refuses is a 400
//! quoting it. On the toy decoder (no download): the bound on compiled
//! formats alive at once.

use lm::OutputFormat;
use lm_serve::ServeConfig;
use serde_json::{Value, json};

use crate::common::{TestServer, ToyText, post_body, smollm2_path, wait_for};

fn server() -> TestServer {
    let lm::GgufModel { decoder, text, .. } = lm::load_gguf(smollm2_path()).unwrap();
    TestServer::start(
        decoder,
        text,
        ServeConfig {
            parallel: 3,
            ..ServeConfig::default()
        },
    )
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "age", "languages"],
        "additionalProperties": false
    })
}

fn chat_body(schema: &Value) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "max_tokens": 120,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "person", "schema": schema, "strict": true}},
    })
}

/// Parses `text` and validates it against `schema`, naming what failed.
fn assert_valid(schema: &Value, text: &str) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{text}: {errors:?}");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn a_json_schema_answer_parses_and_validates() {
    let s = server();
    let schema = person_schema();
    let mut greedy = chat_body(&schema);
    greedy["temperature"] = json!(0);
    let (status, body) = s.post("/v1/chat/completions", &greedy);
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    let whole = choice["message"]["content"].as_str().unwrap().to_owned();
    assert_valid(&schema, &whole);

    // Streamed: the same text in pieces.
    greedy["stream"] = json!(true);
    let response = post_body(s.addr, "/v1/chat/completions", &greedy.to_string());
    assert_eq!(response.status, 200);
    let chunks = response.chunks();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, whole);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    // Sampled, three choices from one compiled constraint.
    let mut sampled = chat_body(&schema);
    sampled["temperature"] = json!(1.0);
    sampled["seed"] = json!(3);
    sampled["n"] = json!(3);
    let (status, body) = s.post("/v1/chat/completions", &sampled);
    assert_eq!(status, 200, "{body}");
    for choice in body["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "stop", "{body}");
        assert_valid(&schema, choice["message"]["content"].as_str().unwrap());
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn json_object_gives_a_json_object() {
    let s = server();
    // Greedy ends with the object's `}`: the constraint is complete
    // (lm-decode's `constraint_complete`), which finishes with "stop".
    let (status, body) = s.post(
        "/v1/completions",
        &json!({"prompt": "The JSON {\"city\": \"Paris\", \"country\": \"France\"} and the JSON",
                "max_tokens": 60, "temperature": 0, "response_format": {"type": "json_object"}}),
    );
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    let text = choice["text"].as_str().unwrap();
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    assert!(value.is_object(), "{text}");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn a_schema_the_engine_refuses_is_a_400_quoting_it() {
    let s = server();
    for schema in [
        json!({"type": "strin"}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
    ] {
        let engine = OutputFormat::JsonSchema(schema.clone())
            .check()
            .unwrap_err()
            .to_string();
        let (status, body) = s.post("/v1/chat/completions", &chat_body(&schema));
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "response_format");
        assert_eq!(
            body["error"]["message"],
            format!("'response_format': {engine}")
        );
    }
    // The server still answers.
    let (status, _) = s.post(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(status, 200);
}

/// The toy's text side, with a "compiler" for any format: the toy sentence
/// `the cat` (a `SequenceChoice`), so compiled formats can be counted
/// without a tokenizer's vocabulary.
struct ToyFormats;

impl lm_serve::ServedText for ToyFormats {
    fn detokenizer(&self) -> &dyn lm_core::Detokenize {
        ToyText.detokenizer()
    }
    fn encode(&self, text: &str) -> Result<Vec<lm_core::TokenId>, lm_serve::TextFailure> {
        ToyText.encode(text)
    }
    fn chat_prompt(
        &self,
        messages: &[lm_tokenize::Message],
    ) -> Result<String, lm_serve::TextFailure> {
        ToyText.chat_prompt(messages)
    }
    fn end_tokens(&self) -> Vec<lm_core::TokenId> {
        ToyText.end_tokens()
    }
    fn output_constraint(
        &self,
        _format: &OutputFormat,
        vocab_size: usize,
    ) -> Result<lm_decode::OutputConstraint, lm_serve::OutputFormatError> {
        let the_cat = lm_core::SequenceChoice::new(vocab_size, vec![vec![1, 2]]).unwrap();
        Ok(lm_decode::OutputConstraint::new(the_cat))
    }
}

/// A completion asking for a schema of its own (`maximum: n`).
fn schema_body(n: usize) -> String {
    json!({
        "prompt": "<start>", "max_tokens": 4, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"maximum": n}}}
    })
    .to_string()
}

/// Sends `schemas` at once to a server whose forward passes wait at a
/// closed gate; returns their threads once all `running` are generating.
fn hold(
    s: &TestServer,
    schemas: std::ops::Range<usize>,
    running: f64,
) -> Vec<std::thread::JoinHandle<u16>> {
    let handles = schemas
        .map(|n| {
            let addr = s.addr;
            std::thread::spawn(move || post_body(addr, "/v1/completions", &schema_body(n)).status)
        })
        .collect();
    wait_for("the requests to run", || {
        s.metric("lm_active_sequences") == running
    });
    handles
}

/// Regression (issue 33): 32 distinct schemas at once were all compiled
/// (3.5 GB on Gemma 3, 1.28 GB still held afterwards); only the queue
/// bounded them. Now at most `--max-formats` compiled formats are alive:
/// with 3 held by running requests, a 4th distinct schema is a 429 with
/// `Retry-After`; once they finish, what they held is freed (3 new
/// distinct schemas run at once again, each one letting go of a kept one).
#[test]
fn distinct_formats_beyond_the_limit_are_429_and_finished_ones_are_freed() {
    let config = ServeConfig {
        parallel: 4,
        max_formats: 3,
        ..ServeConfig::default()
    };
    let (s, gate) = TestServer::gated_toy(ToyFormats, config);
    for round in 0..2 {
        gate.close();
        let base = round * 10;
        let held = hold(&s, base..base + 3, 3.0);
        let r = post_body(s.addr, "/v1/completions", &schema_body(base + 3));
        assert_eq!(r.status, 429, "round {round}");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.json()["error"]["param"], "response_format");
        // A schema already compiled is no new format: it runs.
        let again = hold(&s, base..base + 1, 4.0);
        gate.open();
        for handle in held.into_iter().chain(again) {
            assert_eq!(handle.join().unwrap(), 200, "round {round}");
        }
        wait_for("the requests to end", || {
            s.metric("lm_active_sequences") == 0.0
        });
    }
}
