//! The sampling stages typical-p, top-nσ and XTC, and `min_keep` in top-p
//! and min-p, against llama.cpp's samplers of the same name
//! (`fixtures/samplers/samplers.json`, written by
//! `cargo xtask reference-fixtures --samplers` with llama-cpp-python 0.3.36),
//! and their invariants over random rows.
//!
//! Each case applies one stage at T = 1 to one vector (20 small ones with
//! ties and -inf entries, and SmolLM2's 49,152-entry row, plain and with every
//! fifth id masked) and compares:
//!
//! - the kept set, exactly, with two stated exceptions: tokens of equal
//!   logit are interchangeable (llama.cpp orders ties by an unstable sort;
//!   lm-decode by lower id), and a comparison within [`MASS_SLACK`] of
//!   equality (a running mass against p, a probability against XTC's
//!   threshold) or a logit within [`SIGMA_SLACK`] of the top-nσ threshold
//!   may go either way (llama.cpp sums in f32);
//! - the probabilities of the kept tokens, renormalised over the kept set,
//!   within [`PROB_TOLERANCE`] relative (plus 1e-9 absolute) of the exact
//!   f64 softmax the fixture gives (or the test computes, for large sets).
//!
//! XTC is compared at probability 1, where llama.cpp's coin always lands on
//! "remove"; its seeded coin is tested on its own below.

use crate::common::{kept_sets, logit_bits, masked_row, probabilities_by_id, softmax_over};
use lm_core::TokenId;
use lm_decode::sampler::{CandidateFilter, Candidates, MinP, TopNSigma, TopP, Typical, Xtc};
use lm_decode::{Sampler, SamplingConfig, TokenRng};
use proptest::prelude::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Relative tolerance on a kept token's renormalised probability: our
/// weights are f32 (`lm_core::softmax_weight`), the reference f64.
const PROB_TOLERANCE: f64 = 1e-5;

/// How far (in logits) from top-nσ's threshold a token may be and still fall
/// on the other side in llama.cpp, whose mean and deviation are f32 sums.
const SIGMA_SLACK: f64 = 1e-3;

/// How close to equality a comparison of probabilities may be and still go
/// the other way in llama.cpp: the mass of the smaller kept set against p
/// (typical, top-p), or a token's probability against XTC's threshold.
/// llama.cpp's softmax sums its normaliser in f32, one term after another:
/// on SmolLM2's 49,152-entry row that sum is 1.1e-4 below the exact one, so
/// each of its probabilities is that much too high.
const MASS_SLACK: f64 = 2e-4;

/// The fixture, and every vector by name.
fn load() -> (Value, BTreeMap<String, Vec<f32>>) {
    crate::common::sampler_vectors()
}

/// The stage a case names, and its `min_keep`.
fn stage(sampler: &str, params: &Value) -> (Box<dyn CandidateFilter>, usize) {
    let number = |name: &str| params[name].as_f64().unwrap() as f32;
    let min_keep = params["min_keep"].as_u64().unwrap_or(0) as usize;
    let stage: Box<dyn CandidateFilter> = match sampler {
        "typical" => Box::new(Typical::new(number("p")).unwrap()),
        "top_n_sigma" => Box::new(TopNSigma::new(number("n")).unwrap()),
        "xtc" => Box::new(Xtc::new(number("probability"), number("threshold")).unwrap()),
        "top_p" => Box::new(TopP::new(number("p")).unwrap()),
        "min_p" => Box::new(MinP::new(number("p")).unwrap()),
        other => panic!("unknown sampler {other}"),
    };
    (stage, min_keep)
}

/// The same stage as a [`SamplingConfig`], to check the chain gives it.
fn config(sampler: &str, params: &Value) -> SamplingConfig {
    let number = |name: &str| Some(params[name].as_f64().unwrap() as f32);
    let min_keep = params["min_keep"].as_u64().map(|n| n as usize);
    let base = SamplingConfig {
        min_keep,
        ..SamplingConfig::default()
    };
    match sampler {
        "typical" => SamplingConfig {
            typical_p: number("p"),
            ..base
        },
        "top_n_sigma" => SamplingConfig {
            top_n_sigma: number("n"),
            ..base
        },
        "xtc" => SamplingConfig {
            xtc_probability: number("probability"),
            xtc_threshold: number("threshold"),
            ..base
        },
        "top_p" => SamplingConfig {
            top_p: number("p"),
            ..base
        },
        "min_p" => SamplingConfig {
            min_p: number("p"),
            ..base
        },
        other => panic!("unknown sampler {other}"),
    }
}

