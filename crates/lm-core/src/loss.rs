//! Training losses: cross-entropy against a target token, with label
//! smoothing, and the KL divergence between two distributions.
//!
//! Lesson 002, "Training objective and loss": the predicted distribution at a
//! position is compared with the true next token by cross-entropy (equivalently
//! the KL divergence from the one-hot target); label smoothing (epsilon = 0.1
//! in the original Transformer) moves a little mass off the one-hot target.
//!
//! ```text
//! target_i = (1 - eps) * [i == y] + eps / V
//! CE       = -sum_i target_i * ln softmax(z)_i
//! KL(p||q) = sum_i p_i * ln(p_i / q_i)
//! ```

use crate::{Error, Result, TokenId, log_softmax};

/// The label-smoothed target distribution over `vocab_size` tokens: `1 - eps`
/// on `target` plus `eps / V` spread over every token (Szegedy et al. 2016,
/// as used by the original Transformer).
pub fn label_smoothed_target(vocab_size: usize, target: TokenId, epsilon: f32) -> Result<Vec<f64>> {
    check_target(vocab_size, target)?;
    if !(0.0..=1.0).contains(&epsilon) {
        return Err(Error::InvalidLabelSmoothing { value: epsilon });
    }
    let eps = f64::from(epsilon);
    let mut dist = vec![eps / vocab_size as f64; vocab_size];
    dist[target as usize] += 1.0 - eps;
    Ok(dist)
}

/// Cross-entropy in nats of the distribution `softmax(logits)` against the
/// token `target`, with label smoothing `epsilon` (0 gives `-ln p_target`).
///
/// ```
/// // Without smoothing, cross-entropy is the negative log-probability of the target.
/// let ce = lm_core::cross_entropy(&[2.0, 1.0, 0.0], 0, 0.0).unwrap();
/// assert!((ce - 0.665241f64.ln().abs()).abs() < 1e-5);
/// ```
pub fn cross_entropy(logits: &[f32], target: TokenId, epsilon: f32) -> Result<f64> {
    let log_probs = log_softmax(logits, 1.0)?;
    let dist = label_smoothed_target(logits.len(), target, epsilon)?;
    let mut loss = 0.0f64;
    for (&t, &lp) in dist.iter().zip(&log_probs) {
        if t > 0.0 {
            loss -= t * f64::from(lp);
        }
    }
    Ok(loss)
}

/// `KL(p || q)` in nats for two probability vectors of the same length. Terms
/// with `p_i = 0` contribute nothing; `q_i = 0` where `p_i > 0` gives +inf.
///
/// ```
/// let kl = lm_core::kl_divergence(&[0.5, 0.5], &[0.5, 0.5]).unwrap();
/// assert_eq!(kl, 0.0);
/// ```
pub fn kl_divergence(p: &[f32], q: &[f32]) -> Result<f64> {
    if p.len() != q.len() {
        return Err(Error::LengthMismatch {
            left: p.len(),
            right: q.len(),
        });
    }
    if p.is_empty() {
        return Err(Error::EmptyLogits);
    }
    for (index, &x) in p.iter().chain(q).enumerate() {
        if !(x >= 0.0 && x.is_finite()) {
            return Err(Error::InvalidProbability {
                index: index % p.len(),
                value: f64::from(x),
            });
        }
    }
    let mut kl = 0.0f64;
    for (&pi, &qi) in p.iter().zip(q) {
        if pi > 0.0 {
            kl += f64::from(pi) * (f64::from(pi) / f64::from(qi)).ln();
        }
    }
    Ok(kl)
}

fn check_target(vocab_size: usize, target: TokenId) -> Result<()> {
    if vocab_size == 0 {
        return Err(Error::EmptyLogits);
    }
    if target as usize >= vocab_size {
        return Err(Error::TokenOutOfRange {
            id: target,
            vocab_size,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_smoothed_cross_entropy_hand_computed() {
        // logits (2, 1, 0), target 0, eps = 0.1 (lesson 002), V = 3.
        // Worked by hand: ln(e^2 + e + 1) = 2.407606; the smoothed target is
        // (0.9 + 0.1/3, 0.1/3, 0.1/3), so CE = lse - sum_i t_i z_i
        // = 2.407606 - (0.933333 * 2 + 0.033333 * 1) = 0.507606.
        let ce = cross_entropy(&[2.0, 1.0, 0.0], 0, 0.1).unwrap();
        assert_eq!(format!("{ce:.6}"), "0.507606");
        // Without smoothing: -ln 0.665241 = 0.407606.
        let ce0 = cross_entropy(&[2.0, 1.0, 0.0], 0, 0.0).unwrap();
        assert_eq!(format!("{ce0:.6}"), "0.407606");
    }

    #[test]
    fn smoothing_raises_the_loss_of_a_confident_correct_prediction() {
        let confident = [10.0f32, 0.0, 0.0, 0.0];
        let plain = cross_entropy(&confident, 0, 0.0).unwrap();
        let smoothed = cross_entropy(&confident, 0, 0.1).unwrap();
        assert!(smoothed > plain);
    }

    #[test]
    fn smoothed_target_is_a_distribution() {
        let t = label_smoothed_target(4, 2, 0.1).unwrap();
        for (got, want) in t.iter().zip([0.025, 0.025, 0.925, 0.025]) {
            assert!((got - want).abs() < 1e-8, "{t:?}");
        }
        assert!((t.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn cross_entropy_is_kl_plus_entropy_of_the_target() {
        let logits = [0.5f32, -0.2, 1.7, 0.0];
        let q = crate::softmax(&logits, 1.0).unwrap();
        let target = label_smoothed_target(4, 1, 0.2).unwrap();
        let t32: Vec<f32> = target.iter().map(|&x| x as f32).collect();
        let entropy: f64 = -target.iter().map(|&x| x * x.ln()).sum::<f64>();
        let ce = cross_entropy(&logits, 1, 0.2).unwrap();
        let kl = kl_divergence(&t32, &q).unwrap();
        assert!(
            (ce - (kl + entropy)).abs() < 1e-6,
            "{ce} vs {kl} + {entropy}"
        );
    }

    #[test]
    fn kl_divergence_hand_computed() {
        // 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln 2 + 0.5 ln(2/3) = 0.143841.
        let kl = kl_divergence(&[0.5, 0.5], &[0.25, 0.75]).unwrap();
        assert_eq!(format!("{kl:.6}"), "0.143841");
        assert_eq!(
            kl_divergence(&[1.0, 0.0], &[0.0, 1.0]).unwrap(),
            f64::INFINITY
        );
        assert_eq!(kl_divergence(&[0.0, 1.0], &[0.5, 0.5]).unwrap(), 2f64.ln());
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert_eq!(
            cross_entropy(&[1.0, 2.0], 2, 0.0),
            Err(Error::TokenOutOfRange {
                id: 2,
                vocab_size: 2
            })
        );
        assert_eq!(
            cross_entropy(&[1.0, 2.0], 0, 1.5),
            Err(Error::InvalidLabelSmoothing { value: 1.5 })
        );
        assert_eq!(cross_entropy(&[], 0, 0.0), Err(Error::EmptyLogits));
        assert_eq!(
            kl_divergence(&[1.0], &[0.5, 0.5]),
            Err(Error::LengthMismatch { left: 1, right: 2 })
        );
        assert!(matches!(
            kl_divergence(&[1.0, -0.5], &[0.5, 0.5]),
            Err(Error::InvalidProbability { index: 1, .. })
        ));
    }
}
