//! Modified Kneser-Ney against independent computations: a case worked by
//! hand, `lmplz`'s own output for KenLM's toy corpus, and the committed
//! output of `scripts/ngram/kneser_ney_reference.py` for `fixtures/ngram/tiny.txt`.

use lm_model::ngram::{
    Discount, DiscountFallback, NgramCounts, NgramEntry, NgramError, NgramModel, Smoothing,
    TrainOptions, kneser_ney_discounts, train,
};

use crate::common::fixture_path;

fn counts_of(order: usize, corpus: &str) -> NgramCounts {
    let mut counts = NgramCounts::new(order).unwrap();
    for line in corpus.lines() {
        counts.add_sentence(line.split_whitespace()).unwrap();
    }
    counts
}

fn kneser_ney(fallback: Option<Discount>) -> Smoothing {
    Smoothing::ModifiedKneserNey { fallback }
}

/// Entries of an ARPA text, parsed independently of the crate's reader:
/// (order, words, log10 prob, log10 backoff or 0).
fn arpa_entries(text: &str) -> Vec<(usize, Vec<String>, f64, f64)> {
    let mut entries = Vec::new();
    let mut order = 0;
    for line in text.lines() {
        if let Some(rest) = line
            .strip_prefix('\\')
            .and_then(|r| r.strip_suffix("-grams:"))
        {
            order = rest.parse().unwrap();
            continue;
        }
        if order == 0 || line.trim().is_empty() || line.starts_with('\\') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let words = fields[1..=order].iter().map(|w| (*w).to_owned()).collect();
        let backoff = fields.get(order + 1).map_or(0.0, |b| b.parse().unwrap());
        entries.push((order, words, fields[0].parse().unwrap(), backoff));
    }
    entries
}

/// Every entry of `expected` is in `model` with the same values (1e-4 in
/// log10), and the model has no other entries.
fn assert_same_model(model: &NgramModel, expected: &str) {
    let entries = arpa_entries(expected);
    for order in 1..=model.order() {
        let n_expected = entries.iter().filter(|e| e.0 == order).count();
        assert_eq!(model.n_ngrams(order), n_expected, "number of {order}-grams");
    }
    for (_, words, prob, backoff) in &entries {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        assert_entry(model, &words, *prob, *backoff, 1e-4);
    }
}

/// Asserts that `model` holds the n-gram `words` with log10 probability
/// `prob` and backoff `backoff`, each within `tolerance`.
fn assert_entry(model: &NgramModel, words: &[&str], prob: f64, backoff: f64, tolerance: f64) {
    let NgramEntry {
        log10_prob: got_prob,
        log10_backoff: got_backoff,
    } = model
        .entry(words)
        .unwrap_or_else(|| panic!("{words:?} missing"));
    assert!(
        (f64::from(got_prob) - prob).abs() < tolerance,
        "{words:?}: prob {got_prob} != {prob}"
    );
    assert!(
        (f64::from(got_backoff) - backoff).abs() < tolerance,
        "{words:?}: backoff {got_backoff} != {backoff}"
    );
}

