//! Reusing a state between generations (`generate_cached`): each run equals
//! a run from a fresh state, and reads only the prompt tokens the cache has
//! not read; the cache itself (`PrefixCache`): the longest prefix chosen,
//! the limits respected, the least recently used dropped first;
//! `min_new_tokens` and `penalty_last_n` against hand-made references.

use crate::common::{PrefixModel, go_on};
use std::ops::ControlFlow;

use lm_core::{Counting, Prefix, SequenceState, TokenId};
use lm_decode::{
    CacheLimit, GenerationConfig, PrefixCache, Sampler, SamplingConfig, Step, StopReason, generate,
    generate_cached,
};

fn sampling(seed: u64) -> GenerationConfig {
    let sampling = SamplingConfig {
        seed,
        temperature: 0.8,
        ..SamplingConfig::default()
    };
    GenerationConfig {
        max_new_tokens: 4,
        sampling,
        ..GenerationConfig::default()
    }
}

#[test]
fn each_turn_equals_a_fresh_run_and_reads_only_its_new_tokens() {
    let model = Counting::new(PrefixModel::new(11));
    let fresh = PrefixModel::new(11);
    let mut cache = PrefixCache::one_state();
    let mut conversation: Vec<TokenId> = vec![3, 1, 4];
    let mut expected_reads = Vec::new();
    for turn in 0..4u64 {
        let config = GenerationConfig {
            rng_stream: turn,
            ..sampling(9)
        };
        let run = generate_cached(&model, &mut cache, &conversation, &config, None, go_on).unwrap();
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
        assert_eq!(cache.kept(), [&conversation[..n_fed]]);
        // The next user message.
        conversation.extend([turn as TokenId + 5, 2]);
    }
}

#[test]
fn a_prompt_that_differs_is_read_from_the_first_difference() {
    let model = Counting::new(PrefixModel::new(11));
    let mut cache = PrefixCache::one_state();
    let config = sampling(4);
    generate_cached(&model, &mut cache, &[1, 2, 3, 4, 5], &config, None, go_on).unwrap();
    let before = model.calls().len();
    // An edit at position 2: positions 0 and 1 are kept.
    let prompt = [1, 2, 9, 4, 5, 6];
    let run = generate_cached(&model, &mut cache, &prompt, &config, None, go_on).unwrap();
    assert_eq!(run.n_reused, 2);
    assert_eq!(model.calls()[before], 4);
    let reference = generate(&PrefixModel::new(11), &prompt, &config, None).unwrap();
    assert_eq!(run.generation, reference);
    // The same prompt again reads its last token only.
    let before = model.calls().len();
    let again = generate_cached(&model, &mut cache, &prompt, &config, None, go_on).unwrap();
    assert_eq!(again.n_reused, prompt.len() - 1);
    assert_eq!(model.calls()[before], 1);
    assert_eq!(again.generation, reference);
    // Cleared, it reads the whole prompt.
    cache.clear();
    let before = model.calls().len();
    let cleared = generate_cached(&model, &mut cache, &prompt, &config, None, go_on).unwrap();
    assert_eq!((cleared.n_reused, model.calls()[before]), (0, prompt.len()));
}

#[test]
fn a_run_that_fails_leaves_the_cache_as_it_was() {
    let model = Counting::new(PrefixModel::new(11));
    let mut cache = PrefixCache::one_state();
    let config = sampling(5);
    let first = generate_cached(&model, &mut cache, &[1, 2, 3], &config, None, go_on).unwrap();
    let kept: Vec<Vec<TokenId>> = cache.kept().iter().map(|t| t.to_vec()).collect();
    let mut extended: Vec<TokenId> = [&[1, 2, 3][..], &first.generation.tokens].concat();
    // A token outside the vocabulary of 11, after the kept prefix.
    let bad = [extended.as_slice(), &[99]].concat();
    assert!(generate_cached(&model, &mut cache, &bad, &config, None, go_on).is_err());
    // A hook that fails on the first step.
    let failing = |_: &Step| Err::<ControlFlow<()>, _>(lm_decode::Error::EmptyPrompt);
    assert!(generate_cached(&model, &mut cache, &extended, &config, None, failing).is_err());
    assert_eq!(cache.kept(), kept, "the kept state survives both errors");
    extended.push(7);
    let run = generate_cached(&model, &mut cache, &extended, &config, None, go_on).unwrap();
    assert_eq!(run.n_reused, kept[0].len());
    let reference = generate(&PrefixModel::new(11), &extended, &config, None).unwrap();
    assert_eq!(run.generation, reference);
}