/// The ids llama.cpp kept: `kept`, or the finite ids but `removed`.
fn reference_kept(case: &Value, logits: &[f32]) -> BTreeSet<TokenId> {
    let ids = |name: &str| -> Option<BTreeSet<TokenId>> {
        case[name].as_array().map(|ids| {
            ids.iter()
                .map(|id| id.as_u64().unwrap() as TokenId)
                .collect()
        })
    };
    if let Some(kept) = ids("kept") {
        return kept;
    }
    let removed = ids("removed").expect("kept or removed");
    (0..logits.len() as TokenId)
        .filter(|&id| logits[id as usize] > f32::NEG_INFINITY && !removed.contains(&id))
        .collect()
}

/// Why two kept sets may differ, or `None`: equal multisets of logits (a
/// tie swapped), or every differing token near top-nσ's threshold.
fn explained_difference(
    sampler: &str,
    params: &Value,
    logits: &[f32],
    ours: &BTreeSet<TokenId>,
    reference: &BTreeSet<TokenId>,
) -> Option<&'static str> {
    if logit_bits(logits, ours) == logit_bits(logits, reference) {
        return Some("tie");
    }
    let finite: BTreeSet<TokenId> = (0..logits.len() as TokenId)
        .filter(|&id| logits[id as usize].is_finite())
        .collect();
    let q = softmax_over(logits, &finite, 1.0);
    let q_of: BTreeMap<TokenId, f64> = finite.iter().copied().zip(q).collect();
    let differing: Vec<TokenId> = ours.symmetric_difference(reference).copied().collect();
    let mass = |set: &BTreeSet<TokenId>| set.iter().map(|id| q_of[id]).sum::<f64>();
    if matches!(sampler, "typical" | "top_p") && differing.len() == 1 {
        let smaller = if ours.len() < reference.len() {
            ours
        } else {
            reference
        };
        let p = params["p"].as_f64().unwrap();
        if (mass(smaller) - p).abs() <= MASS_SLACK {
            return Some("mass at p");
        }
    }
    if sampler == "xtc" {
        let threshold = params["threshold"].as_f64().unwrap();
        // The token at the threshold decides how many go, and may not be
        // one of the differing ones.
        if q_of.values().any(|q| (q - threshold).abs() <= MASS_SLACK) {
            return Some("probability at the threshold");
        }
    }
    if sampler == "top_n_sigma" {
        let finite: Vec<f64> = logits
            .iter()
            .filter(|z| z.is_finite())
            .map(|&z| f64::from(z))
            .collect();
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let sd =
            (finite.iter().map(|z| (z - mean).powi(2)).sum::<f64>() / finite.len() as f64).sqrt();
        let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let threshold = max - params["n"].as_f64().unwrap() * sd;
        let near = ours
            .symmetric_difference(reference)
            .all(|&id| (f64::from(logits[id as usize]) - threshold).abs() <= SIGMA_SLACK);
        if near {
            return Some("threshold");
        }
    }
    None
}

