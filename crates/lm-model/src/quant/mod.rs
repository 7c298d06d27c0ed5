//! GGML weight types and the kernels that multiply with them.
//!
//! - [`GgmlType`]: F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants Q2_K,
//!   Q3_K, Q4_K, Q5_K and Q6_K, IQ4_XS, and MXFP4 (`mxfp4`: gpt-oss's
//!   experts), with their block sizes.
//! - [`QMatrix`]: a borrowed matrix of blocks with `matvec`, batched `matmul`
//!   and bit-exact `dequantize_row`.
//! - [`Kernel`]: the portable path and the x86_64 AVX2, AVX-VNNI and AVX-512
//!   paths, chosen at run time (`LM_KERNEL` overrides the choice).
//!
//! Block layouts are drawn in the `block` and `block_k` modules' docs; products run on the
//! blocks directly and never dequantize a whole matrix.

pub(crate) mod activation;
pub(crate) mod block;
pub(crate) mod block_k;

mod ggml_type;
mod matrix;
pub(crate) mod mxfp4;
pub(crate) mod packed;
pub(crate) mod packed_k;
mod quantize;

pub use crate::kernels::dispatch::{KERNEL_ENV, Kernel, PACK_ENV, Packing};
pub(crate) use ggml_type::UnsupportedType;
pub use ggml_type::{GgmlType, SUPPORTED_TYPES};
pub use matrix::QMatrix;
pub use quantize::QuantizeError;

/// Bad input to a quant routine: every variant carries the offending values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// A GGML type id this crate cannot read, named as GGML names it.
    #[error("{}", UnsupportedType { id: *id })]
    UnknownType {
        /// The rejected id.
        id: u32,
    },
    /// A row length that is not a whole number of blocks.
    #[error("{ty} rows need a multiple of {block_size} columns, got {n_cols}")]
    NotBlockMultiple {
        /// The element type.
        ty: GgmlType,
        /// The rejected row length.
        n_cols: usize,
        /// The type's block size.
        block_size: usize,
    },
    /// The byte size of a matrix does not fit in `usize`.
    #[error("a {n_rows} x {n_cols} matrix is too large to address")]
    SizeOverflow {
        /// Number of rows.
        n_rows: usize,
        /// Number of columns.
        n_cols: usize,
    },
    /// The data is not exactly the size the shape requires.
    #[error("a {n_rows} x {n_cols} {ty} matrix takes {expected} bytes, got {actual}")]
    DataLength {
        /// The element type.
        ty: GgmlType,
        /// Number of rows.
        n_rows: usize,
        /// Number of columns.
        n_cols: usize,
        /// Bytes the shape requires.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// A vector or matrix argument of the wrong length.
    #[error("{what} has length {actual}, expected {expected}")]
    ShapeMismatch {
        /// Which argument.
        what: &'static str,
        /// The length the matrix's shape requires.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A row index past the last row.
    #[error("row {row_idx} is out of range for a matrix of {n_rows} rows")]
    RowOutOfRange {
        /// The rejected index.
        row_idx: usize,
        /// Number of rows.
        n_rows: usize,
    },
    /// A block whose f16 scale or minimum (or a float weight) is NaN or
    /// infinite ([`GgmlType::validate`]).
    #[error("block {block_idx} of {ty} data has {what} = {value}")]
    NonFiniteValue {
        /// The element type.
        ty: GgmlType,
        /// The block's index in the data (the element's, for a float type).
        block_idx: usize,
        /// The field: `scale d`, `minimum m`, or `value` for a float type.
        what: &'static str,
        /// What it holds.
        value: NonFinite,
    },
    /// A kernel this CPU cannot run.
    #[error("kernel {kernel} is not available on this cpu")]
    KernelUnavailable {
        /// The requested kernel.
        kernel: Kernel,
    },
    /// A kernel name (`LM_KERNEL`'s value) that names no kernel.
    #[error("unknown kernel {name:?}; kernels: portable, avx2, avxvnni, avx512")]
    UnknownKernel {
        /// The name given.
        name: String,
    },
    /// A packing (`LM_PACK`'s value) that names no [`Packing`].
    #[error("unknown packing {name:?}; expected 0 (row-major), 1 (Q4_0, Q5_0 and Q8_0) or all")]
    UnknownPacking {
        /// The value given.
        name: String,
    },
}

/// A float that is not finite, as [`QuantError::NonFiniteValue`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NonFinite {
    /// Not a number.
    NaN,
    /// Positive infinity.
    Infinity,
    /// Negative infinity.
    NegativeInfinity,
}

impl NonFinite {
    /// The kind of a value that is not finite (`NaN` for anything else too,
    /// which callers never pass).
    fn of(value: f32) -> NonFinite {
        match value {
            f32::INFINITY => NonFinite::Infinity,
            f32::NEG_INFINITY => NonFinite::NegativeInfinity,
            _ => NonFinite::NaN,
        }
    }
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NonFinite::NaN => "NaN",
            NonFinite::Infinity => "inf",
            NonFinite::NegativeInfinity => "-inf",
        })
    }
}