/// Worked by hand, order 2, lmplz's fallback discounts D1 = 0.5, D2 = 1, D3+ = 1.5
/// (this corpus has no adjusted count 3, so the real ones are undefined).
///
/// Sentences `<s> a b </s>` and `<s> a </s>`.
/// - Bigrams (top order, raw counts): `<s> a` 2, `a b` 1, `a </s>` 1, `b </s>` 1.
/// - Unigram adjusted counts = distinct left neighbours: a {<s>} 1, b {a} 1,
///   </s> {a, b} 2; <s> 0, <unk> 0. Total 4; N1 = 2, N2 = 1.
/// - γ(ε) = (0.5·2 + 1·1) / 4 = 0.5; |V| = 4 (<unk> a b </s>), so each word
///   gets 0.5/4 = 0.125 on top of its own share:
///   p(a) = (1 - 0.5)/4 + 0.125 = 0.25, p(b) = 0.25,
///   p(</s>) = (2 - 1)/4 + 0.125 = 0.375, p(<unk>) = 0.125. Sum 1.
/// - After <s>: total 2, γ(<s>) = 1·1/2 = 0.5, p(a | <s>) = (2 - 1)/2 + 0.5·0.25 = 0.625.
/// - After a: total 2, γ(a) = (0.5 + 0.5)/2 = 0.5,
///   p(b | a) = 0.5/2 + 0.5·0.25 = 0.375, p(</s> | a) = 0.25 + 0.5·0.375 = 0.4375.
/// - After b: total 1, γ(b) = 0.5, p(</s> | b) = 0.5 + 0.5·0.375 = 0.6875.
/// - Unseen after a: p(<unk> | a) = γ(a)·p(<unk>) = 0.0625.
#[test]
fn bigram_worked_by_hand() {
    let counts = counts_of(2, "a b\na\n");
    let model =
        NgramModel::estimate(&counts, &kneser_ney(Some(Discount::LMPLZ_FALLBACK)), &[]).unwrap();
    let l = |p: f64| p.log10();
    let expected = [
        (&["a"][..], l(0.25), l(0.5)),
        (&["b"], l(0.25), l(0.5)),
        (&["</s>"], l(0.375), 0.0),
        (&["<unk>"], l(0.125), 0.0),
        (&["<s>"], 0.0, l(0.5)),
        (&["<s>", "a"], l(0.625), 0.0),
        (&["a", "b"], l(0.375), 0.0),
        (&["a", "</s>"], l(0.4375), 0.0),
        (&["b", "</s>"], l(0.6875), 0.0),
    ];
    for (words, prob, backoff) in expected {
        assert_entry(&model, words, prob, backoff, 1e-6);
    }
    let a = model.vocab().id("a").unwrap();
    let unk_after_a = model.log10_prob(&[a], model.vocab().unk());
    assert!((f64::from(unk_after_a.log10_prob) - l(0.0625)).abs() < 1e-6);
    assert_eq!(unk_after_a.ngram_length, 1);
}

/// KenLM's `lm/common/test_data/toy0.arpa`, written by
/// `lmplz --discount_fallback -o 3` for the corpus "a a b a" / "b a a b".
const LMPLZ_TOY0: &str = "\\data\\
ngram 1=5
ngram 2=7
ngram 3=7

\\1-grams:
-0.90309\t<unk>\t0
0\t<s>\t-0.30103
-0.46943438\ta\t-0.30103
-0.5720968\t</s>\t0
-0.5720968\tb\t-0.30103

\\2-grams:
-0.37712017\t<s> a\t-0.30103
-0.37712017\ta a\t-0.30103
-0.2984526\tb a\t-0.30103
-0.58682007\ta </s>\t0
-0.5220179\tb </s>\t0
-0.41574955\t<s> b\t-0.30103
-0.58682007\ta b\t-0.30103

\\3-grams:
-0.14885087\t<s> a a
-0.33741078\tb a a
-0.124077894\t<s> b a
-0.2997394\ta b a
-0.42082912\tb a </s>
-0.397617\ta b </s>
-0.20102891\ta a b

\\end\\
";

#[test]
fn matches_lmplz_on_kenlm_toy_corpus() {
    let counts = counts_of(3, "a a b a\nb a a b\n");
    let model =
        NgramModel::estimate(&counts, &kneser_ney(Some(Discount::LMPLZ_FALLBACK)), &[]).unwrap();
    assert_same_model(&model, LMPLZ_TOY0);
}

#[test]
fn matches_reference_script_on_tiny_corpus() {
    let corpus = std::fs::read_to_string(fixture_path("ngram/tiny.txt")).unwrap();
    let expected = std::fs::read_to_string(fixture_path("ngram/tiny-kn3.arpa")).unwrap();
    let counts = counts_of(3, &corpus);
    // The script prints these from the same count-of-counts.
    let discounts = kneser_ney_discounts(&counts, None).unwrap();
    let printed = [
        (0.3, 1.1, 2.828571),
        (0.456522, 1.397391, 2.501976),
        (0.751724, 0.747126, 0.293793),
    ];
    for (got, (d1, d2, d3)) in discounts.iter().zip(printed) {
        assert!(
            (got.d1 - d1).abs() < 1e-6
                && (got.d2 - d2).abs() < 1e-6
                && (got.d3_plus - d3).abs() < 1e-6,
            "{got:?}"
        );
    }
    let model = NgramModel::estimate(&counts, &kneser_ney(None), &[]).unwrap();
    assert_same_model(&model, &expected);
}