#[test]
fn every_stage_leaves_what_llama_cpp_leaves() {
    let (fixture, vectors) = load();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(vectors.len() >= 20, "{} vectors", vectors.len());
    let mut n_compared = BTreeMap::<&str, usize>::new();
    let mut explained = Vec::new();
    let mut unexplained = Vec::new();
    for case in cases {
        let sampler = case["sampler"].as_str().unwrap();
        let params = &case["params"];
        let name = case["vector"].as_str().unwrap();
        let logits = &vectors[name];
        let what = format!("{sampler} {params} on {name}");
        let (stage, min_keep) = stage(sampler, params);
        let mut candidates = Candidates::from_logits(logits, 1.0)
            .unwrap()
            .with_min_keep(min_keep);
        stage.apply(&mut candidates);
        let ours: BTreeSet<TokenId> = candidates.ids().collect();
        let reference = reference_kept(case, logits);
        if ours != reference {
            match explained_difference(sampler, params, logits, &ours, &reference) {
                Some(why) => explained.push(format!("{what}: {why}")),
                None => unexplained.push(format!(
                    "{what}: we keep {} tokens, llama.cpp {}; only ours: {:?}, only llama.cpp's: {:?}",
                    ours.len(),
                    reference.len(),
                    ours.difference(&reference).take(10).collect::<Vec<_>>(),
                    reference.difference(&ours).take(10).collect::<Vec<_>>()
                )),
            }
        }
        if !unexplained.is_empty() {
            continue;
        }
        // The probabilities of what we keep, against the exact renormalisation
        // of what llama.cpp keeps (the fixture's, when it lists them).
        let expected: Vec<f64> = match case["probs"].as_array() {
            Some(probs) if ours == reference => probs.iter().map(|p| p.as_f64().unwrap()).collect(),
            _ => softmax_over(logits, &ours, 1.0),
        };
        let by_id = probabilities_by_id(&mut candidates);
        assert_eq!(by_id.len(), expected.len(), "{what}");
        for (&(id, ours), &expected) in by_id.iter().zip(&expected) {
            let error = (ours - expected).abs();
            assert!(
                error <= PROB_TOLERANCE * expected + 1e-9,
                "{what}: token {id} has {ours}, expected {expected}"
            );
        }
        // The chain built from the config gives the stage's set.
        let mut sampler_chain = Sampler::new(&config(sampler, params)).unwrap();
        let policy = sampler_chain.policy(logits, &[]).unwrap();
        let (from_chain, positive) = kept_sets(policy, &by_id);
        assert_eq!(from_chain, positive, "{what}: the chain");
        *n_compared.entry(sampler).or_default() += 1;
    }
    assert!(unexplained.is_empty(), "{unexplained:#?}");
    // Every stage is compared on many vectors, the 49,152-entry row included.
    for sampler in ["typical", "top_n_sigma", "xtc", "top_p", "min_p"] {
        assert!(
            n_compared.get(sampler).copied().unwrap_or(0) >= 20,
            "{sampler}: {n_compared:?}"
        );
    }
    // The exceptions stay exceptions (`--nocapture` lists them).
    eprintln!(
        "{} cases; {} kept sets differ, explained: {explained:#?}",
        cases.len(),
        explained.len()
    );
    assert!(explained.len() * 10 <= cases.len(), "{explained:#?}");
}

#[test]
fn xtc_flips_its_coin_from_the_draw_and_a_seed_replays_it() {
    // q = (0.5, 0.3, 0.2); at threshold 0.25 XTC removes token 0 when it fires.
    let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
    let config = SamplingConfig {
        xtc_probability: Some(0.3),
        xtc_threshold: Some(0.25),
        seed: 7,
        ..SamplingConfig::default()
    };
    let mut sampler = Sampler::new(&config).unwrap();
    let mut rng = TokenRng::new(config.seed);
    let mut n_fired = 0;
    let mut outcomes = Vec::new();
    for _ in 0..4000 {
        let u = rng.next_uniform();
        let choice = sampler.select(&logits, &[], u).unwrap();
        // The coin: the first draw of ChaCha20 keyed by u's bits.
        let fires = TokenRng::new(u.to_bits()).next_uniform() < 0.3;
        let p0 = sampler.policy_probs()[0];
        assert_eq!(p0 == 0.0, fires, "u = {u}");
        n_fired += usize::from(fires);
        outcomes.push((choice.token, choice.policy_prob.to_bits()));
    }
    // The coin lands on "remove" about 30% of the time (4000 draws: sd 0.007).
    let rate = n_fired as f64 / 4000.0;
    assert!((rate - 0.3).abs() < 0.03, "rate {rate}");
    // The same seed replays every coin and choice bit for bit.
    let mut again = Sampler::new(&config).unwrap();
    let mut rng = TokenRng::new(config.seed);
    let replay: Vec<(TokenId, u32)> = (0..4000)
        .map(|_| {
            let choice = again.select(&logits, &[], rng.next_uniform()).unwrap();
            (choice.token, choice.policy_prob.to_bits())
        })
        .collect();
    assert_eq!(outcomes, replay);
}

#[test]
fn xtc_without_a_draw_is_the_mixture_of_its_two_outcomes() {
    let logits = [2.0f32, 1.5, 1.0, -1.0, 0.5];
    let p = 0.4;
    let policy = |probability: f32| {
        let config = SamplingConfig {
            xtc_probability: Some(probability),
            xtc_threshold: Some(0.15),
            ..SamplingConfig::default()
        };
        Sampler::new(&config)
            .unwrap()
            .policy(&logits, &[])
            .unwrap()
            .to_vec()
    };
    let fired = policy(1.0);
    let plain = Sampler::new(&SamplingConfig::default())
        .unwrap()
        .policy(&logits, &[])
        .unwrap()
        .to_vec();
    // q = (0.445, 0.270, 0.164, 0.022, 0.099): tokens 0, 1 and 2 pass 0.15,
    // and only token 2, the least probable of them, stays when XTC fires.
    assert_eq!(fired[0], 0.0);
    assert_eq!(fired[1], 0.0);
    assert!(fired[2] > 0.0);
    let mixture = policy(p);
    for (i, ((&m, &f), &q)) in mixture.iter().zip(&fired).zip(&plain).enumerate() {
        let expected = f64::from(p) * f64::from(f) + (1.0 - f64::from(p)) * f64::from(q);
        assert!(
            (f64::from(m) - expected).abs() < 1e-6,
            "token {i}: {m} vs {expected}"
        );
    }
}

