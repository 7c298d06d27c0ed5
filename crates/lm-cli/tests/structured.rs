//! Structured output from the command line: a format the engine refuses is
//! a usage error (exit 2) quoting llguidance, before any model is loaded
//! (a missing model file is never opened); a `--grammar` is GBNF or Lark,
//! inline or a file; on SmolLM2, `--json-schema`, `--choice`, `--regex` and
//! GBNF `--grammar` runs give what was asked, stop as
//! `constraint_complete`, and report `constraint_ms`.

use lm_model::catalog::SMOLLM2;

use crate::common::{Cli, assert_contains};

/// A model path that does not exist: a run that got as far as loading
/// would fail with exit 1, naming it.
const NO_MODEL: &str = "/nonexistent/model.gguf";

#[test]
fn a_refused_format_is_a_usage_error_before_the_model_loads() {
    let cases = [
        (
            "--regex",
            "[0-9",
            "--regex: the output format was refused: ",
        ),
        (
            "--json-schema",
            "{\"type\": \"nonsense\"}",
            "Invalid type: nonsense",
        ),
        (
            "--json-schema",
            "{not json",
            "--json-schema: the schema is not JSON",
        ),
        // A grammar given inline is GBNF when its first rule is `name ::=`,
        // else Lark; each is refused with its own reader's words.
        (
            "--grammar",
            "root ::= \"a",
            "--grammar: the output format was refused: GBNF syntax error at line 1, column 10",
        ),
        (
            "--grammar",
            "root ::= digit",
            "GBNF rule 'digit' is used at line 1, column 10 but never defined",
        ),
        (
            "--grammar",
            "start: (",
            "--grammar: the output format was refused: ",
        ),
    ];
    for (flag, value, expected) in cases {
        let run = Cli::new("generate")
            .model(NO_MODEL)
            .opt("--prompt", "x")
            .opt(flag, value)
            .run();
        assert_eq!(run.code, Some(2), "{flag} {value}: {}", run.stderr);
        assert_contains(&run.stderr, expected);
        assert!(!run.stderr.contains(NO_MODEL), "{}", run.stderr);
    }
    // A good grammar, inline or in a file (llama.cpp's json.gbnf), passes
    // the check and the run goes on to load the model.
    let json_gbnf = format!(
        "{}/../../fixtures/gbnf/json.gbnf",
        env!("CARGO_MANIFEST_DIR")
    );
    for grammar in ["root ::= [0-9]+", "start: /[0-9]+/", json_gbnf.as_str()] {
        let run = Cli::new("generate")
            .model(NO_MODEL)
            .opt("--prompt", "x")
            .opt("--grammar", grammar)
            .run();
        assert_eq!(run.code, Some(1), "{grammar}: {}", run.stderr);
        assert_contains(&run.stderr, NO_MODEL);
    }
    let run = Cli::new("chat").model(NO_MODEL).opt("--regex", "(").run();
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    // Two formats at once are refused by the parser.
    let run = Cli::generate("x")
        .opt("--regex", "a")
        .opt("--choice", "a,b")
        .run();
    assert_eq!(run.code, Some(2));
}

#[test]
fn structured_output_needs_a_gguf_model() {
    let run = Cli::toy("generate").opt("--choice", "cat,dog").run();
    assert_eq!(run.code, Some(1));
    assert_contains(&run.stderr, "structured output needs a GGUF model");
}

fn smollm2_chat(question: &str) -> Cli {
    if let Err(err) = SMOLLM2.path() {
        panic!("{err}");
    }
    Cli::new("generate")
        .model("smollm2")
        .arg("--chat")
        .opt("--prompt", question)
        .n(48)
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn json_schema_choice_and_regex_runs_give_what_was_asked() {
    let schema = r#"{"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 99}},
      "required": ["name", "age"], "additionalProperties": false}"#;
    let report = smollm2_chat("Describe a person as JSON.")
        .opt("--json-schema", schema)
        .arg("--greedy")
        .json();
    assert_eq!(report["stop_reason"], "constraint_complete");
    let value: serde_json::Value = serde_json::from_str(report["text"].as_str().unwrap()).unwrap();
    assert!(
        value["name"].is_string() && value["age"].as_u64().unwrap() < 100,
        "{value}"
    );
    assert!(report["timing"]["constraint_ms"].as_f64().unwrap() > 0.0);
    let steps = report["steps"].as_array().unwrap();
    assert!(
        steps
            .iter()
            .all(|s| s["n_candidates"]["constraint"].as_u64().unwrap() >= 1)
    );

    for seed in 0..3 {
        let run = smollm2_chat("Which is a fruit?")
            .opt("--choice", "apple,carrot,bread")
            .seed(seed)
            .arg("--no-stream")
            .ok();
        let answer = run.stdout.trim();
        assert!(["apple", "carrot", "bread"].contains(&answer), "{answer:?}");
    }
    // Beam search keeps every beam in the language.
    let report = smollm2_chat("Which is a fruit?")
        .opt("--choice", "apple,carrot,bread")
        .opt("--num-beams", 3)
        .json();
    for beam in report["beams"].as_array().unwrap() {
        let text = beam["text"].as_str().unwrap();
        assert!(["apple", "carrot", "bread"].contains(&text), "{text:?}");
    }
    // A GBNF grammar (rules used before they are defined, a repetition
    // range), judged by an independent regex.
    let gbnf = "root ::= answer \" \" digit{1,2}\nanswer ::= \"yes\" | \"no\"\ndigit ::= [0-9]";
    let answer = regex::Regex::new("^(yes|no) [0-9]{1,2}$").unwrap();
    for seed in 0..3 {
        let report = smollm2_chat("Yes or no, and a number?")
            .opt("--grammar", gbnf)
            .seed(seed)
            .json();
        let text = report["text"].as_str().unwrap();
        assert!(answer.is_match(text), "seed {seed}: {text:?}");
        assert_eq!(report["stop_reason"], "constraint_complete");
    }
    let report = smollm2_chat("What is today's date?")
        .opt("--regex", "[0-9]{4}-[0-9]{2}-[0-9]{2}")
        .seed(1)
        .json();
    let text = report["text"].as_str().unwrap();
    let date = regex::Regex::new("^[0-9]{4}-[0-9]{2}-[0-9]{2}$").unwrap();
    assert!(date.is_match(text), "{text:?}");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn the_readme_shows_this_schema_constrained_trace() {
    let schema = r#"{"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": false}"#;
    let run = smollm2_chat("What colour is the sky? Answer in JSON.")
        .opt("--json-schema", schema)
        .arg("--greedy")
        .arg("--trace")
        .ok();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let command = format!(
        "lm-cli generate --model smollm2 --chat --prompt \"What colour is the sky? Answer in JSON.\" --json-schema '{schema}' --greedy --trace\n"
    );
    assert!(
        readme.contains(&format!("{command}{}", run.stdout)),
        "README's structured-output trace differs; now:\n{}",
        run.stdout
    );
    assert!(run.stdout.contains("stop: constraint_complete"));
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn every_chat_reply_is_held_to_the_choice() {
    if let Err(err) = SMOLLM2.path() {
        panic!("{err}");
    }
    let run = Cli::new("chat")
        .model("smollm2")
        .opt("--choice", "yes,no")
        .run_with_stdin("Is water wet?\nIs fire cold?\n");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let replies: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(replies.len(), 2, "{:?}", run.stdout);
    assert!(
        replies.iter().all(|r| ["yes", "no"].contains(r)),
        "{replies:?}"
    );
}
