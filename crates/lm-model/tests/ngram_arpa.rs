//! ARPA files: round trips and the typed errors of malformed files.

use lm_model::ngram::{NgramCounts, NgramEntry, NgramError, NgramModel, Smoothing};

use crate::common::fixture_path;

fn write(model: &NgramModel) -> String {
    let mut out = Vec::new();
    model.write_arpa(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// An entry's expected values.
fn entry(log10_prob: f32, log10_backoff: f32) -> NgramEntry {
    NgramEntry {
        log10_prob,
        log10_backoff,
    }
}

fn read(text: &str) -> Result<NgramModel, NgramError> {
    NgramModel::read_arpa(text.as_bytes())
}

#[test]
fn fixture_reads_and_writes_back_byte_for_byte() {
    let text = std::fs::read_to_string(fixture_path("ngram/tiny-kn3.arpa")).unwrap();
    let model = read(&text).unwrap();
    assert_eq!(model.order(), 3);
    assert_eq!(write(&model), text);
}

#[test]
fn trained_models_round_trip() {
    let corpus = std::fs::read_to_string(fixture_path("ngram/tiny.txt")).unwrap();
    let mut counts = NgramCounts::new(3).unwrap();
    for line in corpus.lines() {
        counts.add_sentence(line.split_whitespace()).unwrap();
    }
    for smoothing in [
        Smoothing::MaximumLikelihood,
        Smoothing::AddK { k: 0.1 },
        Smoothing::ModifiedKneserNey { fallback: None },
    ] {
        let model = NgramModel::estimate(&counts, &smoothing, &[]).unwrap();
        let text = write(&model);
        let back = read(&text).unwrap();
        assert_eq!(write(&back), text, "{smoothing:?}");
        let vocab = model.vocab();
        for word in vocab.words() {
            assert_eq!(back.vocab().id(word), vocab.id(word));
        }
        // Identical probabilities for every word after every trained bigram context.
        let mut row = vec![0.0; vocab.len()];
        let mut back_row = vec![0.0; vocab.len()];
        for first in 0..vocab.len() as u32 {
            for second in [vocab.bos(), vocab.id("the").unwrap(), first] {
                model.fill_log10_row(&[first, second], &mut row);
                back.fill_log10_row(&[first, second], &mut back_row);
                assert_eq!(row, back_row);
            }
        }
    }
}

#[test]
fn compact_form_round_trips_within_half_precision() {
    let text = std::fs::read_to_string(fixture_path("ngram/tiny-kn3.arpa")).unwrap();
    let model = read(&text).unwrap();
    let bytes = model.to_compact();
    let back = NgramModel::from_compact(&bytes).unwrap();
    assert_eq!(back.to_compact(), bytes);
    for order in 1..=3 {
        assert_eq!(back.n_ngrams(order), model.n_ngrams(order));
    }
    let NgramEntry {
        log10_prob: prob,
        log10_backoff: backoff,
    } = model.entry(&["the", "cat"]).unwrap();
    let NgramEntry {
        log10_prob: back_prob,
        log10_backoff: back_backoff,
    } = back.entry(&["the", "cat"]).unwrap();
    assert!((prob - back_prob).abs() <= prob.abs() / 1000.0);
    assert!((backoff - back_backoff).abs() <= backoff.abs() / 1000.0);
    for cut in [0, 5, 8, bytes.len() / 2, bytes.len() - 1] {
        assert!(
            NgramModel::from_compact(&bytes[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(matches!(
        NgramModel::from_compact(&extra),
        Err(NgramError::CompactInvalid {
            what: "trailing bytes",
            ..
        })
    ));
    assert!(matches!(
        NgramModel::from_compact(b"GGUF...."),
        Err(NgramError::CompactBadMagic)
    ));
}

#[test]
fn a_file_without_unk_gets_kenlms_substitute() {
    let model = read("\\data\\\nngram 1=3\n\n\\1-grams:\n0\t<s>\n-0.3\t</s>\n-0.4\tx\n\n\\end\\\n")
        .unwrap();
    assert!(model.unk_was_added());
    assert_eq!(model.entry(&["<unk>"]), Some(entry(-100.0, 0.0)));
    let score = model.score(["y"], true, false);
    assert_eq!(score.words[0].log10_prob, -100.0);
}

const GOOD: &str = "\\data\\
ngram 1=4
ngram 2=2

\\1-grams:
-1\t<unk>\t0
0\t<s>\t-0.5
-0.5\t</s>\t0
-0.5\ta\t-0.25

\\2-grams:
-0.2\t<s> a
-0.1\ta </s>

\\end\\
";

fn check_error(text: &str, matches: impl Fn(&NgramError) -> bool, message: &str) {
    match read(text) {
        Ok(_) => panic!("accepted: {text}"),
        Err(error) => {
            assert!(matches(&error), "{error:?}");
            assert_eq!(error.to_string(), message);
        }
    }
}

/// [`check_error`] on `GOOD` with `from` replaced by `to`, for each
/// `(from, to, line, message)`; `at_line(error, line)` says whether the error
/// is the expected one at that line.
fn check_edits(cases: &[(&str, &str, usize, &str)], at_line: fn(&NgramError, usize) -> bool) {
    for &(from, to, line, message) in cases {
        check_error(&GOOD.replace(from, to), |e| at_line(e, line), message);
    }
}

#[test]
fn good_file_reads() {
    let model = read(GOOD).unwrap();
    assert_eq!(model.entry(&["a", "</s>"]), Some(entry(-0.1, 0.0)));
    assert_eq!(write(&model), GOOD);
}

#[test]
fn counts_that_disagree_with_the_body() {
    let cases = [
        (
            ["ngram 2=2", "ngram 2=3"],
            (2, 3, 2),
            "arpa: header declares 3 2-grams but the body has 2",
        ),
        (
            ["ngram 1=4", "ngram 1=3"],
            (1, 3, 4),
            "arpa: header declares 3 1-grams but the body has 4",
        ),
    ];
    for ([from, to], counts, message) in cases {
        check_error(
            &GOOD.replace(from, to),
            |e| {
                matches!(e, NgramError::ArpaCountMismatch { order, declared, found }
                    if (*order, *declared, *found) == counts)
            },
            message,
        );
    }
}

#[test]
fn missing_end_and_header() {
    check_error(
        &GOOD.replace("\\end\\\n", ""),
        |e| matches!(e, NgramError::ArpaMissingEnd),
        "arpa: missing \\end\\ marker",
    );
    check_error(
        GOOD.split("\\2-grams:").next().unwrap(),
        |e| matches!(e, NgramError::ArpaMissingEnd),
        "arpa: missing \\end\\ marker",
    );
    check_error(
        "",
        |e| matches!(e, NgramError::ArpaMissingHeader),
        "arpa: no \\data\\ header",
    );
    check_error(
        &GOOD.replace("\\end\\", "\\3-grams:"),
        |e| matches!(e, NgramError::ArpaUnexpectedLine { .. }),
        "arpa line 15: expected \\end\\, found \"\\\\3-grams:\"",
    );
}

#[test]
fn bad_numbers() {
    let cases = [
        (
            "-0.2\t<s> a",
            "-0.2x\t<s> a",
            12,
            "arpa line 12: bad number \"-0.2x\"",
        ),
        (
            "0\t<s>\t-0.5",
            "0\t<s>\tnan",
            7,
            "arpa line 7: bad number \"nan\"",
        ),
        (
            "ngram 2=2",
            "ngram 2=two",
            3,
            "arpa line 3: bad number \"two\"",
        ),
    ];
    check_edits(
        &cases,
        |e, at| matches!(e, NgramError::ArpaBadNumber { line, .. } if *line == at),
    );
}

#[test]
fn bad_entries() {
    check_error(
        &GOOD.replace("-0.1\ta </s>", "-0.1\ta"),
        |e| {
            matches!(
                e,
                NgramError::ArpaBadEntry {
                    line: 13,
                    order: 2,
                    ..
                }
            )
        },
        "arpa line 13: a 2-gram entry needs 2 words, found \"-0.1\\ta\"",
    );
    check_error(
        &GOOD.replace("-0.1\ta </s>", "-0.1\ta b"),
        |e| matches!(e, NgramError::ArpaUnknownWord { line: 13, .. }),
        "arpa line 13: word \"b\" is not among the unigrams",
    );
    let duplicates = [
        (
            "-0.1\ta </s>",
            "-0.2\t<s> a",
            13,
            "arpa line 13: duplicate n-gram \"<s> a\"",
        ),
        (
            "-0.5\ta\t-0.25",
            "-0.5\t</s>\t-0.25",
            9,
            "arpa line 9: duplicate n-gram \"</s>\"",
        ),
    ];
    check_edits(
        &duplicates,
        |e, at| matches!(e, NgramError::ArpaDuplicate { line, .. } if *line == at),
    );
    check_error(
        &GOOD
            .replace("0\t<s>\t-0.5", "0\t<t>\t-0.5")
            .replace("<s> a", "<t> a"),
        |e| matches!(e, NgramError::MissingSpecial { word: "<s>" }),
        "the model has no <s> unigram",
    );
}

#[test]
fn missing_context() {
    let trigram = "\\data\\\nngram 1=3\nngram 2=1\nngram 3=1\n\n\\1-grams:\n-1\t<unk>\t0\n0\t<s>\t0\n-0.5\t</s>\t0\n\n\\2-grams:\n-0.1\t<s> </s>\t0\n\n\\3-grams:\n-0.1\t</s> <s> </s>\n\n\\end\\\n";
    check_error(
        trigram,
        |e| matches!(e, NgramError::ArpaMissingContext { line: 15, .. }),
        "arpa line 15: the context of \"</s> <s> </s>\" is not in the model",
    );
}
