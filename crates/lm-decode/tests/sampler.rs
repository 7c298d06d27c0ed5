//! The sampling policy against hand-worked examples and brute force: each
//! transform through a `check(input, expected)` helper with many tiny cases.

use crate::common::rejects;
use lm_decode::sampler::{CandidateFilter, Candidates, TopK, TopP};
use lm_decode::{Error, Sampler, SamplingConfig, Stage, TokenRng};

/// The policy distribution for `logits` after `history`, to `decimals` places.
fn check(
    config: SamplingConfig,
    logits: &[f32],
    history: &[u32],
    expected: &[f64],
    decimals: usize,
) {
    let mut sampler = Sampler::new(&config).unwrap();
    let probs = sampler.policy(logits, history).unwrap();
    let got: Vec<String> = probs.iter().map(|p| format!("{p:.decimals$}")).collect();
    let want: Vec<String> = expected.iter().map(|p| format!("{p:.decimals$}")).collect();
    assert_eq!(got, want, "{config:?} on {logits:?}");
}

fn config() -> SamplingConfig {
    SamplingConfig::default()
}

fn ln(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

#[test]
fn lesson_000_temperature_table() {
    // "A worked example: temperature on three logits".
    let z = [2.0, 1.0, 0.0];
    check(
        SamplingConfig {
            temperature: 0.5,
            ..config()
        },
        &z,
        &[],
        &[0.867, 0.117, 0.016],
        3,
    );
    check(
        SamplingConfig {
            temperature: 1.0,
            ..config()
        },
        &z,
        &[],
        &[0.665, 0.245, 0.090],
        3,
    );
    check(
        SamplingConfig {
            temperature: 2.0,
            ..config()
        },
        &z,
        &[],
        &[0.506, 0.307, 0.186],
        3,
    );
    // Knowledge check question 1 and both limits of question 2.
    check(config(), &[3.0, 1.0, 1.0], &[], &[0.79, 0.11, 0.11], 2);
    check(
        SamplingConfig {
            temperature: f32::INFINITY,
            ..config()
        },
        &z,
        &[],
        &[1.0 / 3.0; 3],
        6,
    );
    check(SamplingConfig::greedy(), &z, &[], &[1.0, 0.0, 0.0], 6);
}

#[test]
fn lesson_001_half_temperature_on_the_first_row() {
    // "At a temperature of 0.5 the first distribution gives dog a share of
    // 0.3202 in place of 0.2334." The lesson's row after <start> the cat is
    // rounded to 4 places, so its squares renormalised give dog 0.3203; to
    // three places both are 0.320. T = 0.5 squares the shares: p^2 / sum p^2.
    let row = ln(&[0.1756, 0.1208, 0.1815, 0.2334, 0.0395, 0.1728, 0.0763]);
    let half = SamplingConfig {
        temperature: 0.5,
        ..config()
    };
    let mut sampler = Sampler::new(&half).unwrap();
    let dog = sampler.policy(&row, &[]).unwrap()[3];
    assert_eq!(format!("{dog:.3}"), "0.320");
    check(
        half,
        &row,
        &[],
        &[0.1813, 0.0858, 0.1937, 0.3203, 0.0092, 0.1756, 0.0342],
        4,
    );
    check(
        config(),
        &row,
        &[],
        &[0.1756, 0.1208, 0.1815, 0.2334, 0.0395, 0.1728, 0.0763],
        4,
    );
}

#[test]
fn lesson_000_inverse_cdf_draws() {
    // p = (0.665, 0.245, 0.090): u = 0.7 passes "red" and lands on "green";
    // "sampling at T = 2 picks blue about one time in five" (u above 0.813).
    let mut sampler = Sampler::new(&config()).unwrap();
    let z = [2.0, 1.0, 0.0];
    assert_eq!(sampler.select(&z, &[], 0.0).unwrap().token, 0);
    assert_eq!(sampler.select(&z, &[], 0.664).unwrap().token, 0);
    assert_eq!(sampler.select(&z, &[], 0.7).unwrap().token, 1);
    assert_eq!(sampler.select(&z, &[], 0.95).unwrap().token, 2);
    let mut hot = Sampler::new(&SamplingConfig {
        temperature: 2.0,
        ..config()
    })
    .unwrap();
    assert_eq!(hot.select(&z, &[], 0.80).unwrap().token, 1);
    assert_eq!(hot.select(&z, &[], 0.82).unwrap().token, 2);
}

#[test]
fn greedy_takes_the_lowest_id_on_ties_and_ignores_u() {
    let mut greedy = Sampler::new(&SamplingConfig::greedy()).unwrap();
    for u in [0.0, 0.3, 0.999] {
        let choice = greedy.select(&[1.0, 3.0, 3.0, -1.0], &[], u).unwrap();
        assert_eq!((choice.token, choice.policy_prob), (1, 1.0));
    }
    // Greedy still applies the raw-logit stage: a ban moves the argmax.
    let mut banned = Sampler::new(&SamplingConfig {
        banned_tokens: vec![1],
        ..SamplingConfig::greedy()
    })
    .unwrap();
    assert_eq!(
        banned
            .select(&[1.0, 3.0, 3.0, -1.0], &[], 0.5)
            .unwrap()
            .token,
        2
    );
}

#[test]
fn top_k_keeps_the_k_best_and_renormalises() {
    let k = |k| SamplingConfig {
        top_k: Some(k),
        ..config()
    };
    // e^3 / (e^3 + e^2) = 0.731059.
    check(
        k(2),
        &[0.0, 3.0, 1.0, 2.0],
        &[],
        &[0.0, 0.731059, 0.0, 0.268941],
        6,
    );
    check(k(1), &[0.0, 3.0, 1.0, 2.0], &[], &[0.0, 1.0, 0.0, 0.0], 6);
    check(k(4), &[0.0, 0.0, 0.0, 0.0], &[], &[0.25; 4], 6);
    check(k(9), &[0.0, 0.0], &[], &[0.5, 0.5], 6);
    // Ties at the boundary: the lower id is kept.
    check(k(2), &[1.0, 1.0, 1.0, 0.0], &[], &[0.5, 0.5, 0.0, 0.0], 6);
    check(k(1), &[0.0, 5.0, 5.0], &[], &[0.0, 1.0, 0.0], 6);
    // Banned tokens are gone before top-k counts.
    check(
        SamplingConfig {
            top_k: Some(1),
            banned_tokens: vec![1],
            ..config()
        },
        &[0.0, 3.0, 1.0, 2.0],
        &[],
        &[0.0, 0.0, 0.0, 1.0],
        6,
    );
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let p = |p| SamplingConfig {
        top_p: Some(p),
        ..config()
    };
    let z = ln(&[0.5, 0.3, 0.2]);
    check(p(0.8), &z, &[], &[0.625, 0.375, 0.0], 6);
    check(p(0.81), &z, &[], &[0.5, 0.3, 0.2], 6);
    check(p(0.5), &z, &[], &[1.0, 0.0, 0.0], 6);
    check(p(0.4), &z, &[], &[1.0, 0.0, 0.0], 6);
    check(p(1e-9), &z, &[], &[1.0, 0.0, 0.0], 6);
    check(p(1.0), &z, &[], &[0.5, 0.3, 0.2], 6);
    // Id order does not matter, only probability order.
    check(p(0.8), &ln(&[0.2, 0.5, 0.3]), &[], &[0.0, 0.625, 0.375], 6);
    // Ties: the lower id first.
    check(p(0.5), &[0.0, 0.0, 0.0, 0.0], &[], &[0.5, 0.5, 0.0, 0.0], 6);
}

#[test]
fn temperature_comes_before_top_p() {
    // Lesson 002: "applies temperature first ... then top-k or top-p".
    // T = 0.5: (0.867, 0.117, 0.016); 0.867 < 0.9 <= 0.984: keep two.
    let tp = |t| SamplingConfig {
        temperature: t,
        top_p: Some(0.9),
        ..config()
    };
    check(tp(0.5), &[2.0, 1.0, 0.0], &[], &[0.881, 0.119, 0.0], 3);
    // T = 1: (0.665, 0.245, 0.090); 0.910 >= 0.9: keep two.
    check(tp(1.0), &[2.0, 1.0, 0.0], &[], &[0.731, 0.269, 0.0], 3);
    // T = 2: (0.506, 0.307, 0.186); 0.813 < 0.9: keep all three.
    check(tp(2.0), &[2.0, 1.0, 0.0], &[], &[0.506, 0.307, 0.186], 3);
}

#[test]
fn top_p_sees_the_distribution_top_k_renormalised() {
    // (0.4, 0.3, 0.2, 0.1) -> top-k 3 -> (0.444, 0.333, 0.222); the first two
    // reach 0.778 >= 0.75 (unrenormalised they would hold only 0.7).
    let both = SamplingConfig {
        top_k: Some(3),
        top_p: Some(0.75),
        ..config()
    };
    check(
        both,
        &ln(&[0.4, 0.3, 0.2, 0.1]),
        &[],
        &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0],
        6,
    );
}

