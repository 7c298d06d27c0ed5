//! Invariants over random inputs: any finite logits with any valid
//! parameters give a distribution and an in-range token; filters agree with a
//! full sort; invalid parameters give typed errors.

use crate::common::words::Words;
use crate::common::{full_sort, full_sort_ids};
use lm_core::TokenId;
use lm_decode::{Error, Sampler, SamplingConfig};
use proptest::prelude::*;

fn logits() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-30.0f32..30.0, 1..80)
}

prop_compose! {
    fn valid_config()(
        temperature in prop_oneof![Just(0.0f32), 0.05f32..5.0, Just(f32::INFINITY)],
        top_k in prop::option::of(1usize..100),
        top_p in prop::option::of(0.001f32..=1.0),
        min_p in prop::option::of(0.0f32..=1.0),
        repetition_penalty in prop::option::of(0.5f32..2.0),
        presence_penalty in prop::option::of(-2.0f32..2.0),
        frequency_penalty in prop::option::of(-2.0f32..2.0),
        seed in any::<u64>(),
    ) -> SamplingConfig {
        SamplingConfig {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            seed,
            ..SamplingConfig::default()
        }
    }
}

fn kept(probs: &[f32]) -> Vec<TokenId> {
    (0..probs.len() as TokenId)
        .filter(|&id| probs[id as usize] > 0.0)
        .collect()
}

