//! Mirostat v1 and v2, and dynamic temperature, against llama.cpp's samplers
//! (`fixtures/samplers/mirostat.json`, written by
//! `scripts/reference/mirostat_reference.py` with llama-cpp-python 0.3.36),
//! and their invariants over random rows.
//!
//! Mirostat: each run replays llama.cpp's chain (temperature, then
//! mirostat) over 24 rows of one sequence (seeded rows of 3 to 500 entries
//! with ties and -inf entries, and SmolLM2's 49,152-entry row perturbed per
//! step). Every step truncates at llama.cpp's bound of that step (so one
//! explained difference does not carry over), compares the kept set, then
//! forces llama.cpp's token and checks the next bound. The kept set must be
//! llama.cpp's exactly, with stated exceptions:
//!
//! - tokens of equal logit are interchangeable (llama.cpp's sort is
//!   unstable; lm-decode keeps the lower id);
//! - v2: a surprise within [`SURPRISE_SLACK`] bits of the bound may go either
//!   way (llama.cpp sums its normaliser in f32);
//! - v1: a `k` within [`K_SLACK`] (relative) of an integer may round either
//!   way (llama.cpp estimates it in f32), and where `k` does not fit an
//!   `int` llama.cpp keeps one token (an undefined conversion: `INT_MIN` on
//!   x86), lm-decode all of them.
//!
//! Dynamic temperature: the temperature within 1e-6 of the formula in f64,
//! and within llama.cpp's: its normalised entropy (read back from its
//! temperature) within [`ENTROPY_SLACK`] of ours, [`ENTROPY_SLACK_LONG`] on
//! SmolLM2's row (llama.cpp sums the entropy in f32); then the
//! probabilities at llama.cpp's temperature within [`PROB_TOLERANCE`]
//! relative of llama.cpp's. (At our own temperature they may differ more:
//! a relative error e in T moves p_i by about e |ln(p_i / p_max)|.)

use crate::common::{logit_bits, logits_of, masked_row, read_f32le, read_json, softmax_over};
use lm_core::TokenId;
use lm_decode::sampler::{Candidates, DynamicTemperature, Mirostat};
use proptest::prelude::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Relative tolerance on a probability, a temperature, or the chosen
/// token's probability against llama.cpp's f32 one.
const PROB_TOLERANCE: f64 = 1e-5;

/// How far (relative) llama.cpp's normalised entropy may be from the exact
/// one: it sums `-p ln p` in f32, one term after another.
const ENTROPY_SLACK: f64 = 1e-5;

/// The same over SmolLM2's 49,152 tokens, where that f32 sum is 6.5e-5
/// (relative) off at T = 1.
const ENTROPY_SLACK_LONG: f64 = 3e-4;

/// How close (in bits) to the bound a v2 surprise may be and still fall on
/// the other side in llama.cpp, whose probabilities come from an f32 sum
/// (1.1e-4 relative off on SmolLM2's row: 1.6e-4 bits).
const SURPRISE_SLACK: f64 = 1e-3;

/// How close (relative) v1's `k` may be to an integer and still round the
/// other way in llama.cpp's f32 estimate.
const K_SLACK: f64 = 1e-3;

/// How far (relative) llama.cpp's probability of the chosen token may be
/// from the exact one: its normaliser is an f32 sum, one term after
/// another (2.2e-4 low over SmolLM2's 49,152 tokens at T = 1.3).
const LLAMA_P_SLACK: f64 = 5e-4;

/// Tolerance (relative, at least absolute) on llama.cpp's bound after a
/// step: its surprise is off by up to `log2(1 + LLAMA_P_SLACK)` = 7.2e-4
/// bits, times eta (at most 0.5 here), plus f32 rounding.
const MU_TOLERANCE: f64 = 5e-4;

