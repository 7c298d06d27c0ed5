//! The typed shape of a decoder-only transformer: sizes, and which kind of
//! normalisation, positions and feed-forward block each layer uses.
//!
//! One [`TransformerConfig`] describes both the lessons' toy decoder (GPT-2
//! style: LayerNorm, learned positions, GELU MLP) and the llama architecture
//! (RMSNorm, rotary positions, grouped-query attention, SwiGLU), so the same
//! blocks and the same forward pass serve both.

use super::TransformerError;

/// Which normalisation the layers use before attention, before the
/// feed-forward block and before the unembedding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * weight + bias` (GPT-2).
    LayerNorm,
    /// `x / sqrt(mean(x^2) + eps) * weight` (llama).
    RmsNorm,
}

/// How a token learns its position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PositionKind {
    /// A learned vector per position added to the token embedding (GPT-2).
    Learned,
    /// Rotary position embeddings on queries and keys, rotating adjacent
    /// pairs `(x[2i], x[2i+1])` of the first `dim` components of each head
    /// by `pos * base^(-2i/dim)` (llama.cpp's "normal" mode).
    Rope {
        /// The frequency base (10000 in the original paper, 100000 for SmolLM2).
        base: f32,
        /// How many components of each head rotate (even, at most `head_dim`).
        dim: usize,
    },
}

/// The feed-forward block of each layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    /// `down(gelu(up(x)))` with the tanh approximation of GELU (GPT-2).
    GeluMlp,
    /// `down(silu(gate(x)) * up(x))` (llama).
    SwiGlu,
}

/// The precision of attention over the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvPrecision {
    /// Keys, values, queries and attention weights in f32.
    #[default]
    F32,
    /// llama.cpp's default (an f16 KV cache, flash attention off): keys and
    /// values are stored rounded to f16, and queries and attention weights
    /// are rounded to f16 before their products; sums stay in f32. Matching
    /// it moves SmolLM2's logits by up to ~1 toward llama.cpp's (its own
    /// f16-versus-f32 cache difference).
    F16,
}

/// The sizes and block kinds of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    /// Tokens in the vocabulary: the length of one logits row.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Number of transformer layers.
    pub n_layer: usize,
    /// Number of query heads.
    pub n_head: usize,
    /// Number of key/value heads (`n_head` for plain multi-head attention;
    /// fewer for grouped-query attention, each shared by `n_head / n_kv_head`
    /// query heads).
    pub n_kv_head: usize,
    /// Width of one head (`n_embd / n_head`).
    pub head_dim: usize,
    /// Hidden width of the feed-forward block.
    pub ffn_dim: usize,
    /// The longest prefix the model reads (the KV cache's capacity).
    pub context_length: usize,
    /// The normalisation kind.
    pub norm: NormKind,
    /// The normalisation epsilon.
    pub norm_eps: f32,
    /// The position encoding.
    pub position: PositionKind,
    /// The feed-forward block kind.
    pub ffn: FfnKind,
    /// Whether the unembedding reuses the token embedding matrix.
    pub tied_output: bool,
    /// The precision of attention over the KV cache.
    pub kv_precision: KvPrecision,
}

impl TransformerConfig {
    /// Width of all query heads together (`n_head * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key (or value) heads together (`n_kv_head * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Checks that the sizes fit together: every size positive, the head
    /// count divides the embedding width, the key/value head count divides
    /// the head count, and the rotary dimension is even and fits in a head.
    pub fn validate(&self) -> Result<(), TransformerError> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
            ("head_dim", self.head_dim),
            ("ffn_dim", self.ffn_dim),
            ("context_length", self.context_length),
        ];
        if let Some(&(field, _)) = sizes.iter().find(|(_, value)| *value == 0) {
            return Err(TransformerError::ZeroSize { field });
        }
        if !self.n_embd.is_multiple_of(self.n_head) || self.n_embd / self.n_head != self.head_dim {
            return Err(TransformerError::HeadCountDoesNotDivide {
                n_embd: self.n_embd,
                n_head: self.n_head,
            });
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return Err(TransformerError::KvHeadCountDoesNotDivide {
                n_head: self.n_head,
                n_kv_head: self.n_kv_head,
            });
        }
        if let PositionKind::Rope { base, dim } = self.position
            && (dim == 0
                || !dim.is_multiple_of(2)
                || dim > self.head_dim
                || base.is_nan()
                || base <= 0.0)
        {
            return Err(TransformerError::InvalidRope {
                base,
                dim,
                head_dim: self.head_dim,
            });
        }
        if self.norm_eps.is_nan() || self.norm_eps < 0.0 {
            return Err(TransformerError::InvalidNormEpsilon {
                value: self.norm_eps,
            });
        }
        Ok(())
    }
}
