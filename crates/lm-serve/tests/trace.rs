//! The opt-in `lm_trace` field (issue 41) and one log-probability per token
//! (issue 42), on the toy model (seven tokens, so the trace's ten
//! candidates are the whole vocabulary): without the field an answer is
//! what it was; with it, each token's entry is the policy recomputed here
//! from the entry's own raw logits (softmax at T over the top k, the draw
//! `u` choosing by the inverse CDF), and the chosen token's log-probability
//! is the same number wherever the answer names it.

use serde_json::{Value, json};

use lm_serve::ServeConfig;

use crate::common::{TestServer, post_body};

const N_VOCAB: usize = 7;

/// The answer to `body` at `path`: the JSON body, or a stream's chunks.
fn answer(s: &TestServer, path: &str, body: &Value) -> Vec<Value> {
    let response = post_body(s.addr, path, &body.to_string());
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    if body["stream"] == json!(true) {
        response.chunks()
    } else {
        vec![response.json()]
    }
}

/// `value` without what differs between two requests (`id`, `created`)
/// and, when `strip`, without its `lm_trace` fields and the stream chunks
/// that only carried one.
fn comparable(chunks: &[Value], strip: bool) -> Vec<Value> {
    let mut out = Vec::new();
    for chunk in chunks {
        let mut chunk = chunk.clone();
        chunk["id"] = Value::Null;
        chunk["created"] = Value::Null;
        let mut only_trace = false;
        for choice in chunk["choices"].as_array_mut().into_iter().flatten() {
            let choice = choice.as_object_mut().unwrap();
            if strip && choice.remove("lm_trace").is_some() {
                let text = choice
                    .get("text")
                    .or_else(|| choice.get("delta")?.get("content"));
                only_trace = choice["logprobs"].is_null()
                    && choice["finish_reason"].is_null()
                    && choice.get("delta").is_none_or(|d| d.get("role").is_none())
                    && text == Some(&json!(""));
            }
        }
        if !only_trace {
            out.push(chunk);
        }
    }
    out
}

