//! Speculative decoding in the server (`ServeConfig::draft`, `lm-cli serve
//! --draft prompt-lookup`), on SmolLM2 (ignored without it): 16 concurrent
//! greedy requests get the ids they get without drafting, while `/metrics`
//! shows drafts accepted; a seeded sampled request gets what lm-decode's
//! `generate_speculative` gives (the loop `lm-cli generate --draft` runs).

use std::num::NonZeroUsize;

use lm_decode::{GenerationConfig, PromptLookup, SamplingConfig, generate_speculative};
use lm_serve::{ServeConfig, ServedText, SpeculativeDrafter};
use serde_json::{Value, json};

use crate::common::{TestServer, post_body, smollm2_path};

const DRAFT_TOKENS: usize = 8;

fn server(draft: bool) -> TestServer {
    let config = ServeConfig {
        parallel: 16,
        draft: draft.then_some(SpeculativeDrafter::PromptLookup {
            max_tokens: NonZeroUsize::new(DRAFT_TOKENS).unwrap(),
        }),
        ..ServeConfig::default()
    };
    TestServer::gguf(smollm2_path(), config)
}

/// Prompts whose continuations copy earlier text (prompt lookup finds
/// drafts) and ones that write new text (it finds few or none).
const PROMPTS: [&str; 8] = [
    "Repeat after me: the quick brown fox jumps over the lazy dog. \
     The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Monday, Tuesday, Wednesday, Monday, Tuesday, Wednesday, Monday,",
    "Once upon a time",
    "The capital of France is",
    "Write a haiku about the sea.",
    "Rust is a programming language that",
];

/// The ids of an answer's one choice, from its `lm_trace` (whole or
/// streamed), and how many stream chunks carried a token.
fn ids_of(addr: std::net::SocketAddr, body: &Value) -> (Vec<u64>, usize) {
    let response = post_body(addr, "/v1/completions", &body.to_string());
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    let (choices, n_chunks): (Vec<Value>, usize) = if body["stream"] == json!(true) {
        let chunks = response.chunks();
        let with_trace: Vec<Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0).cloned())
            .filter(|c| c.get("lm_trace").is_some_and(|t| !t.is_null()))
            .collect();
        let n = with_trace.len();
        (with_trace, n)
    } else {
        (vec![response.json()["choices"][0].clone()], 0)
    };
    let ids = choices
        .iter()
        .flat_map(|c| c["lm_trace"].as_array().cloned().unwrap_or_default())
        .map(|entry| entry["id"].as_u64().unwrap())
        .collect();
    (ids, n_chunks)
}

/// The 16 requests: each prompt twice, once whole and once streamed.
fn bodies() -> Vec<Value> {
    (0..16)
        .map(|i| {
            json!({"prompt": PROMPTS[i % PROMPTS.len()], "max_tokens": 40, "temperature": 0,
                   "lm_trace": true, "stream": i >= PROMPTS.len()})
        })
        .collect()
}

/// Sends every body at once; the ids and token chunks of each answer.
fn concurrently(server: &TestServer, bodies: &[Value]) -> Vec<(Vec<u64>, usize)> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|body| scope.spawn(|| ids_of(server.addr, body)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn prompt_lookup_keeps_the_ids_of_16_concurrent_greedy_requests() {
    let bodies = bodies();
    let plain = {
        let server = server(false);
        let answers = concurrently(&server, &bodies);
        assert_eq!(server.metric("lm_spec_decode_draft_tokens_total"), 0.0);
        answers
    };
    let server = server(true);
    let drafted = concurrently(&server, &bodies);
    for (i, ((plain_ids, _), (drafted_ids, n_chunks))) in plain.iter().zip(&drafted).enumerate() {
        assert!(!plain_ids.is_empty(), "request {i}");
        assert_eq!(drafted_ids, plain_ids, "request {i}: {}", bodies[i]);
        if bodies[i]["stream"] == json!(true) {
            // Each accepted token is a chunk of its own, in order.
            assert_eq!(*n_chunks, drafted_ids.len(), "request {i}");
        }
    }
    let n_drafted = server.metric("lm_spec_decode_draft_tokens_total");
    let n_accepted = server.metric("lm_spec_decode_accepted_tokens_total");
    let n_passes = server.metric("lm_spec_decode_verification_passes_total");
    eprintln!("drafted {n_drafted}, accepted {n_accepted}, in {n_passes} verification passes");
    assert!(n_accepted > 0.0, "no draft was accepted: drafting is off");
    assert!(n_accepted <= n_drafted);
    assert!(n_passes > 0.0 && n_passes <= n_drafted);
    let n_generated = server.metric("lm_generation_tokens_total");
    assert_eq!(
        n_generated,
        drafted.iter().map(|(ids, _)| ids.len()).sum::<usize>() as f64
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn seeded_sampled_requests_equal_generate_speculative() {
    let model = lm::load_gguf(smollm2_path()).expect("SmolLM2 loads");
    let server = server(true);
    let (temperature, seed) = (0.7, 7);
    let mut n_accepted = 0;
    // The prompts that copy: prompt lookup drafts for them.
    for prompt in &PROMPTS[..4] {
        let ids = ServedText::encode(&model.text, prompt).unwrap();
        let config = GenerationConfig {
            max_new_tokens: 40,
            sampling: SamplingConfig {
                temperature,
                seed,
                ..SamplingConfig::default()
            },
            end_tokens: model.text.end_ids.clone(),
            prefill_chunk_len: NonZeroUsize::new(512),
            ..GenerationConfig::default()
        };
        let (run, stats) = generate_speculative(
            &model.decoder,
            &ids,
            &config,
            Some(&model.text.tokenizer),
            PromptLookup::new(DRAFT_TOKENS),
            (),
        )
        .unwrap();
        n_accepted += stats.accepted_tokens;
        let body = json!({"prompt": prompt, "max_tokens": 40, "temperature": temperature,
                          "seed": seed, "lm_trace": true});
        let (served, _) = ids_of(server.addr, &body);
        let expected: Vec<u64> = run.tokens.iter().map(|&t| u64::from(t)).collect();
        assert_eq!(served, expected, "{prompt}");
    }
    assert!(
        n_accepted > 0,
        "no draft was accepted: the test checks nothing"
    );
    assert_eq!(
        server.metric("lm_spec_decode_accepted_tokens_total"),
        n_accepted as f64
    );
}
