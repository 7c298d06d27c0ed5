//! Reusing a state between generations (`generate_cached`): each run equals
//! a run from a fresh state, and reads only the prompt tokens the cache has
//! not read; `min_new_tokens` and `penalty_last_n` against hand-made
//! references.

use crate::common::PrefixModel;
use std::ops::ControlFlow;

use lm_core::{Counting, TokenId};
use lm_decode::{
    GenerationConfig, PrefixCache, Sampler, SamplingConfig, Step, StopReason, generate,
    generate_cached,
};

fn sampling(seed: u64) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 4,
        sampling: SamplingConfig {
            seed,
            temperature: 0.8,
            ..SamplingConfig::default()
        },
        ..GenerationConfig::default()
    }
}

fn no_hook(_: &Step) -> Result<ControlFlow<()>, lm_decode::Error> {
    Ok(ControlFlow::Continue(()))
}

#[test]
fn each_turn_equals_a_fresh_run_and_reads_only_its_new_tokens() {
    let model = Counting::new(PrefixModel::new(11));
    let fresh = PrefixModel::new(11);
    let mut cache = PrefixCache::new(&model);
    let mut conversation: Vec<TokenId> = vec![3, 1, 4];
    let mut expected_reads = Vec::new();
    for turn in 0..4u64 {
        let config = GenerationConfig {
            rng_stream: turn,
            ..sampling(9)
        };
        let run =
            generate_cached(&model, &mut cache, &conversation, &config, None, no_hook).unwrap();
        let reference = generate(&fresh, &conversation, &config, None).unwrap();
        assert_eq!(run.generation, reference, "turn {turn}");
        // The cache had read all but the last reply token and the new user tokens.
        let n_new = conversation.len() - run.n_reused;
        assert_eq!(
            run.n_reused,
            if turn == 0 { 0 } else { conversation.len() - 3 }
        );
        expected_reads.push(n_new);
        expected_reads.extend(std::iter::repeat_n(1, run.generation.tokens.len() - 1));
        assert_eq!(model.calls(), expected_reads, "turn {turn}");
        let n_fed = conversation.len() + run.generation.tokens.len() - 1;
        conversation.extend(&run.generation.tokens);
        assert_eq!(cache.tokens(), &conversation[..n_fed]);
        // The next user message.
        conversation.extend([turn as TokenId + 5, 2]);
    }
}

#[test]
fn a_prompt_that_differs_is_read_from_the_first_difference() {
    let model = Counting::new(PrefixModel::new(11));
    let mut cache = PrefixCache::new(&model);
    let config = sampling(4);
    generate_cached(&model, &mut cache, &[1, 2, 3, 4, 5], &config, None, no_hook).unwrap();
    let before = model.calls().len();
    // An edit at position 2: positions 0 and 1 are kept.
    let prompt = [1, 2, 9, 4, 5, 6];
    let run = generate_cached(&model, &mut cache, &prompt, &config, None, no_hook).unwrap();
    assert_eq!(run.n_reused, 2);
    assert_eq!(model.calls()[before], 4);
    let reference = generate(&PrefixModel::new(11), &prompt, &config, None).unwrap();
    assert_eq!(run.generation, reference);
    // The same prompt again reads its last token only.
    let before = model.calls().len();
    let again = generate_cached(&model, &mut cache, &prompt, &config, None, no_hook).unwrap();
    assert_eq!(again.n_reused, prompt.len() - 1);
    assert_eq!(model.calls()[before], 1);
    assert_eq!(again.generation, reference);
    // Cleared, it reads the whole prompt.
    cache.clear();
    let before = model.calls().len();
    let cleared = generate_cached(&model, &mut cache, &prompt, &config, None, no_hook).unwrap();
    assert_eq!((cleared.n_reused, model.calls()[before]), (0, prompt.len()));
}

#[test]
fn min_new_tokens_masks_the_end_tokens_until_reached() {
    let model = PrefixModel::new(6);
    let prompt = [1, 2];
    // Every token is an end token but 0 and 1: without the minimum the run
    // ends at its first end token.
    let end_tokens: Vec<TokenId> = vec![2, 3, 4, 5];
    let config = GenerationConfig {
        max_new_tokens: 8,
        end_tokens: end_tokens.clone(),
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    let plain = generate(&model, &prompt, &config, None).unwrap();
    assert!(plain.tokens.len() < 5, "{:?}", plain.tokens);
    let config = GenerationConfig {
        min_new_tokens: 5,
        ..config
    };
    let run = generate(&model, &prompt, &config, None).unwrap();
    assert!(run.tokens.len() > 5, "{:?}", run.tokens);
    let mut prefix = prompt.to_vec();
    for (index, step) in run.steps.iter().enumerate() {
        // The greedy choice over the allowed tokens, by hand.
        let logits = model.logits_for(&prefix);
        let allowed = |id: usize| index >= 5 || !end_tokens.contains(&(id as TokenId));
        let best = (0..logits.len())
            .filter(|&id| allowed(id))
            .fold(None, |best: Option<usize>, id| match best {
                Some(b) if logits[b] >= logits[id] => Some(b),
                _ => Some(id),
            })
            .unwrap();
        assert_eq!(step.token as usize, best, "step {index}");
        // The trace keeps the model's own probability of the token.
        let expected = lm_core::softmax(&logits, 1.0).unwrap()[best];
        assert!((step.model_prob - expected).abs() < 1e-6, "step {index}");
        prefix.push(step.token);
    }
    assert!(matches!(
        run.stop_reason,
        StopReason::EndToken(_) | StopReason::MaxNewTokens
    ));
}

#[test]
fn penalty_last_n_counts_only_the_window() {
    let logits = [1.0, 2.0, 0.5, -1.0, 0.0];
    let history: [TokenId; 5] = [0, 1, 0, 2, 4];
    let policy = |config: &SamplingConfig, history: &[TokenId]| {
        Sampler::new(config)
            .unwrap()
            .policy(&logits, history)
            .unwrap()
            .to_vec()
    };
    let penalised = |last_n| SamplingConfig {
        repetition_penalty: Some(1.7),
        frequency_penalty: Some(0.3),
        penalty_last_n: last_n,
        ..SamplingConfig::default()
    };
    for n in 0..=6 {
        let window = &history[history.len().saturating_sub(n)..];
        assert_eq!(
            policy(&penalised(Some(n)), &history),
            policy(&penalised(None), window),
            "last {n}"
        );
    }
    // 0 turns the penalties off.
    assert_eq!(
        policy(&penalised(Some(0)), &history),
        policy(&SamplingConfig::default(), &history)
    );
}