/// Every step's trace entries of an answer, in order.
fn trace_of(chunks: &[Value]) -> Vec<Value> {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .flat_map(|choice| choice["lm_trace"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[test]
fn without_lm_trace_answers_are_unchanged_and_with_it_they_only_gain_the_field() {
    let s = TestServer::toy(ServeConfig::default());
    let chat = json!({"messages": [{"role": "user", "content": "the"}], "max_tokens": 12,
                      "temperature": 1.3, "seed": 5, "logprobs": true, "top_logprobs": 2});
    let completion = json!({"prompt": "<start> the cat", "max_tokens": 12, "temperature": 1.3,
                            "seed": 5, "logprobs": 2});
    for (path, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
    ] {
        for stream in [false, true] {
            let mut plain = body.clone();
            plain["stream"] = json!(stream);
            let mut off = plain.clone();
            off["lm_trace"] = json!(false);
            let mut on = plain.clone();
            on["lm_trace"] = json!(true);
            let (plain, off, on) = (
                answer(&s, path, &plain),
                answer(&s, path, &off),
                answer(&s, path, &on),
            );
            let what = format!("{path}, stream {stream}");
            let plain_text = serde_json::to_string(&plain).unwrap();
            assert!(!plain_text.contains("lm_trace"), "{what}: {plain_text}");
            // Byte for byte, but for the id and the time.
            assert_eq!(
                serde_json::to_string(&comparable(&off, false)).unwrap(),
                serde_json::to_string(&comparable(&plain, false)).unwrap(),
                "{what}"
            );
            assert_eq!(comparable(&on, true), comparable(&plain, false), "{what}");
            // The trace lists ten candidates; `logprobs` still the two asked.
            let trace = trace_of(&on);
            assert!(trace.len() >= 2, "{what}: {trace:?}");
            for (i, entry) in trace.iter().enumerate() {
                assert_eq!(entry["index"], i, "{what}");
                assert_eq!(
                    entry["model_top"].as_array().unwrap().len(),
                    N_VOCAB,
                    "{what}"
                );
            }
        }
    }
}

/// The chosen token's log-probabilities of one trace entry and of its
/// `logprobs` entry (chat's shape) are the same numbers (issue 42).
fn check_one_logprob(entry: &Value, logprobs: Option<&Value>) {
    let id = &entry["id"];
    let in_list = |list: &Value| -> Value {
        let found = list.as_array().unwrap().iter().find(|c| &c["id"] == id);
        found.unwrap_or_else(|| panic!("{id} not in {list}"))["logprob"].clone()
    };
    assert_eq!(in_list(&entry["model_top"]), entry["logprob"], "{entry}");
    assert_eq!(
        in_list(&entry["policy_top"]),
        entry["policy_logprob"],
        "{entry}"
    );
    if let Some(lp) = logprobs {
        assert_eq!(lp["logprob"], entry["logprob"]);
        let top = lp["top_logprobs"].as_array().unwrap();
        let chosen = top.iter().find(|c| c["token"] == lp["token"]).unwrap();
        assert_eq!(chosen["logprob"], lp["logprob"], "{lp}");
    }
}

#[test]
fn each_entry_is_the_policy_recomputed_from_its_logits_and_its_draw() {
    let s = TestServer::toy(ServeConfig::default());
    let (temperature, top_k) = (0.7, 3);
    let body = json!({"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 16,
                      "temperature": temperature, "top_k": top_k, "seed": 11, "logprobs": true,
                      "top_logprobs": N_VOCAB, "lm_trace": true});
    let whole = answer(&s, "/v1/chat/completions", &body);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let trace = trace_of(&whole);
    assert_eq!(
        trace_of(&answer(&s, "/v1/chat/completions", &streamed)),
        trace
    );
    let logprobs = whole[0]["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    // Every token has an entry; an end token that stopped the run has no
    // `logprobs` entry.
    assert!(trace.len() == logprobs.len() || trace.len() == logprobs.len() + 1);
    assert!(trace.len() >= 4, "{trace:?}");
    for (i, entry) in trace.iter().enumerate() {
        check_one_logprob(entry, logprobs.get(i));
        let model_top = entry["model_top"].as_array().unwrap();
        let id = |c: &Value| c["id"].as_u64().unwrap();
        let logits: Vec<(u64, f64)> = model_top
            .iter()
            .map(|c| (id(c), c["logit"].as_f64().unwrap()))
            .collect();
        assert_eq!(logits.len(), N_VOCAB);
        // The model's log-probabilities: z - ln sum exp z.
        let log_sum = logits.iter().map(|(_, z)| z.exp()).sum::<f64>().ln();
        for (c, (_, z)) in model_top.iter().zip(&logits) {
            assert!(
                (c["logprob"].as_f64().unwrap() - (z - log_sum)).abs() < 1e-6,
                "{c}"
            );
        }
        // The policy: softmax at T over the k best, renormalised.
        let kept = &logits[..top_k];
        let weight: f64 = kept.iter().map(|(_, z)| (z / temperature).exp()).sum();
        let policy: Vec<(u64, f64)> = kept
            .iter()
            .map(|&(t, z)| (t, (z / temperature).exp() / weight))
            .collect();
        let policy_top = entry["policy_top"].as_array().unwrap();
        assert_eq!(policy_top.len(), top_k, "{entry}");
        for (c, (t, p)) in policy_top.iter().zip(&policy) {
            assert_eq!(id(c), *t);
            assert!(
                (c["logprob"].as_f64().unwrap() - p.ln()).abs() < 1e-5,
                "{c} vs {p}"
            );
        }
        let stages: Vec<(&str, u64)> = entry["n_candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["stage"].as_str().unwrap(), c["n"].as_u64().unwrap()))
            .collect();
        let n = N_VOCAB as u64;
        let want = [
            ("vocabulary", n),
            ("penalties", n),
            ("temperature", n),
            ("top_k", 3),
        ];
        assert_eq!(stages, want);
        // The draw: the first candidate in id order whose running total
        // exceeds u (lesson 000's inverse CDF).
        let u = entry["u"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&u));
        let mut by_id = policy.clone();
        by_id.sort_by_key(|&(t, _)| t);
        let mut total = 0.0;
        let drawn = by_id.iter().find(|&&(_, p)| {
            total += p;
            total > u
        });
        assert_eq!(drawn.map(|&(t, _)| t), entry["id"].as_u64(), "u = {u}");
    }
}

#[test]
fn the_chosen_logprob_is_its_top_logprobs_entry_exactly_in_completions() {
    let s = TestServer::toy(ServeConfig::default());
    let (mut n_tokens, mut n_below_the_top) = (0, 0);
    for seed in 0..6 {
        let body = json!({"prompt": "<start> the dog", "max_tokens": 16, "temperature": 1.5,
                          "seed": seed, "logprobs": 5, "lm_trace": true});
        let whole = &answer(&s, "/v1/completions", &body)[0];
        let logprobs = &whole["choices"][0]["logprobs"];
        for (i, token) in logprobs["tokens"].as_array().unwrap().iter().enumerate() {
            let chosen = &logprobs["token_logprobs"][i];
            let top = logprobs["top_logprobs"][i].as_object().unwrap();
            if let Some(entry) = top.get(token.as_str().unwrap()) {
                assert_eq!(entry, chosen, "seed {seed}, step {i}");
            }
            n_tokens += 1;
            n_below_the_top += usize::from(top.values().any(|v| v.as_f64() > chosen.as_f64()));
        }
        for entry in trace_of(std::slice::from_ref(whole)) {
            check_one_logprob(&entry, None);
        }
    }
    // Sampled: at T = 1.5 the draw does not always take the most probable token.
    assert!(
        n_tokens >= 10 && n_below_the_top > 0,
        "{n_tokens} tokens, {n_below_the_top}"
    );
}
