//! The GGML weight types this crate reads, with their block geometry.
//!
//! Quantized types store a row as consecutive blocks of 32 weights, or
//! "super-blocks" of 256 for the K-quants and IQ4_XS; float types are
//! "blocks" of one element. Every id GGML has given a type is named here
//! ([`GGML_TYPE_NAMES`]), so a file of a type this crate cannot read is
//! refused with the type's name. A row of `n_cols` weights takes
//! `n_cols / block_size * block_bytes` bytes, and `n_cols` must be a multiple of
//! the block size.

use std::fmt;

use rayon::prelude::*;

use super::block::non_finite_field;
use super::{NonFinite, QuantError};

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
    /// Blocks of 32: an f16 scale `d`, 4 bytes of fifth bits and 16 bytes of
    /// low nibbles, `q` in 0..32; `x = d * (q - 16)`.
    Q5_0 = 6,
    /// Blocks of 32: f16 scale `d`, f16 minimum `m`, 4 bytes of fifth bits and
    /// 16 bytes of low nibbles, `q` in 0..32; `x = d * q + m`.
    Q5_1 = 7,
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
    /// Blocks of 32: an f16 scale `d` and 16 bytes of 4-bit indices `i` into a
    /// fixed non-linear table; `x = d * IQ4_NL_VALUES[i]`.
    IQ4_NL = 20,
    /// Super-blocks of 256: 4-bit indices into a fixed non-linear table of 16
    /// values, in 8 groups of 32 with 6-bit scales.
    IQ4_XS = 23,
    /// bfloat16 (the top half of an f32), 2 bytes per element.
    BF16 = 30,
    /// Blocks of 32: an E8M0 exponent byte `e` and 16 bytes of FP4 (E2M1)
    /// codes `i`; `x = 2^(e - 128) * MXFP4_VALUES[i]` (gpt-oss's experts).
    MXFP4 = 39,
}

/// Every supported type, in id order.
pub const SUPPORTED_TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::BF16,
    GgmlType::MXFP4,
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

/// GGML's name of every type id it has assigned, indexed by id (`enum
/// ggml_type` in ggml.h), removed ones included (Q4_2, Q4_3, the repacked
/// Q4_0_4_4 .. IQ4_NL_8_8): the name an error gives a type this crate cannot
/// read.
const GGML_TYPE_NAMES: [&str; 42] = [
    "F32",
    "F16",
    "Q4_0",
    "Q4_1",
    "Q4_2",
    "Q4_3",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q8_1", // 0..=9
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "Q8_K",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ3_XXS", // 10..=18
    "IQ1_S",
    "IQ4_NL",
    "IQ3_S",
    "IQ2_S",
    "IQ4_XS",
    "I8",
    "I16",
    "I32",
    "I64",
    "F64", // 19..=28
    "IQ1_M",
    "BF16",
    "Q4_0_4_4",
    "Q4_0_4_8",
    "Q4_0_8_8",
    "TQ1_0",
    "TQ2_0", // 29..=35
    "IQ4_NL_4_4",
    "IQ4_NL_4_8",
    "IQ4_NL_8_8",
    "MXFP4",
    "NVFP4",
    "Q1_0", // 36..=41
];

/// A GGML type id this crate cannot read, displayed with GGML's name for it:
/// `Q4_0_4_4 (type 31)`, or `unknown type id 99` past GGML's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnsupportedType {
    /// The id in the file.
    pub id: u32,
}

impl UnsupportedType {
    /// GGML's name of the id, if GGML has assigned it.
    fn ggml_name(self) -> Option<&'static str> {
        usize::try_from(self.id)
            .ok()
            .and_then(|idx| GGML_TYPE_NAMES.get(idx).copied())
    }
}

impl fmt::Display for UnsupportedType {
    /// `Q4_0_4_4 (type 31) is not supported; supported: f32, f16, ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ggml_name() {
            Some(name) => write!(f, "{name} (type {}) is not supported", self.id)?,
            None => write!(f, "unknown type id {}", self.id)?,
        }
        f.write_str("; supported: ")?;
        for (idx, ty) in SUPPORTED_TYPES.iter().enumerate() {
            if idx > 0 {
                f.write_str(", ")?;
            }
            f.write_str(ty.name())?;
        }
        Ok(())
    }
}

impl GgmlType {
    /// The type with GGML id `id`; ids of types this crate cannot read are an error.
    ///
    /// ```
    /// use lm_model::GgmlType;
    /// assert_eq!(GgmlType::from_id(3).unwrap(), GgmlType::Q4_1);
    /// let error = GgmlType::from_id(31).unwrap_err();
    /// assert!(error.to_string().starts_with("Q4_0_4_4 (type 31) is not supported; supported: f32"));
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
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q2_K => "q2_K",
            GgmlType::Q3_K => "q3_K",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::IQ4_NL => "iq4_nl",
            GgmlType::IQ4_XS => "iq4_xs",
            GgmlType::BF16 => "bf16",
            GgmlType::MXFP4 => "mxfp4",
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
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => ActivationKind::Q8,
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
            GgmlType::Q4_0 | GgmlType::IQ4_NL => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::IQ4_XS => 136,
            GgmlType::MXFP4 => super::mxfp4::BLOCK_BYTES,
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

    /// Errors with the first block of `data` (whole blocks of this type)
    /// whose f16 scale or minimum, or whose value for a float type, is NaN
    /// or infinite, as GGML's `ggml_validate_row_data` refuses it: such a
    /// block would turn every product it enters into NaN. Large data is
    /// scanned in parallel; the error names the lowest bad block whatever
    /// the thread count.
    ///
    /// ```
    /// use lm_model::GgmlType;
    /// let mut block = [0u8; 18]; // a Q4_0 block: f16 scale, 16 bytes of nibbles
    /// assert!(GgmlType::Q4_0.validate(&block).is_ok());
    /// block[..2].copy_from_slice(&0x7E00u16.to_le_bytes()); // f16 NaN
    /// let error = GgmlType::Q4_0.validate(&block).unwrap_err();
    /// assert_eq!(error.to_string(), "block 0 of q4_0 data has scale d = NaN");
    /// ```
    pub fn validate(self, data: &[u8]) -> Result<(), QuantError> {
        /// Blocks scanned by one rayon task.
        const BLOCKS_PER_TASK: usize = 1 << 14;
        let block_bytes = self.block_bytes();
        let first_bad = |(task_idx, chunk): (usize, &[u8])| {
            chunk
                .chunks_exact(block_bytes)
                .enumerate()
                .find_map(|(idx, block)| {
                    let (what, value) = non_finite_field(self, block)?;
                    Some(QuantError::NonFiniteValue {
                        ty: self,
                        block_idx: task_idx * BLOCKS_PER_TASK + idx,
                        what,
                        value: NonFinite::of(value),
                    })
                })
        };
        let task_bytes = BLOCKS_PER_TASK * block_bytes;
        let bad = if data.len() > task_bytes && rayon::current_num_threads() > 1 {
            data.par_chunks(task_bytes)
                .enumerate()
                .find_map_first(first_bad)
        } else {
            data.chunks(task_bytes).enumerate().find_map(first_bad)
        };
        bad.map_or(Ok(()), Err)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
