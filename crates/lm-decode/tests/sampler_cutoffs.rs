//! The epsilon and eta cutoffs and `no_repeat_ngram_size` against
//! brute-force f64 versions of HF transformers' `EpsilonLogitsWarper`,
//! `EtaLogitsWarper` and `NoRepeatNGramLogitsProcessor`, written here from
//! their definitions, and their invariants over random rows.
//!
//! The cutoffs run on the 20 small vectors of `fixtures/samplers/samplers.json`
//! (ties, -inf entries) and SmolLM2's 49,152-entry row (plain and with every
//! fifth id masked), at epsilon 3e-4, 1e-3, 0.01 and 0.1, `min_keep` 1 and 3,
//! T = 1 and 0.7. HF's rule, at the temperature's scores `s = z / T`:
//!
//! ```text
//! q = softmax(s);  cutoff = epsilon, or min(epsilon, sqrt(epsilon) exp(-H(q)))
//! remove i  when  q_i < cutoff  and  s_i < the min_keep-th largest score
//! ```
//!
//! The kept set must be HF's exactly: the guard keeps every token tied with
//! the `min_keep`-th best, whatever the ids, so no tie rule is needed. The
//! one stated exception is a probability within [`CUTOFF_SLACK`] (relative)
//! of the cutoff, which may fall either way (HF and lm-decode compare in f32,
//! the brute force in f64): on `geometric`, whose fourth probability is 0.1
//! to f32 precision, both HF's f32 softmax (checked with numpy) and lm-decode
//! keep that token at epsilon 0.1, while in f64 it is 1e-9 short. The kept tokens' probabilities, renormalised,
//! must be within [`PROB_TOLERANCE`] relative of the exact f64 softmax over
//! the kept set.

use crate::common::{kept_sets, probabilities_by_id, softmax_over};
use lm_core::TokenId;
use lm_decode::sampler::{
    CandidateFilter, Candidates, EpsilonCutoff, EtaCutoff, History, LogitTransform, NoRepeatNgram,
    TokenCounts,
};
use lm_decode::{Sampler, SamplingConfig};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Relative tolerance on a kept token's renormalised probability: our
/// weights are f32 (`lm_core::softmax_weight`), the reference f64.
const PROB_TOLERANCE: f64 = 1e-5;

/// How close (relative) to the cutoff a probability may be and still fall on
/// the other side: our probabilities come from f32 weights and are compared
/// at f32 precision.
const CUTOFF_SLACK: f64 = 1e-5;

const CUTOFFS: [f32; 4] = [3e-4, 1e-3, 0.01, 0.1];
const MIN_KEEPS: [usize; 2] = [1, 3];
const TEMPERATURES: [f32; 2] = [1.0, 0.7];

/// Every vector of the sampler fixture by name, SmolLM2's row and its
/// masked copy included.
fn vectors() -> BTreeMap<String, Vec<f32>> {
    crate::common::sampler_vectors().1
}

/// SmolLM2's row's name in the fixture.
const SMOLLM2: &str = "smollm2_chat_capital_of_france";

#[derive(Debug, Clone, Copy)]
enum Rule {
    Epsilon(f32),
    Eta(f32),
}

impl Rule {
    fn filter(self) -> Box<dyn CandidateFilter> {
        match self {
            Self::Epsilon(e) => Box::new(EpsilonCutoff::new(e).unwrap()),
            Self::Eta(e) => Box::new(EtaCutoff::new(e).unwrap()),
        }
    }
}

/// HF's warper in f64: the ids it keeps, the cutoff, and q over the row.
struct Reference {
    kept: BTreeSet<TokenId>,
    cutoff: f64,
    q: Vec<f64>,
}

/// The brute force: scores `z / T`, their softmax and entropy in f64, a full
/// sort for the guard's score, and HF's two comparisons.
fn hf_reference(logits: &[f32], t: f32, rule: Rule, min_keep: usize) -> Reference {
    let scores: Vec<f64> = logits
        .iter()
        .map(|&z| f64::from(z) / f64::from(t))
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    let q: Vec<f64> = exps.iter().map(|e| e / total).collect();
    let cutoff = match rule {
        Rule::Epsilon(e) => f64::from(e),
        Rule::Eta(e) => {
            let entropy: f64 = -q
                .iter()
                .filter(|&&p| p > 0.0)
                .map(|&p| p * p.ln())
                .sum::<f64>();
            let e = f64::from(e);
            e.min(e.sqrt() * (-entropy).exp())
        }
    };
    let mut sorted = scores.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    // HF's k is over the whole row, -inf entries included.
    let kth = sorted[min_keep.min(sorted.len()) - 1];
    let kept = (0..logits.len())
        .filter(|&i| scores[i] > f64::NEG_INFINITY)
        .filter(|&i| !(q[i] < cutoff && scores[i] < kth))
        .map(|i| i as TokenId)
        .collect();
    Reference { kept, cutoff, q }
}

