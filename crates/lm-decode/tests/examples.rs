//! The examples' claims, checked through the same public functions: each
//! example is compiled here as a module (its `main` unused), so the model
//! and helpers under test are the example's own.

#[path = "../examples/custom_model.rs"]
#[allow(dead_code)] // the example's `main`
mod custom_model;
#[path = "../examples/score_text.rs"]
#[allow(dead_code)]
mod score_text;

use custom_model::{Bigram, WORDS};
use lm_core::{Detokenize, LanguageModel};
use lm_decode::{BeamConfig, GenerationConfig, StopReason, score_continuation};

/// `ln softmax(row)[token]` from the logits the model gives after `prefix`.
fn logprob_after<M: LanguageModel>(model: &M, prefix: &[u32], token: u32) -> f64 {
    let mut logits = Vec::new();
    model
        .forward(
            &mut model.new_state(),
            prefix,
            lm_core::Rows::Last,
            &mut logits,
        )
        .unwrap();
    f64::from(lm_core::log_softmax(&logits, 1.0).unwrap()[token as usize])
}

#[test]
fn custom_model_samples_only_what_its_table_allows() {
    let mut config = GenerationConfig {
        end_tokens: vec![6],
        ..Default::default()
    };
    config.sampling.top_p = Some(0.9);
    let run = lm_decode::generate(&Bigram, &[0], &config, Some(&Bigram)).unwrap();
    // What the prompt's text "<s>" grew by, its joining space included.
    assert_eq!(run.text.as_deref(), Some(" the cat sat"));
    assert_eq!(run.stop_reason, StopReason::EndToken(6));
    let mut prefix = vec![0];
    for step in &run.steps {
        let word = WORDS[step.token as usize];
        assert!(step.model_prob > 0.0, "{word} after {prefix:?}");
        prefix.push(step.token);
    }
}

#[test]
fn custom_model_beam_search_finds_the_likeliest_short_text() {
    let beams = BeamConfig {
        end_tokens: vec![6],
        ..Default::default()
    };
    let found = lm_decode::beam_search(&Bigram, &[0], &beams).unwrap();
    let texts: Vec<String> = found.iter().map(|b| Bigram.decode(&b.tokens)).collect();
    assert_eq!(
        texts,
        [
            "the cat sat </s>",
            "the dog ran </s>",
            "the cat sat the cat sat </s>",
            "the cat sat the dog ran </s>"
        ]
    );
    // By hand: p(the | <s>) = 1, then softmax(1.5, 1) x softmax(2, 1) x softmax(1, 0.5).
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    let by_hand = (sigmoid(0.5) * sigmoid(1.0) * sigmoid(0.5)).ln();
    assert!(
        (found[0].logprob - by_hand).abs() < 1e-5,
        "{}",
        found[0].logprob
    );
    assert_eq!(format!("{:.3}", found[0].logprob), "-1.261");
}

#[test]
fn score_text_scores_each_word_by_the_count_model_and_prefers_the_ordered_sentence() {
    let model = score_text::train().unwrap();
    let prompt = [model.vocab().bos()];
    let mut perplexities = Vec::new();
    for text in ["the cat sat on the rug", "rug the on sat cat the"] {
        let ids = score_text::ids(&model, text);
        assert_eq!(ids.len(), 7, "six words and </s>");
        let score = score_continuation(&model, &prompt, &ids).unwrap();
        // Each token's ln p is the model's own, read after the whole prefix.
        for (i, (&id, &logprob)) in ids.iter().zip(&score.logprobs).enumerate() {
            let prefix: Vec<u32> = prompt.iter().chain(&ids[..i]).copied().collect();
            let expected = logprob_after(&model, &prefix, id);
            assert!((logprob - expected).abs() < 1e-6, "{text:?} token {i}");
        }
        perplexities.push(score.perplexity());
    }
    assert_eq!(format!("{:.2}", perplexities[0]), "2.03");
    assert!(perplexities[0] * 10.0 < perplexities[1], "{perplexities:?}");
}
