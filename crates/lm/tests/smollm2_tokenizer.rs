//! SmolLM2's tokenizer built from the real GGUF file by the loader, against
//! reference ids:
//! llama.cpp's (`fixtures/smollm2/tokenize.json`, written by
//! `cargo xtask reference-fixtures` with llama-cpp-python) and those of the
//! independent pure-Python BPE in `scripts/tokenize/reference_bpe.py`
//! (`fixtures/tokenize/smollm2_reference_ids.json`). Ignored until the model
//! is fetched; with `--include-ignored` and no model they fail naming the
//! fetch command.

use lm::lm_core::Detokenize;
use lm::lm_tokenize::Tokenizer;
use serde::Deserialize;

use crate::common;

/// One prompt and the ids a reference tokenizer gives it.
#[derive(Debug, Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
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

/// The encodings of `tokenizer` that differ from a reference's, one message
/// each naming the case, the text and both id lists.
fn encoding_mismatches<'a, Name: std::fmt::Display>(
    tokenizer: &Tokenizer,
    reference: &str,
    cases: impl IntoIterator<Item = (Name, &'a str, &'a [u32])>,
) -> Vec<String> {
    cases
        .into_iter()
        .filter_map(|(name, text, want)| {
            let ids = tokenizer.encode(text).expect("encodes");
            (ids != want)
                .then(|| format!("{name}: {text:?}\n  ours {ids:?}\n  {reference} {want:?}"))
        })
        .collect()
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn encodes_and_decodes_every_prompt_like_llama_cpp() {
    let tokenizer = common::smollm2_text().tokenizer;
    let fixture: LlamaCppFixture = common::fixture_json("smollm2/tokenize.json");
    assert!(fixture.cases.len() >= 20, "{} cases", fixture.cases.len());
    let mut mismatches = encoding_mismatches(
        &tokenizer,
        "llama.cpp",
        fixture
            .cases
            .iter()
            .map(|c| (c.name.as_str(), c.text.as_str(), c.ids.as_slice())),
    );
    for case in &fixture.cases {
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
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn encodes_every_fixture_prompt_like_the_reference_bpe_and_decodes_it_back() {
    let tokenizer = common::smollm2_text().tokenizer;
    let cases: Vec<Case> = common::fixture_json("tokenize/smollm2_reference_ids.json");
    assert!(cases.len() >= 20, "fixture has {} cases", cases.len());
    let mismatches = encoding_mismatches(
        &tokenizer,
        "ref",
        cases
            .iter()
            .enumerate()
            .map(|(index, c)| (index, c.text.as_str(), c.ids.as_slice())),
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    // Decoding inverts encoding on every prompt.
    for case in cases {
        let ids = tokenizer.encode(&case.text).expect("encodes");
        assert_eq!(tokenizer.decode(&ids).expect("decodes"), case.text);
        assert_eq!(Detokenize::decode(&tokenizer, &ids), case.text);
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn vocabulary_facts_match_the_model_card() {
    let tokenizer = common::smollm2_text().tokenizer;
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
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn stream_emits_emoji_only_when_whole() {
    let tokenizer = common::smollm2_text().tokenizer;
    let text = "family 👨‍👩‍👧 flag 🇫🇷 and 🙂 done";
    let (ids, n_withheld) = common::check_stream(&tokenizer, text, false);
    assert!(n_withheld > 0, "no emoji was split across tokens: {ids:?}");
}