/// The fixture, SmolLM2's row, and every mirostat sequence by name.
fn load() -> (Value, Vec<f32>, BTreeMap<String, Vec<Vec<f32>>>) {
    let fixture = read_json("fixtures/samplers/mirostat.json");
    let row = read_f32le(fixture["row"]["file"].as_str().unwrap());
    assert_eq!(row.len(), fixture["row"]["len"].as_u64().unwrap() as usize);
    let mut sequences = BTreeMap::new();
    for sequence in fixture["sequences"].as_array().unwrap() {
        let rows = sequence["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(logits_of)
            .collect();
        sequences.insert(sequence["name"].as_str().unwrap().to_owned(), rows);
    }
    let n_steps = fixture["runs"][0]["steps"].as_array().unwrap().len();
    let perturbation = &fixture["perturbation"];
    let rows = (0..n_steps)
        .map(|step| perturbed(&row, step, perturbation))
        .collect();
    sequences.insert("smollm2_perturbed".to_owned(), rows);
    (fixture, row, sequences)
}

/// SmolLM2's row at `step`: `z_i + a (h - 0.5)` with
/// `h = ((i mul + (step + 1) step_mul) mod 2^32) / 2^32`, in f64, to f32.
fn perturbed(row: &[f32], step: usize, perturbation: &Value) -> Vec<f32> {
    let amplitude = perturbation["amplitude"].as_f64().unwrap();
    let mul = perturbation["mul"].as_u64().unwrap();
    let step_mul = perturbation["step_mul"].as_u64().unwrap();
    row.iter()
        .enumerate()
        .map(|(i, &z)| {
            let h = ((i as u64 * mul + (step as u64 + 1) * step_mul) % (1 << 32)) as f64
                / (1u64 << 32) as f64;
            (f64::from(z) + amplitude * (h - 0.5)) as f32
        })
        .collect()
}

/// The finite ids, best first (higher logit, then lower id).
fn ranked(logits: &[f32]) -> Vec<TokenId> {
    let mut ids: Vec<TokenId> = (0..logits.len() as TokenId)
        .filter(|&id| logits[id as usize].is_finite())
        .collect();
    ids.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    ids
}

/// v1's `k` by brute force in f64 (every finite logit sorted), and whether
/// llama.cpp's f32 `k` overflows an `int`.
fn v1_k(logits: &[f32], t: f64, mu: f32, vocab_size: usize) -> (f64, bool) {
    let ids = ranked(logits);
    let top = &ids[..ids.len().min(100)];
    let (mut tb, mut tt) = (0.0, 0.0);
    for i in 0..top.len().saturating_sub(1) {
        let t_i = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b_i = (f64::from(logits[top[i] as usize]) - f64::from(logits[top[i + 1] as usize])) / t;
        tb += t_i * b_i;
        tt += t_i * t_i;
    }
    let s = tb / tt;
    let k = ((s - 1.0) * f64::from(mu).exp2() / (1.0 - (vocab_size as f64).powf(1.0 - s)))
        .powf(1.0 / s);
    let (s32, n32) = (s as f32, vocab_size as f32);
    let k32 = ((s32 - 1.0) * 2f32.powf(mu) / (1.0 - n32.powf(1.0 - s32))).powf(1.0 / s32);
    (k, k32 >= 2f32.powi(31))
}

/// Why our kept count may differ from llama.cpp's at this step, or `None`.
fn explained(
    version: u64,
    logits: &[f32],
    t: f64,
    mu: f32,
    vocab_size: usize,
    ours: usize,
    theirs: usize,
) -> Option<&'static str> {
    let ids = ranked(logits);
    if version == 2 {
        let q = softmax_over(logits, &ids, t);
        let (lo, hi) = (ours.min(theirs), ours.max(theirs));
        // Every token in the disputed band is within the slack of the bound.
        let near = (lo..hi).all(|i| (-q[i].log2() - f64::from(mu)).abs() <= SURPRISE_SLACK);
        return near.then_some("surprise at the bound");
    }
    let (k, overflows) = v1_k(logits, t, mu, vocab_size);
    if theirs == 1 && overflows {
        return Some("k overflows llama.cpp's int");
    }
    if (k - k.round()).abs() <= K_SLACK * k.abs().max(1.0) && ours.abs_diff(theirs) <= 1 {
        return Some("k at an integer");
    }
    None
}

