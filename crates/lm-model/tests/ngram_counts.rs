//! Count models from hand-computed counts (lesson 000's lab), add-k, the
//! memory bound of training, and the typed errors of bad corpora.

use lm_model::ngram::{
    NgramCounts, NgramError, NgramModel, Smoothing, TrainOptions, Utf8Policy, train,
};

use crate::common::fixture_path;

/// <s> the cat sat </s> / <s> the dog sat </s> / <s> the cat ran </s>
fn three_sentences() -> NgramCounts {
    let mut counts = NgramCounts::new(2).unwrap();
    for sentence in ["the cat sat", "the dog sat", "the cat ran"] {
        counts.add_sentence(sentence.split(' ')).unwrap();
    }
    counts
}

fn prob(model: &NgramModel, context: &[&str], word: &str) -> f64 {
    let ids: Vec<u32> = context
        .iter()
        .map(|w| model.vocab().id(w).unwrap())
        .collect();
    model
        .log10_prob(&ids, model.vocab().id(word).unwrap())
        .probability()
}

fn check(model: &NgramModel, context: &[&str], word: &str, expected: f64) {
    let got = prob(model, context, word);
    assert!(
        (got - expected).abs() < 1e-6,
        "p({word} | {context:?}) = {got}, expected {expected}"
    );
}

/// The sum of p(w | context) over every word but <s>.
fn total(model: &NgramModel, context: &[&str]) -> f64 {
    let bos = model.vocab().bos();
    model
        .vocab()
        .words()
        .filter(|w| model.vocab().id(w) != Some(bos))
        .map(|w| prob(model, context, w))
        .sum()
}

#[test]
fn maximum_likelihood_matches_hand_counts() {
    let model =
        NgramModel::estimate(&three_sentences(), &Smoothing::MaximumLikelihood, &[]).unwrap();
    // Unigram tokens without <s>: the 3, cat 2, sat 2, dog 1, ran 1, </s> 3 = 12.
    check(&model, &[], "the", 3.0 / 12.0);
    check(&model, &[], "cat", 2.0 / 12.0);
    check(&model, &[], "</s>", 3.0 / 12.0);
    check(&model, &[], "<unk>", 0.0);
    // count(the cat) / count(the .) = 2/3, count(the dog) = 1 of 3.
    check(&model, &["the"], "cat", 2.0 / 3.0);
    check(&model, &["the"], "dog", 1.0 / 3.0);
    check(&model, &["cat"], "sat", 1.0 / 2.0);
    check(&model, &["<s>"], "the", 1.0);
    check(&model, &["sat"], "</s>", 1.0);
    // Unseen after a seen context: impossible under maximum likelihood.
    check(&model, &["the"], "sat", 0.0);
    // An unseen context (</s> is never followed) backs off to the unigrams.
    check(&model, &["</s>"], "the", 3.0 / 12.0);
    assert_eq!(model.entry(&["the"]).map(|e| e.log10_backoff), Some(-99.0));
    for context in [&[][..], &["the"], &["cat"], &["</s>"]] {
        assert!((total(&model, context) - 1.0).abs() < 1e-6, "{context:?}");
    }
}

#[test]
fn add_k_matches_hand_counts_and_stays_normalised() {
    let model = NgramModel::estimate(&three_sentences(), &Smoothing::AddK { k: 1.0 }, &[]).unwrap();
    // |V| without <s> = 7 (<unk> </s> the cat sat dog ran); 12 tokens.
    check(&model, &[], "the", 4.0 / 19.0);
    check(&model, &[], "<unk>", 1.0 / 19.0);
    check(&model, &[], "sat", 3.0 / 19.0);
    // After "the" (3 continuations): (2 + 1) / (3 + 7), (1 + 1) / (3 + 7).
    check(&model, &["the"], "cat", 0.3);
    check(&model, &["the"], "dog", 0.2);
    // The remaining 0.5 goes to the other words in proportion to the
    // unigrams: backoff = 0.5 / (1 - 3/19 - 2/19) = 19/28, p(sat) = 3/19.
    check(&model, &["the"], "sat", 19.0 / 28.0 * 3.0 / 19.0);
    for context in [&[][..], &["the"], &["cat"], &["<s>"], &["</s>"]] {
        assert!((total(&model, context) - 1.0).abs() < 1e-5, "{context:?}");
    }
}

