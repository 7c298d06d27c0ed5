//! Several models behind one server (`Server::bind_models`, `lm-cli serve
//! --model A --model B`): `/v1/models` lists each, the request's `model`
//! picks one and each answers as it does served alone (SmolLM2's Q4_1 and
//! Q8_0 files, ignored without them); an unknown model is a 404, two
//! models with one id a startup error; with an idle unload a model is
//! freed and loaded again with the same answers, and never while one of
//! its requests (a stream included) is in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lm_model::catalog::{SMOLLM2, SMOLLM2_Q8_0};
use lm_serve::{LoadModel, LoadedModel, ModelSource, ServeConfig, ServeError, Server};
use serde_json::{Value, json};

use crate::common::{Gate, TestServer, ToyText, gguf_source, request, toy_model, wait_for};

/// The server's settings on a free loopback port.
fn config() -> ServeConfig {
    ServeConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        parallel: 2,
        ..ServeConfig::default()
    }
}

/// The toy model behind `gate`, served as `id`.
fn toy_source(id: &str, gate: &Gate) -> ModelSource {
    toy_source_with(id, gate, config())
}

/// [`toy_source`] with the model's own `config`.
fn toy_source_with(id: &str, gate: &Gate, config: ServeConfig) -> ModelSource {
    let gate = gate.clone();
    let load: LoadModel = Arc::new(move || {
        let model = lm_core::Adapted {
            inner: toy_model(),
            hook: gate.clone(),
        };
        LoadedModel::new(Arc::new(model), Arc::new(ToyText), config.clone())
    });
    ModelSource {
        id: id.into(),
        load,
    }
}

/// The two SmolLM2 files as `q4` and `q8`.
fn smollm2_pair(idle_unload: Option<Duration>) -> TestServer {
    let models = vec![
        gguf_source("q4", &SMOLLM2, config()),
        gguf_source("q8", &SMOLLM2_Q8_0, config()),
    ];
    TestServer::run(Server::bind_models(models, config(), idle_unload).unwrap())
}

/// A greedy completion and a greedy chat answer, `model` set when given.
fn answers(server: &TestServer, model: Option<&str>) -> (String, String) {
    let with_model = |mut body: Value| {
        if let Some(model) = model {
            body["model"] = json!(model);
        }
        body
    };
    let completion = with_model(json!({
        "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0
    }));
    let (status, body) = server.post("/v1/completions", &completion);
    assert_eq!(status, 200, "{body}");
    if let Some(model) = model {
        assert_eq!(body["model"], model);
    }
    let text = body["choices"][0]["text"].as_str().unwrap().to_owned();
    let chat = with_model(json!({
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 24, "temperature": 0
    }));
    let (status, body) = server.post("/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{body}");
    let reply = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    (text, reply)
}

/// A Prometheus sample of `/metrics` (`lm_model_loaded{model="q8"}`).
fn sample(server: &TestServer, name: &str) -> f64 {
    server.metric(name)
}