#[test]
fn min_p_keeps_tokens_near_the_best() {
    let m = |m| SamplingConfig {
        min_p: Some(m),
        ..config()
    };
    let z = ln(&[0.5, 0.25, 0.125, 0.125]);
    // Ratios to the best: 1, 0.5, 0.25, 0.25.
    check(m(0.5), &z, &[], &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0], 6);
    check(m(0.3), &z, &[], &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0], 6);
    check(m(0.25), &z, &[], &[0.5, 0.25, 0.125, 0.125], 6);
    check(m(0.0), &z, &[], &[0.5, 0.25, 0.125, 0.125], 6);
    check(m(1.0), &z, &[], &[1.0, 0.0, 0.0, 0.0], 6);
    check(m(1.0), &[1.0, 1.0, 0.0], &[], &[0.5, 0.5, 0.0], 6);
    // Min-p reads the tempered distribution: at T = 2 the ratio of 0.25 is 0.5.
    check(
        SamplingConfig {
            temperature: 2.0,
            min_p: Some(0.5),
            ..config()
        },
        &z,
        &[],
        &[0.369398, 0.261204, 0.184699, 0.184699],
        6,
    );
}

/// The logits after the raw-logit stage for `history`.
fn check_adjusted(config: SamplingConfig, logits: &[f32], history: &[u32], expected: &[f32]) {
    let mut sampler = Sampler::new(&config).unwrap();
    sampler.policy(logits, history).unwrap();
    assert_eq!(
        sampler.adjusted_logits(),
        expected,
        "{config:?}, history {history:?}"
    );
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
    let rep = |r| SamplingConfig {
        repetition_penalty: Some(r),
        ..config()
    };
    check_adjusted(
        rep(2.0),
        &[2.0, -1.0, 4.0, 0.0],
        &[0, 1, 1, 3],
        &[1.0, -2.0, 4.0, 0.0],
    );
    check_adjusted(rep(2.0), &[2.0, -1.0], &[], &[2.0, -1.0]);
    check_adjusted(rep(0.5), &[2.0, -1.0], &[0, 1], &[4.0, -0.5]);
    check_adjusted(rep(1.0), &[2.0, -1.0], &[0, 1], &[2.0, -1.0]);
    // Counted once however often the token occurs.
    check_adjusted(rep(4.0), &[8.0, 1.0], &[0, 0, 0], &[2.0, 1.0]);
}