#[test]
fn pruning_drops_rare_ngrams_and_renormalises() {
    let counts = three_sentences();
    let full = NgramModel::estimate(&counts, &Smoothing::AddK { k: 0.5 }, &[]).unwrap();
    let pruned = NgramModel::estimate(&counts, &Smoothing::AddK { k: 0.5 }, &[0, 1]).unwrap();
    // Bigrams seen once: the dog, dog sat, cat sat, cat ran, ran </s>.
    assert_eq!(full.n_ngrams(2), 8);
    assert_eq!(pruned.n_ngrams(2), 3);
    assert_eq!(pruned.entry(&["the", "cat"]), full.entry(&["the", "cat"]));
    assert_eq!(pruned.entry(&["the", "dog"]), None);
    for context in [&["the"][..], &["cat"], &["dog"]] {
        assert!((total(&pruned, context) - 1.0).abs() < 1e-5, "{context:?}");
    }
}

#[test]
fn memory_grows_with_distinct_ngrams_not_with_the_corpus() {
    let text = std::fs::read_to_string(fixture_path("ngram/tiny.txt")).unwrap();
    let mut once = NgramCounts::new(3).unwrap();
    once.add_text(text.as_bytes(), Utf8Policy::Strict, |_| {})
        .unwrap();
    let mut twice = NgramCounts::new(3).unwrap();
    let doubled = format!("{text}{text}");
    twice
        .add_text(doubled.as_bytes(), Utf8Policy::Strict, |_| {})
        .unwrap();
    assert_eq!(twice.n_words(), 2 * once.n_words());
    assert_eq!(twice.n_stored(), once.n_stored());
    for order in 1..=3 {
        assert_eq!(twice.n_distinct(order), once.n_distinct(order));
    }
    assert_eq!(
        twice.count(&["the", "cat"]),
        once.count(&["the", "cat"]).map(|c| 2 * c)
    );
}

#[test]
fn training_reports_progress_in_bytes() {
    let line = "the cat sat on the mat .\n";
    let corpus = line.repeat(100_000); // 2.5 MB
    let mut reports = Vec::new();
    let model = train(
        corpus.as_bytes(),
        &TrainOptions {
            smoothing: Smoothing::AddK { k: 1.0 },
            ..TrainOptions::default()
        },
        |bytes| reports.push(bytes),
    )
    .unwrap();
    assert_eq!(reports.last().copied(), Some(corpus.len() as u64));
    assert!(reports.len() >= 3, "{reports:?}");
    assert!(reports.windows(2).all(|w| w[0] < w[1]));
    // <s> the cat, the cat sat, cat sat on, sat on the, on the mat, the mat ., mat . </s>
    assert_eq!(model.n_ngrams(3), 7);
}

#[test]
fn empty_corpus_is_an_error() {
    for corpus in ["", "\n\n   \n", "\r\n"] {
        let result = train(corpus.as_bytes(), &TrainOptions::default(), |_| {});
        assert!(
            matches!(result, Err(NgramError::EmptyCorpus)),
            "{corpus:?}: {result:?}"
        );
    }
}

#[test]
fn invalid_utf8_names_the_byte_offset_or_is_replaced() {
    let corpus = b"the cat\nsat \xc3\x28 mat\n";
    let result = train(&corpus[..], &TrainOptions::default(), |_| {});
    assert!(
        matches!(result, Err(NgramError::InvalidUtf8 { offset: 12 })),
        "{result:?}"
    );
    assert_eq!(
        result.unwrap_err().to_string(),
        "invalid utf-8 at byte offset 12 of the corpus"
    );
    let options = TrainOptions {
        utf8: Utf8Policy::Lossy,
        smoothing: Smoothing::MaximumLikelihood,
        ..TrainOptions::default()
    };
    let model = train(&corpus[..], &options, |_| {}).unwrap();
    assert!(model.vocab().id("\u{fffd}").is_some());
}

#[test]
fn bad_options_are_typed_errors() {
    assert!(matches!(
        NgramCounts::new(0),
        Err(NgramError::InvalidOrder { order: 0, .. })
    ));
    let counts = three_sentences();
    for k in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let result = NgramModel::estimate(&counts, &Smoothing::AddK { k }, &[]);
        assert!(matches!(result, Err(NgramError::InvalidAddK { .. })), "{k}");
    }
    let mut trigram = NgramCounts::new(3).unwrap();
    trigram.add_sentence(["a", "b"]).unwrap();
    let result = NgramModel::estimate(&trigram, &Smoothing::MaximumLikelihood, &[0, 2, 1]);
    assert!(
        matches!(
            result,
            Err(NgramError::PruneNotMonotone {
                order: 3,
                threshold: 1,
                lower: 2
            })
        ),
        "{result:?}"
    );
    // Too little data for Kneser-Ney discounts without a fallback.
    let result = NgramModel::estimate(
        &trigram,
        &Smoothing::ModifiedKneserNey { fallback: None },
        &[],
    );
    assert!(
        matches!(
            result,
            Err(NgramError::DiscountUndefined { order: 1, count: 2 })
        ),
        "{result:?}"
    );
}
