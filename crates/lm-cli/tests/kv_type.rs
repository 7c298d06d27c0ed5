//! `--kv-type`: the KV cache's precision for every transformer command,
//! checked on the toy decoder (whose own cache is f32): `f32` changes
//! nothing, `f16` and `q8_0` move the log-probabilities by their rounding
//! only, an unknown type is a usage error and a count model refuses it.

use crate::common::Cli;

/// The greedy ids and the sequence log-probability of five toy steps.
fn toy_run(kv_type: Option<&str>) -> (serde_json::Value, f64) {
    let cli = Cli::toy("generate")
        .n(5)
        .args(["--greedy", "--json", "--no-timing"]);
    let cli = match kv_type {
        Some(kv_type) => cli.opt("--kv-type", kv_type),
        None => cli,
    };
    let report = cli.run().json();
    let logprob = report["sequence_logprob"].as_f64().unwrap();
    (report["ids"].clone(), logprob)
}

#[test]
fn kv_type_sets_the_cache_precision_of_a_transformer() {
    let (ids, logprob) = toy_run(None);
    assert_eq!(
        toy_run(Some("f32")),
        (ids.clone(), logprob),
        "the toy's own"
    );
    // Measured: f16 moves the total by 2.6e-4, q8_0 by 5.4e-3.
    for (kv_type, largest) in [("f16", 1e-3), ("q8_0", 1e-2)] {
        let (kv_ids, kv_logprob) = toy_run(Some(kv_type));
        assert_eq!(kv_ids, ids, "{kv_type}");
        let moved = (kv_logprob - logprob).abs();
        assert!(
            moved > 0.0 && moved < largest,
            "{kv_type}: moved by {moved}"
        );
    }
}

#[test]
fn an_unknown_kv_type_or_a_count_model_is_refused() {
    Cli::toy("generate")
        .opt("--kv-type", "q4")
        .run()
        .assert_usage_error("possible values: f32, f16, q8_0");
    let count = Cli::generate("in the beginning")
        .opt("--kv-type", "q8_0")
        .run();
    assert_eq!(count.code, Some(1), "{}", count.stderr);
    assert!(
        count
            .stderr
            .contains("--kv-type applies to transformer models"),
        "{}",
        count.stderr
    );
}
