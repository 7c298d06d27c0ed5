//! The endpoints in OpenAI's wire format, on the toy decoder: shapes,
//! fields, streaming, errors naming the field.

use std::time::{Duration, Instant};

use lm_serve::ServeConfig;
use serde_json::{Value, json};

use crate::common::{
    TestServer, ToyText, assert_error_message, post_body, request, toy_model, wait_for,
};

fn server() -> TestServer {
    TestServer::toy(ServeConfig::default())
}

#[test]
fn completions_answer_in_openai_shape_with_usage() {
    let s = server();
    let (status, body) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start> the", "max_tokens": 5, "temperature": 0, "model": "lm"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], "lm");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert!(choice["text"].as_str().unwrap().starts_with(' '), "{body}");
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    assert_eq!(body["usage"]["prompt_tokens"], 2);
    let n = body["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=5).contains(&n), "{body}");
    assert_eq!(body["usage"]["total_tokens"], 2 + n);
}

#[test]
fn prompt_as_token_ids_equals_prompt_as_text() {
    let s = server();
    let text = s.post(
        "/v1/completions",
        &json!({"prompt": "<start> the cat", "max_tokens": 6, "temperature": 0.8, "seed": 5}),
    );
    let ids = s.post(
        "/v1/completions",
        &json!({"prompt": [0, 1, 2], "max_tokens": 6, "temperature": 0.8, "seed": 5}),
    );
    assert_eq!(text.0, 200);
    assert_eq!(text.1["choices"], ids.1["choices"]);
}

#[test]
fn the_same_seed_gives_the_same_text_and_n_choices_differ() {
    let s = server();
    let body =
        json!({"prompt": "<start>", "max_tokens": 12, "seed": 9, "n": 3, "temperature": 1.5});
    let (status, first) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{first}");
    let (_, second) = s.post("/v1/completions", &body);
    assert_eq!(first["choices"], second["choices"]);
    let texts: Vec<&str> = (0..3)
        .map(|i| first["choices"][i]["text"].as_str().unwrap())
        .collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    // Choice j is the request with seed 9 read from random stream j: choice 0
    // is what n = 1 gives.
    let (_, one) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start>", "max_tokens": 12, "seed": 9, "temperature": 1.5}),
    );
    assert_eq!(one["choices"][0]["text"], first["choices"][0]["text"]);
}

#[test]
fn stop_strings_cut_the_text_and_finish_with_stop() {
    let s = server();
    let (_, free) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start> the", "max_tokens": 8, "temperature": 0, "logit_bias": {"6": -100}}),
    );
    let text = free["choices"][0]["text"].as_str().unwrap().to_owned();
    let word = text
        .split_whitespace()
        .nth(1)
        .expect("two words")
        .to_owned();
    let (_, cut) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start> the", "max_tokens": 8, "temperature": 0, "logit_bias": {"6": -100}, "stop": [word.clone()]}),
    );
    let expected = &text[..text.find(&word).unwrap()];
    assert_eq!(cut["choices"][0]["text"], expected, "{text} cut at {word}");
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
}

#[test]
fn logprobs_report_the_chosen_token_and_the_top_alternatives() {
    let s = server();
    let (status, body) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start> the", "max_tokens": 3, "temperature": 0, "logprobs": 2, "logit_bias": {"6": -100}}),
    );
    assert_eq!(status, 200, "{body}");
    let lp = &body["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the most probable one.
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!((best - chosen).abs() < 1e-5, "{chosen} vs {best}");
        assert!(chosen < 0.0);
    }
    let (_, chat) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "the"}], "max_tokens": 2, "temperature": 0,
                "logprobs": true, "top_logprobs": 3, "logit_bias": {"6": -100}}),
    );
    let content = chat["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 3);
    assert_eq!(
        content[0]["bytes"],
        json!(content[0]["token"].as_str().unwrap().as_bytes())
    );
}

#[test]
fn chat_answers_as_the_assistant() {
    let s = server();
    let (status, body) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert!(body["choices"][0]["message"]["content"].is_string());
    assert_eq!(body["usage"]["prompt_tokens"], 3);
}