#[test]
fn mirostat_keeps_what_llama_cpp_keeps_step_by_step() {
    let (fixture, _, sequences) = load();
    let runs = fixture["runs"].as_array().unwrap();
    let (mut n_steps, mut explanations, mut unexplained) = (0, Vec::new(), Vec::new());
    let mut n_mu_checked = 0;
    for run in runs {
        let version = run["version"].as_u64().unwrap();
        let tau = run["tau"].as_f64().unwrap() as f32;
        let eta = run["eta"].as_f64().unwrap() as f32;
        let t = run["temperature"].as_f64().unwrap() as f32;
        let vocab_size = run["vocab_size"].as_u64().unwrap() as usize;
        let name = run["sequence"].as_str().unwrap();
        let rows = &sequences[name];
        let mirostat = Mirostat::new(version as u8, tau, eta).unwrap().unwrap();
        let steps = run["steps"].as_array().unwrap();
        assert_eq!(
            mirostat.initial_mu(),
            steps[0]["mu"].as_f64().unwrap() as f32
        );
        for (index, step) in steps.iter().enumerate() {
            let what = format!("v{version} tau {tau} eta {eta} T {t} on {name}, step {index}");
            let logits = &rows[index];
            let mu = step["mu"].as_f64().unwrap() as f32;
            let mut candidates = Candidates::from_logits(logits, t).unwrap();
            mirostat.truncate(&mut candidates, mu, vocab_size);
            let ours: BTreeSet<TokenId> = candidates.ids().collect();
            let n_kept = step["n_kept"].as_u64().unwrap() as usize;
            // llama.cpp keeps the n_kept best (the script checks it).
            let theirs: BTreeSet<TokenId> = match step["kept"].as_array() {
                Some(ids) => ids
                    .iter()
                    .map(|id| id.as_u64().unwrap() as TokenId)
                    .collect(),
                None => ranked(logits)[..n_kept].iter().copied().collect(),
            };
            n_steps += 1;
            if ours.len() != theirs.len() {
                let f64_t = f64::from(t);
                match explained(version, logits, f64_t, mu, vocab_size, ours.len(), n_kept) {
                    Some(why) => explanations.push(format!("{what}: {why}")),
                    None => unexplained.push(format!(
                        "{what}: we keep {}, llama.cpp {n_kept}",
                        ours.len()
                    )),
                }
                continue;
            }
            if ours != theirs {
                if logit_bits(logits, &ours) == logit_bits(logits, &theirs) {
                    explanations.push(format!("{what}: tie"));
                } else {
                    unexplained.push(format!("{what}: same count, other tokens"));
                }
            }
            // llama.cpp's token, its probability over what we kept (against
            // the exact f64 one, and llama.cpp's f32 one), the bound.
            let selected = step["selected"].as_u64().unwrap() as TokenId;
            let Some(&(_, z)) = candidates.entries().iter().find(|e| e.0 == selected) else {
                continue;
            };
            let p = (candidates.weight(z) / candidates.total_weight()) as f32;
            let kept: Vec<TokenId> = ours.iter().copied().collect();
            let exact =
                softmax_over(logits, &kept, f64::from(t))[kept.binary_search(&selected).unwrap()];
            let error = (f64::from(p) - exact).abs();
            assert!(
                error <= PROB_TOLERANCE * exact,
                "{what}: p {p}, exactly {exact}"
            );
            let p_theirs = step["p_selected"].as_f64().unwrap();
            let error = (f64::from(p) - p_theirs).abs();
            assert!(
                error <= LLAMA_P_SLACK * p_theirs,
                "{what}: p {p}, llama.cpp {p_theirs}"
            );
            let ours_next = f64::from(mirostat.next_mu(mu, p));
            let exact_next = f64::from(mu) - f64::from(eta) * (-exact.log2() - f64::from(tau));
            let error = (ours_next - exact_next).abs();
            assert!(
                error <= 1e-5 * exact_next.abs().max(1.0),
                "{what}: mu {ours_next}, exactly {exact_next}"
            );
            let next = steps
                .get(index + 1)
                .map_or(&run["mu_end"], |next| &next["mu"])
                .as_f64()
                .unwrap();
            let error = (ours_next - next).abs();
            assert!(
                error <= MU_TOLERANCE * next.abs().max(1.0),
                "{what}: mu {ours_next}, llama.cpp {next}"
            );
            n_mu_checked += 1;
        }
    }
    assert!(unexplained.is_empty(), "{unexplained:#?}");
    eprintln!(
        "{} runs, {n_steps} steps, {n_mu_checked} bounds checked; explained: {explanations:#?}",
        runs.len()
    );
    assert!(runs.len() >= 40 && n_steps >= 40 * 20, "{n_steps} steps");
    assert!(explanations.len() * 10 <= n_steps, "{explanations:#?}");
    assert!(
        n_mu_checked * 10 >= n_steps * 9,
        "{n_mu_checked} of {n_steps}"
    );
}

