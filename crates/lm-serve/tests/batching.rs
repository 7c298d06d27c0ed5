//! Continuous batching changes speed, never output: requests served
//! together give the tokens each gives alone, and those are what
//! lm-decode's `generate` gives for the same prompt and policy.

use std::num::NonZeroUsize;

use lm_core::{Detokenize, LanguageModel};
use lm_decode::{GenerationConfig, SamplingConfig, generate};
use lm_model::Toy;
use lm_serve::ServeConfig;
use serde_json::{Value, json};

use crate::common::{TestServer, ToyText, gated, post_body, toy_model, wait_for};

/// What the server should answer for `body`'s prompt, from lm-decode alone.
fn expected_text(
    model: &impl LanguageModel,
    prompt: &str,
    max_tokens: usize,
    temperature: f32,
    seed: u64,
) -> String {
    let ids = Toy::encode(prompt).unwrap();
    let config = GenerationConfig {
        max_new_tokens: max_tokens,
        sampling: SamplingConfig {
            temperature,
            seed,
            ..SamplingConfig::default()
        },
        end_tokens: vec![Toy::END],
        prefill_chunk_len: NonZeroUsize::new(4),
        ..GenerationConfig::default()
    };
    let run = generate(model, &ids, &config, Some(&Toy)).unwrap();
    let mut tokens = run.tokens.clone();
    if tokens.last() == Some(&Toy::END) {
        tokens.pop();
    }
    let full = Toy.decode(&[ids.clone(), tokens].concat());
    full[Toy.decode(&ids).len()..].to_owned()
}

fn body(i: u64) -> Value {
    let prompts = [
        "<start>",
        "<start> the",
        "<start> the dog",
        "<start> the cat sat the",
    ];
    json!({
        "prompt": prompts[i as usize % prompts.len()],
        "max_tokens": 20 + i % 7,
        "temperature": 0.7 + 0.1 * (i % 5) as f64,
        "seed": 100 + i,
        "stream": i % 2 == 1,
    })
}

/// The text of an answer, whole or streamed.
fn text_of(response: &crate::common::Response) -> String {
    assert_eq!(response.status, 200);
    if response
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream")
    {
        response
            .chunks()
            .iter()
            .filter_map(|c| {
                c["choices"]
                    .get(0)
                    .map(|c| c["text"].as_str().unwrap().to_owned())
            })
            .collect()
    } else {
        response.json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

#[test]
fn concurrent_requests_equal_their_solo_runs_and_generate() {
    let parallel = 6;
    let config = ServeConfig {
        parallel,
        // Small chunks: prompts are read over several steps, between others' decode steps.
        prefill_chunk_len: NonZeroUsize::new(4).unwrap(),
        ..ServeConfig::default()
    };
    let (gated, gate) = gated(toy_model());
    let s = TestServer::start(gated, ToyText, config);
    let model = toy_model();
    let n_requests = 12u64;
    let solo: Vec<String> = (0..n_requests)
        .map(|i| {
            let b = body(i);
            let r = post_body(s.addr, "/v1/completions", &b.to_string());
            text_of(&r)
        })
        .collect();
    for (i, text) in solo.iter().enumerate() {
        let b = body(i as u64);
        let expected = expected_text(
            &model,
            b["prompt"].as_str().unwrap(),
            b["max_tokens"].as_u64().unwrap() as usize,
            b["temperature"].as_f64().unwrap() as f32,
            b["seed"].as_u64().unwrap(),
        );
        assert_eq!(
            text, &expected,
            "request {i} served alone against lm-decode's generate"
        );
    }
    let steps_before = s.metric("lm_decode_steps_total");
    let rows_before = s.metric("lm_decode_step_sequences_total");
    // The model waits until every worker holds a request and the rest are
    // queued, so they are served together however the threads are scheduled
    // (the toy is so fast that requests arriving apart could finish apart).
    gate.close();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n_requests)
            .map(|i| {
                let addr = s.addr;
                scope.spawn(move || {
                    let b = body(i);
                    text_of(&post_body(addr, "/v1/completions", &b.to_string()))
                })
            })
            .collect();
        let queued = (n_requests - parallel as u64) as f64;
        wait_for(
            "every worker to hold a request and the rest to queue",
            || {
                s.metric("lm_active_sequences") == parallel as f64
                    && s.metric("lm_queue_depth") == queued
            },
        );
        gate.open();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, solo);
    let steps = s.metric("lm_decode_steps_total") - steps_before;
    let rows = s.metric("lm_decode_step_sequences_total") - rows_before;
    assert!(
        rows / steps > 1.5,
        "mean batch {} over {steps} steps: requests were not batched",
        rows / steps
    );
}

#[test]
fn a_prompt_extending_a_finished_one_reads_only_its_new_tokens_and_answers_the_same() {
    let prompt = "<start> the cat sat the dog slept the cat";
    let first = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0.9, "seed": 3, "logit_bias": {"6": -100}});
    let cached = TestServer::toy(ServeConfig::default());
    let (_, answer) = cached.post("/v1/completions", &first);
    let continued = format!(
        "{prompt}{} the",
        answer["choices"][0]["text"].as_str().unwrap()
    );
    let second = json!({"prompt": continued, "max_tokens": 8, "temperature": 0.9, "seed": 4});
    let read_before = cached.metric("lm_prefill_tokens_total");
    let (_, with_cache) = cached.post("/v1/completions", &second);
    let read = cached.metric("lm_prefill_tokens_total") - read_before;
    let n_prompt = with_cache["usage"]["prompt_tokens"].as_f64().unwrap();
    // The first run fed all but its last token: that one and " the" are new.
    assert_eq!(read, 2.0, "{n_prompt} prompt tokens");
    assert_eq!(
        cached.metric("lm_prefix_cache_hit_tokens_total"),
        n_prompt - 2.0
    );
    // The same prompt again: every token but the last (read by a decode
    // step, not a prefill) comes from the cache.
    let hits_before = cached.metric("lm_prefix_cache_hit_tokens_total");
    let read_before = cached.metric("lm_prefill_tokens_total");
    cached.post("/v1/completions", &second);
    assert_eq!(cached.metric("lm_prefill_tokens_total"), read_before);
    assert_eq!(
        cached.metric("lm_prefix_cache_hit_tokens_total") - hits_before,
        n_prompt - 1.0
    );
    let uncached = TestServer::toy(ServeConfig {
        cache_bytes: 0,
        ..ServeConfig::default()
    });
    let (_, without_cache) = uncached.post("/v1/completions", &second);
    assert_eq!(with_cache["choices"], without_cache["choices"]);
    assert_eq!(uncached.metric("lm_prefill_tokens_total"), n_prompt);
}
