//! On SmolLM2 (ignored without it): `temperature: 0` answers what
//! lm-decode's greedy `generate` gives (the loop `lm-cli generate --greedy`
//! runs), and concurrent streaming clients each get their solo output.

use std::num::NonZeroUsize;
use std::sync::OnceLock;

use lm::GgufModel;
use lm_decode::{GenerationConfig, SamplingConfig, generate};
use lm_serve::ServedText;
use serde_json::{Value, json};

use crate::common::{TestServer, post_body, smollm2_path};

fn smollm2() -> &'static GgufModel {
    static MODEL: OnceLock<GgufModel> = OnceLock::new();
    MODEL.get_or_init(|| lm::load_gguf(smollm2_path()).expect("SmolLM2 loads"))
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn temperature_zero_equals_greedy_generate() {
    let s = TestServer::smollm2(2);
    let reference = smollm2();
    for prompt in [
        "The capital of France is",
        "Once upon a time",
        "def fibonacci(n):",
    ] {
        let ids = ServedText::encode(&reference.text, prompt).unwrap();
        let config = GenerationConfig {
            max_new_tokens: 24,
            sampling: SamplingConfig::greedy(),
            end_tokens: reference.text.end_ids.clone(),
            prefill_chunk_len: NonZeroUsize::new(512),
            ..GenerationConfig::default()
        };
        let run = generate(
            &reference.decoder,
            &ids,
            &config,
            Some(&reference.text.tokenizer),
        )
        .unwrap();
        let (status, body) = s.post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 24, "temperature": 0}),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["text"], run.text.unwrap(), "{prompt}");
        assert_eq!(body["usage"]["completion_tokens"], run.tokens.len());
    }
}

fn stream_text(addr: std::net::SocketAddr, body: &Value) -> String {
    let response = post_body(addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(response.status, 200);
    assert_eq!(response.events().last().unwrap(), "[DONE]");
    response
        .chunks()
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn concurrent_streaming_chats_equal_their_solo_runs() {
    let s = TestServer::smollm2(8);
    let questions = [
        "What is Rust?",
        "Name a color.",
        "Count to five.",
        "What is 2+2?",
    ];
    let body = |i: usize| {
        json!({"messages": [{"role": "user", "content": questions[i % 4]}],
               "max_tokens": 24, "temperature": 0.8, "seed": i, "stream": true})
    };
    let solo: Vec<String> = (0..8).map(|i| stream_text(s.addr, &body(i))).collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (addr, b) = (s.addr, body(i));
                scope.spawn(move || stream_text(addr, &b))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, solo);
    assert!(solo.iter().all(|t| !t.is_empty()));
}
