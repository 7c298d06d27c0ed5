//! Tensor infos and borrowed views of tensor data.
//!
//! ```text
//! tensor info: | name: string | n_dims: u32 | dims: n_dims x u64 | type: u32 | offset: u64 |
//! dims are in ggml order: dims[0] is the row length (contiguous), dims[1] the row count
//! offset is relative to the data section, which starts at the first multiple of the
//! alignment after the last tensor info
//! ```

use std::fmt;

use super::GgufError;
use super::cursor::Cursor;
use crate::quant::{GgmlType, QMatrix};

/// GGML's limit on the number of dimensions.
pub const MAX_DIMS: u32 = 4;

/// Where a tensor lives and what it holds (validated against the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the row length.
    pub dims: Vec<usize>,
    /// The element type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data within the data section (a multiple of the alignment).
    pub offset: usize,
    /// Size of the data in bytes.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Number of elements (the product of the dimensions).
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Row length (`dims[0]`).
    pub fn n_cols(&self) -> usize {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of `dims[1..]`).
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product()
    }
}

impl fmt::Display for TensorInfo {
    /// `name type [d0, d1] (n bytes at offset o)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {:?} ({} bytes at offset {})",
            self.name, self.ggml_type, self.dims, self.n_bytes, self.offset
        )
    }
}

/// A tensor's info together with its bytes in the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// Name, shape, type and location.
    pub info: &'a TensorInfo,
    /// Exactly `info.n_bytes` bytes of data.
    pub data: &'a [u8],
    /// Whether `data` is packed in panels ([`GgufFile::pack_tensors`](super::GgufFile::pack_tensors))
    /// rather than in GGUF's row-major layout.
    pub(crate) packed: bool,
}

impl<'a> TensorView<'a> {
    /// The tensor as an `n_rows x n_cols` matrix: `n_cols = dims[0]`, the other
    /// dimensions flattened into rows (a 1-d tensor is one row).
    pub fn matrix(&self) -> Result<QMatrix<'a>, GgufError> {
        QMatrix::new(
            self.info.ggml_type,
            self.info.n_rows(),
            self.info.n_cols(),
            self.data,
        )
        .map(|matrix| {
            if self.packed {
                matrix.in_panels()
            } else {
                matrix
            }
        })
        .map_err(|source| GgufError::TensorShape {
            name: self.info.name.clone(),
            source,
        })
    }

    /// All elements as f32, in storage order (for small tensors such as norm weights).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, GgufError> {
        Ok(self.matrix()?.to_f32_vec())
    }
}

/// Reads one tensor info, checking its dimensions and type (not yet its offset).
pub(crate) fn read_tensor_info(cursor: &mut Cursor<'_>) -> Result<TensorInfo, GgufError> {
    let name = cursor.string("tensor name")?.to_owned();
    let n_dims = cursor.u32("tensor dimension count")?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::BadDimCount { name, n_dims });
    }
    let mut raw_dims = Vec::with_capacity(MAX_DIMS as usize);
    for _ in 0..n_dims {
        raw_dims.push(cursor.u64("tensor dimension")?);
    }
    let type_id = cursor.u32("tensor type")?;
    let raw_offset = cursor.u64("tensor offset")?;
    let Ok(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType { name, type_id });
    };
    let row_len = raw_dims[0];
    let block_size = ggml_type.block_size();
    if !row_len.is_multiple_of(block_size as u64) {
        return Err(GgufError::RowNotBlockMultiple {
            name,
            ty: ggml_type,
            row_len,
            block_size,
        });
    }
    // The row count (every dimension but the first), the element count and
    // the byte count must all fit, even when a zero dimension makes the
    // element and byte counts 0 (`n_rows` multiplies the others alone).
    let n_rows = raw_dims
        .iter()
        .skip(1)
        .try_fold(1u64, |acc, &dim| acc.checked_mul(dim));
    let row_bytes = (row_len / block_size as u64).checked_mul(ggml_type.block_bytes() as u64);
    let n_bytes = n_rows
        .filter(|&rows| rows.checked_mul(row_len).is_some())
        .zip(row_bytes)
        .and_then(|(rows, row_bytes)| rows.checked_mul(row_bytes));
    let to_usize = |v: u64| usize::try_from(v).ok();
    let (Some(n_bytes), Some(dims)) = (
        n_bytes.and_then(to_usize),
        raw_dims
            .iter()
            .map(|&d| to_usize(d))
            .collect::<Option<Vec<_>>>(),
    ) else {
        return Err(GgufError::DimsOverflow {
            name,
            dims: raw_dims,
        });
    };
    // An offset beyond usize cannot lie inside the file either; saturate and let
    // the bounds check report it with the original value below.
    let offset = to_usize(raw_offset).unwrap_or(usize::MAX);
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes,
    })
}
