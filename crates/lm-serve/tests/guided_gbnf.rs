//! GBNF (llama.cpp's grammar format) in the `grammar` / `guided_grammar`
//! fields on SmolLM2 (ignored without it): ten seeded sampled chat
//! requests under a small GBNF grammar all conform, judged by the `regex`
//! crate's equivalent of the grammar (not by the translator), and stop as
//! the grammar ends; a greedy completion under llama.cpp's own
//! `json.gbnf` that stops parses as JSON; a GBNF grammar that does not
//! translate is a 400 naming the field and the translator's reason.

use regex::Regex;
use serde_json::{Value, json};

use crate::common::{TestServer, assert_error_message};

/// Codes and colours, with a rule used before it is defined, alternatives,
/// classes, repetition ranges, an optional escaped newline and comments.
const CODE_GBNF: &str = r#"# a code and a colour
root   ::= code " " colour "\n"?
code   ::= [A-Z]{2} "-" digit{3}   # two capitals, three digits
digit  ::= [0-9]
colour ::= ("red" | "green"
           | "blue")
"#;

/// [`CODE_GBNF`]'s language, written independently.
const CODE_REGEX: &str = r"\A[A-Z]{2}-[0-9]{3} (red|green|blue)\n?\z";

fn chat(field: &str, grammar: &str, seed: u64) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Give me a product code and a colour."}],
        "max_tokens": 64,
        "temperature": 1.0,
        "seed": seed,
        field: grammar,
    })
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn gbnf_grammars_hold_sampled_smollm2_output_and_bad_ones_are_400s() {
    let server = TestServer::smollm2(2);
    let language = Regex::new(CODE_REGEX).unwrap();
    let mut texts = Vec::new();
    for seed in 0..10 {
        let field = if seed % 2 == 0 {
            "grammar"
        } else {
            "guided_grammar"
        };
        let (status, answer) = server.post("/v1/chat/completions", &chat(field, CODE_GBNF, seed));
        assert_eq!(status, 200, "{answer}");
        let choice = &answer["choices"][0];
        let text = choice["message"]["content"].as_str().unwrap().to_owned();
        assert!(language.is_match(&text), "seed {seed}: {text:?}");
        assert_eq!(choice["finish_reason"], "stop", "seed {seed}: {answer}");
        texts.push(text);
    }
    // Sampling was free inside the grammar: the ten are not all one text.
    texts.sort();
    texts.dedup();
    assert!(texts.len() > 1, "{texts:?}");

    // llama.cpp's JSON grammar, one character per lexeme on a 49k
    // vocabulary: a greedy run that stops is JSON.
    let json_gbnf = include_str!("../../../fixtures/gbnf/json.gbnf");
    let body = json!({
        "prompt": "A JSON object describing a cat:",
        "max_tokens": 48,
        "temperature": 0,
        "grammar": json_gbnf,
    });
    let (status, answer) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{answer}");
    let choice = &answer["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text:?}");
    if choice["finish_reason"] == "stop" {
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(value.is_object(), "{text:?}");
    }

    for (field, grammar, reason) in [
        (
            "grammar",
            "root ::= \"a\"\nbad ::= [a-",
            "GBNF syntax error at line 2, column 9",
        ),
        (
            "guided_grammar",
            "root ::= missing",
            "GBNF rule 'missing' is used at line 1, column 10 but never defined",
        ),
    ] {
        let (status, answer) = server.post("/v1/chat/completions", &chat(field, grammar, 0));
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], field, "{answer}");
        assert_error_message(&answer, reason);
    }
}
