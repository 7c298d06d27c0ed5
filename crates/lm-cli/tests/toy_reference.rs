//! The lessons' toy decoder as an independent oracle: log-probabilities from
//! its reference path (explicit causal mask, no cache, the whole prefix
//! every time), which the command line's cached runs must reproduce.

use lm_core::TokenId;
use lm_model::{Decoder, Toy};

/// One toy decoder for every reference computation (building it draws its weights).
fn toy() -> &'static Decoder {
    static TOY: std::sync::OnceLock<Decoder> = std::sync::OnceLock::new();
    TOY.get_or_init(Toy::decoder)
}

/// ln p of every token after `prefix`.
pub fn next_logprobs(prefix: &[TokenId]) -> Vec<f64> {
    let logits = toy().reference_logits(prefix).unwrap();
    log_softmax(logits.row(prefix.len() - 1).to_vec())
}

/// ln p of each of `continuation` after `prompt`: one pass over prompt +
/// continuation, one row per continuation token.
pub fn continuation_logprobs(prompt: &[TokenId], continuation: &[TokenId]) -> Vec<f64> {
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(&continuation[..continuation.len() - 1]);
    let logits = toy().reference_logits(&tokens).unwrap();
    continuation
        .iter()
        .enumerate()
        .map(|(i, &token)| log_softmax(logits.row(prompt.len() - 1 + i).to_vec())[token as usize])
        .collect()
}

fn log_softmax(row: Vec<f32>) -> Vec<f64> {
    lm_core::log_softmax(&row, 1.0)
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}