proptest! {
    #[test]
    fn valid_parameters_give_a_distribution_and_a_token_in_range(
        logits in logits(),
        config in valid_config(),
        history_seed in prop::collection::vec(any::<u32>(), 0..20),
        u in 0.0f64..1.0,
    ) {
        let vocab_size = logits.len();
        let history: Vec<TokenId> = history_seed.iter().map(|h| h % vocab_size as u32).collect();
        let mut sampler = Sampler::new(&config).unwrap();
        let probs = sampler.policy(&logits, &history).unwrap().to_vec();
        prop_assert_eq!(probs.len(), vocab_size);
        prop_assert!(probs.iter().all(|p| p.is_finite() && *p >= 0.0));
        let sum: f64 = probs.iter().map(|&p| f64::from(p)).sum();
        prop_assert!((sum - 1.0).abs() <= 1e-6, "sum {}", sum);
        let choice = sampler.select(&logits, &history, u).unwrap();
        prop_assert!((choice.token as usize) < vocab_size);
        prop_assert!(probs[choice.token as usize] > 0.0);
        prop_assert_eq!(choice.policy_prob, probs[choice.token as usize]);
        // The selector's walk (over the survivors alone after a filter) is
        // the inverse CDF over the whole policy row.
        let walked = if config.temperature == 0.0 {
            lm_core::argmax(&probs).unwrap()
        } else {
            lm_core::sample_inverse_cdf(&probs, u).unwrap()
        };
        prop_assert_eq!(choice.token, walked);
    }

    #[test]
    fn top_k_keeps_the_k_best_of_a_full_sort(logits in logits(), k in 1usize..100) {
        let mut sampler = Sampler::new(&SamplingConfig { top_k: Some(k), ..SamplingConfig::default() }).unwrap();
        let probs = sampler.policy(&logits, &[]).unwrap();
        let mut expected = full_sort_ids(&logits);
        expected.truncate(k);
        expected.sort_unstable();
        // Logits within 60 of each other: no kept token underflows at T = 1.
        prop_assert_eq!(kept(probs), expected);
    }

    /// Past `SORTED_KEEP`, top-k keeps its set by one partition, unsorted:
    /// the same set as a full sort's first k.
    #[test]
    fn a_large_top_k_keeps_the_k_best_of_a_full_sort(
        logits in prop::collection::vec((-8.0f32..8.0).prop_map(|z| (z * 4.0).round() / 4.0), 300..1500),
        share in 0.2f64..0.95,
    ) {
        let k = ((logits.len() as f64 * share) as usize).max(lm_decode::sampler::SORTED_KEEP + 1);
        let mut candidates = lm_decode::sampler::Candidates::from_logits(&logits, 1.0).unwrap();
        lm_decode::sampler::CandidateFilter::apply(&lm_decode::sampler::TopK::new(k).unwrap(), &mut candidates);
        let mut kept: Vec<TokenId> = candidates.ids().collect();
        kept.sort_unstable();
        let mut expected = full_sort_ids(&logits);
        expected.truncate(k);
        expected.sort_unstable();
        // Rounded logits: many ties, which the lower id wins either way.
        prop_assert_eq!(kept, expected);
    }

    #[test]
    fn top_p_keeps_the_shortest_prefix_of_a_full_sort(logits in prop::collection::vec(-5.0f32..5.0, 1..200), p in 0.01f32..=1.0) {
        let mut sampler = Sampler::new(&SamplingConfig { top_p: Some(p), ..SamplingConfig::default() }).unwrap();
        let probs = sampler.policy(&logits, &[]).unwrap();
        let order = full_sort_ids(&logits);
        let max = f64::from(logits[order[0] as usize]);
        let weights: Vec<f64> = order.iter().map(|&id| (f64::from(logits[id as usize]) - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut cumulative = 0.0;
        let n_kept = weights.iter().position(|w| { cumulative += w; (cumulative / total) as f32 >= p }).map_or(order.len(), |i| i + 1);
        let mut expected = order[..n_kept].to_vec();
        expected.sort_unstable();
        prop_assert_eq!(kept(probs), expected);
    }

    #[test]
    fn invalid_parameters_are_typed_errors(
        negative in -1e6f32..-1e-6,
        above_one in 1.000_001f32..1e6,
        non_positive in -1e6f32..=0.0,
    ) {
        let build = |c: SamplingConfig| Sampler::new(&c).err();
        let base = SamplingConfig::default;
        prop_assert_eq!(build(SamplingConfig { temperature: negative, ..base() }), Some(Error::Core(lm_core::Error::InvalidTemperature { value: negative })));
        prop_assert_eq!(build(SamplingConfig { top_p: Some(above_one), ..base() }), Some(Error::InvalidTopP { value: above_one }));
        prop_assert_eq!(build(SamplingConfig { top_p: Some(non_positive), ..base() }), Some(Error::InvalidTopP { value: non_positive }));
        prop_assert_eq!(build(SamplingConfig { min_p: Some(negative), ..base() }), Some(Error::InvalidMinP { value: negative }));
        prop_assert_eq!(build(SamplingConfig { min_p: Some(above_one), ..base() }), Some(Error::InvalidMinP { value: above_one }));
        prop_assert_eq!(
            build(SamplingConfig { repetition_penalty: Some(non_positive), ..base() }),
            Some(Error::InvalidRepetitionPenalty { value: non_positive })
        );
    }
}

proptest! {
    /// Growing the sorted prefix in any steps, by the heap scan or by
    /// `select_nth_unstable_by`, gives the prefix of a full sort.
    #[test]
    fn sorted_prefixes_agree_with_a_full_sort(
        levels in prop::collection::vec(-4i8..4, 1..600),
        steps in prop::collection::vec(1usize..200, 1..4),
    ) {
        use lm_decode::sampler::Candidates;
        // Few distinct levels, so ties (broken by the lower id) are common.
        let logits: Vec<f32> = levels.iter().map(|&l| f32::from(l) * 0.5).collect();
        let reference = full_sort(&logits);
        let mut candidates = Candidates::from_logits(&logits, 1.0).unwrap();
        let mut n = 0;
        for step in steps {
            n = (n + step).min(logits.len());
            candidates.sort_prefix(n);
            prop_assert_eq!(candidates.n_sorted(), n);
            prop_assert_eq!(&candidates.entries()[..n], &reference[..n]);
            let mut ids: Vec<TokenId> = candidates.ids().collect();
            ids.sort_unstable();
            prop_assert!(ids.iter().copied().eq(0..logits.len() as TokenId));
        }
    }
}

prop_compose! {
    /// Every stage of the chain on, with random settings and a random
    /// order of the filters (temperature anywhere among them).
    fn every_stage()(
        temperature in 0.3f32..3.0,
        dynatemp in 0.0f32..=0.5,
        top_n_sigma in 0.5f32..3.0,
        top_k in 1usize..60,
        typical_p in 0.05f32..=1.0,
        top_p in 0.05f32..=1.0,
        min_p in 0.0f32..=0.3,
        xtc in (0.0f32..=1.0, 0.0f32..=0.5),
        epsilon_cutoff in 1e-4f32..0.05,
        eta_cutoff in 1e-4f32..0.05,
        min_keep in 0usize..6,
        mirostat in 0u8..=2,
        dry_multiplier in 0.0f32..2.0,
        no_repeat_ngram_size in 0usize..4,
        banned in prop::collection::vec(0u32..40, 0..4),
        order in Just(["top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                       "epsilon_cutoff", "eta_cutoff", "temperature"]).prop_shuffle(),
        seed in any::<u64>(),
    ) -> SamplingConfig {
        let mut samplers = vec!["penalties", "dry"];
        samplers.extend(order);
        SamplingConfig {
            temperature,
            // At most half the temperature, so no weight underflows.
            dynatemp_range: Some(dynatemp * temperature),
            top_n_sigma: Some(top_n_sigma),
            top_k: Some(top_k),
            typical_p: Some(typical_p),
            top_p: Some(top_p),
            min_p: Some(min_p),
            xtc_probability: Some(xtc.0),
            xtc_threshold: Some(xtc.1),
            epsilon_cutoff: Some(epsilon_cutoff),
            eta_cutoff: Some(eta_cutoff),
            min_keep: Some(min_keep),
            mirostat: Some(mirostat),
            dry_multiplier: Some(dry_multiplier),
            no_repeat_ngram_size: Some(no_repeat_ngram_size),
            repetition_penalty: Some(1.2),
            banned_tokens: banned,
            order: Some(lm_decode::SamplerOrder::new(samplers)),
            seed,
            ..SamplingConfig::default()
        }
    }
}

proptest! {
    /// Every stage at once, over a few steps of a growing history: the
    /// policy is a distribution over at least `min_keep` of the tokens in
    /// play (mirostat, which llama.cpp lets keep one, at least one), no
    /// banned or masked token comes back, and the same seed replays the
    /// choices and mirostat's bound bit for bit.
    #[test]
    fn every_stage_at_once_keeps_min_keep_never_unbans_and_replays(
        rows in prop::collection::vec(prop::collection::vec(-4.0f32..4.0, 40), 4),
        masked in prop::collection::vec(0usize..40, 0..6),
        config in every_stage(),
        prompt in prop::collection::vec(0u32..40, 1..30),
        draws in prop::collection::vec(0.0f64..1.0, 4),
    ) {
        let run = || -> Vec<(TokenId, Option<f32>, u32)> {
            let mut sampler = Sampler::with_text(&config, 40, &Words(7)).unwrap();
            let mut history = prompt.clone();
            let mut steps = Vec::new();
            for (row, &u) in rows.iter().zip(&draws) {
                let mut logits = row.clone();
                for &id in &masked {
                    logits[id] = f32::NEG_INFINITY;
                }
                let Ok(probs) = sampler.policy(&logits, &history) else {
                    // The bans, masks and n-gram rule may leave nothing.
                    continue;
                };
                let probs = probs.to_vec();
                let sum: f64 = probs.iter().map(|&p| f64::from(p)).sum();
                assert!(probs.iter().all(|p| p.is_finite() && *p >= 0.0), "{probs:?}");
                assert!((sum - 1.0).abs() <= 1e-5, "sum {sum}");
                let adjusted = sampler.adjusted_logits();
                for (id, &p) in probs.iter().enumerate() {
                    let out = adjusted[id] == f32::NEG_INFINITY
                        || logits[id] == f32::NEG_INFINITY
                        || config.banned_tokens.contains(&(id as u32));
                    assert!(!(out && p > 0.0), "token {id} came back with {p}");
                }
                let n_in_play = adjusted.iter().filter(|&&z| z > f32::NEG_INFINITY).count();
                let n_kept = probs.iter().filter(|&&p| p > 0.0).count();
                let floor = if config.mirostat == Some(0) { config.min_keep.unwrap_or(1).max(1) } else { 1 };
                assert!(n_kept >= floor.min(n_in_play), "{n_kept} kept of {n_in_play}, floor {floor}");
                let choice = sampler.select(&logits, &history, u).unwrap();
                assert!(probs[choice.token as usize] > 0.0);
                steps.push((choice.token, sampler.mirostat_mu(), choice.policy_prob.to_bits()));
                history.push(choice.token);
            }
            steps
        };
        prop_assert_eq!(run(), run());
    }
}