#[test]
fn streaming_sends_the_same_text_in_chunks_then_done() {
    let s = server();
    let body = json!({"prompt": "<start> the", "max_tokens": 10, "seed": 4, "temperature": 1.0});
    let (_, whole) = s.post("/v1/completions", &body);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let response = post_body(s.addr, "/v1/completions", &streamed.to_string());
    assert_eq!(response.status, 200);
    assert!(
        response
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    assert_eq!(response.events().last().unwrap(), "[DONE]");
    let chunks = response.chunks();
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .map(|c| c["text"].as_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    let last_choice = chunks
        .iter()
        .rev()
        .find(|c| c["choices"].get(0).is_some())
        .unwrap();
    assert_eq!(
        last_choice["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    assert_eq!(chunks.last().unwrap()["usage"], whole["usage"]);

    let chat = json!({"messages": [{"role": "user", "content": "the"}], "max_tokens": 5, "temperature": 0, "stream": true});
    let response = post_body(s.addr, "/v1/chat/completions", &chat.to_string());
    let events = response.events();
    let first: serde_json::Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events.last().unwrap(), "[DONE]");
}

#[test]
fn models_health_tokenize_detokenize_and_metrics() {
    let s = server();
    let models = s.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "lm");
    assert_eq!(models["data"][0]["context_length"], 1024);
    assert_eq!(s.get("/health").json(), json!({"status": "ok"}));
    let (_, tokens) = s.post("/tokenize", &json!({"content": "<start> the cat"}));
    assert_eq!(tokens, json!({"tokens": [0, 1, 2]}));
    let (_, text) = s.post("/detokenize", &json!({"tokens": [0, 1, 2]}));
    assert_eq!(text, json!({"content": "<start> the cat"}));
    let (status, error) = s.post("/detokenize", &json!({"tokens": [0, 99]}));
    assert_eq!(status, 400);
    assert_eq!(error["error"]["param"], "tokens");
    s.post(
        "/v1/completions",
        &json!({"prompt": "<start>", "max_tokens": 3, "logit_bias": {"6": -100}}),
    );
    assert_eq!(s.metric("lm_generation_tokens_total"), 3.0);
    assert_eq!(s.metric("lm_prompt_tokens_total"), 1.0);
    assert_eq!(s.metric("lm_time_to_first_token_count"), 1.0);
    assert_eq!(s.metric("lm_active_sequences"), 0.0);
    assert!(s.metric("lm_requests_total") >= 6.0);
}

#[test]
fn bad_fields_are_400s_naming_the_field() {
    let s = server();
    for (body, param) in [
        (
            json!({"prompt": "<start>", "temperature": "hot"}),
            "temperature",
        ),
        (json!({"prompt": "<start>", "top_p": 1.5}), "top_p"),
        (json!({"prompt": "<start>", "n": 5}), "n"),
        (
            json!({"prompt": "<start>", "max_tokens": 5000}),
            "max_tokens",
        ),
        (json!({"prompt": "<start> zebra"}), "prompt"),
        (json!({"prompt": [0, 7]}), "prompt"),
        (
            json!({"prompt": "<start>", "logit_bias": {"7": 1}}),
            "logit_bias",
        ),
        (json!({"prompt": ""}), "prompt"),
    ] {
        let (status, error) = s.post("/v1/completions", &body);
        assert_eq!(status, 400, "{body} -> {error}");
        assert_eq!(error["error"]["param"], param, "{body} -> {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }
    let (_, error) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start>", "max_tokens": 5000}),
    );
    assert_eq!(error["error"]["code"], "context_length_exceeded");
    assert_error_message(&error, "1024");
    let (_, error) = s.post("/v1/completions", &json!({"prompt": "<start>", "n": 5}));
    assert_error_message(&error, "--parallel 4");
}

#[test]
fn response_format_needs_a_vocabulary_and_text_is_free() {
    let s = server();
    let (status, body) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "the"}], "max_tokens": 3,
                "response_format": {"type": "json_object"}}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "response_format");
    assert_error_message(&body, "needs a model with a tokenizer's vocabulary");
    let (status, body) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start> the", "max_tokens": 3, "temperature": 0,
                "response_format": {"type": "text"}}),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn shutdown_answers_unfinished_requests_503_and_health_503_while_draining() {
    // Both requests wait at the gate until the grace is over: the server
    // must cancel them, and say so instead of a truncated "stop".
    let grace = Duration::from_secs(2);
    let config = ServeConfig {
        shutdown_grace: grace,
        parallel: 2,
        ..ServeConfig::default()
    };
    let (mut s, gate) = TestServer::gated_toy(ToyText, config);
    let addr = s.addr;
    let send = move |stream: bool| {
        std::thread::spawn(move || {
            let body = json!({"prompt": "<start>", "max_tokens": 500, "stream": stream,
                              "logit_bias": {"6": -100}, "seed": 2})
            .to_string();
            request(addr, "POST", "/v1/completions", &[], body.as_bytes())
        })
    };
    let (whole, streamed) = (send(false), send(true));
    wait_for("both requests to run", || {
        s.metric("lm_active_sequences") == 2.0
    });
    let stopped = Instant::now();
    s.signal_stop();
    // Draining: the socket still answers, /health and new work with 503.
    wait_for("/health to answer 503", || {
        request(addr, "GET", "/health", &[], b"").status == 503
    });
    let body = json!({"prompt": "<start>", "max_tokens": 1}).to_string();
    let refused = request(addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(refused.status, 503);
    std::thread::sleep((grace + Duration::from_millis(300)).saturating_sub(stopped.elapsed()));
    gate.open();

    let whole = whole.join().unwrap();
    assert_eq!(
        whole.status,
        503,
        "{}",
        String::from_utf8_lossy(&whole.body)
    );
    assert_eq!(whole.header("retry-after"), Some("5"));
    assert_eq!(whole.json()["error"]["code"], "server_shutting_down");

    let streamed = streamed.join().unwrap();
    assert_eq!(streamed.status, 200);
    let events = streamed.events();
    let parsed: Vec<Value> = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(
        parsed
            .iter()
            .all(|e| e["choices"][0]["finish_reason"].is_null()),
        "a cut-off stream reports no finish_reason: {events:?}"
    );
    let last = parsed.last().unwrap();
    assert_eq!(last["error"]["code"], "server_shutting_down", "{events:?}");
    assert_eq!(last["error"]["type"], "server_error");
    s.stop().unwrap();
}

/// A request from a browser page at `origin`, with extra `headers`.
fn from_origin(
    s: &TestServer,
    method: &str,
    path: &str,
    origin: &str,
    headers: &[(&str, &str)],
) -> crate::common::Response {
    let mut all = vec![("Origin", origin)];
    all.extend_from_slice(headers);
    let body = if method == "POST" {
        json!({"prompt": "<start>", "max_tokens": 1}).to_string()
    } else {
        String::new()
    };
    request(s.addr, method, path, &all, body.as_bytes())
}

#[test]
fn cors_answers_preflight_without_the_key_and_marks_every_answer() {
    let s = TestServer::toy(ServeConfig {
        api_key: Some("k1".into()),
        cors_origins: vec!["https://app.example".into()],
        ..ServeConfig::default()
    });
    let site = "https://app.example";
    let preflight = from_origin(
        &s,
        "OPTIONS",
        "/v1/chat/completions",
        site,
        &[
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type",
            ),
        ],
    );
    assert_eq!(preflight.status, 204);
    assert_eq!(preflight.header("access-control-allow-origin"), Some(site));
    assert!(
        preflight
            .header("access-control-allow-methods")
            .is_some_and(|m| m.contains("POST"))
    );
    assert_eq!(
        preflight.header("access-control-allow-headers"),
        Some("authorization, content-type")
    );
    // Answers, errors included, carry the origin.
    let ok = from_origin(
        &s,
        "POST",
        "/v1/completions",
        site,
        &[("Authorization", "Bearer k1")],
    );
    assert_eq!(ok.status, 200);
    assert_eq!(ok.header("access-control-allow-origin"), Some(site));
    let unauthorized = from_origin(&s, "POST", "/v1/completions", site, &[]);
    assert_eq!(unauthorized.status, 401);
    assert_eq!(
        unauthorized.header("access-control-allow-origin"),
        Some(site)
    );
    let missing = from_origin(&s, "GET", "/nowhere", site, &[]);
    assert_eq!(missing.status, 404);
    assert_eq!(missing.header("access-control-allow-origin"), Some(site));
    // Another origin gets nothing, and its preflight needs the key.
    let other = from_origin(
        &s,
        "OPTIONS",
        "/v1/completions",
        "https://evil.example",
        &[("Access-Control-Request-Method", "POST")],
    );
    assert_eq!(other.status, 401);
    assert_eq!(other.header("access-control-allow-origin"), None);
}

