//! Scoring a given continuation: checked against the chain rule computed
//! token by token through the uncached reference path, with the reads
//! counted and every bad input a typed error.

use crate::common::{PrefixModel, TableModel, smollm2};
use lm_core::{Counting, LanguageModel, Rows, TokenId, Uncached};
use lm_decode::{ContinuationScore, Error, score_continuation, score_continuation_in_chunks};
use lm_model::{Toy, ToyArchitecture};

/// The chain rule one token at a time: `ln p(c_i | prompt, c_<i)` from a
/// fresh uncached state that reads the whole prefix with [`Rows::Last`].
fn chain_rule<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    continuation: &[TokenId],
) -> Vec<f64> {
    let reference = Uncached(model);
    let mut prefix = prompt.to_vec();
    let mut logprobs = Vec::new();
    for &token in continuation {
        let mut logits = Vec::new();
        reference
            .forward(&mut reference.new_state(), &prefix, Rows::Last, &mut logits)
            .unwrap();
        logprobs.push(f64::from(
            lm_core::log_softmax(&logits, 1.0).unwrap()[token as usize],
        ));
        prefix.push(token);
    }
    logprobs
}

fn assert_close(score: &ContinuationScore, expected: &[f64], tolerance: f64) {
    assert_eq!(score.logprobs.len(), expected.len());
    for (i, (got, want)) in score.logprobs.iter().zip(expected).enumerate() {
        assert!(
            (got - want).abs() <= tolerance,
            "token {i}: {got} vs {want}"
        );
    }
    let total: f64 = expected.iter().sum();
    assert!((score.logprob - total).abs() <= tolerance * expected.len() as f64);
    assert_eq!(score.logprob, score.logprobs.iter().sum::<f64>());
    assert_eq!(
        score.perplexity(),
        lm_core::perplexity(&score.logprobs).unwrap()
    );
}

#[test]
fn scores_match_the_chain_rule_token_by_token() {
    let model = PrefixModel::new(9);
    for (prompt, continuation) in [
        (&[0][..], &[5][..]),
        (&[0, 1, 2], &[3, 4, 8, 8, 0]),
        (&[7; 6], &[1, 2]),
    ] {
        let score = score_continuation(&model, prompt, continuation).unwrap();
        assert_eq!(score.tokens, continuation);
        // The same logits either way: the same numbers, exactly.
        assert_close(&score, &chain_rule(&model, prompt, continuation), 0.0);
    }
}

#[test]
fn a_cached_transformer_scores_as_its_uncached_reference() {
    // Toy's words: <start> the cat dog sat slept <end>.
    let (prompt, continuation) = ([0, 1, 2], [4, 1, 3, 5, 6]);
    for architecture in [ToyArchitecture::Gpt2, ToyArchitecture::Llama] {
        let model = Toy::with_options(architecture, 16, Toy::SEED).unwrap();
        let score = score_continuation(&model, &prompt, &continuation).unwrap();
        assert_close(&score, &chain_rule(&model, &prompt, &continuation), 1e-4);
        assert!(score.perplexity() > 1.0, "{architecture:?}");
    }
}

#[test]
fn every_position_is_read_once_and_the_last_token_never() {
    let model = Counting::new(PrefixModel::new(9));
    score_continuation(&model, &[0, 1, 2], &[3, 4, 5, 6]).unwrap();
    assert_eq!(
        model.calls(),
        vec![3, 3],
        "the prompt, then all but the last token"
    );
    let model = Counting::new(PrefixModel::new(9));
    score_continuation(&model, &[0, 1], &[3]).unwrap();
    assert_eq!(model.calls(), vec![2], "one token: only the prompt is read");
}

#[test]
fn a_continuation_read_in_chunks_scores_as_one_pass_reading_each_position_once() {
    let (prompt, continuation) = ([0, 1, 2], [3, 4, 5, 6, 7, 8, 0]);
    let whole = score_continuation(&PrefixModel::new(9), &prompt, &continuation).unwrap();
    for chunk_len in 1..=7 {
        let model = Counting::new(PrefixModel::new(9));
        let mut progress = Vec::new();
        let chunk = std::num::NonZeroUsize::new(chunk_len).unwrap();
        let score = score_continuation_in_chunks(&model, &prompt, &continuation, chunk, |n| {
            progress.push(n)
        })
        .unwrap();
        assert_eq!(score, whole, "chunks of {chunk_len}");
        // The prompt, then the 6 tokens before the last in chunks.
        let mut expected_calls = vec![3];
        expected_calls.extend(
            (0..6)
                .step_by(chunk_len)
                .map(|start| chunk_len.min(6 - start)),
        );
        assert_eq!(model.calls(), expected_calls, "chunks of {chunk_len}");
        assert_eq!(progress.last(), Some(&continuation.len()));
        assert_eq!(progress.len(), expected_calls.len());
    }
    // A cached transformer too, within rounding of one pass.
    let model = Toy::with_options(ToyArchitecture::Llama, 16, Toy::SEED).unwrap();
    let (prompt, continuation) = ([0, 1, 2], [4, 1, 3, 5, 6]);
    let chunk = std::num::NonZeroUsize::new(2).unwrap();
    let chunked = score_continuation_in_chunks(&model, &prompt, &continuation, chunk, |_| {});
    assert_close(
        &chunked.unwrap(),
        &chain_rule(&model, &prompt, &continuation),
        1e-4,
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let model = PrefixModel::new(5);
    assert_eq!(
        score_continuation(&model, &[], &[1]),
        Err(Error::EmptyPrompt)
    );
    assert_eq!(
        score_continuation(&model, &[1], &[]),
        Err(Error::EmptyContinuation)
    );
    // The last token is never fed to the model, and still checked.
    let out_of_range = Err(Error::Core(lm_core::Error::TokenOutOfRange {
        id: 5,
        vocab_size: 5,
    }));
    assert_eq!(score_continuation(&model, &[1], &[2, 5]), out_of_range);
    assert_eq!(score_continuation(&model, &[5], &[2]), out_of_range);
    // Prompt and all but the last token must fit the context.
    let bounded = PrefixModel::new(5).with_context(4);
    assert!(score_continuation(&bounded, &[1, 2], &[3, 4, 0]).is_ok());
    assert!(matches!(
        score_continuation(&bounded, &[1, 2], &[3, 4, 0, 1]),
        Err(Error::Core(_))
    ));
}

#[test]
fn a_model_that_returns_too_few_logits_is_an_error() {
    // Three tokens, rows of two logits.
    let short_rows = TableModel {
        table: vec![vec![0.0; 2]; 3],
        context_length: None,
    };
    assert_eq!(
        score_continuation(&short_rows, &[0], &[1]),
        Err(Error::LogitsRows {
            len: 2,
            n_rows: 1,
            vocab_size: 3
        })
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_scores_as_its_uncached_chain_rule() {
    let model = smollm2();
    // "The capital of France is", then " Paris of France is" (ids from
    // SmolLM2's `tokenizer.ggml.tokens`).
    let (prompt, continuation) = ([504, 3575, 282, 4649, 314], [7042, 282, 4649, 314]);
    let score = score_continuation(&model, &prompt, &continuation).unwrap();
    // One pass over several tokens against one token at a time: the same
    // numbers up to the rounding of the quantized activations.
    assert_close(&score, &chain_rule(&model, &prompt, &continuation), 2e-3);
    assert!(
        score.logprobs[0] > 0.5f64.ln(),
        "Paris is likely: {score:?}"
    );
}