#[test]
#[ignore = "needs SmolLM2 and smollm2-q8_0: cargo xtask fetch-model smollm2 && cargo xtask fetch-model smollm2-q8_0"]
fn two_models_are_listed_and_each_answers_as_it_does_alone() {
    let alone: Vec<(String, String)> = [(&SMOLLM2, "q4"), (&SMOLLM2_Q8_0, "q8")]
        .into_iter()
        .map(|(model, id)| {
            let path = model.path().unwrap_or_else(|err| panic!("{err}"));
            let server = TestServer::named(path, id, config());
            answers(&server, Some(id))
        })
        .collect();
    // The two files answer differently, so picking the wrong one shows.
    assert_ne!(alone[0], alone[1]);

    let server = smollm2_pair(None);
    let listed = server.get("/v1/models").json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["q4", "q8"], "{listed}");
    for model in listed["data"].as_array().unwrap() {
        assert_eq!(model["loaded"], true, "{model}");
        assert_eq!(model["object"], "model");
        assert_eq!(model["context_length"], 8192, "{model}");
    }
    assert_eq!(answers(&server, Some("q8")), alone[1]);
    assert_eq!(answers(&server, Some("q4")), alone[0]);
    // No `model`: the first one given.
    assert_eq!(answers(&server, None), alone[0]);

    // Each model counts its own requests.
    assert_eq!(sample(&server, r#"lm_requests_total{model="q4"}"#), 4.0);
    assert_eq!(sample(&server, r#"lm_requests_total{model="q8"}"#), 2.0);
    assert_eq!(sample(&server, r#"lm_model_loads_total{model="q8"}"#), 1.0);

    let (status, body) = server.post(
        "/v1/completions",
        &json!({"model": "q5", "prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["param"], "model");
    assert_eq!(body["error"]["type"], "not_found_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("'q5' does not exist") && message.contains("'q4', 'q8'"),
        "{message}"
    );
}

#[test]
#[ignore = "needs SmolLM2 and smollm2-q8_0: cargo xtask fetch-model smollm2 && cargo xtask fetch-model smollm2-q8_0"]
fn an_idle_model_is_unloaded_and_loaded_again_with_the_same_answers() {
    let server = smollm2_pair(Some(Duration::from_millis(300)));
    let before = answers(&server, Some("q8"));
    let loaded = r#"lm_model_loaded{model="q8"}"#;
    wait_for("q8 to idle out", || sample(&server, loaded) == 0.0);
    assert_eq!(
        sample(&server, r#"lm_model_unloads_total{model="q8"}"#),
        1.0
    );
    let listed = server.get("/v1/models").json();
    assert_eq!(listed["data"][1]["id"], "q8");
    assert_eq!(listed["data"][1]["loaded"], false, "{listed}");
    // Its cache went with it.
    assert_eq!(
        sample(&server, r#"lm_prefix_cache_entries{model="q8"}"#),
        0.0
    );

    // The next request loads it again, and waits for the load.
    assert_eq!(answers(&server, Some("q8")), before);
    assert_eq!(sample(&server, r#"lm_model_loads_total{model="q8"}"#), 2.0);
    // Counters carry over the reload.
    assert_eq!(sample(&server, r#"lm_requests_total{model="q8"}"#), 4.0);
}

#[test]
fn concurrent_requests_for_an_unloaded_model_share_one_load() {
    // The loader counts its calls and waits at `loading` (as at a forward
    // pass), so the requests pile up while it loads.
    let (gate, loading) = (Gate::default(), Gate::default());
    let n_loads = Arc::new(AtomicUsize::new(0));
    let slow = {
        let (gate, loading, n_loads) = (gate.clone(), loading.clone(), Arc::clone(&n_loads));
        let source = toy_source("b", &gate);
        let load: LoadModel = Arc::new(move || {
            n_loads.fetch_add(1, Ordering::SeqCst);
            lm_core::ForwardHook::before_forward(&loading, &toy_model(), 0, &[]).map_err(
                |error| ServeError::Load {
                    id: "b".into(),
                    source: error.into(),
                },
            )?;
            (source.load)()
        });
        ModelSource {
            id: "b".into(),
            load,
        }
    };
    let models = vec![toy_source("a", &gate), slow];
    let idle = Duration::from_millis(50);
    let server = TestServer::run(Server::bind_models(models, config(), Some(idle)).unwrap());
    let (status, answer) = server.post(
        "/v1/completions",
        &json!({"model": "a", "prompt": "<start> the", "max_tokens": 1}),
    );
    assert_eq!(status, 200, "{answer}");
    let mut ids = vec![answer["id"].clone()];
    wait_for("b to idle out", || {
        sample(&server, r#"lm_model_loaded{model="b"}"#) == 0.0
    });
    loading.close();
    let addr = server.addr;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let body = json!({"model": "b", "prompt": "<start> the", "max_tokens": 3,
                                  "temperature": 0})
                .to_string();
                request(addr, "POST", "/v1/completions", &[], body.as_bytes())
            })
        })
        .collect();
    wait_for("the four requests to wait for b", || {
        sample(&server, r#"lm_model_requests_in_flight{model="b"}"#) == 4.0
    });
    assert_eq!(sample(&server, r#"lm_model_loaded{model="b"}"#), 0.0);
    loading.open();
    let texts: Vec<Value> = clients
        .into_iter()
        .map(|client| {
            let response = client.join().unwrap();
            assert_eq!(response.status, 200);
            let answer = response.json();
            ids.push(answer["id"].clone());
            answer["choices"][0]["text"].clone()
        })
        .collect();
    assert!(texts.iter().all(|text| *text == texts[0]), "{texts:?}");
    // One numbering for every model and load: no two answers share an id.
    let distinct: std::collections::HashSet<String> = ids.iter().map(Value::to_string).collect();
    assert_eq!(distinct.len(), 5, "{ids:?}");
    // The load at start, and one for the four.
    assert_eq!(n_loads.load(Ordering::SeqCst), 2);
    assert_eq!(sample(&server, r#"lm_model_loads_total{model="b"}"#), 2.0);
}

#[test]
fn a_stream_in_flight_is_never_cut_by_an_unload() {
    let gate = Gate::default();
    let models = vec![toy_source("toy", &gate)];
    let idle = Duration::from_millis(20);
    let server = TestServer::run(Server::bind_models(models, config(), Some(idle)).unwrap());
    let unloads = r#"lm_model_unloads_total{model="toy"}"#;
    let body = json!({"prompt": "<start> the", "max_tokens": 40, "stream": true,
                      "logit_bias": {"6": -100}, "temperature": 0})
    .to_string();
    let first = request(server.addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(first.status, 200);

    gate.close();
    let addr = server.addr;
    let streamed =
        std::thread::spawn(move || request(addr, "POST", "/v1/completions", &[], body.as_bytes()));
    wait_for("the stream to run", || {
        sample(&server, r#"lm_active_sequences{model="toy"}"#) == 1.0
    });
    // (It may have idled out before this request came: counted from here.)
    let n_unloads = sample(&server, unloads);
    // Many idle periods pass while its forward pass waits at the gate
    // (its answer's headers are sent: only its body is in flight).
    std::thread::sleep(idle * 25);
    assert_eq!(sample(&server, unloads), n_unloads);
    assert_eq!(sample(&server, r#"lm_model_loaded{model="toy"}"#), 1.0);
    gate.open();

    let streamed = streamed.join().unwrap();
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.events().last().unwrap(), "[DONE]");
    assert_eq!(streamed_text(&streamed), streamed_text(&first));
    assert_eq!(streamed_text(&first).split_whitespace().count(), 40);
    wait_for("the model to idle out once it ended", || {
        sample(&server, unloads) > n_unloads
    });
}

/// A completion stream's text, its chunks joined.
fn streamed_text(response: &crate::common::Response) -> String {
    response
        .chunks()
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["text"].as_str())
        .collect()
}

#[test]
fn two_models_with_one_id_are_a_startup_error() {
    let gate = Gate::default();
    let models = vec![
        toy_source("toy", &gate),
        toy_source("other", &gate),
        toy_source("toy", &gate),
    ];
    let error = Server::bind_models(models, config(), None).unwrap_err();
    assert!(
        matches!(error, ServeError::InvalidSetting { name: "model", .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("two models are served as 'toy'"),
        "{error}"
    );
}

#[test]
fn an_id_that_is_a_path_or_an_idle_unload_of_zero_is_refused() {
    let gate = Gate::default();
    for id in ["", "models/a", "a.gguf"] {
        let error = Server::bind_models(vec![toy_source(id, &gate)], config(), None).unwrap_err();
        assert!(
            error.to_string().contains("cannot be a model id"),
            "{error}"
        );
    }
    let error = Server::bind_models(vec![toy_source("a", &gate)], config(), Some(Duration::ZERO))
        .unwrap_err();
    assert!(error.to_string().contains("idle-unload"), "{error}");
}

#[test]
fn the_front_asks_for_the_key_and_caps_the_body_before_loading() {
    let gate = Gate::default();
    let models = vec![toy_source("a", &gate), toy_source("b", &gate)];
    let config = ServeConfig {
        api_key: Some("k1".into()),
        max_body_bytes: 2000,
        ..config()
    };
    let idle = Duration::from_millis(20);
    let server = TestServer::run(Server::bind_models(models, config, Some(idle)).unwrap());
    let (addr, key) = (server.addr, [("Authorization", "Bearer k1")]);
    let sample = |name: &str| -> f64 {
        let response = request(addr, "GET", "/metrics", &key, b"");
        assert_eq!(response.status, 200);
        let text = String::from_utf8(response.body).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .parse()
            .unwrap()
    };
    let (loaded, loads) = (
        r#"lm_model_loaded{model="b"}"#,
        r#"lm_model_loads_total{model="b"}"#,
    );
    wait_for("b to idle out", || sample(loaded) == 0.0);

    let body = json!({"model": "b", "prompt": "<start> the", "max_tokens": 2}).to_string();
    let refused = request(addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["error"]["code"], "invalid_api_key");
    for path in ["/v1/models", "/metrics"] {
        assert_eq!(request(addr, "GET", path, &[], b"").status, 401, "{path}");
    }
    assert_eq!(request(addr, "GET", "/health", &[], b"").status, 200);

    let big = json!({"model": "b", "prompt": "x".repeat(3000)}).to_string();
    let too_large = request(addr, "POST", "/v1/completions", &key, big.as_bytes());
    assert_eq!(too_large.status, 413);
    let message = too_large.json()["error"]["message"].clone();
    assert!(
        message.to_string().contains("--max-body-bytes"),
        "{message}"
    );
    // Neither loaded b.
    assert_eq!((sample(loaded), sample(loads)), (0.0, 1.0));
    let unknown = json!({"model": "c", "prompt": "<start>"}).to_string();
    let not_found = request(addr, "POST", "/v1/completions", &key, unknown.as_bytes());
    assert_eq!(not_found.status, 404);
    // The front counted its refusals (three 401s, the 413, the 404)
    // unlabelled; b's own routes saw none of them.
    assert_eq!(sample("lm_requests_failed_total"), 5.0);
    assert_eq!(sample(r#"lm_requests_total{model="b"}"#), 0.0);

    let served = request(addr, "POST", "/v1/completions", &key, body.as_bytes());
    assert_eq!(served.status, 200);
    assert_eq!(served.json()["model"], "b");
    assert_eq!(sample(loads), 2.0);
}

/// A reload that fails answers a 500 naming the model, counted by the
/// front; the next request tries the load again.
#[test]
fn a_failed_reload_is_a_500_naming_the_model_and_is_tried_again() {
    let gate = Gate::default();
    let n_loads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let toy = toy_source("toy", &gate);
    let counted = Arc::clone(&n_loads);
    let load: LoadModel =
        Arc::new(
            move || match counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 | 3 => (toy.load)(),
                _ => Err(ServeError::Load {
                    id: "toy".into(),
                    source: "the weights went away".into(),
                }),
            },
        );
    let models = vec![ModelSource {
        id: "toy".into(),
        load,
    }];
    let idle = Duration::from_millis(20);
    let server = TestServer::run(Server::bind_models(models, config(), Some(idle)).unwrap());
    let loaded = r#"lm_model_loaded{model="toy"}"#;
    wait_for("toy to idle out", || sample(&server, loaded) == 0.0);

    let body = json!({"model": "toy", "prompt": "<start> the", "max_tokens": 2}).to_string();
    for _ in 0..2 {
        let failed = request(server.addr, "POST", "/v1/completions", &[], body.as_bytes());
        assert_eq!(failed.status, 500);
        let message = failed.json()["error"]["message"].to_string();
        assert!(
            message.contains("'toy' could not be loaded") && message.contains("went away"),
            "{message}"
        );
    }
    assert_eq!(sample(&server, "lm_requests_failed_total"), 2.0);
    let served = request(server.addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(served.status, 200);
    assert_eq!(n_loads.load(std::sync::atomic::Ordering::SeqCst), 4);
    assert_eq!(sample(&server, r#"lm_model_loads_total{model="toy"}"#), 2.0);
}

#[test]
fn the_front_answers_cors_once_for_every_model() {
    let gate = Gate::default();
    // As lm-cli gives them: the models' settings name the origin too.
    let config = ServeConfig {
        cors_origins: vec!["https://app.example".into()],
        ..config()
    };
    let models = vec![
        toy_source_with("a", &gate, config.clone()),
        toy_source_with("b", &gate, config.clone()),
    ];
    let server = TestServer::run(Server::bind_models(models, config, None).unwrap());
    let origin = ("Origin", "https://app.example");
    let preflight = request(
        server.addr,
        "OPTIONS",
        "/v1/completions",
        &[origin, ("Access-Control-Request-Method", "POST")],
        b"",
    );
    assert_eq!(preflight.status, 204);
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let count = |response: &crate::common::Response, header: &str| {
        response
            .headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(header))
            .count()
    };
    let allow_origins =
        |response: &crate::common::Response| count(response, "access-control-allow-origin");
    let complete = |origin: (&str, &str), body: &str| {
        request(
            server.addr,
            "POST",
            "/v1/completions",
            &[origin],
            body.as_bytes(),
        )
    };
    let body = json!({"model": "b", "prompt": "<start> the", "max_tokens": 1}).to_string();
    let forwarded = complete(origin, &body);
    assert_eq!(forwarded.status, 200);
    assert_eq!(allow_origins(&forwarded), 1, "{:?}", forwarded.headers);
    // One CORS layer: the front's (a model's own would add a second Vary).
    assert_eq!(count(&forwarded, "vary"), 1, "{:?}", forwarded.headers);
    let listed = request(server.addr, "GET", "/v1/models", &[origin], b"");
    assert_eq!(allow_origins(&listed), 1, "{:?}", listed.headers);
    let unknown = json!({"model": "c", "prompt": "x"}).to_string();
    let missing = complete(origin, &unknown);
    assert_eq!(missing.status, 404);
    assert_eq!(allow_origins(&missing), 1, "{:?}", missing.headers);
    // Another origin gets none.
    let other = complete(("Origin", "https://evil.example"), &body);
    assert_eq!(allow_origins(&other), 0, "{:?}", other.headers);
}