/// Runs one case; `Ok(None)` when the sets agree, `Ok(Some(why))` for an
/// explained difference, `Err` for a failure.
fn check_case(
    what: &str,
    logits: &[f32],
    t: f32,
    rule: Rule,
    min_keep: usize,
) -> Result<Option<String>, String> {
    let reference = hf_reference(logits, t, rule, min_keep);
    let mut candidates = Candidates::from_logits(logits, t)
        .unwrap()
        .with_min_keep(min_keep);
    rule.filter().apply(&mut candidates);
    let ours: BTreeSet<TokenId> = candidates.ids().collect();
    let mut explained = None;
    if ours != reference.kept {
        let near = ours.symmetric_difference(&reference.kept).all(|&id| {
            (reference.q[id as usize] - reference.cutoff).abs() <= CUTOFF_SLACK * reference.cutoff
        });
        if !near {
            return Err(format!(
                "{what}: we keep {}, HF {}; only ours: {:?}, only HF's: {:?}",
                ours.len(),
                reference.kept.len(),
                ours.difference(&reference.kept)
                    .take(10)
                    .collect::<Vec<_>>(),
                reference
                    .kept
                    .difference(&ours)
                    .take(10)
                    .collect::<Vec<_>>()
            ));
        }
        explained = Some(format!("{what}: a probability at the cutoff"));
    }
    let expected = softmax_over(logits, &ours, f64::from(t));
    let ours_probs = probabilities_by_id(&mut candidates);
    for (&(id, p), &expected) in ours_probs.iter().zip(&expected) {
        // A probability below f32's range is 0 in f32 (in HF's too).
        let underflow = f64::from(f32::MIN_POSITIVE);
        let close = (p - expected).abs() <= PROB_TOLERANCE * expected;
        let both_underflow = expected < underflow && p < underflow;
        if !close && !both_underflow {
            return Err(format!("{what}: token {id} has {p}, expected {expected}"));
        }
    }
    // The chain with the filter pushed gives the same set, summing to 1.
    let config = SamplingConfig {
        temperature: t,
        min_keep: Some(min_keep),
        ..SamplingConfig::default()
    };
    let mut sampler = Sampler::new(&config).unwrap();
    sampler.push_filter(rule.filter());
    let policy = sampler.policy(logits, &[]).unwrap();
    let (from_chain, positive) = kept_sets(policy, &ours_probs);
    let sum: f64 = policy.iter().map(|&p| f64::from(p)).sum();
    if from_chain != positive || (sum - 1.0).abs() > 1e-5 {
        return Err(format!(
            "{what}: the chain keeps {} (sum {sum})",
            from_chain.len()
        ));
    }
    Ok(explained)
}