/// A `Prefix` state that has read `tokens`.
fn prefix(tokens: &[TokenId]) -> Prefix {
    Prefix {
        tokens: tokens.to_vec(),
    }
}

/// A cache of `Prefix` states under `max_bytes`, 4 bytes a token.
fn byte_cache(max_bytes: usize) -> PrefixCache<Prefix> {
    PrefixCache::new(CacheLimit::bytes(max_bytes), |state: &Prefix| {
        4 * state.tokens.len()
    })
}

#[test]
fn the_longest_shared_prefix_is_found_and_truncated_to() {
    let mut cache = byte_cache(1000);
    cache.insert(vec![1, 2, 3], prefix(&[1, 2, 3]));
    cache.insert(vec![1, 5], prefix(&[1, 5]));
    cache.insert(vec![1, 2, 3, 4, 6], prefix(&[1, 2, 3, 4, 6]));
    // [1, 2, 3] was dropped: [1, 2, 3, 4, 6] extends it.
    assert_eq!(cache.kept(), [&[1, 2, 3, 4, 6][..], &[1, 5]]);
    let (state, n_shared) = cache.longest_prefix(&[1, 2, 3, 4, 5]).unwrap();
    assert_eq!((state.tokens, n_shared), (vec![1, 2, 3, 4], 4));
    let (state, n_shared) = cache.longest_prefix(&[1, 5, 5]).unwrap();
    assert_eq!((state.tokens, n_shared), (vec![1, 5], 2));
    // A copy: the kept states are whole.
    assert_eq!(cache.kept(), [&[1, 5][..], &[1, 2, 3, 4, 6]]);
    assert!(cache.longest_prefix(&[7]).is_none());
    assert!(cache.longest_prefix(&[]).is_none());
    assert_eq!((cache.len(), cache.used_bytes()), (2, 28));
    // Taken, it leaves the cache.
    let (state, n_shared) = cache.take_longest_prefix(&[1, 2, 9]).unwrap();
    assert_eq!((state.pos(), n_shared), (2, 2));
    assert_eq!((cache.kept(), cache.used_bytes()), (vec![&[1, 5][..]], 8));
}

#[test]
fn of_two_equal_prefixes_the_most_recently_used_is_chosen() {
    let mut cache = byte_cache(1000);
    cache.insert(vec![1, 2, 3], prefix(&[1, 2, 3]));
    cache.insert(vec![1, 2, 4], prefix(&[1, 2, 4]));
    let (state, _) = cache.longest_prefix(&[1, 2, 5]).unwrap();
    assert_eq!(state.tokens, [1, 2]);
    assert_eq!(cache.kept()[0], [1, 2, 4]);
    cache.longest_prefix(&[1, 2, 3]).unwrap();
    assert_eq!(cache.kept()[0], [1, 2, 3]);
}

#[test]
fn a_state_replaces_the_ones_it_extends_and_the_budget_drops_the_least_recently_used() {
    let mut cache = byte_cache(38);
    cache.insert(vec![1, 2], prefix(&[1, 2]));
    cache.insert(vec![1, 2, 3], prefix(&[1, 2, 3]));
    assert_eq!((cache.len(), cache.used_bytes()), (1, 12));
    cache.insert(vec![4, 4, 4], prefix(&[4, 4, 4]));
    cache.insert(vec![5, 5, 5], prefix(&[5, 5, 5]));
    assert_eq!((cache.len(), cache.used_bytes()), (3, 36));
    // Touch [1, 2, 3]; then a fourth entry evicts [4, 4, 4], the oldest.
    cache.longest_prefix(&[1, 2, 3]).unwrap();
    cache.insert(vec![6], prefix(&[6]));
    assert_eq!((cache.len(), cache.used_bytes()), (3, 28));
    assert!(cache.longest_prefix(&[4]).is_none());
    assert!(cache.longest_prefix(&[1]).is_some());
    // Bigger than the whole budget: not kept, nothing dropped for it.
    cache.insert(vec![7; 11], prefix(&[7; 11]));
    assert!(cache.longest_prefix(&[7]).is_none());
    assert_eq!(cache.len(), 3);
}

