//! The typed errors of the transformer backend: a bad configuration or a
//! model file that disagrees with its own metadata names the problem.

use crate::gguf::GgufError;

/// Why a transformer could not be built or loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransformerError {
    /// A size in the configuration is zero.
    #[error("{field} must be positive")]
    ZeroSize {
        /// The configuration field.
        field: &'static str,
    },
    /// The head count does not divide the embedding width.
    #[error("head count {n_head} does not divide the embedding size {n_embd}")]
    HeadCountDoesNotDivide {
        /// The embedding width.
        n_embd: usize,
        /// The query head count.
        n_head: usize,
    },
    /// The key/value head count does not divide the query head count.
    #[error("key/value head count {n_kv_head} does not divide the head count {n_head}")]
    KvHeadCountDoesNotDivide {
        /// The query head count.
        n_head: usize,
        /// The key/value head count.
        n_kv_head: usize,
    },
    /// The rotary dimension is odd, zero or wider than a head.
    #[error("rotary embedding of dimension {dim} and base {base} does not fit heads of {head_dim}")]
    InvalidRope {
        /// The frequency base.
        base: f32,
        /// The rotary dimension.
        dim: usize,
        /// The head width.
        head_dim: usize,
    },
    /// The normalisation epsilon is negative or NaN.
    #[error("normalisation epsilon must be >= 0, got {value}")]
    InvalidNormEpsilon {
        /// The rejected epsilon.
        value: f32,
    },
    /// A weight's shape disagrees with the configuration.
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor name.
        name: String,
        /// The shape the configuration implies (rows, columns).
        expected: Vec<usize>,
        /// The shape found.
        found: Vec<usize>,
    },
    /// The number of layer weights differs from the configured layer count.
    #[error("{found} layers of weights for a configuration of {expected}")]
    LayerCount {
        /// The configured layer count.
        expected: usize,
        /// The layers supplied.
        found: usize,
    },
    /// A layer's feed-forward weights are of another kind than configured.
    #[error("feed-forward weights do not match the configured kind {expected:?}")]
    FfnKindMismatch {
        /// The configured kind.
        expected: super::FfnKind,
    },
    /// A normalisation layer is of another kind than configured.
    #[error("normalisation weights do not match the configured kind {expected:?}")]
    NormKindMismatch {
        /// The configured kind.
        expected: super::NormKind,
    },
    /// An unembedding matrix was given for a tied configuration, or none
    /// for an untied one.
    #[error("the configuration says tied_output = {tied_output}, the weights disagree")]
    OutputTying {
        /// The configured value.
        tied_output: bool,
    },
    /// A layer's optional part (a bias, a QK norm, a post norm) is given
    /// though the configuration does not ask for it, or missing though it does.
    #[error("layer part {part}: the configuration says {configured}, the weights disagree")]
    OptionalPart {
        /// The part.
        part: &'static str,
        /// Whether the configuration asks for it.
        configured: bool,
    },
    /// Learned positions are configured but no position table was given.
    #[error("learned positions need a position embedding table")]
    MissingPositionEmbedding,
    /// The file's architecture is not one this backend runs.
    #[error("architecture `{found}` is not supported; supported: {}", super::arch::SUPPORTED.join(", "))]
    UnsupportedArchitecture {
        /// `general.architecture` in the file.
        found: String,
    },
    /// Required metadata keys are absent (all of them are listed).
    #[error("missing metadata keys: {}", keys.join(", "))]
    MissingMetadata {
        /// Every missing key.
        keys: Vec<String>,
    },
    /// Required tensors are absent (all of them are listed).
    #[error("missing tensors: {}", names.join(", "))]
    MissingTensors {
        /// Every missing tensor name.
        names: Vec<String>,
    },
    /// The block count asks for more layers than the file has tensors for.
    #[error("block count {n_layer} is more layers than the file has tensors ({n_tensors})")]
    TooFewTensorsForLayers {
        /// The declared number of layers.
        n_layer: usize,
        /// Tensors in the file.
        n_tensors: usize,
    },
    /// A weight matrix is not two-dimensional.
    #[error("tensor {name} has dimensions {dims:?}, expected a matrix")]
    TensorRank {
        /// The tensor name.
        name: String,
        /// Its dimensions (ggml order).
        dims: Vec<usize>,
    },
    /// A scale, RoPE base or frequency factor is zero, negative or not finite.
    #[error("{name} must be finite and positive, got {value}")]
    InvalidScale {
        /// What the value is.
        name: &'static str,
        /// The rejected value.
        value: f32,
    },
    /// The RoPE frequency factors are not one per rotated pair.
    #[error("{found} rope frequency factors for {expected} rotated pairs")]
    RopeFreqFactorsLength {
        /// Rotated pairs (`rope dimension / 2`).
        expected: usize,
        /// Factors given.
        found: usize,
    },
    /// `attention.sliding_window_pattern` flags layers in no repeating
    /// pattern (or is not a period or one flag per layer).
    #[error(
        "{key}: only a repeating pattern is supported (layer i slides when i % p < p - 1, \
         one flag per layer or the period p)"
    )]
    UnsupportedSlidingWindowPattern {
        /// The metadata key.
        key: String,
    },
    /// A sliding window or its layer period is zero.
    #[error("sliding window of {window} positions every {period} layers: both must be positive")]
    InvalidSlidingWindow {
        /// Positions a query sees.
        window: usize,
        /// The layer pattern's period.
        period: usize,
    },
    /// A RoPE scaling kind this backend does not implement.
    #[error("rope scaling `{found}` is not supported; supported: none, linear, yarn")]
    UnsupportedRopeScaling {
        /// `{arch}.rope.scaling.type` in the file.
        found: String,
    },
    /// A mixture of experts' count, top-k or width does not fit (see
    /// [`MoeOptions`](super::MoeOptions)).
    #[error("{key} = {value}: {reason}")]
    InvalidExperts {
        /// The metadata key (or configuration field).
        key: String,
        /// The value found.
        value: usize,
        /// What it must be.
        reason: String,
    },
    /// Reading the model file failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
}
