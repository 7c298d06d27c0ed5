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
//! cancels, nothing overflows); every routine here is built on
//! [`softmax_weights_into`], vectorised f32 exponentials summed in f64. T = 0 is the
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
    let sum = softmax_weights_into(logits, temperature, out)?;
    // sum >= 1: the maximum contributes exp(0) = 1.
    let inv = (1.0 / sum) as f32;
    for o in out.iter_mut() {
        *o *= inv;
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
    let log_sum = weights::<false>(logits, max, temperature, &mut []).ln();
    let t = f64::from(temperature);
    for (o, &z) in out.iter_mut().zip(logits) {
        *o = if z == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else {
            ((f64::from(z) - f64::from(max)) / t - log_sum) as f32
        };
    }
    Ok(())
}

/// The unnormalised softmax: `w_i = exp((z_i - max) / T)` into `out`, and
/// `sum_i w_i` (in f64), so that `p_i = w_i / sum`. The best token weighs 1,
/// a masked one 0 (so does any whose weight is below 2^-125); T = 0 gives the
/// one-hot argmax, T = +inf weight 1 for every unmasked token.
///
/// Sampling runs this over the whole vocabulary at every step, so it is
/// vectorised: `exp` in f32 by a polynomial, within 2e-7 relative of the
/// exact value, summed in f32 lanes over blocks of 256 and the blocks in
/// f64. [`softmax`], [`log_softmax`] and [`log_sum_exp`] are built on it.
///
/// ```
/// let mut w = [0.0; 3];
/// let sum = lm_core::softmax_weights_into(&[2.0, 1.0, 0.0], 1.0, &mut w).unwrap();
/// // Lesson 000: e^0 + e^-1 + e^-2 = 1.5032.
/// assert_eq!(format!("{:.4} {:.4} {:.4} {sum:.4}", w[0], w[1], w[2]), "1.0000 0.3679 0.1353 1.5032");
/// ```
pub fn softmax_weights_into(logits: &[f32], temperature: f32, out: &mut [f32]) -> Result<f64> {
    let max = validate(logits, temperature, out.len())?;
    if temperature == 0.0 {
        one_hot_argmax(logits, out)?;
        return Ok(1.0);
    }
    Ok(weights::<true>(logits, max, temperature, out))
}

/// The softmax normaliser at T = 1: `ln sum_j exp(z_j)`, so that
/// `ln p_i = z_i - log_sum_exp(z)`: the per-step cost of reporting the
/// model's probability of each chosen token. Computed as
/// [`softmax_weights_into`] does, without storing the weights.
///
/// ```
/// // Lesson 000: ln(e^2 + e^1 + e^0) = 2.4076.
/// let lse = lm_core::log_sum_exp(&[2.0, 1.0, 0.0]).unwrap();
/// assert!((lse - 2.407_605_964).abs() < 1e-6);
/// ```
pub fn log_sum_exp(logits: &[f32]) -> Result<f64> {
    let max = validate(logits, 1.0, logits.len())?;
    Ok(f64::from(max) + weights::<false>(logits, max, 1.0, &mut []).ln())
}

/// `sum_i exp((z_i - max) / t)`, each term also written to `out` when
/// `STORE`: branch-free lanes, which the compiler vectorises. The lanes and
/// the order of additions are the code's, not the vector width's, so every
/// build gives the same bits.
fn weights<const STORE: bool>(logits: &[f32], max: f32, t: f32, out: &mut [f32]) -> f64 {
    const BLOCK: usize = 256;
    const LANES: usize = 8;
    let weight = |z: f32| softmax_weight(z, max, t);
    let mut sum = 0.0f64;
    for (index, block) in logits.chunks(BLOCK).enumerate() {
        let mut lanes = [0.0f32; LANES];
        let mut chunks = block.chunks_exact(LANES);
        let mut offset = index * BLOCK;
        for chunk in &mut chunks {
            let mut w = [0.0f32; LANES];
            for lane in 0..LANES {
                w[lane] = weight(chunk[lane]);
                lanes[lane] += w[lane];
            }
            if STORE {
                out[offset..offset + LANES].copy_from_slice(&w);
            }
            offset += LANES;
        }
        let mut tail = 0.0f32;
        for &z in chunks.remainder() {
            let w = weight(z);
            tail += w;
            if STORE {
                out[offset] = w;
            }
            offset += 1;
        }
        sum += f64::from(lanes.iter().sum::<f32>() + tail);
    }
    sum
}