#[test]
fn eviction_follows_the_order_of_use_until_the_budget_holds() {
    // Five 8-byte states in 40 bytes; the sixth needs 16 more: the two
    // least recently used go, in that order.
    let mut cache = byte_cache(40);
    for t in 1..=5 {
        cache.insert(vec![t, t], prefix(&[t, t]));
    }
    // Use order, oldest first: 2, 4, 5, 1, 3.
    for t in [1, 3] {
        cache.longest_prefix(&[t]).unwrap();
    }
    cache.insert(vec![6, 6, 6, 6], prefix(&[6, 6, 6, 6]));
    assert_eq!(cache.kept(), [&[6, 6, 6, 6][..], &[3, 3], &[1, 1], &[5, 5]]);
    assert_eq!(cache.used_bytes(), 40);
    // The used bytes always equal the kept states' sizes, within the budget.
    let total: usize = cache.kept().iter().map(|tokens| 4 * tokens.len()).sum();
    assert_eq!(total, cache.used_bytes());
}

#[test]
fn the_entry_limit_keeps_the_most_recent_states_and_zero_keeps_nothing() {
    let limit = CacheLimit {
        max_entries: 2,
        max_bytes: usize::MAX,
    };
    let mut cache = PrefixCache::new(limit, |_: &Prefix| 0);
    for t in 1..=3 {
        cache.insert(vec![t], prefix(&[t]));
    }
    assert_eq!(cache.kept(), [[3], [2]]);
    // One state: each insert replaces the last, whatever its size.
    let mut one = PrefixCache::one_state();
    one.insert(vec![1; 1000], prefix(&[1; 1000]));
    one.insert(vec![2], prefix(&[2]));
    assert_eq!(one.kept(), [[2]]);
    // A limit of 0 in either dimension keeps nothing.
    let mut none = byte_cache(0);
    none.insert(vec![1], prefix(&[1]));
    let mut no_entries = PrefixCache::new(
        CacheLimit {
            max_entries: 0,
            max_bytes: 100,
        },
        |_: &Prefix| 0,
    );
    no_entries.insert(vec![1], prefix(&[1]));
    assert!(none.is_empty() && no_entries.is_empty());
    // A state records only the tokens it has read.
    let mut cache = byte_cache(100);
    cache.insert(vec![1, 2, 3], prefix(&[1, 2]));
    cache.insert(vec![4], prefix(&[4, 5, 6]));
    assert_eq!(cache.kept(), [&[4][..], &[1, 2]]);
    assert_eq!(cache.longest_prefix(&[4, 5]).unwrap().0.tokens, [4]);
}

#[test]
fn a_shared_cache_serves_several_conversations_each_equal_to_a_fresh_run() {
    // Two conversations take turns on one cache of two states: each turn
    // starts from its own conversation's state.
    let model = Counting::new(PrefixModel::new(11));
    let mut cache = PrefixCache::new(
        CacheLimit {
            max_entries: 2,
            max_bytes: usize::MAX,
        },
        |_| 0,
    );
    let mut conversations: [Vec<TokenId>; 2] = [vec![3, 1, 4], vec![2, 7, 1]];
    for turn in 0..3u64 {
        for (c, conversation) in conversations.iter_mut().enumerate() {
            let config = GenerationConfig {
                rng_stream: turn,
                ..sampling(c as u64)
            };
            let run =
                generate_cached(&model, &mut cache, conversation, &config, None, go_on).unwrap();
            let reference = generate(&PrefixModel::new(11), conversation, &config, None).unwrap();
            assert_eq!(run.generation, reference, "turn {turn}, conversation {c}");
            let expected_reuse = if turn == 0 { 0 } else { conversation.len() - 3 };
            assert_eq!(
                run.n_reused, expected_reuse,
                "turn {turn}, conversation {c}"
            );
            conversation.extend(&run.generation.tokens);
            conversation.extend([turn as TokenId + 5, 2]);
        }
    }
    assert_eq!(cache.len(), 2);
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
