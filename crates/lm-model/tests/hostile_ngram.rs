//! The hostile ARPA files and corpora of `fixtures/hostile/ngram/` through
//! lm-model's own readers: each gives the typed `NgramError` that names the
//! line, the number or the byte offset (lm-cli's `hostile_inputs` test
//! checks the same files' messages on the command line).

use std::io::BufReader;
use std::path::PathBuf;

use lm_model::ngram::{self, NgramError, NgramModel, Smoothing, TrainOptions, Utf8Policy};

use crate::common::fixture_path;

fn path(name: &str) -> PathBuf {
    fixture_path("hostile/ngram").join(name)
}

fn read_arpa(name: &str) -> Result<NgramModel, NgramError> {
    let file = std::fs::File::open(path(name)).unwrap();
    NgramModel::read_arpa(BufReader::new(file))
}

fn train(name: &str, utf8: Utf8Policy) -> Result<NgramModel, NgramError> {
    let options = TrainOptions {
        order: 2,
        smoothing: Smoothing::MaximumLikelihood,
        utf8,
        prune: Vec::new(),
    };
    let file = std::fs::File::open(path(name)).unwrap();
    ngram::train(BufReader::new(file), &options, |_| {})
}

#[test]
fn every_hostile_arpa_file_is_a_typed_error() {
    type Check = fn(&NgramError) -> bool;
    let cases: [(&str, Check); 11] = [
        ("arpa-counts-disagree.arpa", |e| {
            matches!(
                e,
                NgramError::ArpaCountMismatch {
                    order: 2,
                    declared: 5,
                    found: 2
                }
            )
        }),
        ("arpa-count-u64-max.arpa", |e| {
            matches!(
                e,
                NgramError::ArpaCountMismatch {
                    order: 1,
                    declared: u64::MAX,
                    found: 4
                }
            )
        }),
        ("arpa-count-beyond-u64.arpa", |e| {
            matches!(e, NgramError::ArpaBadNumber { line: 2, .. })
        }),
        ("arpa-missing-end.arpa", |e| {
            matches!(e, NgramError::ArpaMissingEnd)
        }),
        ("arpa-missing-section.arpa", |e| {
            matches!(e, NgramError::ArpaUnexpectedLine { line: 11, .. })
        }),
        (
            "arpa-bad-number.arpa",
            |e| matches!(e, NgramError::ArpaBadNumber { line: 12, text } if text == "-0.2x"),
        ),
        (
            "arpa-nan-probability.arpa",
            |e| matches!(e, NgramError::ArpaBadNumber { line: 9, text } if text == "nan"),
        ),
        (
            "arpa-infinite-backoff.arpa",
            |e| matches!(e, NgramError::ArpaBadNumber { line: 9, text } if text == "inf"),
        ),
        (
            "arpa-unknown-word.arpa",
            |e| matches!(e, NgramError::ArpaUnknownWord { line: 13, word } if word == "zebra"),
        ),
        ("arpa-short-entry.arpa", |e| {
            matches!(
                e,
                NgramError::ArpaBadEntry {
                    line: 13,
                    order: 2,
                    ..
                }
            )
        }),
        ("arpa-invalid-utf8.arpa", |e| {
            matches!(e, NgramError::ArpaInvalidUtf8 { line: 9 })
        }),
    ];
    for (name, check) in cases {
        let error = read_arpa(name).err();
        assert!(error.as_ref().is_some_and(check), "{name}: {error:?}");
    }
    let valid = read_arpa("arpa-valid.arpa").unwrap();
    assert_eq!(
        (valid.order(), valid.n_ngrams(1), valid.n_ngrams(2)),
        (2, 4, 2)
    );
}

#[test]
fn hostile_corpora_are_typed_errors_or_read_lossily_when_asked() {
    assert!(matches!(
        train("corpus-empty.txt", Utf8Policy::Strict),
        Err(NgramError::EmptyCorpus)
    ));
    assert!(matches!(
        train("corpus-whitespace-only.txt", Utf8Policy::Strict),
        Err(NgramError::EmptyCorpus)
    ));
    // "the cat sat\nthe dog " is 20 bytes; byte 20 is 0xff.
    assert!(matches!(
        train("corpus-invalid-utf8.txt", Utf8Policy::Strict),
        Err(NgramError::InvalidUtf8 { offset: 20 })
    ));
    // The documented lossy option reads each bad byte as U+FFFD, a token
    // of its own (not a letter).
    let model = train("corpus-invalid-utf8.txt", Utf8Policy::Lossy).unwrap();
    for word in ["the", "dog", "\u{fffd}", "ran"] {
        assert!(model.vocab().id(word).is_some(), "{word:?}");
    }
}
