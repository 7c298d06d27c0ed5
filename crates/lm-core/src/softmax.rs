//! Softmax with temperature and its logarithm, computed stably.
//!
//! Lesson 000 ("The mathematics: logits, softmax and temperature"), lesson 002
//! ("Temperature and sampling"):
//!
//! ```text
//! p_i = exp(z_i / T) / sum_j exp(z_j / T)
//! ```
//!
//! The largest logit is subtracted before exponentiating (the common factor
//! cancels, nothing overflows) and the sum is accumulated in f64. T = 0 is the
//! limit T -> 0, argmax as a one-hot distribution, never a division by zero;
//! T = +inf is the other limit, uniform over the tokens that are not masked.
//! A logit of -inf masks its token (probability 0); NaN and +inf are errors.

use crate::{Error, Result, argmax};

/// Softmax of `logits` at temperature `temperature` (lesson 000's worked table).
///
/// ```
/// let p = lm_core::softmax(&[3.0, 1.0, 1.0], 1.0).unwrap();
/// // Lesson 000, knowledge check question 1.
/// assert_eq!(format!("{:.2} {:.2} {:.2}", p[0], p[1], p[2]), "0.79 0.11 0.11");
/// ```
pub fn softmax(logits: &[f32], temperature: f32) -> Result<Vec<f32>> {
    let mut out = vec![0.0; logits.len()];
    softmax_into(logits, temperature, &mut out)?;
    Ok(out)
}

/// [`softmax`] into a caller-owned buffer of the same length (no allocation).
pub fn softmax_into(logits: &[f32], temperature: f32, out: &mut [f32]) -> Result<()> {
    let max = validate(logits, temperature, out.len())?;
    if temperature == 0.0 {
        return one_hot_argmax(logits, out);
    }
    let t = f64::from(temperature);
    let mut sum = 0.0f64;
    for (o, &z) in out.iter_mut().zip(logits) {
        let e = scaled_exp(z, max, t);
        sum += e;
        *o = e as f32;
    }
    // sum >= 1: the maximum contributes exp(0) = 1.
    let inv = 1.0 / sum;
    for o in out.iter_mut() {
        *o = (f64::from(*o) * inv) as f32;
    }
    Ok(())
}

/// Natural log of [`softmax`]: `(z_i - max) / T - ln(sum_j exp((z_j - max) / T))`.
///
/// Masked tokens (and, at T = 0, every token but the argmax) get -inf.
pub fn log_softmax(logits: &[f32], temperature: f32) -> Result<Vec<f32>> {
    let mut out = vec![0.0; logits.len()];
    log_softmax_into(logits, temperature, &mut out)?;
    Ok(out)
}

/// [`log_softmax`] into a caller-owned buffer of the same length.
pub fn log_softmax_into(logits: &[f32], temperature: f32, out: &mut [f32]) -> Result<()> {
    let max = validate(logits, temperature, out.len())?;
    if temperature == 0.0 {
        one_hot_argmax(logits, out)?;
        for o in out.iter_mut() {
            *o = if *o == 1.0 { 0.0 } else { f32::NEG_INFINITY };
        }
        return Ok(());
    }
    let t = f64::from(temperature);
    let sum: f64 = logits.iter().map(|&z| scaled_exp(z, max, t)).sum();
    let log_sum = sum.ln();
    for (o, &z) in out.iter_mut().zip(logits) {
        *o = if z == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else {
            ((f64::from(z) - f64::from(max)) / t - log_sum) as f32
        };
    }
    Ok(())
}

/// `exp((z - max) / t)` in f64, with -inf logits giving exactly 0.
fn scaled_exp(z: f32, max: f32, t: f64) -> f64 {
    if z == f32::NEG_INFINITY {
        0.0
    } else {
        ((f64::from(z) - f64::from(max)) / t).exp()
    }
}

fn one_hot_argmax(logits: &[f32], out: &mut [f32]) -> Result<()> {
    let best = argmax(logits)?;
    out.fill(0.0);
    out[best as usize] = 1.0;
    Ok(())
}