/// The default options on a corpus whose discounts are all defined give
/// exactly the model without a fallback (the reference script's), and no
/// fallback is recorded.
#[test]
fn default_options_change_nothing_where_kneser_ney_is_defined() {
    let corpus = std::fs::read_to_string(fixture_path("ngram/tiny.txt")).unwrap();
    let expected = std::fs::read_to_string(fixture_path("ngram/tiny-kn3.arpa")).unwrap();
    let model = train(corpus.as_bytes(), &TrainOptions::default(), |_| {}).unwrap();
    assert_same_model(&model, &expected);
    assert_eq!(model.discount_fallbacks(), []);
    let strict = NgramModel::estimate(&counts_of(3, &corpus), &kneser_ney(None), &[]).unwrap();
    assert_eq!(model.to_compact(), strict.to_compact());
}

/// On a corpus too small for Kneser-Ney (`lmplz` refuses it), the default
/// options train with lmplz's documented fallback discounts (the model worked
/// by hand in `bigram_worked_by_hand`) and record each order that took them.
#[test]
fn default_options_fall_back_on_a_tiny_corpus_and_say_so() {
    let corpus = "a b\na\n";
    let counts = counts_of(2, corpus);
    assert!(matches!(
        NgramModel::estimate(&counts, &kneser_ney(None), &[]),
        Err(NgramError::DiscountUndefined { order: 1, count: 3 })
    ));
    let options = TrainOptions {
        order: 2,
        ..TrainOptions::default()
    };
    let model = train(corpus.as_bytes(), &options, |_| {}).unwrap();
    assert_entry(&model, &["a"], 0.25f64.log10(), 0.5f64.log10(), 1e-6);
    assert_entry(&model, &["a", "</s>"], 0.4375f64.log10(), 0.0, 1e-6);
    let fallback = |order, count| DiscountFallback {
        order,
        count,
        discount: Discount::LMPLZ_FALLBACK,
    };
    assert_eq!(model.discount_fallbacks(), [fallback(1, 3), fallback(2, 3)]);
    assert_eq!(
        model.discount_fallbacks()[0].to_string(),
        "kneser-ney discounts for 1-grams cannot be estimated from this corpus (adjusted count 3); \
         used the fallback discounts D1 = 0.5, D2 = 1, D3+ = 1.5"
    );
    // What is documented: lmplz's `--discount_fallback` values.
    assert_eq!(
        Discount::LMPLZ_FALLBACK,
        Discount {
            d1: 0.5,
            d2: 1.0,
            d3_plus: 1.5
        }
    );
    // A model read back from a file knows nothing of how it was estimated.
    let mut arpa = Vec::new();
    model.write_arpa(&mut arpa).unwrap();
    let read = NgramModel::read_arpa(arpa.as_slice()).unwrap();
    assert_eq!(read.discount_fallbacks(), []);
}

#[test]
fn every_context_sums_to_one() {
    let corpus = std::fs::read_to_string(fixture_path("ngram/tiny.txt")).unwrap();
    let model = NgramModel::estimate(&counts_of(3, &corpus), &kneser_ney(None), &[]).unwrap();
    let vocab = model.vocab();
    let id = |w: &str| vocab.id(w).unwrap();
    let contexts = [
        vec![],
        vec![id("<s>")],
        vec![id("the")],
        vec![id("<s>"), id("the")],
        vec![id("the"), id("cat")],
        vec![id("cat"), id("the")],
        vec![id("</s>"), id("mat")],
    ];
    for context in contexts {
        let total: f64 = (0..vocab.len() as u32)
            .filter(|&w| w != vocab.bos())
            .map(|w| model.log10_prob(&context, w).probability())
            .sum();
        assert!((total - 1.0).abs() < 1e-5, "{context:?}: {total}");
    }
}
