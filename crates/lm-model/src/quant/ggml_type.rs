//! The GGML weight types this crate reads, with their block geometry.
//!
//! Quantized types store a row as consecutive blocks of 32 weights, or
//! "super-blocks" of 256 for the K-quants; float types are "blocks" of one
//! element. A row of `n_cols` weights takes
//! `n_cols / block_size * block_bytes` bytes, and `n_cols` must be a multiple of
//! the block size.

use std::fmt;

use super::QuantError;

/// A GGML tensor element type that this crate can read and multiply with.
///
/// The discriminants are GGML's type ids as stored in GGUF tensor infos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types)] // GGML's names: `Q4_K`, `IQ4_XS`
pub enum GgmlType {
    /// IEEE 754 single precision, 4 bytes per element.
    F32 = 0,
    /// IEEE 754 half precision, 2 bytes per element.
    F16 = 1,
    /// Blocks of 32: an f16 scale `d` and 16 bytes of 4-bit values `q`; `x = d * (q - 8)`.
    Q4_0 = 2,
    /// Blocks of 32: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit values `q`; `x = d * q + m`.
    Q4_1 = 3,
    /// Blocks of 32: an f16 scale `d` and 32 signed bytes `q`; `x = d * q`.
    Q8_0 = 8,
    /// Super-blocks of 256: 2-bit values in 16 groups with 4-bit scales and minimums.
    Q2_K = 10,
    /// Super-blocks of 256: 3-bit values in 16 groups with 6-bit scales.
    Q3_K = 11,
    /// Super-blocks of 256: 4-bit values in 8 groups with 6-bit scales and minimums.
    Q4_K = 12,
    /// Super-blocks of 256: 5-bit values in 8 groups with 6-bit scales and minimums.
    Q5_K = 13,
    /// Super-blocks of 256: 6-bit values in 16 groups with 8-bit scales.
    Q6_K = 14,
    /// Super-blocks of 256: 4-bit indices into a fixed non-linear table of 16
    /// values, in 8 groups of 32 with 6-bit scales.
    IQ4_XS = 23,
    /// bfloat16 (the top half of an f32), 2 bytes per element.
    BF16 = 30,
}

/// Every supported type, in id order.
pub const SUPPORTED_TYPES: [GgmlType; 12] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
    GgmlType::BF16,
];

/// The form of the activations a weight type is multiplied with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActivationKind {
    /// The f32 values themselves (float weights).
    F32,
    /// 32-value [`Q8Block`](super::activation::Q8Block)s (the 32-weight block types).
    Q8,
    /// 256-value [`Q8KBlock`](super::activation::Q8KBlock)s (the K-quants).
    Q8K,
}

impl GgmlType {
    /// The type with GGML id `id`; ids of types this crate cannot read are an error.
    ///
    /// ```
    /// use lm_model::GgmlType;
    /// assert_eq!(GgmlType::from_id(3).unwrap(), GgmlType::Q4_1);
    /// assert!(GgmlType::from_id(20).is_err()); // IQ4_NL: not supported
    /// ```
    pub fn from_id(id: u32) -> Result<GgmlType, QuantError> {
        SUPPORTED_TYPES
            .into_iter()
            .find(|ty| ty.id() == id)
            .ok_or(QuantError::UnknownType { id })
    }

    /// GGML's numeric id of this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// GGML's name of this type (`"q4_1"`, `"f32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q2_K => "q2_K",
            GgmlType::Q3_K => "q3_K",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::IQ4_XS => "iq4_xs",
            GgmlType::BF16 => "bf16",
        }
    }

    /// Number of weights in one block (1 for the float types, 32 for the
    /// 32-weight block types, 256 for the K-quants).
    pub fn block_size(self) -> usize {
        match self.activation_kind() {
            ActivationKind::F32 => 1,
            ActivationKind::Q8 => 32,
            ActivationKind::Q8K => 256,
        }
    }

    /// The activations this type's rows multiply with: each family of block
    /// types has its own 8-bit activation block, matching llama.cpp's
    /// `vec_dot_type`.
    pub(crate) fn activation_kind(self) -> ActivationKind {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActivationKind::F32,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => ActivationKind::Q8,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS => ActivationKind::Q8K,
        }
    }

    /// Number of bytes one block occupies.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::IQ4_XS => 136,
        }
    }

    /// Whether the type is block-quantized (as opposed to a plain float type).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by a row of `n_cols` weights.
    ///
    /// Errors if `n_cols` is not a multiple of the block size or the byte count overflows.
    ///
    /// ```
    /// use lm_model::GgmlType;
    /// assert_eq!(GgmlType::Q4_1.row_bytes(576).unwrap(), 18 * 20);
    /// assert!(GgmlType::Q4_1.row_bytes(40).is_err());
    /// ```
    pub fn row_bytes(self, n_cols: usize) -> Result<usize, QuantError> {
        let block_size = self.block_size();
        if !n_cols.is_multiple_of(block_size) {
            return Err(QuantError::NotBlockMultiple {
                ty: self,
                n_cols,
                block_size,
            });
        }
        (n_cols / block_size)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::SizeOverflow { n_rows: 1, n_cols })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
