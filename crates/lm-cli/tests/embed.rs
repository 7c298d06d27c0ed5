//! `lm-cli embed` and `lm-cli serve --pooling`: the vectors equal the
//! facade's (`lm::embed_tokens`, `GgufModel::embed`) and `/v1/embeddings`'
//! (the toy decoder here; SmolLM2 when fetched), and a count model, which
//! has no hidden states, is refused.

use lm_model::catalog::SMOLLM2;
use serde_json::json;

use crate::common::{Cli, floats};
use crate::serve::{post, start_with};

/// `lm-cli embed`'s vectors for `texts` under `model` with `pooling`.
fn cli_vectors(model: &str, pooling: &str, texts: &[&str]) -> Vec<Vec<f64>> {
    let mut cli = Cli::new("embed").model(model).opt("--pooling", pooling);
    for text in texts {
        cli = cli.opt("--text", text);
    }
    let report = cli.ok().json();
    assert_eq!(report["pooling"], pooling);
    report["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| floats(&item["embedding"]))
        .collect()
}

/// `/v1/embeddings`' vectors for `texts` from `lm-cli serve --model model
/// --pooling pooling`.
fn served_vectors(model: &str, pooling: &str, texts: &[&str]) -> Vec<Vec<f64>> {
    let (_served, addr) = start_with(Cli::new("serve").model(model).opt("--pooling", pooling));
    let (status, body) = post(
        &addr,
        "/v1/embeddings",
        &json!({"input": texts}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| floats(&item["embedding"]))
        .collect()
}

fn assert_close(a: &[Vec<f64>], b: &[Vec<f64>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len(), "{what}");
        let gap = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f64::max);
        assert!(gap <= 1e-5, "{what}: vectors differ by {gap}");
    }
}

#[test]
fn embed_on_the_toy_equals_the_library_and_the_server() {
    let texts = ["<start> the cat sat", "<start> the dog slept <end>"];
    let cli = cli_vectors("toy", "last", &texts);
    let decoder = lm_model::Toy::decoder();
    for (text, vector) in texts.iter().zip(&cli) {
        let ids = lm_model::Toy::encode(text).unwrap();
        let library = lm::embed_tokens(&decoder, &ids, lm::Pooling::Last).unwrap();
        let library: Vec<f64> = library.iter().map(|&x| f64::from(x)).collect();
        assert_close(&[library], std::slice::from_ref(vector), text);
        let norm: f64 = vector.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() <= 1e-5, "{text}: length {norm}");
    }
    assert_close(&served_vectors("toy", "last", &texts), &cli, "served");
    // Mean pooling is another vector.
    assert_ne!(cli_vectors("toy", "mean", &texts[..1])[0], cli[0]);
}

#[test]
fn embed_refuses_a_count_model_and_an_unknown_pooling() {
    let run = Cli::new("embed").opt("--text", "And God said").run();
    run.assert_exit(1, "no hidden states");
    let run = Cli::new("embed")
        .model("toy")
        .opt("--pooling", "max")
        .opt("--text", "<start>")
        .run();
    run.assert_usage_error("unknown pooling \"max\"");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn embed_on_smollm2_equals_the_library_and_the_server() {
    let path = SMOLLM2.path().unwrap_or_else(|err| panic!("{err}"));
    let model = lm::load(&path).unwrap();
    let texts = ["A cat sat on the mat.", "The stock market fell today."];
    for pooling in ["mean", "last"] {
        let cli = cli_vectors("smollm2", pooling, &texts);
        let library: Vec<Vec<f64>> = texts
            .iter()
            .map(|t| {
                let v = model.embed(t, pooling.parse().unwrap()).unwrap();
                v.iter().map(|&x| f64::from(x)).collect()
            })
            .collect();
        assert_close(&cli, &library, pooling);
        assert_eq!(cli[0].len(), 576);
        assert_close(&served_vectors("smollm2", pooling, &texts), &cli, pooling);
    }
}
