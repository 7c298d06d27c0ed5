//! The facade's other ways to decode on SmolLM2 (what `lm-python`'s
//! `generate([...])`, `draft=` and `num_beams=` call): a batch, prompt-lookup
//! drafting and beam search, each checked against plain greedy runs and
//! against log-softmax computed here from the model's own rows.

use lm::lm_core::{LanguageModel, Rows};
use lm::prelude::*;

use crate::common;

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
];

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn a_batch_gives_each_prompt_its_own_greedy_run() {
    let model = common::smollm2();
    let options = Options::default().max_new_tokens(16);
    let prompts: Vec<Prompt<'_>> = PROMPTS.iter().map(|&p| p.into()).collect();
    let batch = model.generate_batch(&prompts, &options).unwrap();
    assert_eq!(batch.len(), PROMPTS.len());
    for (prompt, together) in PROMPTS.iter().zip(&batch) {
        let alone = model.generate(*prompt, &options).unwrap();
        assert_eq!(together.ids(), alone.ids(), "{prompt:?}");
        assert_eq!(together.text, alone.text, "{prompt:?}");
        assert!(!alone.ids().is_empty(), "{prompt:?}");
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn prompt_lookup_drafting_keeps_the_greedy_ids() {
    let model = common::smollm2();
    // A prompt whose continuation repeats it, so drafts are made and taken.
    let prompt = "Repeat the list: apples, pears, plums, cherries, grapes. \
                  The list again: apples, pears, plums,";
    let plain = Options::default().max_new_tokens(32);
    let drafted = plain.clone().draft(Drafting::PromptLookup);
    let want = model.generate(prompt, &plain).unwrap();
    let got = model.generate(prompt, &drafted).unwrap();
    assert_eq!(got.ids(), want.ids());
    assert_eq!(got.text, want.text);
    assert!(want.text.starts_with(" grapes."), "{:?}", want.text);
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn beam_search_of_one_beam_is_greedy_and_scores_as_the_model_does() {
    let model = common::smollm2();
    let prompt = PROMPTS[0];
    let options = Options::default().max_new_tokens(12);
    let greedy = model.generate(prompt, &options).unwrap();
    let one = model.beam_search(prompt, &options, 1, 1.0).unwrap();
    assert_eq!(one[0].tokens, greedy.ids());

    let beams = model.beam_search(prompt, &options, 4, 1.0).unwrap();
    assert!(!beams.is_empty());
    assert!(beams.windows(2).all(|w| w[0].score >= w[1].score));
    // Each step's log-probability from one pass over prompt + hypothesis.
    let prompt_ids = model.prompt_ids(prompt).unwrap();
    let vocab_size = model.decoder.vocab_size();
    for hypothesis in &beams {
        let tokens = &hypothesis.tokens;
        let fed: Vec<TokenId> = prompt_ids
            .iter()
            .chain(&tokens[..tokens.len() - 1])
            .copied()
            .collect();
        let mut state = model.decoder.new_state();
        let mut rows = Vec::new();
        model
            .decoder
            .forward(&mut state, &fed, Rows::All, &mut rows)
            .unwrap();
        let rows: Vec<&[f32]> = rows.chunks_exact(vocab_size).collect();
        let predicting = &rows[prompt_ids.len() - 1..];
        assert_eq!(predicting.len(), tokens.len());
        for ((row, &token), &got) in predicting.iter().zip(tokens).zip(&hypothesis.step_logprobs) {
            let want = common::log_softmax_at(row, token);
            assert!((got - want).abs() < 1e-3, "{got} against {want}");
        }
        let sum: f64 = hypothesis.step_logprobs.iter().sum();
        assert!((hypothesis.logprob - sum).abs() < 1e-9);
    }
}