/// Checks the inputs and returns the largest logit.
fn validate(logits: &[f32], temperature: f32, out_len: usize) -> Result<f32> {
    if temperature.is_nan() || temperature < 0.0 {
        return Err(Error::InvalidTemperature { value: temperature });
    }
    if out_len != logits.len() {
        return Err(Error::LengthMismatch {
            left: logits.len(),
            right: out_len,
        });
    }
    let best = argmax(logits)?;
    Ok(logits[best as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(logits: &[f32], t: f32, expected: &[f64], decimals: usize) {
        let p = softmax(logits, t).unwrap();
        let got: Vec<String> = p.iter().map(|x| format!("{x:.decimals$}")).collect();
        let want: Vec<String> = expected.iter().map(|x| format!("{x:.decimals$}")).collect();
        assert_eq!(got, want, "softmax({logits:?}, T = {t})");
    }

    #[test]
    fn lesson_000_temperature_table() {
        // Lesson 000, "A worked example: temperature on three logits".
        check(&[2.0, 1.0, 0.0], 0.5, &[0.867, 0.117, 0.016], 3);
        check(&[2.0, 1.0, 0.0], 1.0, &[0.665, 0.245, 0.090], 3);
        check(&[2.0, 1.0, 0.0], 2.0, &[0.506, 0.307, 0.186], 3);
    }

    #[test]
    fn lesson_000_question_1() {
        // The question asks for two decimals: (0.79, 0.11, 0.11). The
        // explanation's third decimal, 0.106, divides the rounded 2.718 by the
        // rounded 25.53; unrounded, e / (e^3 + 2e) = 0.10651.
        check(&[3.0, 1.0, 1.0], 1.0, &[0.79, 0.11, 0.11], 2);
        check(&[3.0, 1.0, 1.0], 1.0, &[0.7870, 0.1065, 0.1065], 4);
    }

    #[test]
    fn matches_the_definition_computed_directly() {
        let logits = [0.3f32, -1.2, 2.5, 0.0, 1.1];
        for t in [0.25f32, 0.7, 1.0, 3.0] {
            let exps: Vec<f64> = logits
                .iter()
                .map(|&z| (f64::from(z) / f64::from(t)).exp())
                .collect();
            let sum: f64 = exps.iter().sum();
            let p = softmax(&logits, t).unwrap();
            let lp = log_softmax(&logits, t).unwrap();
            for i in 0..logits.len() {
                assert!((f64::from(p[i]) - exps[i] / sum).abs() < 1e-7);
                assert!((f64::from(lp[i]) - (exps[i] / sum).ln()).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let p = softmax(&[1000.0, 999.0, -1000.0], 1.0).unwrap();
        assert!((p[0] - 0.731_058_6).abs() < 1e-6);
        assert!((p[1] - 0.268_941_4).abs() < 1e-6);
        assert_eq!(p[2], 0.0);
    }

    #[test]
    fn temperature_zero_is_argmax_lowest_id_on_ties() {
        assert_eq!(softmax(&[1.0, 3.0, 3.0], 0.0).unwrap(), vec![0.0, 1.0, 0.0]);
        let lp = log_softmax(&[1.0, 3.0, 3.0], 0.0).unwrap();
        assert_eq!(lp, vec![f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn tiny_temperature_approaches_argmax() {
        let p = softmax(&[2.0, 1.0, 0.0], 1e-30).unwrap();
        assert_eq!(p, vec![1.0, 0.0, 0.0]);
    }

    #[test]
    fn infinite_temperature_is_uniform_over_unmasked() {
        let p = softmax(&[5.0, f32::NEG_INFINITY, -3.0, 0.0], f32::INFINITY).unwrap();
        let third = 1.0 / 3.0;
        assert!((p[0] - third).abs() < 1e-7 && (p[2] - third).abs() < 1e-7);
        assert_eq!(p[1], 0.0);
    }

    #[test]
    fn masked_tokens_get_zero_and_minus_infinity() {
        let p = softmax(&[0.0, f32::NEG_INFINITY], 1.0).unwrap();
        assert_eq!(p, vec![1.0, 0.0]);
        let lp = log_softmax(&[0.0, f32::NEG_INFINITY], 1.0).unwrap();
        assert_eq!(lp, vec![0.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert_eq!(softmax(&[], 1.0), Err(Error::EmptyLogits));
        assert_eq!(
            softmax(&[1.0], -0.5),
            Err(Error::InvalidTemperature { value: -0.5 })
        );
        assert!(matches!(
            softmax(&[1.0], f32::NAN),
            Err(Error::InvalidTemperature { .. })
        ));
        assert!(matches!(
            softmax(&[1.0, f32::NAN], 1.0),
            Err(Error::InvalidLogit { index: 1, .. })
        ));
        assert!(matches!(
            softmax(&[f32::INFINITY], 1.0),
            Err(Error::InvalidLogit { index: 0, .. })
        ));
        assert_eq!(softmax(&[f32::NEG_INFINITY; 2], 1.0), Err(Error::AllMasked));
        let mut short = [0.0; 1];
        assert_eq!(
            softmax_into(&[1.0, 2.0], 1.0, &mut short),
            Err(Error::LengthMismatch { left: 2, right: 1 })
        );
    }
}