/// The normalised entropy `H / ln n` of the finite logits at T = 1, by
/// brute force: `-sum q ln q` over the f64 softmax.
fn normalised_entropy(logits: &[f32]) -> f64 {
    let ids = ranked(logits);
    let q = softmax_over(logits, &ids, 1.0);
    let h: f64 = q.iter().filter(|&&q| q > 0.0).map(|&q| -q * q.ln()).sum();
    h / (ids.len() as f64).ln()
}

#[test]
fn dynamic_temperature_gives_llama_cpp_s_temperature_and_probabilities() {
    let (fixture, row, _) = load();
    let mut vectors: BTreeMap<String, Vec<f32>> = fixture["dynatemp_vectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                logits_of(&v["logits"]),
            )
        })
        .collect();
    vectors.insert("smollm2_chat_capital_of_france".to_owned(), row);
    let cases = fixture["dynatemp"].as_array().unwrap();
    let mut n_probs = 0;
    for case in cases {
        let name = case["vector"].as_str().unwrap();
        let logits = &vectors[name];
        let number = |key: &str| case[key].as_f64().unwrap() as f32;
        let (t, range, exponent) = (number("temperature"), number("range"), number("exponent"));
        let what = format!("T {t} range {range} exponent {exponent} on {name}");
        let mut candidates = Candidates::from_logits(logits, 1.0).unwrap();
        let ours = DynamicTemperature::new(range, exponent)
            .unwrap()
            .temperature(t, &mut candidates);
        // Ours against the formula in f64.
        let (lo, hi) = (f64::from((t - range).max(0.0)), f64::from(t + range));
        let h = normalised_entropy(logits);
        let exact = if range == 0.0 || candidates.len() == 1 {
            f64::from(t)
        } else {
            lo + (hi - lo) * h.powf(f64::from(exponent))
        };
        let error = (f64::from(ours) - exact).abs();
        assert!(
            error <= 1e-6 * exact + 1e-9,
            "{what}: T {ours}, exactly {exact}"
        );
        let Some(theirs) = case["dynamic_temperature"].as_f64() else {
            // One candidate: llama.cpp leaves it alone; it has probability 1.
            assert_eq!(candidates.len(), 1, "{what}");
            continue;
        };
        // Ours against llama.cpp's, through the normalised entropy it used.
        if range > 0.0 && exponent > 0.0 && hi > lo {
            let h_theirs = ((theirs - lo) / (hi - lo))
                .max(0.0)
                .powf(1.0 / f64::from(exponent));
            let slack = if candidates.len() > 1000 {
                ENTROPY_SLACK_LONG
            } else {
                ENTROPY_SLACK
            };
            let error = (h - h_theirs).abs();
            assert!(
                error <= slack * h.max(1e-3),
                "{what}: H / ln n {h}, llama.cpp's {h_theirs}"
            );
        } else {
            let error = (f64::from(ours) - theirs).abs();
            assert!(
                error <= 1e-6 * theirs,
                "{what}: T {ours}, llama.cpp {theirs}"
            );
        }
        // The probabilities at llama.cpp's temperature, against its own.
        let pairs = case["probs"].as_array().or(case["top"].as_array()).unwrap();
        let mut at_t = Candidates::from_logits(logits, theirs as f32).unwrap();
        let total = at_t.total_weight();
        let by_id: BTreeMap<TokenId, f32> = at_t.entries().iter().copied().collect();
        for pair in pairs {
            let id = pair[0].as_u64().unwrap() as TokenId;
            let expected = pair[1].as_f64().unwrap();
            let p = at_t.weight(by_id[&id]) / total;
            let error = (p - expected).abs();
            assert!(
                error <= PROB_TOLERANCE * expected + 1e-12,
                "{what}: token {id} has {p}, llama.cpp {expected}"
            );
            n_probs += 1;
        }
    }
    assert!(
        cases.len() >= 40 && n_probs >= 1000,
        "{} cases, {n_probs} probabilities",
        cases.len()
    );
}

