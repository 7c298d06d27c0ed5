//! Loading Hugging Face `tokenizer.json` documents, good and bad.

use lm_tokenize::{TokenizeError, Tokenizer};

/// A byte-level BPE with tokens "h", "i", "hi", "Ġ", "Ġhi" and a special end token.
const TINY_JSON: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {"id": 0, "content": "<|end|>", "single_word": false, "lstrip": false,
     "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {
    "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
    "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
    "vocab": {"<|end|>": 0, "h": 1, "i": 2, "hi": 3, "Ġ": 4, "Ġhi": 5},
    "merges": ["h i", "Ġ hi"]
  }
}"#;

#[test]
fn tiny_tokenizer_json_encodes_and_decodes() {
    let tokenizer = Tokenizer::from_json_str(TINY_JSON).unwrap();
    // Hand-worked: "hi" -> h,i -> hi (3); " hi" -> Ġ,h,i -> Ġ,hi -> Ġhi (5); then <|end|>.
    assert_eq!(tokenizer.encode("hi hi<|end|>").unwrap(), vec![3, 5, 0]);
    assert_eq!(tokenizer.decode(&[3, 5, 0]).unwrap(), "hi hi<|end|>");
    assert_eq!(
        tokenizer.decode_skipping_special(&[3, 5, 0]).unwrap(),
        "hi hi"
    );
    assert_eq!(tokenizer.vocab_size(), 6);
    assert_eq!(tokenizer.token_text(5), Some("Ġhi"));
    assert!(tokenizer.is_special(0));
    assert_eq!(tokenizer.end_ids(), &[0], "<|end|> ends generation");
    assert_eq!(tokenizer.eos_id(), None);
    assert!(matches!(
        tokenizer.decode(&[6]),
        Err(TokenizeError::TokenOutOfRange {
            id: 6,
            vocab_size: 6
        })
    ));
}

#[test]
fn tiny_tokenizer_json_loads_from_a_file() {
    let path = std::env::temp_dir().join(format!("lm-tokenize-{}-tiny.json", std::process::id()));
    std::fs::write(&path, TINY_JSON).unwrap();
    let loaded = Tokenizer::from_json_file(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.unwrap().encode("hi").unwrap(), vec![3]);
}

#[test]
fn missing_file_is_a_read_error_naming_the_path() {
    let path = std::path::Path::new("/nonexistent/tokenizer.json");
    let err = Tokenizer::from_json_file(path).unwrap_err();
    assert!(
        matches!(&err, TokenizeError::ReadJson { path: p, .. } if p == path),
        "{err:?}"
    );
}

#[test]
fn invalid_documents_are_typed_errors() {
    for json in [
        "",
        "{",
        "[]",
        r#"{"model": 3}"#,
        &TINY_JSON.replace("\"BPE\"", "\"NoSuchModel\""),
    ] {
        let err = Tokenizer::from_json_str(json).unwrap_err();
        assert!(
            matches!(err, TokenizeError::InvalidJson { .. }),
            "{json:?}: {err:?}"
        );
    }
}