#[test]
fn presence_and_frequency_penalties_subtract() {
    let presence = SamplingConfig {
        presence_penalty: Some(0.5),
        ..config()
    };
    check_adjusted(presence, &[1.0; 4], &[1, 1, 2], &[1.0, 0.5, 0.5, 1.0]);
    let frequency = SamplingConfig {
        frequency_penalty: Some(0.25),
        ..config()
    };
    check_adjusted(
        frequency.clone(),
        &[1.0; 4],
        &[1, 1, 2],
        &[1.0, 0.5, 0.75, 1.0],
    );
    check_adjusted(frequency, &[1.0; 4], &[], &[1.0; 4]);
    let negative = SamplingConfig {
        presence_penalty: Some(-1.0),
        ..config()
    };
    check_adjusted(negative, &[0.0, 0.0], &[1], &[0.0, 1.0]);
}

#[test]
fn penalties_apply_in_the_documented_order() {
    // Token 0 (twice): 3 / 1.5 = 2, - 0.5 = 1.5, - 2 * 0.25 = 1.0.
    // Token 1 (once): -2 * 1.5 = -3, - 0.5 = -3.5, - 0.25 = -3.75.
    let all = SamplingConfig {
        repetition_penalty: Some(1.5),
        presence_penalty: Some(0.5),
        frequency_penalty: Some(0.25),
        ..config()
    };
    check_adjusted(all, &[3.0, -2.0, 1.0], &[0, 0, 1], &[1.0, -3.75, 1.0]);
}

