//! Scoring against KenLM's own query code: `fixtures/ngram/tiny-query-kenlm.tsv`
//! is the output of `scripts/ngram/kenlm_query_reference.py` (the `kenlm`
//! PyPI package) for `tiny-kn3.arpa` and the sentences of `tiny-query.txt`.

use lm_model::ngram::{CorpusScore, NgramModel};

use crate::common::fixture_path;

fn tiny_model() -> NgramModel {
    let text = std::fs::read(fixture_path("ngram/tiny-kn3.arpa")).unwrap();
    NgramModel::read_arpa(text.as_slice()).unwrap()
}

#[test]
fn scores_match_kenlm_query() {
    let model = tiny_model();
    let reference = std::fs::read_to_string(fixture_path("ngram/tiny-query-kenlm.tsv")).unwrap();
    let mut n_checked = 0;
    let mut n_oov_seen = 0;
    for line in reference.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let (bos, eos, sentence) = (fields[0] == "1", fields[1] == "1", fields[2]);
        let total: f64 = fields[3].parse().unwrap();
        let probs: Vec<f64> = fields[4].split(' ').map(|p| p.parse().unwrap()).collect();
        let lengths: Vec<usize> = fields[5].split(' ').map(|n| n.parse().unwrap()).collect();
        let oovs: Vec<bool> = fields[6].split(' ').map(|o| o == "1").collect();
        let score = model.score(sentence.split_whitespace(), bos, eos);
        assert_eq!(score.words.len(), probs.len(), "{line}");
        for (i, word) in score.words.iter().enumerate() {
            assert!(
                (f64::from(word.log10_prob) - probs[i]).abs() < 1e-4,
                "{line}: token {i}: {word:?}"
            );
            assert_eq!(word.ngram_length, lengths[i], "{line}: token {i}");
            assert_eq!(word.oov, oovs[i], "{line}: token {i}");
        }
        assert!((score.total_log10() - total).abs() < 1e-4, "{line}");
        n_oov_seen += score.n_oov();
        n_checked += 1;
    }
    assert_eq!(n_checked, 3 * 8);
    assert!(n_oov_seen >= 3);
}

#[test]
fn perplexity_and_natural_log_follow_from_log10() {
    let model = tiny_model();
    let score = model.score_line("the cat sat on the mat .");
    // 7 words and </s>.
    assert_eq!(score.words.len(), 8);
    let total = score.total_log10();
    assert!((score.total_ln() - total * std::f64::consts::LN_10).abs() < 1e-5);
    assert!((score.perplexity() - 10f64.powf(-total / 8.0)).abs() < 1e-6);
    let unknown = model.score_line("the zebra sat");
    let mut corpus = CorpusScore::default();
    corpus.add(&score);
    corpus.add(&unknown);
    assert_eq!(
        (corpus.n_tokens, corpus.n_oov, corpus.n_sentences),
        (12, 1, 2)
    );
    let expected = 10f64.powf(-(total + unknown.total_log10()) / 12.0);
    assert!((corpus.perplexity() - expected).abs() < 1e-6);
    let zebra = f64::from(unknown.words[1].log10_prob);
    let expected_in_vocab = 10f64.powf(-(total + unknown.total_log10() - zebra) / 11.0);
    assert!((corpus.perplexity_excluding_oov() - expected_in_vocab).abs() < 1e-6);
}

/// `score_line` cuts words with `split_words`, as training does: punctuation
/// glued to a word is its own token.
#[test]
fn score_line_splits_punctuation_off_words() {
    let model = tiny_model();
    assert_eq!(
        model.score_line("the cat sat on the mat."),
        model.score_line("the cat sat on the mat .")
    );
    assert_eq!(model.score_line("the cat sat on the mat.").n_oov(), 0);
}
