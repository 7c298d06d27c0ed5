//! `lm-cli serve` with several `--model`s and `--idle-unload`: the flags
//! parse (`ID=SPEC`, a range for the seconds), two models with one id stop
//! the start, and the binary serves each model under its id, unloading an
//! idle one and loading it again for the next request.

use serde_json::json;

use crate::common::{Cli, assert_contains};
use crate::serve::{get, post, start_with};

/// A sample's value in `/metrics` (`lm_model_loaded{model="b"}`).
fn metric(addr: &str, name: &str) -> f64 {
    let text = get(addr, "/metrics");
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn idle_unload_out_of_range_is_a_usage_error() {
    for seconds in ["0", "2592001", "soon"] {
        let run = Cli::new("serve")
            .model("toy")
            .opt("--idle-unload", seconds)
            .run();
        run.assert_usage_error("invalid value");
        assert_contains(&run.stderr, "--idle-unload");
    }
    let run = Cli::new("serve")
        .model("toy")
        .opt("--idle-unload", "0")
        .run();
    assert_contains(&run.stderr, "0 is not in 1..=2592000");
}

#[test]
fn two_models_with_one_id_stop_the_start_naming_the_id() {
    let run = Cli::new("serve")
        .model("toy")
        .model("count=toy")
        .model("toy")
        .opt("--port", 0)
        .run();
    run.assert_exit(1, "two models are served as 'toy'");
}

#[test]
fn a_bad_spec_after_an_id_is_a_usage_error() {
    let run = Cli::new("serve").model("a=no-such-model").run();
    run.assert_usage_error("no-such-model");
}

#[test]
fn serve_picks_each_model_by_id_and_reloads_an_idle_one() {
    let (served, addr) = start_with(
        Cli::new("serve")
            .model("a=toy")
            .model("b=toy")
            .opt("--idle-unload", 1),
    );
    let models: serde_json::Value = serde_json::from_str(&get(&addr, "/v1/models")).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"], "{models}");

    let ask = |model: &str| {
        let body = json!({"model": model, "prompt": "<start> the", "max_tokens": 3,
                          "temperature": 0});
        post(&addr, "/v1/completions", &body.to_string())
    };
    let (status, first) = ask("b");
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["model"], "b");
    // Each model answers /v1/embeddings with its own weights (the same toy).
    let embed = |model: &str| {
        let body = json!({"model": model, "input": "the cat"});
        let (status, answer) = post(&addr, "/v1/embeddings", &body.to_string());
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["model"], model);
        answer["data"][0]["embedding"].clone()
    };
    let embedding = embed("a");
    assert!(
        embedding.as_array().is_some_and(|v| !v.is_empty()),
        "{embedding}"
    );
    assert_eq!(embed("b"), embedding);
    let (status, missing) = ask("c");
    assert_eq!(status, 404, "{missing}");
    assert_eq!(missing["error"]["code"], "model_not_found");

    let start = std::time::Instant::now();
    while metric(&addr, r#"lm_model_loaded{model="b"}"#) != 0.0 {
        assert!(start.elapsed().as_secs() < 30, "b was never unloaded");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (status, again) = ask("b");
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["choices"], first["choices"]);
    assert_eq!(metric(&addr, r#"lm_model_loads_total{model="b"}"#), 2.0);
    drop(served);
}
