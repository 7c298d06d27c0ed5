//! Choosing one token from logits or probabilities: argmax with a defined tie
//! rule, and inverse-CDF selection with a uniform draw.

use crate::{Error, Result, TokenId};

/// The index of the largest value; the lowest index wins ties (greedy decoding).
///
/// Values may be -inf (masked); NaN and +inf are errors, as is a slice that is
/// empty or entirely -inf.
///
/// ```
/// assert_eq!(lm_core::argmax(&[1.0, 3.0, 3.0]).unwrap(), 1);
/// ```
pub fn argmax(values: &[f32]) -> Result<TokenId> {
    if values.is_empty() {
        return Err(Error::EmptyLogits);
    }
    let mut best: Option<(usize, f32)> = None;
    for (index, &value) in values.iter().enumerate() {
        if value.is_nan() || value == f32::INFINITY {
            return Err(Error::InvalidLogit { index, value });
        }
        if value > f32::NEG_INFINITY && best.is_none_or(|(_, b)| value > b) {
            best = Some((index, value));
        }
    }
    let (index, _) = best.ok_or(Error::AllMasked)?;
    Ok(index as TokenId)
}

/// Inverse-CDF selection (lesson 000, "The mathematics"): walk the tokens in id
/// order, add up their probabilities, and take the first token at which the
/// running total exceeds `u`.
///
/// `u` must lie in [0, 1). The probabilities must be non-negative and finite
/// with a positive sum; they are used as given, so a sum a little off 1 from
/// rounding is harmless. The selection never falls off the end: when `u` is at
/// least the running total after the last token (u close to 1 and a sum that
/// rounded low), the last token with a positive probability is taken. A token
/// of probability 0 is never selected.
///
/// ```
/// // p = (0.665, 0.245, 0.090): u = 0.7 passes "red" and lands on "green".
/// assert_eq!(lm_core::sample_inverse_cdf(&[0.665, 0.245, 0.090], 0.7).unwrap(), 1);
/// ```
pub fn sample_inverse_cdf(probs: &[f32], u: f64) -> Result<TokenId> {
    if !(0.0..1.0).contains(&u) {
        return Err(Error::UniformOutOfRange { value: u });
    }
    if probs.is_empty() {
        return Err(Error::EmptyLogits);
    }
    let mut last_positive = None;
    for (index, &p) in probs.iter().enumerate() {
        if !(p >= 0.0 && p.is_finite()) {
            return Err(Error::InvalidProbability {
                index,
                value: f64::from(p),
            });
        }
        if p > 0.0 {
            last_positive = Some(index);
        }
    }
    let last_positive = last_positive.ok_or(Error::AllMasked)?;
    let mut running = 0.0f64;
    for (index, &p) in probs[..last_positive].iter().enumerate() {
        running += f64::from(p);
        if p > 0.0 && running > u {
            return Ok(index as TokenId);
        }
    }
    Ok(last_positive as TokenId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_lowest_index_on_ties() {
        assert_eq!(argmax(&[0.5, 0.5]).unwrap(), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -7.0, -7.0]).unwrap(), 1);
    }

    #[test]
    fn argmax_rejects_bad_input() {
        assert_eq!(argmax(&[]), Err(Error::EmptyLogits));
        assert_eq!(argmax(&[f32::NEG_INFINITY]), Err(Error::AllMasked));
        assert!(matches!(
            argmax(&[0.0, f32::NAN]),
            Err(Error::InvalidLogit { index: 1, .. })
        ));
    }

    /// Brute-force reference: the first index whose cumulative sum exceeds u.
    fn reference(probs: &[f32], u: f64) -> usize {
        let mut cdf = 0.0;
        for (i, &p) in probs.iter().enumerate() {
            cdf += f64::from(p);
            if cdf > u {
                return i;
            }
        }
        unreachable!("u below the total")
    }

    #[test]
    fn inverse_cdf_matches_the_cumulative_sum() {
        let probs = [0.1f32, 0.0, 0.3, 0.6];
        for k in 0..1000 {
            let u = f64::from(k) / 1000.0;
            assert_eq!(
                sample_inverse_cdf(&probs, u).unwrap() as usize,
                reference(&probs, u),
                "u = {u}"
            );
        }
    }

    #[test]
    fn inverse_cdf_lesson_000_boundaries() {
        let p = [0.665f32, 0.245, 0.090];
        assert_eq!(sample_inverse_cdf(&p, 0.0).unwrap(), 0);
        assert_eq!(sample_inverse_cdf(&p, 0.664).unwrap(), 0);
        assert_eq!(sample_inverse_cdf(&p, 0.666).unwrap(), 1);
        assert_eq!(sample_inverse_cdf(&p, 0.95).unwrap(), 2);
    }

    #[test]
    fn inverse_cdf_never_falls_off_the_end() {
        // The sum rounds below u: the last positive token is taken, never a
        // zero-probability one after it.
        let probs = [0.3f32, 0.3, 0.3, 0.0];
        assert_eq!(sample_inverse_cdf(&probs, 0.95).unwrap(), 2);
        let next_below_one = 1.0 - f64::EPSILON / 2.0;
        assert_eq!(sample_inverse_cdf(&[0.5, 0.5], next_below_one).unwrap(), 1);
    }

    #[test]
    fn inverse_cdf_skips_zero_probability_tokens() {
        assert_eq!(sample_inverse_cdf(&[0.0, 1.0], 0.0).unwrap(), 1);
        assert_eq!(sample_inverse_cdf(&[0.0, 0.0, 1.0, 0.0], 0.999).unwrap(), 2);
    }

    #[test]
    fn inverse_cdf_rejects_bad_input() {
        assert_eq!(
            sample_inverse_cdf(&[1.0], 1.0),
            Err(Error::UniformOutOfRange { value: 1.0 })
        );
        assert!(matches!(
            sample_inverse_cdf(&[1.0], -0.1),
            Err(Error::UniformOutOfRange { .. })
        ));
        assert!(matches!(
            sample_inverse_cdf(&[1.0], f64::NAN),
            Err(Error::UniformOutOfRange { .. })
        ));
        assert_eq!(sample_inverse_cdf(&[], 0.5), Err(Error::EmptyLogits));
        assert_eq!(sample_inverse_cdf(&[0.0, 0.0], 0.5), Err(Error::AllMasked));
        assert!(matches!(
            sample_inverse_cdf(&[0.5, -0.1], 0.5),
            Err(Error::InvalidProbability { index: 1, .. })
        ));
        assert!(matches!(
            sample_inverse_cdf(&[f32::NAN], 0.5),
            Err(Error::InvalidProbability { index: 0, .. })
        ));
    }
}
