//! The typed errors of lm-core: every bad input names itself.

use crate::TokenId;

/// Bad input to an lm-core routine or to a [`crate::LanguageModel`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The temperature is negative or NaN (0 means argmax, +inf means uniform).
    #[error("temperature must be >= 0 and not NaN, got {value}")]
    InvalidTemperature {
        /// The rejected temperature.
        value: f32,
    },
    /// A distribution over zero tokens was asked for.
    #[error("logits are empty")]
    EmptyLogits,
    /// A logit is NaN or +inf; only -inf is allowed (a masked token).
    #[error("logit {index} is {value}; logits must be finite or -inf")]
    InvalidLogit {
        /// Position of the bad logit.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// Every logit is -inf, so no token can be chosen.
    #[error("every token is masked (all logits are -inf)")]
    AllMasked,
    /// A probability is negative, NaN, or the probabilities do not sum to 1.
    #[error("invalid probability {value} at index {index}")]
    InvalidProbability {
        /// Position of the bad probability.
        index: usize,
        /// Its value.
        value: f64,
    },
    /// A uniform draw outside [0, 1).
    #[error("uniform draw must be in [0, 1), got {value}")]
    UniformOutOfRange {
        /// The rejected draw.
        value: f64,
    },
    /// A token id beyond the vocabulary: fed to a model, or named by a
    /// decoding parameter (end tokens, bias, bans) or a history.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The rejected id.
        id: TokenId,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// Label smoothing outside [0, 1].
    #[error("label smoothing must be in [0, 1], got {value}")]
    InvalidLabelSmoothing {
        /// The rejected epsilon.
        value: f32,
    },
    /// Two inputs that must have the same length do not.
    #[error("length mismatch: {left} != {right}")]
    LengthMismatch {
        /// Length of the first input.
        left: usize,
        /// Length of the second input.
        right: usize,
    },
    /// A prefix longer than the model's context bound.
    #[error("sequence of {len} tokens exceeds the context length {max}")]
    ContextExceeded {
        /// Tokens the model would have to read.
        len: usize,
        /// The model's context bound.
        max: usize,
    },
    /// A forward pass over zero tokens.
    #[error("no tokens to process")]
    EmptyInput,
    /// A token that a structured-output constraint does not allow here.
    #[error("token {id} is not allowed by the output constraint")]
    TokenNotAllowed {
        /// The refused token.
        id: TokenId,
    },
    /// The structured-output engine failed; its own message, as it gave it.
    #[error("output constraint: {message}")]
    ConstraintEngine {
        /// The engine's message.
        message: String,
    },
}

/// `error` and its sources on one line, `what: why: ...`, as lm-cli prints
/// an error: for a message that must carry the cause (a template's
/// `raise_exception` text, the stage that refused a file).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a message and, optionally, a source.
    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layer(message: &'static str, source: Option<Layer>) -> Layer {
        let source = source.map(Box::new);
        Layer { message, source }
    }

    #[test]
    fn the_chain_joins_the_error_and_every_source_in_order() {
        let lone = layer("bad file", None);
        assert_eq!(error_chain(&lone), "bad file");
        let chained = layer(
            "model",
            Some(layer("tokenizer", Some(layer("no vocabulary", None)))),
        );
        assert_eq!(error_chain(&chained), "model: tokenizer: no vocabulary");
    }
}
