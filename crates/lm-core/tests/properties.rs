//! Invariants of lm-core's numerics over random inputs, hostile ones
//! included: any finite logits (up to ±f32::MAX) at any valid temperature
//! (0, subnormal, huge, +inf) give a distribution (non-negative, summing to 1
//! within 1e-6) that agrees with a float64 reference, and a token in range;
//! invalid temperatures and uniform draws are typed errors; NaN and +inf
//! logits are errors naming the index, -inf masks its token, as the crate
//! documents.

use lm_core::{Error, argmax, cross_entropy, log_softmax, sample_inverse_cdf, softmax};
use proptest::prelude::*;

/// Finite logits, from everyday values to the extremes of f32, sometimes
/// with masked (-inf) tokens, never all masked.
fn logits() -> impl Strategy<Value = Vec<f32>> {
    let value = prop_oneof![
        8 => -30.0f32..30.0,
        1 => prop_oneof![Just(f32::MAX), Just(-f32::MAX), Just(0.0), Just(-0.0)],
        1 => any::<f32>().prop_filter("finite", |v| v.is_finite()),
        1 => Just(f32::NEG_INFINITY),
    ];
    prop::collection::vec(value, 1..200).prop_filter("not all masked", |v| {
        v.iter().any(|z| *z > f32::NEG_INFINITY)
    })
}

/// Valid temperatures: 0 (greedy), subnormal, ordinary, huge, +inf (uniform).
fn temperature() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(0.0f32),
        Just(f32::from_bits(1)),
        Just(f32::MIN_POSITIVE),
        1e-6f32..10.0,
        Just(f32::MAX),
        Just(f32::INFINITY),
    ]
}

