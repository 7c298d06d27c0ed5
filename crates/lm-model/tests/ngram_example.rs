//! What `examples/count_model.rs` shows, checked: the example is compiled
//! into this module, so its corpus and its sampling function are the ones
//! checked, and its `main` runs here.

#[path = "../examples/count_model.rs"]
mod count_model;

use lm_core::Detokenize;
use lm_decode::StopReason;
use lm_model::ngram::{
    Discount, NgramError, NgramModel, Smoothing, TrainOptions, split_words, train,
};

fn example_model() -> NgramModel {
    train(
        count_model::CORPUS.as_bytes(),
        &TrainOptions::default(),
        |_| {},
    )
    .unwrap()
}

#[test]
fn the_example_runs() {
    count_model::main().unwrap();
}

/// "Far too little text for Kneser-Ney": lmplz's own rule refuses it, the
/// default options train with the fallback discounts and say for which orders.
#[test]
fn the_example_corpus_needs_and_gets_the_fallback() {
    let strict = TrainOptions {
        smoothing: Smoothing::ModifiedKneserNey { fallback: None },
        ..TrainOptions::default()
    };
    let refused = train(count_model::CORPUS.as_bytes(), &strict, |_| {});
    assert!(
        matches!(
            refused,
            Err(NgramError::DiscountOutOfRange {
                order: 2,
                count: 3,
                ..
            })
        ),
        "{refused:?}"
    );
    let model = example_model();
    let fallbacks: Vec<_> = model.discount_fallbacks().iter().map(|f| f.order).collect();
    assert_eq!(fallbacks, [2, 3]);
    assert!(
        model
            .discount_fallbacks()
            .iter()
            .all(|f| f.discount == Discount::LMPLZ_FALLBACK)
    );
}

/// One score per word and one for `</s>` (what the example zips with the
/// words), each a log10 probability; the total is their sum and the
/// perplexity `10^(-total / tokens)`.
#[test]
fn the_example_score_is_per_token_log10_and_their_sum() {
    let model = example_model();
    let sentence = "the dog sat on the mat .";
    let score = model.score(split_words(sentence), true, true);
    assert_eq!(score.words.len(), split_words(sentence).count() + 1);
    assert_eq!(score.words.last().map(|w| w.id), Some(model.vocab().eos()));
    assert!(score.words.iter().all(|w| w.log10_prob < 0.0 && !w.oov));
    assert!(
        score
            .words
            .iter()
            .all(|w| (1..=3).contains(&w.ngram_length))
    );
    let sum: f64 = score.words.iter().map(|w| f64::from(w.log10_prob)).sum();
    assert!((score.total_log10() - sum).abs() < 1e-12);
    let n_tokens = score.words.len() as f64;
    assert!((score.perplexity() - 10f64.powf(-sum / n_tokens)).abs() < 1e-9);
}

/// The seeded continuation the example prints, the same on every run; no
/// seed writes `<unk>`, and every run ends at `</s>` or the token limit.
#[test]
fn the_example_continuation_is_seeded_and_never_unk() {
    let model = example_model();
    let run = count_model::continue_text(&model, "the cat", 3).unwrap();
    let text = model.decode(&[run.prompt.as_slice(), &run.tokens].concat());
    assert_eq!(text, "the cat saw the dog sat on the mat.\n");
    assert_eq!(run.stop_reason, StopReason::EndToken(model.vocab().eos()));
    let unk = model.vocab().unk();
    for seed in 0..50 {
        let run = count_model::continue_text(&model, "the cat", seed).unwrap();
        assert!(!run.tokens.contains(&unk), "seed {seed}: {:?}", run.tokens);
        assert!(
            matches!(
                run.stop_reason,
                StopReason::EndToken(_) | StopReason::MaxNewTokens
            ),
            "{:?}",
            run.stop_reason
        );
    }
}
