//! `POST /v1/embeddings` on SmolLM2 (ignored without it), mean pooling:
//! the vectors equal the facade's `GgufModel::embed` to 1e-5 (lm-cli's
//! tests check `lm-cli embed` against the same), have unit length, are the
//! same bits alone or among 16 inputs, and rank a paraphrase above an
//! unrelated sentence on at least 8 of 10 held pairs. The official `openai`
//! client reads them too (`embeddings.py`: its default base64 encoding).

use std::sync::Arc;

use lm::{Embedder, Pooling};
use lm_serve::{RunningServer, ServeConfig, Server};
use serde_json::{Value, json};

use crate::common::{post_body, run_checks, smollm2_path, venv_python};

/// Ten sentences, each with a paraphrase and an unrelated sentence.
const HELD_PAIRS: [(&str, &str, &str); 10] = [
    (
        "The cat is sleeping on the sofa.",
        "A cat naps on the couch.",
        "The stock market fell sharply today.",
    ),
    (
        "How do I bake bread at home?",
        "What is a simple way to make homemade bread?",
        "The train to Paris leaves at noon.",
    ),
    (
        "It is raining heavily outside.",
        "There is a downpour out there.",
        "She plays the violin in an orchestra.",
    ),
    (
        "The car would not start this morning.",
        "My car failed to start today.",
        "Penguins live in the Southern Hemisphere.",
    ),
    (
        "He is learning to speak Spanish.",
        "He is studying the Spanish language.",
        "The soup needs more salt.",
    ),
    (
        "The meeting was moved to Friday.",
        "The meeting has been rescheduled for Friday.",
        "Volcanoes erupt molten rock.",
    ),
    (
        "I lost my keys somewhere in the house.",
        "My keys are missing somewhere at home.",
        "The football match ended in a draw.",
    ),
    (
        "The doctor said I need more sleep.",
        "My physician told me to rest more.",
        "The library closes at eight.",
    ),
    (
        "Prices of food keep going up.",
        "Groceries are getting more expensive.",
        "The telescope revealed a distant galaxy.",
    ),
    (
        "The children are playing in the park.",
        "Kids are playing at the playground.",
        "The contract was signed by both companies.",
    ),
];

/// SmolLM2 served with embeddings pooled by `pooling`.
fn serve(pooling: Pooling) -> RunningServer {
    let lm::GgufModel { decoder, text, .. } = lm::load_gguf(smollm2_path()).unwrap();
    let decoder = Arc::new(decoder);
    let config = ServeConfig {
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        model_name: "smollm2".into(),
        ..ServeConfig::default()
    };
    Server::bind(Arc::new(Arc::clone(&decoder)), Arc::new(text), config)
        .unwrap()
        .with_embeddings(Embedder::new(decoder, pooling))
        .spawn()
        .unwrap()
}

/// The vectors `/v1/embeddings` answers for `input` (and the body).
fn embed(server: &RunningServer, input: Value) -> (Vec<Vec<f32>>, Value) {
    let body = json!({"input": input, "model": "smollm2"});
    let response = post_body(server.local_addr(), "/v1/embeddings", &body.to_string());
    let answer = response.json();
    assert_eq!(response.status, 200, "{answer}");
    let vectors = answer["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["index"], i);
            let values = item["embedding"].as_array().unwrap();
            values.iter().map(|x| x.as_f64().unwrap() as f32).collect()
        })
        .collect();
    (vectors, answer)
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// How many held pairs rank the paraphrase above the unrelated sentence.
fn n_paraphrases_closer(vectors: &[Vec<f32>]) -> usize {
    vectors
        .chunks_exact(3)
        .filter(|v| dot(&v[0], &v[1]) > dot(&v[0], &v[2]))
        .count()
}

#[test]
#[ignore = "needs SmolLM2 and the openai venv: cargo xtask fetch-model smollm2; .ci/run installs openai"]
fn embeddings_equal_the_library_have_unit_length_and_rank_paraphrases() {
    let server = serve(Pooling::Mean);
    let reference = lm::load_gguf(smollm2_path()).unwrap();
    let texts: Vec<&str> = HELD_PAIRS.iter().flat_map(|&(a, b, c)| [a, b, c]).collect();
    let (vectors, answer) = embed(&server, json!(texts));
    assert_eq!(vectors.len(), 30);
    let n_tokens: usize = texts
        .iter()
        .map(|t| reference.text.tokenizer.encode(t).unwrap().len())
        .sum();
    assert_eq!(answer["usage"]["prompt_tokens"], n_tokens);
    for (text, served) in texts.iter().zip(&vectors) {
        let library = reference.embed(text, Pooling::Mean).unwrap();
        assert_eq!(served.len(), 576);
        let gap = served
            .iter()
            .zip(&library)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(gap <= 1e-5, "{text}: differs from the library by {gap}");
        let norm = dot(served, served).sqrt();
        assert!((norm - 1.0).abs() <= 1e-5, "{text}: length {norm}");
    }
    let closer = n_paraphrases_closer(&vectors);
    // Last-token pooling, for the record (the library's vectors).
    let last: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| reference.embed(t, Pooling::Last).unwrap())
        .collect();
    println!(
        "paraphrase closer than unrelated: mean pooling {closer}/10, last {}/10",
        n_paraphrases_closer(&last)
    );
    assert!(closer >= 8, "mean pooling ranks {closer} of 10 pairs");

    // One input alone, and among 16 (token ids, a list of id lists): the
    // same bits.
    let alone = embed(&server, json!(texts[4])).0.remove(0);
    let (batch, _) = embed(&server, json!(texts[..16]));
    assert_eq!(batch[4], alone);
    let ids = reference.text.tokenizer.encode(texts[4]).unwrap();
    assert_eq!(embed(&server, json!(ids)).0[0], alone);
    assert_eq!(embed(&server, json!([[1, 2, 3], ids])).0[1], alone);

    // Refusals name the field.
    for (body, param) in [
        (json!({"input": "a", "dimensions": 64}), "dimensions"),
        (json!({"input": [49152]}), "input"),
        (json!({"input": ""}), "input"),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
    ] {
        let response = post_body(server.local_addr(), "/v1/embeddings", &body.to_string());
        assert_eq!(response.status, 400, "{body}");
        assert_eq!(response.json()["error"]["param"], param, "{body}");
    }
    let body = json!({"input": "a", "dimensions": 576});
    let response = post_body(server.local_addr(), "/v1/embeddings", &body.to_string());
    assert_eq!(response.status, 200);

    // The openai client (base64 by default) reads the same vectors.
    let python = venv_python("LM_OPENAI_PYTHON", "openai-venv", &["openai"]);
    let expected = serde_json::to_string(&vectors[..3]).unwrap();
    run_checks(
        &python,
        "embeddings.py",
        &[
            format!("http://{}/v1", server.local_addr()),
            serde_json::to_string(&texts[..3]).unwrap(),
            expected,
        ],
    );
}