/// The weight `exp((z - max) / T)` of one logit, with the bits that
/// [`softmax_weights_into`] writes for it: for a caller that needs a few
/// weights of a row whose largest logit `max` it knows. Not checked:
/// `temperature` must be positive (or +inf) and `logit` at most `max`.
///
/// ```
/// let w = lm_core::softmax_weight(1.0, 2.0, 1.0);
/// assert!((w - (-1.0f32).exp()).abs() < 1e-7);
/// ```
#[inline(always)]
pub fn softmax_weight(logit: f32, max: f32, temperature: f32) -> f32 {
    // (z - max) / T, computed as 2 (z / 2 - max / 2) (1 / T): halving is
    // exact, and the difference of two logits of f32's extreme magnitudes
    // cannot overflow to -inf (at a huge T it is a finite exponent). Below
    // T = 2^-127, 1 / T overflows, so the division stays. In a loop, the
    // compiler hoists everything but the per-logit arithmetic.
    let half_difference = 0.5 * logit - 0.5 * max;
    let inv_t = 1.0 / temperature;
    let x = if inv_t.is_finite() {
        2.0 * (half_difference * inv_t)
    } else {
        2.0 * (half_difference / temperature)
    };
    masked_exp(logit, x)
}

/// `exp(x)` for `x <= 0`, and 0 where `z` is -inf or `x` is at most -87
/// (`exp(x)` < 2^-125, no longer a normal f32; NaN from -inf / +inf lands
/// here too). Arithmetic that vectorises: no libm call, no branch, no
/// float-to-int conversion. `x = n ln 2 + r` with |r| <= ln 2 / 2, a
/// degree-7 polynomial for `exp(r)` (Cephes' `expf` coefficients), and `2^n`
/// written into the exponent bits.
fn masked_exp(z: f32, x: f32) -> f32 {
    const LOWEST: f32 = -87.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let keep = x > LOWEST && z > f32::NEG_INFINITY;
    let clamped = if x > LOWEST { x } else { LOWEST };
    let shifted = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5; // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32
    let e = p * r * r + r + 1.0;
    // `shifted` is 1.5 * 2^23 + n, so its low mantissa bits hold n in two's
    // complement: shifting n + 127 (in [1, 127]) into the exponent field
    // gives 2^n.
    let scale = f32::from_bits(shifted.to_bits().wrapping_add(127) << 23);
    // A mask rather than an `if`, which the compiler turns into a branch.
    f32::from_bits((e * scale).to_bits() & u32::from(keep).wrapping_neg())
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
pub(crate) mod tests {
    use super::*;

    /// The logit checks every reader of a logits row shares: empty, entirely
    /// masked, and NaN or +inf (at its index) are each their typed error.
    pub(crate) fn assert_refuses_bad_logits<T: std::fmt::Debug>(
        read: impl Fn(&[f32]) -> Result<T>,
    ) {
        assert!(matches!(read(&[]), Err(Error::EmptyLogits)));
        assert!(matches!(
            read(&[f32::NEG_INFINITY; 2]),
            Err(Error::AllMasked)
        ));
        assert!(matches!(
            read(&[0.0, f32::NAN]),
            Err(Error::InvalidLogit { index: 1, .. })
        ));
        assert!(matches!(
            read(&[f32::INFINITY]),
            Err(Error::InvalidLogit { index: 0, .. })
        ));
    }

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
                // f32 exponentials: a few parts in 10^7 of each probability.
                let want = exps[i] / sum;
                assert!(
                    (f64::from(p[i]) - want).abs() < 5e-7 * want,
                    "{} vs {want}",
                    p[i]
                );
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

    /// `n` deterministic logits uniform in [-half_width, half_width), every
    /// `masked_every`-th one -inf (xorshift64).
    fn spread_logits(n: usize, masked_every: usize, half_width: f32) -> Vec<f32> {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % masked_every == 0 {
                    f32::NEG_INFINITY
                } else {
                    ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * half_width
                }
            })
            .collect()
    }

    #[test]
    fn polynomial_exp_is_within_two_ulp_of_f64_exp() {
        let mut worst = 0.0f64;
        for i in 0..2_000_000 {
            let x = -87.0 * f64::from(i) / 2_000_000.0;
            let got = f64::from(masked_exp(0.0, x as f32));
            let want = f64::from(x as f32).exp();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 2e-7, "worst relative error {worst:e}");
        assert_eq!(masked_exp(0.0, 0.0), 1.0);
        assert_eq!(masked_exp(0.0, -87.0), 0.0);
        assert_eq!(masked_exp(0.0, f32::NEG_INFINITY), 0.0);
        assert_eq!(masked_exp(0.0, f32::NAN), 0.0);
        assert_eq!(masked_exp(f32::NEG_INFINITY, 0.0), 0.0);
    }

    #[test]
    fn weights_match_f64_at_every_temperature() {
        let logits = spread_logits(1000, 31, 15.0);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut w = vec![0.0; logits.len()];
        for t in [0.05f32, 0.3, 1.0, 2.5, 1e6] {
            let sum = softmax_weights_into(&logits, t, &mut w).unwrap();
            let mut want_sum = 0.0;
            for (&z, &got) in logits.iter().zip(&w) {
                if z == f32::NEG_INFINITY {
                    assert_eq!(got, 0.0);
                    continue;
                }
                let want = ((f64::from(z) - f64::from(max)) / f64::from(t)).exp();
                want_sum += want;
                // The polynomial's 2e-7, plus the f32 rounding of the
                // argument (z - max) / T: two roundings of a number up to 87.
                let x = (f64::from(z) - f64::from(max)) / f64::from(t);
                let tolerance = want * (2e-7 + x.abs() * 2.5e-7) + 2e-38;
                assert!(
                    (f64::from(got) - want).abs() <= tolerance,
                    "T = {t}: {got} vs {want}"
                );
            }
            assert!(
                (sum - want_sum).abs() < 1e-6 * want_sum,
                "T = {t}: {sum} vs {want_sum}"
            );
        }
    }

    #[test]
    fn log_sum_exp_matches_f64_over_a_vocabulary() {
        // 49,152 logits spread like a model's, some masked, and the row's
        // normaliser in f64 computed directly.
        let logits = spread_logits(49_152, 97, 20.0);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits
            .iter()
            .map(|&z| (f64::from(z) - f64::from(max)).exp())
            .sum();
        let want = f64::from(max) + sum.ln();
        let got = log_sum_exp(&logits).unwrap();
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        // And it is the normaliser log_softmax uses.
        let lp = log_softmax(&logits, 1.0).unwrap();
        assert!((f64::from(logits[1]) - got - f64::from(lp[1])).abs() < 1e-5);
    }

    #[test]
    fn log_sum_exp_checks_its_input() {
        assert_refuses_bad_logits(log_sum_exp);
        assert_eq!(log_sum_exp(&[1000.0, f32::NEG_INFINITY]), Ok(1000.0));
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert_refuses_bad_logits(|logits| softmax(logits, 1.0));
        assert_refuses_bad_logits(|logits| log_softmax(logits, 1.0));
        assert_eq!(
            softmax(&[1.0], -0.5),
            Err(Error::InvalidTemperature { value: -0.5 })
        );
        assert!(matches!(
            softmax(&[1.0], f32::NAN),
            Err(Error::InvalidTemperature { .. })
        ));
        let mut short = [0.0; 1];
        assert_eq!(
            softmax_into(&[1.0, 2.0], 1.0, &mut short),
            Err(Error::LengthMismatch { left: 2, right: 1 })
        );
    }
}
