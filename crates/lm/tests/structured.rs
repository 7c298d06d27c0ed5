//! Structured output on the real SmolLM2 (Q4_1) with llguidance: twelve JSON
//! Schemas, greedy and ten seeds each, all parse and validate (the
//! `jsonschema` crate is the independent judge); regular expressions and
//! choices match (the `regex` crate); constrained greedy takes the
//! unconstrained token wherever the constraint allows it; and the
//! vocabulary mapping of both kinds (SmolLM2's byte-level BPE, Gemma 3's
//! SentencePiece) agrees with the tokenizer's own decoding.

use lm::lm_core::{Constraint, LanguageModel, TokenMask};
use lm::lm_decode::{
    Generation, GenerationConfig, OutputConstraint, SamplingConfig, Stage, StopReason, generate,
    generate_many,
};
use lm::lm_tokenize::{Message, TokenBytes};
use lm::{GgufModel, OutputFormat};
use serde_json::{Value, json};

use crate::common;

/// The twelve schemas: nested objects, bounded arrays, enums, number
/// ranges, required fields, string patterns. Every string and number is
/// bounded, so each run completes within the token limit (an unbounded
/// `number` lets a sampled run write digits until the limit).
fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "a person",
            json!({"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": false}),
        ),
        (
            "a city with its country and population",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 24},
                "country": {"type": "string", "maxLength": 24},
                "population": {"type": "integer", "minimum": 1, "maximum": 50000000}},
              "required": ["city", "country", "population"], "additionalProperties": false}),
        ),
        (
            "a colour",
            json!({"type": "object", "properties": {
                "color": {"enum": ["red", "green", "blue", "yellow"]}},
              "required": ["color"], "additionalProperties": false}),
        ),
        (
            "three to five fruits",
            json!({"type": "object", "properties": {
                "fruits": {"type": "array", "minItems": 3, "maxItems": 5,
                           "items": {"type": "string", "maxLength": 12}}},
              "required": ["fruits"], "additionalProperties": false}),
        ),
        (
            "a book with its author's name and birth year",
            json!({"type": "object", "properties": {
                "title": {"type": "string", "maxLength": 30},
                "author": {"type": "object", "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "born": {"type": "integer", "minimum": 1000, "maximum": 2020}},
                  "required": ["name", "born"], "additionalProperties": false}},
              "required": ["title", "author"], "additionalProperties": false}),
        ),
        (
            "a temperature reading in Celsius",
            json!({"type": "object", "properties": {
                "celsius": {"type": "integer", "minimum": -50, "maximum": 60},
                "unit": {"const": "C"}},
              "required": ["celsius", "unit"], "additionalProperties": false}),
        ),
        (
            "a date",
            json!({"type": "object", "properties": {
                "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
              "required": ["date"], "additionalProperties": false}),
        ),
        (
            "a product with a price and a stock flag",
            json!({"type": "object", "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                "price_cents": {"type": "integer", "minimum": 0, "maximum": 100000},
                "in_stock": {"type": "boolean"}},
              "required": ["sku", "price_cents", "in_stock"], "additionalProperties": false}),
        ),
        (
            "a point on a grid",
            json!({"type": "object", "properties": {
                "x": {"type": "integer", "minimum": -10, "maximum": 10},
                "y": {"type": "integer", "minimum": -10, "maximum": 10}},
              "required": ["x", "y"], "additionalProperties": false}),
        ),
        (
            "two tags and a score",
            json!({"type": "object", "properties": {
                "tags": {"type": "array", "minItems": 1, "maxItems": 2,
                         "items": {"enum": ["news", "sport", "science", "art"]}},
                "score": {"type": "integer", "minimum": 1, "maximum": 5}},
              "required": ["tags", "score"], "additionalProperties": false}),
        ),
        (
            "a user with an optional email",
            json!({"type": "object", "properties": {
                "username": {"type": "string", "pattern": "^[a-z]{3,10}$"},
                "email": {"type": "string", "maxLength": 30},
                "admin": {"type": "boolean"}},
              "required": ["username", "admin"], "additionalProperties": false}),
        ),
        (
            "a list of two or three points",
            json!({"type": "object", "properties": {
                "points": {"type": "array", "minItems": 2, "maxItems": 3, "items": {
                    "type": "object", "properties": {
                        "x": {"type": "integer", "minimum": 0, "maximum": 9},
                        "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                    "required": ["x", "y"], "additionalProperties": false}}},
              "required": ["points"], "additionalProperties": false}),
        ),
    ]
}

/// SmolLM2's chat prompt asking for `what` as JSON.
fn chat_prompt(model: &GgufModel, what: &str) -> Vec<u32> {
    let question = format!("Give me {what} as JSON.");
    let text = model
        .text
        .chat_prompt(&[Message::new("user", question)])
        .unwrap();
    model.text.tokenizer.encode(&text).unwrap()
}

fn config(model: &GgufModel, format: &OutputFormat, sampling: SamplingConfig) -> GenerationConfig {
    let constraint = model
        .text
        .structured_output(format, model.decoder.vocab_size())
        .unwrap();
    GenerationConfig {
        max_new_tokens: 96,
        sampling,
        end_tokens: model.text.end_ids.clone(),
        constraint: Some(OutputConstraint::new(constraint)),
        ..GenerationConfig::default()
    }
}

/// The run's text (the end token left out).
/// The constrained greedy run of `prompt`.
fn greedy(model: &GgufModel, prompt: &[u32], format: &OutputFormat) -> Generation {
    let config = config(model, format, SamplingConfig::greedy());
    generate(&model.decoder, prompt, &config, None).unwrap()
}

fn text(model: &GgufModel, run: &Generation) -> String {
    let tokens = match run.stop_reason {
        StopReason::EndToken(_) => &run.tokens[..run.tokens.len() - 1],
        _ => &run.tokens[..],
    };
    model.text.tokenizer.decode(tokens).unwrap()
}

fn sampled(seed: u64) -> SamplingConfig {
    SamplingConfig {
        temperature: 0.8,
        top_p: Some(0.95),
        seed,
        ..SamplingConfig::default()
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn twelve_schemas_greedy_and_sampled_all_parse_and_validate() {
    let model = common::smollm2();
    for (what, schema) in schemas() {
        let validator = jsonschema::validator_for(&schema).unwrap();
        let format = OutputFormat::JsonSchema(schema.clone());
        let prompt = chat_prompt(model, what);
        let greedy = greedy(model, &prompt, &format);
        let many = GenerationConfig {
            num_return_sequences: 10,
            ..config(model, &format, sampled(7))
        };
        let runs = generate_many(&model.decoder, &prompt, &many, None).unwrap();
        for run in std::iter::once(&greedy).chain(&runs) {
            let output = text(model, run);
            assert!(
                run.is_finished(),
                "{what}: {:?} {output:?}",
                run.stop_reason
            );
            let value: Value = serde_json::from_str(&output)
                .unwrap_or_else(|e| panic!("{what}: {output:?} does not parse: {e}"));
            assert!(
                validator.is_valid(&value),
                "{what}: {output} does not validate"
            );
            // Each step says how many tokens the constraint allowed.
            assert!(
                run.steps
                    .iter()
                    .all(|s| s.n_candidates.get(Stage::Constraint).is_some())
            );
        }
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn regular_expressions_choices_and_grammars_are_matched_whole() {
    let model = common::smollm2();
    let cases = [
        ("What is today's date?", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
        ("Is the sky blue?", r"(yes|no)"),
        ("Name a planet.", r"[A-Z][a-z]{2,9}"),
        ("Give a US phone number.", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
        ("Write a word in capitals.", r"[A-Z]{2,12}!?"),
    ];
    let choices = [
        ("What colour is grass?", vec!["green", "red", "blue"]),
        ("Pick a pet.", vec!["cat", "dog", "a goldfish \"Bob\""]),
    ];
    let mut formats: Vec<(&str, OutputFormat, String)> = cases
        .iter()
        .map(|&(q, rx)| (q, OutputFormat::Regex(rx.into()), format!("^(?:{rx})$")))
        .collect();
    for (q, options) in &choices {
        let escaped: Vec<String> = options.iter().map(|o| regex::escape(o)).collect();
        formats.push((
            q,
            OutputFormat::Choice(options.iter().map(|o| o.to_string()).collect()),
            format!("^(?:{})$", escaped.join("|")),
        ));
    }
    // A Lark grammar: a sentence with a bounded number in it.
    formats.push((
        "How many legs does a spider have?",
        OutputFormat::Lark(
            "start: \"A spider has \" NUMBER \" legs.\"\nNUMBER: /[0-9]{1,2}/\n".into(),
        ),
        "^A spider has [0-9]{1,2} legs\\.$".into(),
    ));
    for (question, format, pattern) in formats {
        let matcher = regex::Regex::new(&pattern).unwrap();
        let text_prompt = model
            .text
            .chat_prompt(&[Message::new("user", question)])
            .unwrap();
        let prompt = model.text.tokenizer.encode(&text_prompt).unwrap();
        let mut runs = vec![greedy(model, &prompt, &format)];
        let many = GenerationConfig {
            num_return_sequences: 10,
            ..config(model, &format, sampled(3))
        };
        runs.extend(generate_many(&model.decoder, &prompt, &many, None).unwrap());
        for run in &runs {
            let output = text(model, run);
            assert!(run.is_finished(), "{pattern}: {:?}", run.stop_reason);
            assert!(matcher.is_match(&output), "{output:?} !~ {pattern}");
        }
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn constrained_greedy_takes_the_unconstrained_token_wherever_it_is_allowed() {
    let model = common::smollm2();
    let vocab_size = model.decoder.vocab_size();
    let (what, schema) = schemas().swap_remove(0);
    let format = OutputFormat::JsonSchema(schema);
    let prompt = chat_prompt(model, what);
    let constrained = greedy(model, &prompt, &format);
    // Replay: at each step, the unconstrained argmax of the same prefix,
    // and the constraint's own mask (plus the end tokens once accepting).
    let constraint = model.text.structured_output(&format, vocab_size).unwrap();
    let mut state = constraint.start().unwrap();
    let mut mask = TokenMask::new(vocab_size);
    let mut n_agreeing = 0;
    for (index, step) in constrained.steps.iter().enumerate() {
        let (prompt, generated) = constrained.prefix(index).unwrap();
        let prefix = [prompt, generated].concat();
        let free = generate(
            &model.decoder,
            &prefix,
            &GenerationConfig {
                max_new_tokens: 1,
                sampling: SamplingConfig::greedy(),
                ..GenerationConfig::default()
            },
            None,
        )
        .unwrap();
        let free_token = free.tokens[0];
        state.fill_allowed(&mut mask).unwrap();
        if state.is_accepting().unwrap() {
            model.text.end_ids.iter().for_each(|&id| mask.allow(id));
        }
        assert!(mask.is_allowed(step.token));
        assert_eq!(
            step.n_candidates.get(Stage::Constraint),
            Some(mask.count()),
            "step {index}"
        );
        if mask.is_allowed(free_token) {
            assert_eq!(step.token, free_token, "step {index}");
            n_agreeing += 1;
        }
        if !model.text.end_ids.contains(&step.token) {
            state.advance(step.token).unwrap();
        }
    }
    assert!(n_agreeing > 0, "the check compared something");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn an_unconstrained_run_is_unchanged() {
    let model = common::smollm2();
    let prompt = chat_prompt(model, "a person");
    let base = GenerationConfig {
        max_new_tokens: 24,
        sampling: sampled(5),
        end_tokens: model.text.end_ids.clone(),
        ..GenerationConfig::default()
    };
    let first = generate(&model.decoder, &prompt, &base, None).unwrap();
    // The structured-output machinery built and dropped in between.
    let _ = model
        .text
        .structured_output(&OutputFormat::JsonObject, model.decoder.vocab_size())
        .unwrap();
    let second = generate(&model.decoder, &prompt, &base, None).unwrap();
    assert_eq!(first, second);
    assert!(
        first
            .steps
            .iter()
            .all(|s| s.n_candidates.get(Stage::Constraint).is_none())
    );
}

/// Every token's bytes, as the engine sees them, decode (alone, after a
/// neutral token) to the tokenizer's own text: checked for every id of
/// both vocabularies whose text is whole UTF-8.
fn check_token_bytes(text: &lm::GgufText, lead: u32) {
    let tokenizer = &text.tokenizer;
    let lead_text = tokenizer.decode(&[lead]).unwrap();
    let mut n_checked = 0;
    for (id, bytes) in (0u32..).zip(tokenizer.token_bytes()) {
        let TokenBytes::Text(bytes) = bytes else {
            continue;
        };
        let Ok(expected) = String::from_utf8(bytes) else {
            continue;
        };
        let decoded = tokenizer.decode(&[lead, id]).unwrap();
        assert_eq!(
            decoded.strip_prefix(&lead_text),
            Some(expected.as_str()),
            "token {id}"
        );
        n_checked += 1;
    }
    assert!(n_checked > tokenizer.vocab_size() / 2, "{n_checked}");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_token_bytes_are_what_the_tokenizer_decodes() {
    let text = common::smollm2_text();
    let lead = text.tokenizer.encode("a").unwrap()[0];
    check_token_bytes(&text, lead);
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn gemma3_token_bytes_are_what_the_tokenizer_decodes() {
    let text = common::gemma3_text();
    let lead = text.tokenizer.token_id("a").unwrap();
    check_token_bytes(text, lead);
    // A constraint over Gemma's vocabulary allows a choice's first pieces.
    let format = OutputFormat::Choice(vec!["yes".into(), "no".into()]);
    let constraint = text.structured_output(&format, 262_144).unwrap();
    let mut state = constraint.start().unwrap();
    let mut mask = TokenMask::new(262_144);
    state.fill_allowed(&mut mask).unwrap();
    for piece in ["yes", "no", "y", "n"] {
        if let Some(id) = text.tokenizer.token_id(piece) {
            assert!(mask.is_allowed(id), "{piece}");
        }
    }
    assert!(!mask.is_allowed(text.tokenizer.token_id("▁yes").unwrap()));
}

#[test]
fn a_format_the_engine_refuses_names_the_engines_reason() {
    let error = OutputFormat::Lark("start: foo".into()).check().unwrap_err();
    assert!(error.message.contains("foo"), "{error}");
    let error = OutputFormat::JsonSchema(json!({"type": "nonsense"}))
        .check()
        .unwrap_err();
    assert!(error.message.contains("nonsense"), "{error}");
    assert!(OutputFormat::JsonObject.check().is_ok());
    assert!(
        OutputFormat::Choice(vec!["a \"quoted\" one".into()])
            .check()
            .is_ok()
    );
}