#[test]
fn logit_bias_and_bans() {
    let both = SamplingConfig {
        logit_bias: vec![(2, 1.0), (1, -0.5)],
        banned_tokens: vec![0],
        ..config()
    };
    check_adjusted(
        both.clone(),
        &[1.0, 1.0, 1.0],
        &[],
        &[f32::NEG_INFINITY, 0.5, 2.0],
    );
    // The banned token has probability 0; the rest: softmax(0.5, 2).
    check(both, &[1.0, 1.0, 1.0], &[], &[0.0, 0.18243, 0.81757], 5);
}

#[test]
fn a_negative_temperature_is_one_error_wherever_it_is_met() {
    let expected = Error::Core(lm_core::Error::InvalidTemperature { value: -0.5 });
    let from_config = Sampler::new(&SamplingConfig {
        temperature: -0.5,
        ..config()
    });
    assert_eq!(from_config.err(), Some(expected.clone()));
    assert_eq!(
        Candidates::from_logits(&[1.0, 0.0], -0.5).err(),
        Some(expected.clone())
    );
    assert_eq!(
        lm_core::softmax(&[1.0, 0.0], -0.5)
            .map_err(Error::from)
            .err(),
        Some(expected)
    );
}

#[test]
fn invalid_parameters_are_typed_errors() {
    let check = rejects(config(), |config| Sampler::new(config).err());
    let temperature = |value| Error::Core(lm_core::Error::InvalidTemperature { value });
    check(|c| c.temperature = -0.1, temperature(-0.1));
    check(|c| c.temperature = f32::NAN, temperature(f32::NAN));
    check(|c| c.top_k = Some(0), Error::InvalidTopK { value: 0 });
    check(|c| c.top_p = Some(0.0), Error::InvalidTopP { value: 0.0 });
    check(|c| c.top_p = Some(1.01), Error::InvalidTopP { value: 1.01 });
    check(
        |c| c.top_p = Some(f32::NAN),
        Error::InvalidTopP { value: f32::NAN },
    );
    check(|c| c.min_p = Some(-0.1), Error::InvalidMinP { value: -0.1 });
    check(|c| c.min_p = Some(1.5), Error::InvalidMinP { value: 1.5 });
    let repetition = |value| Error::InvalidRepetitionPenalty { value };
    check(|c| c.repetition_penalty = Some(0.0), repetition(0.0));
    check(|c| c.repetition_penalty = Some(-1.0), repetition(-1.0));
    let presence = Error::InvalidPresencePenalty { value: f32::NAN };
    check(|c| c.presence_penalty = Some(f32::NAN), presence);
    let frequency = Error::InvalidFrequencyPenalty {
        value: f32::INFINITY,
    };
    check(|c| c.frequency_penalty = Some(f32::INFINITY), frequency);
    let bias = Error::InvalidLogitBias {
        token: 1,
        value: f32::NAN,
    };
    check(|c| c.logit_bias = vec![(1, f32::NAN)], bias);
    // Messages name the value, lowercase, no trailing period.
    assert_eq!(
        Error::InvalidTopP { value: 1.5 }.to_string(),
        "top_p must be in (0, 1], got 1.5"
    );
    assert_eq!(
        Error::InvalidTopK { value: 0 }.to_string(),
        "top_k must be at least 1, got 0"
    );
}