prop_compose! {
    /// One new stage (or top-k, top-p, min-p), with min_keep and a temperature.
    fn one_stage()(
        which in 0usize..6,
        value in 0.0f32..=1.0,
        min_keep in prop::option::of(0usize..12),
        temperature in 0.5f32..3.0,
    ) -> SamplingConfig {
        let base = SamplingConfig { temperature, min_keep, ..SamplingConfig::default() };
        match which {
            0 => SamplingConfig { typical_p: Some(value.max(0.01)), ..base },
            1 => SamplingConfig { top_n_sigma: Some((value * 3.0).max(0.01)), ..base },
            2 => SamplingConfig { xtc_probability: Some(1.0), xtc_threshold: Some(value * 0.5), ..base },
            3 => SamplingConfig { xtc_probability: Some(value), xtc_threshold: Some(0.1), ..base },
            4 => SamplingConfig { top_p: Some(value.max(0.01)), ..base },
            _ => SamplingConfig { min_p: Some(value), top_k: Some(3), ..base },
        }
    }
}

proptest! {
    #[test]
    fn every_stage_keeps_min_keep_tokens_never_a_banned_one_and_sums_to_one(
        row in masked_row(120),
        config in one_stage(),
        u in 0.0f64..1.0,
    ) {
        let n_in_play = row.iter().filter(|z| z.is_finite()).count();
        let min_keep = config.min_keep.unwrap_or(0).max(1).min(n_in_play);
        let mut sampler = Sampler::new(&config).unwrap();
        // Without a draw (the distribution), then with one (a step).
        let policy = sampler.policy(&row, &[]).unwrap().to_vec();
        let choice = sampler.select(&row, &[], u).unwrap();
        let step = sampler.policy_probs().to_vec();
        for probs in [&policy, &step] {
            prop_assert!(probs.iter().all(|p| p.is_finite() && *p >= 0.0));
            let sum: f64 = probs.iter().map(|&p| f64::from(p)).sum();
            prop_assert!((sum - 1.0).abs() <= 1e-5, "sum {}", sum);
            for (z, p) in row.iter().zip(probs.iter()) {
                prop_assert!(z.is_finite() || *p == 0.0, "a banned token has {}", p);
            }
            let n_kept = probs.iter().filter(|&&p| p > 0.0).count();
            // top-k keeps max(k, min_keep) in our chain, so the bound holds too.
            prop_assert!(n_kept >= min_keep, "{} kept, min_keep {}", n_kept, min_keep);
        }
        prop_assert!(row[choice.token as usize].is_finite());
        prop_assert!(step[choice.token as usize] > 0.0);
    }

    #[test]
    fn a_stage_on_candidates_keeps_min_keep(
        row in masked_row(120),
        config in one_stage(),
    ) {
        // The bare stages through Candidates, as a custom chain would run them.
        let n_in_play = row.iter().filter(|z| z.is_finite()).count();
        let min_keep = config.min_keep.unwrap_or(0);
        let stages: Vec<Box<dyn CandidateFilter>> = vec![
            Box::new(Typical::new(config.typical_p.unwrap_or(0.5)).unwrap()),
            Box::new(TopNSigma::new(config.top_n_sigma.unwrap_or(1.0)).unwrap()),
            Box::new(Xtc::new(1.0, config.xtc_threshold.unwrap_or(0.0)).unwrap()),
            Box::new(TopP::new(config.top_p.unwrap_or(0.01)).unwrap()),
            Box::new(MinP::new(config.min_p.unwrap_or(1.0)).unwrap()),
        ];
        for stage in stages {
            let mut candidates = Candidates::from_logits(&row, config.temperature)
                .unwrap()
                .with_min_keep(min_keep);
            stage.apply(&mut candidates);
            let n = candidates.len();
            prop_assert!(n >= min_keep.max(1).min(n_in_play), "{:?} kept {}", stage, n);
            prop_assert!(candidates.ids().all(|id| row[id as usize].is_finite()));
            let total = candidates.total_weight();
            prop_assert!(total > 0.0 && total.is_finite(), "{:?}: total {}", stage, total);
        }
    }
}