#[test]
fn cors_is_off_by_default_and_star_allows_any_origin() {
    let s = server();
    let r = from_origin(&s, "POST", "/v1/completions", "https://app.example", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
    let star = TestServer::toy(ServeConfig {
        cors_origins: vec!["*".into()],
        ..ServeConfig::default()
    });
    let r = from_origin(&star, "GET", "/v1/models", "http://localhost:5173", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    // A malformed origin is refused at start.
    let bad = lm_serve::Server::bind(
        std::sync::Arc::new(toy_model()),
        std::sync::Arc::new(ToyText),
        ServeConfig {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            cors_origins: vec!["https://app.example/".into()],
            ..ServeConfig::default()
        },
    );
    assert!(
        matches!(
            &bad,
            Err(lm_serve::ServeError::InvalidSetting { name: "cors", .. })
        ),
        "{bad:?}"
    );
}

#[test]
fn the_bearer_scheme_is_case_insensitive_and_tolerates_extra_spaces() {
    let s = TestServer::toy(ServeConfig {
        api_key: Some("k1".into()),
        ..ServeConfig::default()
    });
    for (auth, status) in [
        ("Bearer k1", 200),
        ("bearer  k1", 200),
        ("BEARER k1", 200),
        ("Bearer   k1", 200),
        ("Basic k1", 401),
        ("Bearer k2", 401),
    ] {
        let r = request(s.addr, "GET", "/v1/models", &[("Authorization", auth)], b"");
        assert_eq!(r.status, status, "{auth:?}");
    }
}

#[test]
fn a_lone_surrogate_escape_is_read_as_the_replacement_character() {
    let s = server();
    // The text reaches the tokenizer as U+FFFD (which the toy does not know).
    let body = br#"{"content": "<start> \ud800"}"#;
    let r = request(s.addr, "POST", "/tokenize", &[], body);
    assert_eq!(r.status, 400);
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("'\u{FFFD}'"), "{message}");
    // Anywhere in a request: a stop string, an ignored field, a pair cut
    // in two halves.
    let body = br#"{"prompt": "<start> the", "max_tokens": 2, "stop": ["\udc00", "\ud83d"],
                    "user": "x\ud83d\ude00\ud83d"}"#;
    let r = request(s.addr, "POST", "/v1/completions", &[], body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn models_shows_a_path_by_its_file_stem() {
    let s = TestServer::toy(ServeConfig {
        model_name: "/srv/models/SmolLM2-135M-Instruct-Q4_1.gguf".into(),
        ..ServeConfig::default()
    });
    let id = "SmolLM2-135M-Instruct-Q4_1";
    assert_eq!(s.get("/v1/models").json()["data"][0]["id"], id);
    let (status, body) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start>", "max_tokens": 1, "model": id}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], id);
}

#[test]
fn request_defaults_fill_the_fields_a_request_leaves_out() {
    let defaults = json!({"temperature": 0, "max_tokens": 4});
    let s = TestServer::toy(ServeConfig {
        request_defaults: defaults.as_object().unwrap().clone(),
        ..ServeConfig::default()
    });
    let answer = |body: Value| {
        let (status, body) = s.post("/v1/completions", &body);
        assert_eq!(status, 200, "{body}");
        (body["choices"].clone(), body["usage"].clone())
    };
    let spelled = answer(json!({"prompt": "<start> the", "temperature": 0, "max_tokens": 4}));
    assert_eq!(answer(json!({"prompt": "<start> the"})), spelled);
    // `null` is left out too; a field the request gives wins.
    assert_eq!(
        answer(json!({"prompt": "<start> the", "temperature": null})),
        spelled
    );
    let one = answer(json!({"prompt": "<start> the", "max_tokens": 1}));
    assert_eq!(one.1["completion_tokens"], 1);
    // Chat requests take them too.
    let chat = |body: Value| {
        let (status, body) = s.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{body}");
        (body["choices"].clone(), body["usage"].clone())
    };
    let messages = json!([{"role": "user", "content": "the"}]);
    assert_eq!(
        chat(json!({"messages": messages})),
        chat(json!({"messages": messages, "temperature": 0, "max_tokens": 4}))
    );
}
