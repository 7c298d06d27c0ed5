//! Gemma 3's SentencePiece tokenizer built from the real GGUF file by the
//! loader, against llama.cpp (`fixtures/gemma3/tokenize.json`, written by
//! `cargo xtask reference-fixtures` with llama-cpp-python, vocabulary only):
//! ids without and with BOS, and detokenized text with and without control
//! tokens. The same texts under the same vocabulary with
//! `add_space_prefix` set (Llama 2's style; Gemma's is unset) check that path.
//! Ignored until the model is fetched; with `--include-ignored` and no model
//! they fail naming the fetch command.

use lm::lm_core::Detokenize;
use lm::lm_model::GgufFile;
use lm::lm_model::catalog::GEMMA3_270M;
use lm::lm_tokenize::Tokenizer;
use serde::Deserialize;

use crate::common;

/// llama.cpp's fixture: `{"add_bos", "end_of_generation_ids", "cases": [..]}`.
#[derive(Debug, Deserialize)]
struct Fixture {
    add_bos: bool,
    end_of_generation_ids: Vec<u32>,
    cases: Vec<Case>,
    with_add_space_prefix: Cases,
}

/// llama.cpp's cases under the vocabulary with `add_space_prefix` set.
#[derive(Debug, Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    text: String,
    ids: Vec<u32>,
    ids_with_bos: Vec<u32>,
    detokenized: String,
    detokenized_without_special: String,
}

fn fixture() -> Fixture {
    common::fixture_json("gemma3/tokenize.json")
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn encodes_every_text_like_llama_cpp_with_and_without_bos() {
    let tokenizer = &common::gemma3_text().tokenizer;
    let fixture = fixture();
    assert!(fixture.cases.len() >= 30, "{} cases", fixture.cases.len());
    assert_eq!(tokenizer.add_bos(), fixture.add_bos);
    let mismatches = encoding_mismatches(tokenizer, &fixture.cases);
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn decodes_every_case_like_llama_cpp_detokenize() {
    let tokenizer = &common::gemma3_text().tokenizer;
    let mismatches = decoding_mismatches(tokenizer, &fixture().cases);
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn with_a_space_prefix_encodes_and_decodes_like_llama_cpp() {
    let path = GEMMA3_270M.path().unwrap_or_else(|err| panic!("{err}"));
    let file = GgufFile::open_metadata(path).unwrap();
    let mut vocab = lm::spm_vocab(&file).unwrap();
    assert!(!vocab.add_space_prefix);
    vocab.add_space_prefix = true;
    let tokenizer = Tokenizer::from_spm_vocab(vocab).unwrap();
    let cases = fixture().with_add_space_prefix.cases;
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let mut mismatches = encoding_mismatches(&tokenizer, &cases);
    mismatches.extend(decoding_mismatches(&tokenizer, &cases));
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// The cases whose ids (with BOS, as `encode` adds it) differ from llama.cpp's.
fn encoding_mismatches(tokenizer: &Tokenizer, cases: &[Case]) -> Vec<String> {
    let bos_id = tokenizer.bos_id().expect("Gemma names a bos token");
    let mut mismatches = Vec::new();
    for case in cases {
        let with_bos = tokenizer.encode(&case.text).expect("encodes");
        if with_bos != case.ids_with_bos {
            mismatches.push(format!(
                "{}: {:?}\n  ours      {with_bos:?}\n  llama.cpp {:?}",
                case.name, case.text, case.ids_with_bos
            ));
        }
        // llama.cpp's `ids` are the same without BOS.
        assert_eq!(
            case.ids_with_bos.split_first(),
            Some((&bos_id, &case.ids[..]))
        );
    }
    mismatches
}

/// The cases whose decoded text differs from llama.cpp's detokenized text,
/// with control tokens written out and left out.
fn decoding_mismatches(tokenizer: &Tokenizer, cases: &[Case]) -> Vec<String> {
    let mut mismatches = Vec::new();
    for case in cases {
        let checks = [
            (
                "decode",
                tokenizer.decode(&case.ids).unwrap(),
                &case.detokenized,
            ),
            (
                "Detokenize::decode",
                Detokenize::decode(tokenizer, &case.ids),
                &case.detokenized,
            ),
            (
                "decode_skipping_special",
                tokenizer.decode_skipping_special(&case.ids).unwrap(),
                &case.detokenized_without_special,
            ),
        ];
        for (how, ours, want) in checks {
            if &ours != want {
                mismatches.push(format!(
                    "{}: {how} gives {ours:?}, llama.cpp {want:?}",
                    case.name
                ));
            }
        }
    }
    mismatches
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn vocabulary_facts_and_end_tokens_match_llama_cpp() {
    let text = common::gemma3_text();
    let tokenizer = &text.tokenizer;
    // docs: shared/models/GEMMA3.md; the end tokens from the fixture.
    assert_eq!(tokenizer.vocab_size(), 262_144);
    assert_eq!((tokenizer.bos_id(), tokenizer.eos_id()), (Some(2), Some(1)));
    assert!(!tokenizer.add_eos());
    assert_eq!(text.end_ids, fixture().end_of_generation_ids);
    assert_eq!(text.end_ids, [1, 106, 212]);
    assert_eq!(tokenizer.token_id("<start_of_turn>"), Some(105));
    assert_eq!(tokenizer.token_text(238), Some("<0x00>"));
    assert!(tokenizer.is_special(106) && !tokenizer.is_special(107));
    assert_eq!(
        tokenizer.encode("The capital of France is").unwrap(),
        [2, 818, 5279, 529, 7001, 563]
    );
    // A literal "<start_of_turn>" is spelled out, never the control token.
    let literal = tokenizer.encode_literal("<start_of_turn>").unwrap();
    assert!(!literal.contains(&105) && literal.len() > 2, "{literal:?}");
    assert_eq!(tokenizer.decode(&literal).unwrap(), "<bos><start_of_turn>");
    // llama.cpp (parse_special=False): "</s>", an end token and so a control
    // token, is spelled out; the user-defined "<b>" (200) is still matched.
    assert_eq!(
        tokenizer.encode_literal("a</s>b<b>c").unwrap(),
        [2, 236746, 954, 236751, 236813, 236763, 200, 236755]
    );
    assert_eq!(
        tokenizer.encode("a</s>b<b>c").unwrap(),
        [2, 236746, 212, 236763, 200, 236755]
    );
    assert!(tokenizer.is_special(212));
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn stream_emits_byte_fallback_characters_only_when_whole() {
    let tokenizer = &common::gemma3_text().tokenizer;
    // U+20000 and U+2A6D6 are spelled with <0xNN> byte tokens.
    let text = "rare \u{20000}\u{2A6D6} and 🙂 done";
    let (ids, n_withheld) = common::check_stream(tokenizer, text, true);
    assert!(
        n_withheld >= 3,
        "no character was split into bytes: {ids:?}"
    );
}
