//! [`GgufError`]: everything that can be wrong with a GGUF file or a lookup in it.

use std::path::PathBuf;

use crate::quant::{GgmlType, QuantError, UnsupportedType};

/// A malformed GGUF file, or a metadata / tensor lookup that failed.
///
/// Parse errors carry the offending values and, where it helps, the byte
/// offset in the file at which the bad field starts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, read or mapped.
    #[error("cannot read gguf file {path:?}")]
    Io {
        /// The path given.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A directory, device, FIFO or socket: only a regular file is read
    /// (a FIFO would be waited on, `/dev/zero` read forever).
    #[error("cannot read gguf file {path:?}: not a regular file")]
    NotRegularFile {
        /// The path given.
        path: PathBuf,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a gguf file: {}", describe_magic(found))]
    BadMagic {
        /// The first four bytes (fewer if the file is shorter).
        found: Vec<u8>,
    },
    /// A version other than 2 or 3.
    #[error("unsupported gguf version {version} (supported: 2, 3)")]
    UnsupportedVersion {
        /// The version in the header.
        version: u32,
    },
    /// The file ends inside a field.
    #[error(
        "file truncated reading {what} at offset {offset}: need {needed} bytes, {available} left"
    )]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A count that cannot fit in the rest of the file, even at the smallest item size.
    #[error(
        "{what} count {count} at offset {offset} cannot fit: {remaining} bytes left, each item takes at least {min_item_bytes}"
    )]
    CountBeyondFile {
        /// What is being counted.
        what: &'static str,
        /// The count in the file.
        count: u64,
        /// Smallest encoding of one item.
        min_item_bytes: u64,
        /// Where the count was read.
        offset: u64,
        /// Bytes left in the file after the count.
        remaining: u64,
    },
    /// A string whose length runs past the end of the file.
    #[error("{what} at offset {offset} has length {len}, but only {remaining} bytes are left")]
    StringBeyondFile {
        /// Which string.
        what: &'static str,
        /// The length in the file.
        len: u64,
        /// Where the string's bytes start.
        offset: u64,
        /// Bytes left in the file.
        remaining: u64,
    },
    /// A key, name or string value that is not UTF-8.
    #[error("{what} at offset {offset} is not valid utf-8")]
    InvalidUtf8 {
        /// Which string.
        what: &'static str,
        /// Where the string's bytes start.
        offset: u64,
    },
    /// A metadata value type id outside 0..=12.
    #[error("unknown metadata value type {type_id} at offset {offset}")]
    UnknownValueType {
        /// The type id in the file.
        type_id: u32,
        /// Where it was read.
        offset: u64,
    },
    /// A bool stored as a byte other than 0 or 1.
    #[error("invalid bool byte {value} at offset {offset}")]
    InvalidBool {
        /// The byte in the file.
        value: u8,
        /// Where it was read.
        offset: u64,
    },
    /// Arrays nested deeper than this reader follows.
    #[error("arrays nested deeper than {max_depth} levels at offset {offset}")]
    NestingTooDeep {
        /// The deepest nesting accepted.
        max_depth: usize,
        /// Where the too-deep array starts.
        offset: u64,
    },
    /// The same metadata key twice.
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// `general.alignment` is 0 or not a power of two.
    #[error("alignment {alignment} is not a power of two")]
    BadAlignment {
        /// The alignment in the file.
        alignment: u64,
    },
    /// A tensor with no dimensions or more than GGML's four.
    #[error("tensor {name:?} has {n_dims} dimensions, expected 1 to 4")]
    BadDimCount {
        /// The tensor's name.
        name: String,
        /// The number of dimensions in the file.
        n_dims: u32,
    },
    /// A tensor whose element count or byte size overflows 64 bits.
    #[error("tensor {name:?} has dimensions {dims:?} whose size overflows")]
    DimsOverflow {
        /// The tensor's name.
        name: String,
        /// Its dimensions, ggml order.
        dims: Vec<u64>,
    },
    /// A tensor type id this crate cannot read, named as GGML names it.
    #[error("tensor {name:?}: {}", UnsupportedType { id: *type_id })]
    UnknownTensorType {
        /// The tensor's name.
        name: String,
        /// The type id in the file.
        type_id: u32,
    },
    /// A quantized tensor whose rows are not whole blocks.
    #[error(
        "tensor {name:?} of type {ty} has rows of {row_len} elements, not a multiple of {block_size}"
    )]
    RowNotBlockMultiple {
        /// The tensor's name.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// `dims[0]`.
        row_len: u64,
        /// The type's block size.
        block_size: usize,
    },
    /// A tensor offset that is not a multiple of the file's alignment.
    #[error("tensor {name:?} data offset {offset} is not a multiple of the alignment {alignment}")]
    TensorMisaligned {
        /// The tensor's name.
        name: String,
        /// Its offset within the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose bytes extend past the data section.
    #[error(
        "tensor {name:?} data [{offset}, {offset} + {n_bytes}) lies outside the data section of {data_len} bytes"
    )]
    TensorOutOfBounds {
        /// The tensor's name.
        name: String,
        /// Its offset within the data section.
        offset: u64,
        /// Its size in bytes.
        n_bytes: u64,
        /// The size of the data section.
        data_len: u64,
    },
    /// The same tensor name twice.
    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor {
        /// The repeated name.
        name: String,
    },
    /// A metadata key that is not in the file.
    #[error("metadata key {key:?} not found")]
    MissingKey {
        /// The key looked up.
        key: String,
    },
    /// A metadata value of another type than the getter reads.
    #[error("metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        /// The key looked up.
        key: String,
        /// What the getter accepts.
        expected: &'static str,
        /// The type found.
        found: &'static str,
    },
    /// An integer metadata value that does not fit the getter's type.
    #[error("metadata key {key:?} holds {value}, which does not fit in {expected}")]
    ValueOutOfRange {
        /// The key looked up.
        key: String,
        /// The value found.
        value: i128,
        /// The getter's type.
        expected: &'static str,
    },
    /// A tensor name that is not in the file.
    #[error("tensor {name:?} not found")]
    MissingTensor {
        /// The name looked up.
        name: String,
    },
    /// A tensor with a NaN or infinite scale, minimum or float value
    /// ([`GgufFile::validate_tensor_data`](super::GgufFile::validate_tensor_data)).
    #[error("tensor {name:?}: {defect}")]
    InvalidTensorData {
        /// The tensor's name.
        name: String,
        /// The first bad block (`QuantError::NonFiniteValue`).
        defect: QuantError,
    },
    /// A tensor that cannot be viewed as a matrix.
    #[error("tensor {name:?} cannot be viewed as a matrix")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// Why.
        #[source]
        source: QuantError,
    },
}

/// The magic bytes found, as hex and as text (`0x47474d4c ("GGML")`), a
/// byte that is not printable ASCII shown as `.`.
fn describe_magic(found: &[u8]) -> String {
    if found.is_empty() {
        return "the file is empty (expected the magic \"GGUF\")".to_owned();
    }
    let hex: String = found.iter().map(|b| format!("{b:02x}")).collect();
    let text: String = found
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            }
        })
        .collect();
    format!("magic is 0x{hex} ({text:?}), expected 0x47475546 (\"GGUF\")")
}