#[test]
fn bad_logits_and_emptied_distributions_are_errors() {
    let mut sampler = Sampler::new(&config()).unwrap();
    assert!(matches!(
        sampler.policy(&[0.0, f32::NAN], &[]),
        Err(Error::Core(lm_core::Error::InvalidLogit { index: 1, .. }))
    ));
    assert!(matches!(
        sampler.policy(&[f32::INFINITY], &[]),
        Err(Error::Core(lm_core::Error::InvalidLogit { index: 0, .. }))
    ));
    assert_eq!(
        sampler.policy(&[], &[]),
        Err(Error::Core(lm_core::Error::EmptyLogits))
    );
    assert_eq!(
        sampler.policy(&[f32::NEG_INFINITY], &[]),
        Err(Error::Core(lm_core::Error::AllMasked))
    );
    assert_eq!(
        sampler.select(&[1.0], &[], 1.0),
        Err(Error::Core(lm_core::Error::UniformOutOfRange {
            value: 1.0
        }))
    );
    let mut all_banned = Sampler::new(&SamplingConfig {
        banned_tokens: vec![0, 1],
        ..config()
    })
    .unwrap();
    assert_eq!(
        all_banned.policy(&[1.0, 2.0], &[]),
        Err(Error::AllTokensFiltered)
    );
    let mut out_of_range = Sampler::new(&SamplingConfig {
        banned_tokens: vec![5],
        ..config()
    })
    .unwrap();
    assert_eq!(
        out_of_range.policy(&[1.0, 2.0], &[]),
        Err(Error::Core(lm_core::Error::TokenOutOfRange {
            id: 5,
            vocab_size: 2
        }))
    );
    let mut penalised = Sampler::new(&SamplingConfig {
        presence_penalty: Some(1.0),
        ..config()
    })
    .unwrap();
    assert_eq!(
        penalised.policy(&[1.0, 2.0], &[7]),
        Err(Error::Core(lm_core::Error::TokenOutOfRange {
            id: 7,
            vocab_size: 2
        }))
    );
}

#[test]
fn debug_output_shows_the_chain_in_order() {
    let full = SamplingConfig {
        temperature: 0.7,
        top_k: Some(40),
        top_p: Some(0.9),
        min_p: Some(0.05),
        repetition_penalty: Some(1.1),
        presence_penalty: Some(0.5),
        frequency_penalty: Some(0.25),
        penalty_last_n: None,
        logit_bias: vec![(3, -1.0)],
        banned_tokens: vec![0],
        seed: 1,
        ..SamplingConfig::default()
    };
    insta::assert_snapshot!(
        format!("{:?}", Sampler::new(&full).unwrap()),
        @"Sampler { chain: [RepetitionPenalty(1.1), PresencePenalty(0.5), FrequencyPenalty(0.25), LogitBias([(3, -1.0)]), BannedTokens([0]), Temperature(0.7), TopK(40), TopP(0.9), MinP(0.05)], selector: Sample }"
    );
    insta::assert_snapshot!(
        format!("{:?}", Sampler::new(&SamplingConfig::greedy()).unwrap()),
        @"Sampler { chain: [Temperature(0.0)], selector: Greedy }"
    );
}

/// Logits spread over `n` tokens, deterministic.
fn spread(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
        .collect()
}

