//! `echo` on `/v1/completions` (SmolLM2; ignored without it): the prompt's
//! per-token logprobs equal the facade's `score` (lm-decode's
//! `score_continuation`, what `lm-cli score` prints) to 1e-4, the first
//! token's `null`; `max_tokens: 0` scores without generating; a streamed
//! echo sends the prompt first and assembles to the whole answer.

use serde_json::{Value, json};

use crate::common::{TestServer, post_body, smollm2_path};

/// A completions request with `extra`'s fields, answered 200.
fn complete(server: &TestServer, extra: Value) -> Value {
    let (status, body) = server.post("/v1/completions", &extra);
    assert_eq!(status, 200, "{body}");
    body
}

fn token_logprobs(choice: &Value) -> Vec<Option<f64>> {
    choice["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(Value::as_f64)
        .collect()
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn echo_with_logprobs_equals_the_score_and_max_tokens_zero_generates_nothing() {
    let reference = lm::load_gguf(smollm2_path()).unwrap();
    let server = TestServer::smollm2(2);
    let text = "The cat sat on the mat because the floor was warm.";
    let score = reference.score(text).unwrap();
    // The score reads the text after <|endoftext|>; so does this prompt.
    let ids: Vec<u32> = score.context.iter().chain(&score.tokens).copied().collect();
    let body = complete(
        &server,
        json!({"prompt": ids, "echo": true, "logprobs": 3, "max_tokens": 0}),
    );
    let choice = &body["choices"][0];
    let logprobs = token_logprobs(choice);
    assert_eq!(logprobs.len(), ids.len());
    assert_eq!(logprobs[0], None, "the first token has no logprob");
    for (i, (served, scored)) in logprobs[1..].iter().zip(&score.logprobs).enumerate() {
        let served = served.unwrap();
        assert!(
            (served - scored).abs() <= 1e-4,
            "token {}: served {served}, scored {scored}",
            i + 1
        );
    }
    // Each token's alternatives hold the most likely first, and the token's own
    // logprob where it is among them.
    let tops = choice["logprobs"]["top_logprobs"].as_array().unwrap();
    assert_eq!(tops[0], Value::Null);
    for (i, top) in tops.iter().enumerate().skip(1) {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3, "{top:?}");
        let best = top
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::MIN, f64::max);
        assert!(best >= logprobs[i].unwrap(), "position {i}: {top:?}");
    }
    assert!(choice["text"].as_str().unwrap().ends_with(text), "{choice}");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(body["usage"]["prompt_tokens"], ids.len());
    assert_eq!(body["usage"]["completion_tokens"], 0);

    // Echo then generate: the prompt, then what the same request without
    // echo generates; the logprobs run on through the generated tokens.
    let prompt = "Once upon a time";
    let ask = |echo: bool| json!({"prompt": prompt, "echo": echo, "logprobs": 1, "max_tokens": 4, "temperature": 0});
    let plain = complete(&server, ask(false));
    let echoed = complete(&server, ask(true));
    let (plain, echoed) = (&plain["choices"][0], &echoed["choices"][0]);
    assert_eq!(
        echoed["text"].as_str().unwrap(),
        format!("{prompt}{}", plain["text"].as_str().unwrap())
    );
    let n_prompt = reference.text.tokenizer.encode(prompt).unwrap().len();
    let (echoed_lp, plain_lp) = (token_logprobs(echoed), token_logprobs(plain));
    assert_eq!(echoed_lp.len(), n_prompt + plain_lp.len());
    for (e, p) in echoed_lp[n_prompt..].iter().zip(&plain_lp) {
        assert!(
            (e.unwrap() - p.unwrap()).abs() <= 1e-4,
            "{echoed_lp:?} {plain_lp:?}"
        );
    }
    let offsets = echoed["logprobs"]["text_offset"].as_array().unwrap();
    assert_eq!(offsets[0], 0);
    assert_eq!(offsets[n_prompt], prompt.chars().count());

    // Echo without logprobs: the text alone.
    let body = complete(
        &server,
        json!({"prompt": prompt, "echo": true, "max_tokens": 0}),
    );
    assert_eq!(body["choices"][0]["text"], prompt);
    assert_eq!(body["choices"][0]["logprobs"], Value::Null);

    // Streamed: the prompt (and its logprobs) first, then the tokens.
    let mut streamed = ask(true);
    streamed["stream"] = json!(true);
    let response = post_body(server.addr, "/v1/completions", &streamed.to_string());
    assert_eq!(response.status, 200);
    let chunks = response.chunks();
    assert_eq!(chunks[0]["choices"][0]["text"], prompt);
    let first_logprobs = token_logprobs(&chunks[0]["choices"][0]);
    assert_eq!(first_logprobs[..], echoed_lp[..n_prompt]);
    let whole: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(whole, echoed["text"].as_str().unwrap());
}
