//! The probability of a whole sequence by the chain rule, kept in log space,
//! and perplexity.
//!
//! Lesson 001, part 2 ("The probability of a sequence"):
//!
//! ```text
//! p(x_1, ..., x_T) = prod_t p(x_t | x_1, ..., x_{t-1})
//! ln p(x_1, ..., x_T) = sum_t ln p(x_t | x_1, ..., x_{t-1})
//! ```
//!
//! Products of many factors below one underflow; sums of logarithms do not.

use crate::{Error, Result};

/// A running chain-rule log-probability: add one conditional probability per
/// generated token.
///
/// ```
/// use lm_core::LogProb;
/// // Lesson 001, "The probability of each default run": the sampled run.
/// let mut run = LogProb::default();
/// for p in [0.2334, 0.1179, 0.2015, 0.0938, 0.2696] {
///     run.push_prob(p);
/// }
/// assert_eq!(format!("{:.6}", run.prob()), "0.000140");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogProb {
    ln: f64,
    n_tokens: usize,
}

impl LogProb {
    /// Adds the factor `p(x_t | x_<t)` given as a probability.
    pub fn push_prob(&mut self, prob: f64) {
        self.push_ln(prob.ln());
    }

    /// Adds the factor given as a natural-log probability.
    pub fn push_ln(&mut self, logprob: f64) {
        self.ln += logprob;
        self.n_tokens += 1;
    }

    /// The natural log of the sequence probability (0 for no tokens).
    pub fn ln(&self) -> f64 {
        self.ln
    }

    /// The sequence probability itself (may underflow to 0 for long sequences).
    pub fn prob(&self) -> f64 {
        self.ln.exp()
    }

    /// How many factors have been added.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// `exp(-ln p / n)`, or `None` before the first token.
    pub fn perplexity(&self) -> Option<f64> {
        (self.n_tokens > 0).then(|| (-self.ln / self.n_tokens as f64).exp())
    }
}

/// The chain-rule log-probability of a sequence from its per-step
/// probabilities: `sum_t ln p_t`.
///
/// ```
/// // Lesson 001, "The probability of a sequence": 0.5 x 0.4 = 0.2.
/// let ln = lm_core::sequence_logprob(&[0.5, 0.4]).unwrap();
/// assert!((ln.exp() - 0.2).abs() < 1e-12);
/// ```
pub fn sequence_logprob(step_probs: &[f64]) -> Result<f64> {
    let mut total = LogProb::default();
    for (index, &p) in step_probs.iter().enumerate() {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::InvalidProbability { index, value: p });
        }
        total.push_prob(p);
    }
    Ok(total.ln())
}

/// Perplexity of natural-log probabilities: `exp(-(1/N) sum_t ln p_t)`.
///
/// ```
/// // Every token at probability 1/4: perplexity 4.
/// let lp = [0.25f64.ln(); 3];
/// assert!((lm_core::perplexity(&lp).unwrap() - 4.0).abs() < 1e-12);
/// ```
pub fn perplexity(logprobs: &[f64]) -> Result<f64> {
    if logprobs.is_empty() {
        return Err(Error::EmptyInput);
    }
    if let Some((index, &value)) = logprobs
        .iter()
        .enumerate()
        .find(|&(_, &lp)| lp.is_nan() || lp > 0.0)
    {
        return Err(Error::InvalidProbability { index, value });
    }
    let mean = logprobs.iter().sum::<f64>() / logprobs.len() as f64;
    Ok((-mean).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn product(factors: &[f64]) -> String {
        format!("{:.6}", sequence_logprob(factors).unwrap().exp())
    }

    #[test]
    fn lesson_001_five_factor_products() {
        // "The probability of each default run".
        assert_eq!(
            product(&[0.2334, 0.1179, 0.2015, 0.0938, 0.2696]),
            "0.000140"
        );
        assert_eq!(
            product(&[0.2334, 0.2388, 0.2450, 0.2495, 0.3438]),
            "0.001171"
        );
    }

    #[test]
    fn lesson_001_greedy_is_overtaken_at_four_tokens() {
        // "Where the greedy run is overtaken": the lesson prints 0.003405 and
        // 0.004104 from unrounded factors; its rounded factors give these.
        let greedy = [0.2334, 0.2388, 0.2450, 0.2495];
        let alternative = [0.2334, 0.2388, 0.1921, 0.3835];
        assert_eq!(product(&greedy), "0.003407");
        assert_eq!(product(&alternative), "0.004106");
        assert!(sequence_logprob(&alternative).unwrap() > sequence_logprob(&greedy).unwrap());
    }

    #[test]
    fn log_space_does_not_underflow() {
        let ln = sequence_logprob(&[1e-5; 100]).unwrap();
        assert!((ln - 100.0 * 1e-5f64.ln()).abs() < 1e-9);
        assert_eq!(ln.exp(), 0.0, "the product itself underflows");
    }

    #[test]
    fn running_total_matches_the_batch_functions() {
        let probs = [0.5, 0.25, 0.125];
        let mut run = LogProb::default();
        probs.iter().for_each(|&p| run.push_prob(p));
        assert_eq!(run.n_tokens(), 3);
        assert!((run.ln() - sequence_logprob(&probs).unwrap()).abs() < 1e-12);
        let lps: Vec<f64> = probs.iter().map(|p: &f64| p.ln()).collect();
        // Geometric mean of 1/2, 1/4, 1/8 is 1/4: perplexity 4.
        assert!((run.perplexity().unwrap() - 4.0).abs() < 1e-12);
        assert!((perplexity(&lps).unwrap() - 4.0).abs() < 1e-12);
        assert_eq!(LogProb::default().perplexity(), None);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert!(matches!(
            sequence_logprob(&[0.5, 1.5]),
            Err(Error::InvalidProbability { index: 1, .. })
        ));
        assert_eq!(perplexity(&[]), Err(Error::EmptyInput));
        assert!(matches!(
            perplexity(&[0.1]),
            Err(Error::InvalidProbability { index: 0, .. })
        ));
    }
}