#[test]
fn top_k_sorts_only_the_kept_part() {
    let mut c = Candidates::from_logits(&spread(49_152), 1.0).unwrap();
    TopK::new(40).unwrap().apply(&mut c);
    assert_eq!((c.len(), c.n_sorted()), (40, 40));
    let mut reference: Vec<(u32, f32)> = spread(49_152)
        .into_iter()
        .enumerate()
        .map(|(i, z)| (i as u32, z))
        .collect();
    reference.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    assert_eq!(c.entries(), &reference[..40]);
}

#[test]
fn top_p_matches_a_full_sort_and_stops_early_when_confident() {
    for (n, temperature, p) in [
        (1000, 1.0, 0.9),
        (1000, 0.05, 0.9),
        (5000, 3.0, 0.95),
        (300, 0.5, 0.3),
    ] {
        let logits = spread(n);
        let mut c = Candidates::from_logits(&logits, temperature).unwrap();
        TopP::new(p).unwrap().apply(&mut c);
        // Reference: sort everything, walk until the mass reaches p.
        let sorted = crate::common::full_sort(&logits);
        let weights: Vec<f64> = sorted
            .iter()
            .map(|&(_, z)| ((f64::from(z) - 4.99) / f64::from(temperature)).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut cumulative = 0.0;
        let n_kept = weights
            .iter()
            .position(|w| {
                cumulative += w;
                (cumulative / total) as f32 >= p
            })
            .map_or(n, |i| i + 1);
        assert_eq!(c.len(), n_kept, "n {n}, T {temperature}, p {p}");
        assert_eq!(c.entries(), &sorted[..n_kept]);
        if n_kept <= 64 {
            assert!(
                c.n_sorted() <= 64,
                "a confident distribution sorts one small round"
            );
        }
    }
}

#[test]
fn seeded_frequencies_match_the_policy_within_four_standard_errors() {
    let config = SamplingConfig {
        temperature: 0.8,
        top_k: Some(4),
        ..config()
    };
    let logits = [1.0, 0.5, 0.0, -0.5, 2.0];
    let mut sampler = Sampler::new(&config).unwrap();
    let probs = sampler.policy(&logits, &[]).unwrap().to_vec();
    let n_draws = 100_000;
    let mut counts = [0usize; 5];
    let mut rng = TokenRng::new(20_240_601);
    for _ in 0..n_draws {
        let token = sampler
            .select(&logits, &[], rng.next_uniform())
            .unwrap()
            .token;
        counts[token as usize] += 1;
    }
    assert_eq!(counts[3], 0, "top-k removed the lowest token");
    for (token, (&count, &p)) in counts.iter().zip(&probs).enumerate() {
        let p = f64::from(p);
        let frequency = count as f64 / n_draws as f64;
        let standard_error = (p * (1.0 - p) / n_draws as f64).sqrt();
        assert!(
            (frequency - p).abs() <= 4.0 * standard_error,
            "token {token}: frequency {frequency} vs probability {p} (4 SE = {})",
            4.0 * standard_error
        );
    }
}

/// A custom filter that breaks the built-in filters' habit of keeping the
/// best token: it removes the `n` best.
#[derive(Debug)]
struct DropBest(usize);

impl CandidateFilter for DropBest {
    fn apply(&self, candidates: &mut Candidates) {
        let n = self.0.min(candidates.len() - 1);
        candidates.sort_prefix(n);
        let dropped: Vec<u32> = candidates.ids().take(n).collect();
        candidates.retain(|(id, _)| !dropped.contains(&id));
    }
}

#[test]
fn a_custom_filter_that_drops_the_best_token_still_gets_a_normalised_policy() {
    // 1,000 survivors (enough for the vectorised total) without the row's
    // maximum: the policy is the softmax of the survivors alone.
    let logits = spread(1001);
    let mut sampler = Sampler::new(&SamplingConfig {
        temperature: 0.7,
        ..SamplingConfig::default()
    })
    .unwrap();
    sampler.push_filter(Box::new(DropBest(1)));
    let probs = sampler.policy(&logits, &[]).unwrap();
    let best = lm_core::argmax(&logits).unwrap() as usize;
    assert_eq!(probs[best], 0.0);
    let survivors_max = logits
        .iter()
        .enumerate()
        .filter(|&(id, _)| id != best)
        .map(|(_, &z)| f64::from(z))
        .fold(f64::NEG_INFINITY, f64::max);
    let weight = |z: f32| ((f64::from(z) - survivors_max) / 0.7).exp();
    let total: f64 = logits
        .iter()
        .enumerate()
        .filter(|&(id, _)| id != best)
        .map(|(_, &z)| weight(z))
        .sum();
    for (id, (&p, &z)) in probs.iter().zip(&logits).enumerate() {
        if id != best {
            let want = weight(z) / total;
            // f32 weights: a few parts in 10^6 at exponents near -16.
            assert!(
                (f64::from(p) - want).abs() <= 1e-5 * want,
                "{id}: {p} vs {want}"
            );
        }
    } // The trace names it as a stage of its own, after temperature.
    let stages: Vec<_> = sampler.stage_counts().iter().collect();
    assert_eq!(
        stages,
        [
            (Stage::Vocabulary, 1001),
            (Stage::Penalties, 1001),
            (Stage::Temperature, 1001),
            (Stage::Custom, 1000)
        ]
    );
}

/// What each stage of a chain with every stage on leaves, by brute force
/// over `(id, logit)` pairs at temperature `t`: full sorts, f64 sums, each
/// filter's rule as its doc comment states it.
struct BruteForce {
    kept: Vec<(usize, f64)>,
    t: f64,
}

impl BruteForce {
    /// The kept tokens' probabilities, renormalised.
    fn probs(&self) -> Vec<f64> {
        let max = self.kept.iter().map(|&(_, z)| z).fold(f64::MIN, f64::max);
        let weights: Vec<f64> = self
            .kept
            .iter()
            .map(|&(_, z)| ((z - max) / self.t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| w / total).collect()
    }

    /// Best first: higher logit, then lower id.
    fn sort(&mut self) {
        self.kept
            .sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    }

    fn top_n_sigma(&mut self, n: f64) {
        let count = self.kept.len() as f64;
        let mean = self.kept.iter().map(|&(_, z)| z).sum::<f64>() / count;
        let variance = self
            .kept
            .iter()
            .map(|&(_, z)| (z - mean).powi(2))
            .sum::<f64>()
            / count;
        let max = self.kept.iter().map(|&(_, z)| z).fold(f64::MIN, f64::max);
        self.kept.retain(|&(_, z)| z >= max - n * variance.sqrt());
    }

    fn top_k(&mut self, k: usize) {
        self.sort();
        self.kept.truncate(k);
    }

    fn typical(&mut self, p: f64) {
        let probs = self.probs();
        let entropy: f64 = -probs.iter().map(|q| q * q.ln()).sum::<f64>();
        let mut order: Vec<usize> = (0..probs.len()).collect();
        let surprise = |i: usize| (-probs[i].ln() - entropy).abs();
        order.sort_by(|&a, &b| surprise(a).total_cmp(&surprise(b)));
        let mut mass = 0.0;
        let n = 1 + order
            .iter()
            .position(|&i| {
                mass += probs[i];
                mass > p
            })
            .unwrap_or(order.len() - 1);
        let keep: Vec<(usize, f64)> = order[..n].iter().map(|&i| self.kept[i]).collect();
        self.kept = keep;
    }

    fn top_p(&mut self, p: f64) {
        self.sort();
        let probs = self.probs();
        let mut mass = 0.0;
        let n = 1 + probs
            .iter()
            .position(|q| {
                mass += q;
                mass >= p
            })
            .unwrap_or(probs.len() - 1);
        self.kept.truncate(n);
    }

    fn min_p(&mut self, ratio: f64) {
        let max = self.kept.iter().map(|&(_, z)| z).fold(f64::MIN, f64::max);
        let t = self.t;
        self.kept.retain(|&(_, z)| ((z - max) / t).exp() >= ratio);
    }

    /// XTC when its coin comes up (probability 1): every token at least as
    /// probable as the threshold but the least probable of them goes.
    fn xtc(&mut self, threshold: f64) {
        self.sort();
        let n_above = self.probs().iter().filter(|&&q| q >= threshold).count();
        self.kept.drain(..n_above.saturating_sub(1));
    }

    fn drop_best(&mut self) {
        self.sort();
        self.kept.remove(0);
    }
}

/// A filter's stage and its rule applied by hand.
type FilterByHand = (Stage, fn(&mut BruteForce));

#[test]
fn a_chain_with_every_stage_on_reports_each_stage_under_its_own_name() {
    let logits = spread(400);
    let banned = [1, 2, 3];
    let config = SamplingConfig {
        temperature: 0.5,
        banned_tokens: banned.to_vec(),
        top_n_sigma: Some(1.0),
        top_k: Some(20),
        typical_p: Some(0.9),
        top_p: Some(0.9),
        min_p: Some(0.3),
        xtc_probability: Some(1.0),
        xtc_threshold: Some(0.1),
        ..SamplingConfig::default()
    };
    let mut sampler = Sampler::new(&config).unwrap();
    // The constraint allows the even ids; a filter of one's own runs last.
    let mut allowed = lm_core::TokenMask::new(logits.len());
    (0..logits.len() as u32)
        .step_by(2)
        .for_each(|id| allowed.allow(id));
    sampler.set_allowed(Some(allowed));
    sampler.push_filter(Box::new(DropBest(1)));
    sampler.policy(&logits, &[]).unwrap();

    let mut brute = BruteForce {
        kept: logits
            .iter()
            .enumerate()
            .filter(|&(id, _)| !banned.contains(&(id as u32)) && id % 2 == 0)
            .map(|(id, &z)| (id, f64::from(z)))
            .collect(),
        t: 0.5,
    };
    let mut expected = vec![
        (Stage::Vocabulary, 400),
        (Stage::Penalties, 397),
        (Stage::Constraint, brute.kept.len()),
        (Stage::Temperature, brute.kept.len()),
    ];
    let filters: [FilterByHand; 7] = [
        (Stage::TopNSigma, |b| b.top_n_sigma(1.0)),
        (Stage::TopK, |b| b.top_k(20)),
        (Stage::Typical, |b| b.typical(0.9)),
        (Stage::TopP, |b| b.top_p(0.9)),
        (Stage::MinP, |b| b.min_p(0.3)),
        (Stage::Xtc, |b| b.xtc(0.1)),
        (Stage::Custom, |b| b.drop_best()),
    ];
    for (stage, apply) in filters {
        let before = brute.kept.len();
        apply(&mut brute);
        // Each stage removes something here, so a count under the wrong
        // name could not pass by chance.
        assert!(brute.kept.len() < before, "{stage:?} removes nothing");
        expected.push((stage, brute.kept.len()));
    }
    // The same counts as a Python run of these rules, written out.
    let n_left: Vec<usize> = expected.iter().map(|&(_, n)| n).collect();
    assert_eq!(n_left, [400, 397, 199, 199, 57, 20, 15, 12, 11, 8, 7]);
    let counts = sampler.stage_counts();
    assert_eq!(counts.iter().collect::<Vec<_>>(), expected);
    let names: Vec<&str> = counts.iter().map(|(stage, _)| stage.name()).collect();
    assert_eq!(
        names,
        [
            "vocabulary",
            "penalties",
            "constraint",
            "temperature",
            "top_n_sigma",
            "top_k",
            "typical_p",
            "top_p",
            "min_p",
            "xtc",
            "custom"
        ]
    );
    // The policy is spread over the last stage's survivors.
    let n_positive = sampler.policy_probs().iter().filter(|&&p| p > 0.0).count();
    assert_eq!(Some(n_positive), counts.last());
}