/// Softmax in f64, written apart from the crate's: the limits T = 0 (one-hot
/// at the lowest-index maximum) and T = inf (uniform over unmasked tokens)
/// spelled out.
fn reference_softmax(logits: &[f32], t: f32) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let unmasked = |z: f32| z > f32::NEG_INFINITY;
    if t == 0.0 {
        let best = logits.iter().position(|&z| z == max).unwrap();
        return (0..logits.len())
            .map(|i| if i == best { 1.0 } else { 0.0 })
            .collect();
    }
    let weights: Vec<f64> = logits
        .iter()
        .map(|&z| {
            if !unmasked(z) {
                0.0
            } else if t == f32::INFINITY {
                1.0
            } else {
                ((f64::from(z) - f64::from(max)) / f64::from(t)).exp()
            }
        })
        .collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_finite_logits_at_any_valid_temperature_give_a_distribution(
        logits in logits(),
        t in temperature(),
        u in 0.0f64..1.0,
    ) {
        let probs = softmax(&logits, t).unwrap();
        prop_assert_eq!(probs.len(), logits.len());
        prop_assert!(probs.iter().all(|p| p.is_finite() && *p >= 0.0), "{:?}", probs);
        let sum: f64 = probs.iter().map(|&p| f64::from(p)).sum();
        prop_assert!((sum - 1.0).abs() <= 1e-6, "sum {}", sum);
        let reference = reference_softmax(&logits, t);
        for (i, (&p, &r)) in probs.iter().zip(&reference).enumerate() {
            prop_assert!((f64::from(p) - r).abs() <= 1e-6, "token {}: {} vs {}", i, p, r);
        }
        // Masked tokens get nothing; a token is never chosen at probability 0.
        for (&z, &p) in logits.iter().zip(&probs) {
            if z == f32::NEG_INFINITY {
                prop_assert_eq!(p, 0.0);
            }
        }
        let token = sample_inverse_cdf(&probs, u).unwrap() as usize;
        prop_assert!(token < logits.len());
        prop_assert!(probs[token] > 0.0);
        let best = argmax(&logits).unwrap() as usize;
        prop_assert!(best < logits.len());
        prop_assert!(logits.iter().all(|&z| z <= logits[best]));
        prop_assert!(logits[..best].iter().all(|&z| z < logits[best]), "lowest index wins ties");
    }

    #[test]
    fn log_softmax_is_the_log_of_softmax(logits in logits(), t in temperature()) {
        let log_probs = log_softmax(&logits, t).unwrap();
        let reference = reference_softmax(&logits, t);
        for (i, (&lp, &r)) in log_probs.iter().zip(&reference).enumerate() {
            prop_assert!(!lp.is_nan() && lp <= 1e-6, "token {}: {}", i, lp);
            if r == 0.0 {
                // Underflow in f64 as well: log-probability -inf or very negative.
                prop_assert!(lp < -700.0 || lp == f32::NEG_INFINITY, "token {}: {}", i, lp);
            } else if r > 1e-30 {
                prop_assert!((f64::from(lp) - r.ln()).abs() <= 1e-4 * r.ln().abs().max(1.0),
                    "token {}: {} vs {}", i, lp, r.ln());
            }
        }
    }

    #[test]
    fn cross_entropy_is_finite_and_non_negative_for_an_unmasked_target(
        logits in prop::collection::vec(-1e4f32..1e4, 1..100),
        target_seed in any::<u32>(),
        epsilon in 0.0f32..=1.0,
    ) {
        let target = target_seed % logits.len() as u32;
        let ce = cross_entropy(&logits, target, epsilon).unwrap();
        prop_assert!(ce.is_finite() && ce >= -1e-9, "{}", ce);
    }

    #[test]
    fn invalid_temperatures_and_draws_are_typed_errors(
        logits in logits(),
        negative in prop_oneof![Just(f32::NEG_INFINITY), Just(-f32::MIN_POSITIVE), -1e30f32..-1e-30],
        u_out in prop_oneof![Just(1.0f64), Just(f64::NAN), Just(f64::INFINITY), Just(-0.5), 1.0f64..1e300],
    ) {
        prop_assert_eq!(softmax(&logits, negative), Err(Error::InvalidTemperature { value: negative }));
        prop_assert_eq!(log_softmax(&logits, negative), Err(Error::InvalidTemperature { value: negative }));
        let nan = softmax(&logits, f32::NAN).unwrap_err();
        let is_nan_temperature = matches!(nan, Error::InvalidTemperature { value } if value.is_nan());
        prop_assert!(is_nan_temperature, "{:?}", nan);
        let probs = softmax(&logits, 1.0).unwrap();
        let err = sample_inverse_cdf(&probs, u_out).unwrap_err();
        prop_assert!(matches!(err, Error::UniformOutOfRange { .. }), "{:?}", err);
    }

    #[test]
    fn nan_and_positive_infinite_logits_are_errors_naming_their_index(
        logits in logits(),
        index_seed in any::<usize>(),
        bad in prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(-f32::NAN)],
        t in temperature(),
    ) {
        let mut logits = logits;
        let index = index_seed % logits.len();
        logits[index] = bad;
        // The first bad logit is the one named (there is exactly one here).
        for err in [
            softmax(&logits, t).unwrap_err(),
            log_softmax(&logits, t).unwrap_err(),
            argmax(&logits).unwrap_err(),
        ] {
            let names_it = matches!(err, Error::InvalidLogit { index: i, value }
                if i == index && (value.is_nan() || value == f32::INFINITY));
            prop_assert!(names_it, "{:?}", err);
        }
    }

    #[test]
    fn bad_probabilities_are_errors_naming_their_index(
        probs in prop::collection::vec(0.0f32..1.0, 1..50),
        index_seed in any::<usize>(),
        bad in prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(-1e-3f32), Just(f32::NEG_INFINITY)],
        u in 0.0f64..1.0,
    ) {
        let mut probs = probs;
        let index = index_seed % probs.len();
        probs[index] = bad;
        let err = sample_inverse_cdf(&probs, u).unwrap_err();
        let names_it = matches!(err, Error::InvalidProbability { index: i, .. } if i == index);
        prop_assert!(names_it, "{:?}", err);
    }
}

#[test]
fn empty_and_fully_masked_logits_are_typed_errors() {
    assert_eq!(softmax(&[], 1.0), Err(Error::EmptyLogits));
    assert_eq!(argmax(&[]), Err(Error::EmptyLogits));
    assert_eq!(sample_inverse_cdf(&[], 0.5), Err(Error::EmptyLogits));
    let masked = [f32::NEG_INFINITY; 3];
    for t in [0.0, 1.0, f32::INFINITY] {
        assert_eq!(softmax(&masked, t), Err(Error::AllMasked));
    }
    assert_eq!(sample_inverse_cdf(&[0.0, 0.0], 0.5), Err(Error::AllMasked));
}

#[test]
fn the_extremes_of_f32_are_handled_exactly() {
    // max - min overflows f32 but not the f64 the crate works in.
    assert_eq!(softmax(&[f32::MAX, -f32::MAX], 1.0).unwrap(), [1.0, 0.0]);
    // A subnormal temperature is greedy in effect, ties shared equally.
    assert_eq!(
        softmax(&[1.0, 1.0, 0.5], f32::from_bits(1)).unwrap(),
        [0.5, 0.5, 0.0]
    );
    // T = +inf is uniform over the unmasked tokens, however far apart.
    assert_eq!(
        softmax(
            &[f32::MAX, f32::NEG_INFINITY, -f32::MAX, 0.0],
            f32::INFINITY
        )
        .unwrap(),
        [1.0 / 3.0, 0.0, 1.0 / 3.0, 1.0 / 3.0]
    );
}
