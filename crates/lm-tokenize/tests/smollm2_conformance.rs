//! SmolLM2's tokenizer built from the real GGUF file against reference ids:
//! llama.cpp's (`fixtures/smollm2/tokenize.json`, written by
//! `cargo xtask reference-fixtures` with llama-cpp-python) and those of the
//! independent pure-Python BPE in `scripts/tokenize/reference_bpe.py`
//! (`fixtures/tokenize/smollm2_reference_ids.json`). Skips (with a message)
//! when the model file is absent.

mod common;

use lm_core::Detokenize;
use serde::Deserialize;

/// One prompt and the ids a reference tokenizer gives it.
#[derive(Debug, Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

fn read_cases(relative: &str) -> Vec<Case> {
    let path = common::fixture_path(relative);
    let json = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    serde_json::from_str(&json).expect("fixture is a list of {text, ids}")
}

/// llama.cpp's fixture: `{"cases": [{name, text, ids, detokenized, ..}]}`.
#[derive(Debug, Deserialize)]
struct LlamaCppFixture {
    cases: Vec<LlamaCppCase>,
}

#[derive(Debug, Deserialize)]
struct LlamaCppCase {
    name: String,
    text: String,
    ids: Vec<u32>,
    detokenized: String,
}

#[test]
fn encodes_and_decodes_every_prompt_like_llama_cpp() {
    let Some(tokenizer) =
        common::smollm2_tokenizer("encodes_and_decodes_every_prompt_like_llama_cpp")
    else {
        return;
    };
    let path = common::fixture_path("smollm2/tokenize.json");
    let json = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    let fixture: LlamaCppFixture = serde_json::from_str(&json).expect("tokenize.json");
    assert!(fixture.cases.len() >= 20, "{} cases", fixture.cases.len());
    let mut mismatches = Vec::new();
    for case in &fixture.cases {
        let ids = tokenizer.encode(&case.text).expect("encodes");
        if ids != case.ids {
            mismatches.push(format!(
                "{}: {:?}\n  ours      {ids:?}\n  llama.cpp {:?}",
                case.name, case.text, case.ids
            ));
        }
        let text = tokenizer.decode(&case.ids).expect("decodes");
        if text != case.detokenized {
            mismatches.push(format!(
                "{}: decode gives {text:?}, llama.cpp {:?}",
                case.name, case.detokenized
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn encodes_every_fixture_prompt_like_the_reference_bpe() {
    let Some(tokenizer) =
        common::smollm2_tokenizer("encodes_every_fixture_prompt_like_the_reference_bpe")
    else {
        return;
    };
    let cases = read_cases("tokenize/smollm2_reference_ids.json");
    assert!(cases.len() >= 20, "fixture has {} cases", cases.len());
    let mut mismatches = Vec::new();
    for case in &cases {
        let ids = tokenizer.encode(&case.text).expect("encodes");
        if ids != case.ids {
            mismatches.push(format!(
                "{:?}\n  ours {ids:?}\n  ref  {:?}",
                case.text, case.ids
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn decode_inverts_encode_on_every_fixture_prompt() {
    let Some(tokenizer) =
        common::smollm2_tokenizer("decode_inverts_encode_on_every_fixture_prompt")
    else {
        return;
    };
    for case in read_cases("tokenize/smollm2_reference_ids.json") {
        let ids = tokenizer.encode(&case.text).expect("encodes");
        assert_eq!(tokenizer.decode(&ids).expect("decodes"), case.text);
        assert_eq!(Detokenize::decode(&tokenizer, &ids), case.text);
    }
}

#[test]
fn vocabulary_facts_match_the_model_card() {
    let Some(tokenizer) = common::smollm2_tokenizer("vocabulary_facts_match_the_model_card") else {
        return;
    };
    // docs: shared/models/SMOLLM2.md.
    assert_eq!(tokenizer.vocab_size(), 49152);
    assert_eq!(tokenizer.bos_id(), Some(1));
    assert_eq!(tokenizer.eos_id(), Some(2));
    assert!(!tokenizer.add_bos());
    assert_eq!(tokenizer.end_ids(), &[0, 2, 4]);
    assert_eq!(tokenizer.token_text(1), Some("<|im_start|>"));
    assert_eq!(tokenizer.token_id("<|im_end|>"), Some(2));
    assert!((0..=16).all(|id| tokenizer.is_special(id)));
    assert!(!tokenizer.is_special(17));
    assert_eq!(
        tokenizer
            .decode_skipping_special(&[1, 19556, 905, 2])
            .unwrap(),
        "Hello world"
    );
}

#[test]
fn stream_emits_emoji_only_when_whole() {
    let Some(tokenizer) = common::smollm2_tokenizer("stream_emits_emoji_only_when_whole") else {
        return;
    };
    let text = "family 👨‍👩‍👧 flag 🇫🇷 and 🙂 done";
    let ids = tokenizer.encode(text).unwrap();
    let mut stream = tokenizer.text_stream(false);
    let mut chunks = Vec::new();
    let mut n_withheld = 0;
    for &id in &ids {
        match stream.push(id).unwrap() {
            Some(chunk) => chunks.push(chunk),
            None => n_withheld += 1,
        }
    }
    chunks.push(stream.finish().unwrap());
    assert!(n_withheld > 0, "no emoji was split across tokens: {ids:?}");
    assert!(
        chunks
            .iter()
            .all(|c| !c.contains(char::REPLACEMENT_CHARACTER)),
        "{chunks:?}"
    );
    assert_eq!(chunks.concat(), text);
}