#[test]
fn the_cutoffs_keep_what_hf_keeps() {
    let vectors = vectors();
    assert_eq!(vectors.len(), 22);
    let (mut n_cases, mut n_cut, mut n_guarded) = (0, 0, 0);
    let mut explained = Vec::new();
    let mut failures = Vec::new();
    for (name, logits) in &vectors {
        let n_in_play = logits.iter().filter(|z| z.is_finite()).count();
        for value in CUTOFFS {
            for rule in [Rule::Epsilon(value), Rule::Eta(value)] {
                for min_keep in MIN_KEEPS {
                    for t in TEMPERATURES {
                        let what = format!("{rule:?} min_keep {min_keep} T {t} on {name}");
                        match check_case(&what, logits, t, rule, min_keep) {
                            Ok(Some(why)) => explained.push(why),
                            Ok(None) => {}
                            Err(failure) => failures.push(failure),
                        }
                        // How many cases cut something, and how many the
                        // guard decides (the cutoff alone keeps too few).
                        let reference = hf_reference(logits, t, rule, min_keep);
                        n_cut += usize::from(reference.kept.len() < n_in_play);
                        let n_above = reference
                            .q
                            .iter()
                            .filter(|&&q| q >= reference.cutoff)
                            .count();
                        n_guarded += usize::from(n_above < min_keep.min(n_in_play));
                        n_cases += 1;
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    eprintln!(
        "{n_cases} cases, {n_cut} cut something, {n_guarded} kept by the guard; explained: {explained:#?}"
    );
    assert_eq!(n_cases, 22 * 4 * 2 * 2 * 2);
    assert!(n_cut * 2 >= n_cases, "{n_cut} of {n_cases} cut something");
    assert!(n_guarded >= 20, "{n_guarded} cases test the guard");
    assert!(explained.len() * 50 <= n_cases, "{explained:#?}");
}

#[test]
fn on_smollm2_the_cutoffs_keep_the_plausible_head() {
    // 'The capital of France is' ... : the row is peaked, so at epsilon
    // 3e-4 a few dozen tokens of 49,152 stay, and eta, whose cutoff falls
    // with the entropy, keeps at least as many.
    let row = &vectors()[SMOLLM2];
    let kept = |filter: Box<dyn CandidateFilter>| {
        let mut candidates = Candidates::from_logits(row, 1.0).unwrap();
        filter.apply(&mut candidates);
        candidates.len()
    };
    let epsilon = kept(Box::new(EpsilonCutoff::new(3e-4).unwrap()));
    let eta = kept(Box::new(EtaCutoff::new(3e-4).unwrap()));
    let reference = hf_reference(row, 1.0, Rule::Epsilon(3e-4), 1).kept.len();
    assert_eq!(epsilon, reference);
    assert!((2..2000).contains(&epsilon), "{epsilon}");
    assert!(eta >= epsilon, "eta {eta}, epsilon {epsilon}");
}

#[test]
fn the_cutoffs_at_the_temperature_limits() {
    let logits = [1.0f32, 3.0, 3.0, 0.5, -2.0];
    let kept = |filter: &dyn CandidateFilter, t: f32| {
        let mut candidates = Candidates::from_logits(&logits, t).unwrap();
        filter.apply(&mut candidates);
        let mut ids: Vec<TokenId> = candidates.ids().collect();
        ids.sort_unstable();
        ids
    };
    for filter in [Rule::Epsilon(0.1).filter(), Rule::Eta(0.1).filter()] {
        // T = 0: the two best share all the mass (H = ln 2, no NaN).
        assert_eq!(kept(filter.as_ref(), 0.0), vec![1, 2], "{filter:?}");
        // T = +inf: uniform, 0.2 each, above 0.1 and above eta = 0.063.
        assert_eq!(kept(filter.as_ref(), f32::INFINITY).len(), 5, "{filter:?}");
    }
}

#[test]
fn out_of_range_settings_are_refused() {
    use lm_decode::Error;
    for value in [0.0, 1.0, -0.1, 1.5, f32::NAN] {
        assert!(matches!(
            EpsilonCutoff::new(value),
            Err(Error::InvalidEpsilonCutoff { .. })
        ));
        assert!(matches!(
            EtaCutoff::new(value),
            Err(Error::InvalidEtaCutoff { .. })
        ));
    }
    assert_eq!(
        NoRepeatNgram::new(0),
        Err(Error::InvalidNoRepeatNgramSize { value: 0 })
    );
    assert_eq!(NoRepeatNgram::new(1).unwrap().n(), 1);
}

/// The brute force: every n-gram of `tokens` in a set, then each id that
/// would complete the history's last n - 1 tokens into one of them (HF bans
/// nothing while the history is shorter than n - 1).
fn banned_by_set(tokens: &[TokenId], n: usize, vocab_size: usize) -> BTreeSet<TokenId> {
    if tokens.len() + 1 < n {
        return BTreeSet::new();
    }
    let ngrams: HashSet<&[TokenId]> = tokens.windows(n).collect();
    let suffix = &tokens[tokens.len() + 1 - n..];
    (0..vocab_size as TokenId)
        .filter(|&id| {
            let mut ngram = suffix.to_vec();
            ngram.push(id);
            ngrams.contains(ngram.as_slice())
        })
        .collect()
}

/// A row over a small vocabulary with some tokens masked already.
fn small_row(vocab_size: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(
        prop_oneof![5 => -5.0f32..5.0, 1 => Just(f32::NEG_INFINITY)],
        vocab_size,
    )
}

prop_compose! {
    /// A history over a vocabulary of `vocab_size`, short or long, with
    /// many repeats.
    fn history(vocab_size: u32)(
        tokens in prop::collection::vec(0..vocab_size, 0..40),
    ) -> Vec<TokenId> {
        tokens
    }
}

proptest! {
    #[test]
    fn no_repeat_ngram_bans_what_the_set_of_ngrams_bans(
        n in 1usize..=4,
        tokens in history(5),
        row in small_row(5),
    ) {
        let counts = TokenCounts::default();
        let mut logits = row.clone();
        NoRepeatNgram::new(n).unwrap().apply(&mut logits, &History::new(&tokens, &counts));
        let banned = banned_by_set(&tokens, n, row.len());
        for (id, (&before, &after)) in row.iter().zip(&logits).enumerate() {
            if banned.contains(&(id as TokenId)) {
                prop_assert_eq!(after, f32::NEG_INFINITY, "token {} not banned", id);
            } else {
                // Untouched, so a masked token stays masked and no other moves.
                prop_assert_eq!(after.to_bits(), before.to_bits(), "token {} changed", id);
            }
        }
    }

    #[test]
    fn no_repeat_ngram_in_the_chain_gives_banned_tokens_no_probability(
        n in 1usize..=4,
        tokens in history(12),
        row in prop::collection::vec(-5.0f32..5.0, 12),
    ) {
        let banned = banned_by_set(&tokens, n, row.len());
        prop_assume!(banned.len() < row.len());
        let mut sampler = Sampler::new(&SamplingConfig::default()).unwrap();
        sampler.push_transform(Box::new(NoRepeatNgram::new(n).unwrap()));
        let policy = sampler.policy(&row, &tokens).unwrap();
        for (id, &p) in policy.iter().enumerate() {
            prop_assert_eq!(p == 0.0, banned.contains(&(id as TokenId)), "token {}", id);
        }
        let sum: f64 = policy.iter().map(|&p| f64::from(p)).sum();
        prop_assert!((sum - 1.0).abs() <= 1e-5);
    }

    #[test]
    fn the_cutoffs_keep_min_keep_never_nan_never_a_masked_token(
        row in prop::collection::vec(
            prop_oneof![9 => -20.0f32..20.0, 1 => Just(f32::NEG_INFINITY)],
            1..300,
        ).prop_filter("a token in play", |row| row.iter().any(|z| z.is_finite())),
        log_cutoff in -9.0f64..-0.01,
        eta in any::<bool>(),
        min_keep in 0usize..12,
        temperature in 0.5f32..3.0,
    ) {
        let value = log_cutoff.exp() as f32;
        let rule = if eta { Rule::Eta(value) } else { Rule::Epsilon(value) };
        let n_in_play = row.iter().filter(|z| z.is_finite()).count();
        let floor = min_keep.max(1).min(n_in_play);
        // The bare filter.
        let mut candidates = Candidates::from_logits(&row, temperature)
            .unwrap()
            .with_min_keep(min_keep);
        rule.filter().apply(&mut candidates);
        prop_assert!(candidates.len() >= floor, "{:?} kept {}", rule, candidates.len());
        prop_assert!(candidates.ids().all(|id| row[id as usize].is_finite()));
        // The chain: a distribution over the kept tokens.
        let config = SamplingConfig { temperature, min_keep: Some(min_keep), ..SamplingConfig::default() };
        let mut sampler = Sampler::new(&config).unwrap();
        sampler.push_filter(rule.filter());
        let policy = sampler.policy(&row, &[]).unwrap();
        prop_assert!(policy.iter().all(|p| p.is_finite() && *p >= 0.0));
        let sum: f64 = policy.iter().map(|&p| f64::from(p)).sum();
        prop_assert!((sum - 1.0).abs() <= 1e-5, "sum {}", sum);
        for (z, p) in row.iter().zip(policy) {
            prop_assert!(z.is_finite() || *p == 0.0, "a masked token has {}", p);
        }
        prop_assert!(policy.iter().filter(|&&p| p > 0.0).count() >= floor);
    }
}
