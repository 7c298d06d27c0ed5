//! The loader on committed files: the tiny valid llama GGUF, and every
//! hostile GGUF refused at the stage `expected.tsv` names, as a typed error
//! whose message names the problem.

use std::path::Path;
use std::process::Command;

use lm::lm_core::LanguageModel;
use lm::lm_decode::{GenerationConfig, SamplingConfig, generate};
use lm::lm_tokenize::Message;
use lm::{Error, GgufText, TextError, load_gguf};

use crate::common::{error_chain, fixture_path};

#[test]
fn the_tiny_gguf_loads_whole_and_generates() {
    let path = fixture_path("hostile/gguf/valid-tiny-llama.gguf");
    let model = load_gguf(&path).unwrap();
    let text = &model.text;
    assert_eq!(model.decoder.vocab_size(), text.tokenizer.vocab_size());
    let eos = text.tokenizer.eos_id().expect("the fixture names its eos");
    assert!(text.end_ids.contains(&eos), "{:?}", text.end_ids);
    assert!(text.end_ids.is_sorted(), "{:?}", text.end_ids);

    // A base model: no template, and a chat says so.
    assert!(matches!(
        text.chat_template(),
        Err(TextError::NoChatTemplate)
    ));
    let chat = text.chat_prompt(&[Message::new("user", "hi")]);
    assert!(matches!(chat, Err(TextError::NoChatTemplate)), "{chat:?}");

    let prompt = text.tokenizer.encode("hi").unwrap();
    let config = GenerationConfig {
        max_new_tokens: 3,
        sampling: SamplingConfig::greedy(),
        end_tokens: text.end_ids.clone(),
        ..GenerationConfig::default()
    };
    let generation = generate(&model.decoder, &prompt, &config, Some(&text.tokenizer)).unwrap();
    assert!(!generation.steps.is_empty() && generation.steps.len() <= 3);

    // The text side alone reads the same metadata.
    let alone = GgufText::open(&path).unwrap();
    assert_eq!(alone.end_ids, text.end_ids);
    assert_eq!(alone.tokenizer.vocab_size(), text.tokenizer.vocab_size());
}

#[test]
fn a_missing_file_is_named() {
    let path = Path::new("/no/such.gguf");
    for error in [
        load_gguf(path).unwrap_err(),
        GgufText::open(path).unwrap_err(),
    ] {
        assert!(
            matches!(&error, Error::FileMissing { path: p } if p == path),
            "{error:?}"
        );
        assert_eq!(error.to_string(), "model file /no/such.gguf not found");
    }
}

#[test]
fn a_directory_or_a_fifo_is_named_not_missing() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // No writer ever opens the FIFO: a loader that waited on it would hang.
    for path in [dir.path(), fifo.as_path()] {
        for error in [
            load_gguf(path).unwrap_err(),
            GgufText::open(path).unwrap_err(),
        ] {
            let text = error_chain(&error);
            assert!(text.contains("not a regular file"), "{text}");
            assert!(!text.contains("not found"), "{text}");
        }
    }
}

#[test]
fn every_hostile_gguf_file_is_refused_at_its_stage_naming_the_problem() {
    let dir = fixture_path("hostile/gguf");
    let manifest = std::fs::read_to_string(dir.join("expected.tsv")).unwrap();
    let rows: Vec<&str> = manifest.lines().filter(|l| !l.starts_with('#')).collect();
    for line in &rows {
        let [file, stage, fragment] = line.split('\t').collect::<Vec<_>>()[..] else {
            panic!("malformed manifest line {line:?}");
        };
        check_hostile_file(&dir, file, stage, fragment);
    }
    assert!(rows.len() >= 45, "only {} files checked", rows.len());
}

/// Loads the hostile file `file` of `dir` whole and as text alone, and
/// checks that both are refused at `stage` (or load, when it is "valid")
/// with `fragment` and the file's name in the message.
fn check_hostile_file(dir: &Path, file: &str, stage: &str, fragment: &str) {
    let path = dir.join(file);
    let loaded = load_gguf(&path);
    let text = GgufText::open(&path);
    let refused = |error: &Error| {
        let message = error_chain(error);
        assert!(message.contains(fragment), "{file}: {message}");
        assert!(message.contains(file), "{file}: {message}");
    };
    match stage {
        "valid" => {
            loaded.unwrap_or_else(|e| panic!("{file}: {}", error_chain(&e)));
            text.unwrap_or_else(|e| panic!("{file}: {}", error_chain(&e)));
        }
        "parse" => {
            let model_error = loaded.unwrap_err();
            assert!(
                matches!(model_error, Error::Model { .. }),
                "{file}: {model_error:?}"
            );
            refused(&model_error);
            let text_error = text.unwrap_err();
            if fragment.contains("; supported: f32") {
                // The text side skips weights of types lm-model cannot
                // read; this file has no tokenizer, so it fails there.
                assert!(
                    matches!(text_error, Error::Text { .. }),
                    "{file}: {text_error:?}"
                );
            } else {
                assert!(
                    matches!(text_error, Error::Open { .. }),
                    "{file}: {text_error:?}"
                );
                refused(&text_error);
            }
        }
        "llama" => {
            let error = loaded.unwrap_err();
            assert!(matches!(error, Error::Model { .. }), "{file}: {error:?}");
            refused(&error);
        }
        "tokenizer" => {
            for error in [loaded.unwrap_err(), text.unwrap_err()] {
                assert!(matches!(error, Error::Text { .. }), "{file}: {error:?}");
                refused(&error);
            }
        }
        other => panic!("unknown stage {other:?} for {file}"),
    }
}

#[test]
fn a_chat_template_that_does_not_compile_fails_only_a_chat() {
    let path = fixture_path("hostile/gguf/valid-broken-chat-template.gguf");
    let model = load_gguf(&path).expect("the template is not compiled at load");
    let prompt = model.text.tokenizer.encode("hi").unwrap();
    let config = GenerationConfig {
        max_new_tokens: 2,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    let run = generate(&model.decoder, &prompt, &config, None).unwrap();
    assert_eq!(run.tokens.len(), 2);
    let chat = model.text.chat_prompt(&[Message::new("user", "hi")]);
    assert!(matches!(chat, Err(TextError::Tokenize(_))), "{chat:?}");
}