#[test]
fn the_settings_are_checked() {
    use lm_decode::Error;
    assert_eq!(Mirostat::new(0, 5.0, 0.1), Ok(None));
    assert_eq!(
        Mirostat::new(3, 5.0, 0.1),
        Err(Error::InvalidMirostat { value: 3 })
    );
    assert_eq!(
        Mirostat::new(0, -1.0, 0.1),
        Err(Error::InvalidMirostatTau { value: -1.0 })
    );
    assert!(matches!(
        Mirostat::new(2, 5.0, f32::NAN),
        Err(Error::InvalidMirostatEta { .. })
    ));
    assert_eq!(
        Mirostat::new(1, 5.0, f32::INFINITY),
        Err(Error::InvalidMirostatEta {
            value: f32::INFINITY
        })
    );
    let v1 = Mirostat::new(1, 5.0, 0.1).unwrap().unwrap();
    assert_eq!((v1.version(), v1.initial_mu()), (1, 10.0));
    assert_eq!(
        DynamicTemperature::new(-0.5, 1.0),
        Err(Error::InvalidDynatempRange { value: -0.5 })
    );
    assert!(matches!(
        DynamicTemperature::new(0.5, f32::NAN),
        Err(Error::InvalidDynatempExponent { .. })
    ));
}

proptest! {
    #[test]
    fn mirostat_keeps_the_best_tokens_at_least_one_and_its_bound_stays_a_number(
        row in masked_row(300),
        version in 1u8..=2,
        tau in 0.0f32..10.0,
        eta in 0.0f32..1.0,
        mu in -5.0f32..60.0,
        t in prop_oneof![Just(0.0f32), 0.2f32..3.0, Just(f32::INFINITY)],
        min_keep in 0usize..8,
        extra_vocab in 0usize..50_000,
    ) {
        let mirostat = Mirostat::new(version, tau, eta).unwrap().unwrap();
        let n_in_play = row.iter().filter(|z| z.is_finite()).count();
        let mut candidates = Candidates::from_logits(&row, t).unwrap().with_min_keep(min_keep);
        mirostat.truncate(&mut candidates, mu, row.len() + extra_vocab);
        let n = candidates.len();
        prop_assert!(n >= min_keep.max(1).min(n_in_play), "{} kept", n);
        // What is kept is the n best: no dropped logit above a kept one.
        let kept: BTreeSet<TokenId> = candidates.ids().collect();
        let lowest = kept.iter().map(|&id| row[id as usize]).fold(f32::INFINITY, f32::min);
        prop_assert!(lowest.is_finite());
        for (id, &z) in row.iter().enumerate() {
            prop_assert!(kept.contains(&(id as TokenId)) || z <= lowest);
        }
        let total = candidates.total_weight();
        prop_assert!(total > 0.0 && total.is_finite());
        for &(_, z) in candidates.entries() {
            let p = (candidates.weight(z) / total) as f32;
            let next = mirostat.next_mu(mu, p);
            // A token of weight 0 (greedy ties aside) has infinite surprise.
            prop_assert!(!next.is_nan(), "mu {} from p {}", next, p);
            prop_assert!(p == 0.0 || next.is_finite());
        }
    }

    #[test]
    fn dynamic_temperature_stays_within_its_range(
        row in masked_row(300),
        t in 0.0f32..3.0,
        range in 0.0f32..3.0,
        exponent in 0.0f32..4.0,
    ) {
        let mut candidates = Candidates::from_logits(&row, 1.0).unwrap();
        let dynamic = DynamicTemperature::new(range, exponent).unwrap().temperature(t, &mut candidates);
        prop_assert!(dynamic >= (t - range).max(0.0) && dynamic <= t + range, "{}", dynamic);
    }
}
