//! A GGUF version 3 writer: the layout the reader in this module parses
//! (drawn in the module docs), as ggml's `gguf_write_to_file` writes it.
//!
//! Metadata pairs keep the order they are set in; tensor infos are written
//! in the order they are added, their data in the same order, each tensor's
//! data starting at a multiple of `general.alignment` (default 32) from the
//! start of the data section and padded with zeros. The file is written to a
//! temporary file beside the destination and renamed over it only once
//! complete and flushed to disk, so an error never leaves a partial file nor
//! damages an existing one.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use lm_model::{GgmlType, GgufFile, GgufWriter, MetadataValue};
//! let dir = std::env::temp_dir().join(format!("gguf-writer-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("tiny.gguf");
//! let mut writer = GgufWriter::new();
//! writer.set("general.architecture", MetadataValue::String("llama".into()));
//! writer.add_tensor("norm.weight", &[4], GgmlType::F32)?;
//! writer.write(&path, |_, info| {
//!     Ok([1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect())
//! })?;
//! let file = GgufFile::map(&path)?;
//! assert_eq!(file.get_str("general.architecture")?, "llama");
//! assert_eq!(file.tensor("norm.weight")?.to_f32_vec()?, [1.0, 2.0, 3.0, 4.0]);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

use std::fs::{self, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::tensor::MAX_DIMS;
use super::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MetadataValue, TensorInfo};
use crate::quant::GgmlType;

/// The error a tensor's data source gives [`GgufWriter::write`].
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Why a GGUF file could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// Creating, writing, syncing or renaming the file failed.
    #[error("cannot write gguf file {path:?}")]
    Io {
        /// The file being written (the temporary one, or the destination).
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A tensor name added twice.
    #[error("tensor {name:?} added twice")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// No dimensions, more than GGML's four, or a shape the type cannot hold.
    #[error("tensor {name:?}: {reason}")]
    BadShape {
        /// The tensor.
        name: String,
        /// What is wrong with its dimensions.
        reason: String,
    },
    /// `general.alignment` set to something other than a power of two that
    /// fits a u32.
    #[error("general.alignment must be a power of two, got {value}")]
    BadAlignment {
        /// The value set.
        value: String,
    },
    /// The data source gave a tensor the wrong number of bytes.
    #[error("tensor {name:?} takes {expected} bytes, its data has {actual}")]
    DataLength {
        /// The tensor.
        name: String,
        /// Bytes its shape and type take.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// An array metadata value whose items are not all of one type.
    #[error("metadata {key:?}: an array's items must all have one type")]
    MixedArray {
        /// The key.
        key: String,
    },
    /// The data source failed.
    #[error("tensor {name:?}")]
    Source {
        /// The tensor being produced.
        name: String,
        /// The source's error.
        #[source]
        source: SourceError,
    },
}

/// Builds a GGUF file: metadata pairs, then tensor infos, then
/// [`GgufWriter::write`] with a source of each tensor's bytes.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<TensorInfo>,
}

impl GgufWriter {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets `key` to `value`: in place if the key is present, else last.
    pub fn set(&mut self, key: &str, value: MetadataValue) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, old)) => *old = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
    }

    /// Removes `key` if present.
    pub fn remove(&mut self, key: &str) {
        self.metadata.retain(|(k, _)| k != key);
    }

    /// The metadata pairs, in the order they will be written.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    /// The tensors added so far (each `offset` is 0 until
    /// [`GgufWriter::write`] places them).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Adds a tensor of shape `dims` (ggml order: `dims[0]` is the row
    /// length) and type `ty`; its bytes come from the source given to
    /// [`GgufWriter::write`].
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[usize],
        ty: GgmlType,
    ) -> Result<&TensorInfo, WriteError> {
        let bad = |reason: String| WriteError::BadShape {
            name: name.to_owned(),
            reason,
        };
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(WriteError::DuplicateTensor {
                name: name.to_owned(),
            });
        }
        if dims.is_empty() || dims.len() > MAX_DIMS as usize {
            return Err(bad(format!("{} dimensions (1 to {MAX_DIMS})", dims.len())));
        }
        let n_rows = dims[1..]
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let n_bytes = ty
            .row_bytes(dims[0])
            .map_err(|e| bad(e.to_string()))?
            .checked_mul(n_rows.unwrap_or(usize::MAX))
            .filter(|_| n_rows.is_some())
            .ok_or_else(|| bad(format!("{dims:?} is too large")))?;
        self.tensors.push(TensorInfo {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ggml_type: ty,
            offset: 0,
            n_bytes,
        });
        Ok(&self.tensors[self.tensors.len() - 1])
    }

    /// The alignment `general.alignment` sets (default 32).
    fn alignment(&self) -> Result<usize, WriteError> {
        let Some((_, value)) = self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        value
            .as_integer()
            .filter(|&v| v > 0 && v <= i128::from(u32::MAX) && (v as u128).is_power_of_two())
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| WriteError::BadAlignment {
                value: value.to_string(),
            })
    }

    /// Writes the file at `path`: `data(i, info)` gives tensor `i`'s bytes,
    /// exactly `info.n_bytes` of them, called once per tensor in order
    /// (quantize there, and only one tensor's result is held at a time).
    ///
    /// The bytes go to a temporary file in `path`'s directory, renamed over
    /// `path` once complete and synced; on any error it is removed and
    /// `path` is untouched.
    pub fn write(
        &self,
        path: &Path,
        mut data: impl FnMut(usize, &TensorInfo) -> Result<Vec<u8>, SourceError>,
    ) -> Result<(), WriteError> {
        let temp = temp_path(path);
        let result = (|| {
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)
                .map_err(|source| io_error(&temp, source))?;
            let mut out = BufWriter::with_capacity(1 << 20, file);
            let io = |source| io_error(&temp, source);
            self.write_to(&mut out, &temp, &mut data)?;
            let file = out.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            fs::rename(&temp, path).map_err(|source| io_error(path, source))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }

    /// The file's bytes in memory, `data` as for [`GgufWriter::write`]
    /// (an assembled model handed to [`GgufFile::from_bytes`](crate::GgufFile::from_bytes)).
    pub fn write_to_vec(
        &self,
        mut data: impl FnMut(usize, &TensorInfo) -> Result<Vec<u8>, SourceError>,
    ) -> Result<Vec<u8>, WriteError> {
        let mut out = Vec::new();
        self.write_to(&mut out, Path::new("<memory>"), &mut data)?;
        Ok(out)
    }

    /// Writes the whole file to `out` (`path` names it in errors).
    fn write_to(
        &self,
        out: &mut impl Write,
        path: &Path,
        data: &mut impl FnMut(usize, &TensorInfo) -> Result<Vec<u8>, SourceError>,
    ) -> Result<(), WriteError> {
        let alignment = self.alignment()?;
        let (head, tensors) = self.head()?;
        let io = |source| io_error(path, source);
        out.write_all(&head).map_err(io)?;
        for (idx, info) in tensors.iter().enumerate() {
            let bytes = data(idx, info).map_err(|source| WriteError::Source {
                name: info.name.clone(),
                source,
            })?;
            if bytes.len() != info.n_bytes {
                return Err(WriteError::DataLength {
                    name: info.name.clone(),
                    expected: info.n_bytes,
                    actual: bytes.len(),
                });
            }
            // Each tensor's data padded to the alignment, the last too (as ggml).
            out.write_all(&bytes).map_err(io)?;
            pad(out, bytes.len(), alignment).map_err(io)?;
        }
        Ok(())
    }

    /// The file up to its data section (header, metadata, tensor infos,
    /// padding) and the tensor infos with their offsets in that section:
    /// what a file assembled from pieces needs
    /// ([`GgufFile::from_pieces`](crate::GgufFile)).
    pub(crate) fn head(&self) -> Result<(Vec<u8>, Vec<TensorInfo>), WriteError> {
        let alignment = self.alignment()?;
        if let Some((key, _)) = self.metadata.iter().find(|(_, v)| !homogeneous(v)) {
            return Err(WriteError::MixedArray { key: key.clone() });
        }
        let tensors = self.placed(alignment)?;
        let mut head = Vec::new();
        let io = |source| io_error(Path::new("<memory>"), source);
        let header_len = self.write_header(&mut head, &tensors).map_err(io)?;
        pad(&mut head, header_len, alignment).map_err(io)?;
        Ok((head, tensors))
    }

    /// The tensor infos with their offsets at `alignment`.
    fn placed(&self, alignment: usize) -> Result<Vec<TensorInfo>, WriteError> {
        let mut offset = 0usize;
        let mut placed = Vec::with_capacity(self.tensors.len());
        for info in &self.tensors {
            placed.push(TensorInfo {
                offset,
                ..info.clone()
            });
            offset = offset
                .checked_add(info.n_bytes)
                .and_then(|end| end.checked_next_multiple_of(alignment))
                .ok_or_else(|| WriteError::BadShape {
                    name: info.name.clone(),
                    reason: "the data section is too large".into(),
                })?;
        }
        Ok(placed)
    }

    /// Writes the header, the metadata and the tensor infos; returns the
    /// number of bytes written.
    fn write_header(&self, out: &mut impl Write, tensors: &[TensorInfo]) -> io::Result<usize> {
        let mut counter = Counting { out, n: 0 };
        counter.write_all(&MAGIC)?;
        counter.write_all(&3u32.to_le_bytes())?;
        counter.write_all(&(tensors.len() as u64).to_le_bytes())?;
        counter.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (key, value) in &self.metadata {
            write_string(&mut counter, key)?;
            counter.write_all(&value.type_id().to_le_bytes())?;
            write_value(&mut counter, value)?;
        }
        for info in tensors {
            write_string(&mut counter, &info.name)?;
            counter.write_all(&(info.dims.len() as u32).to_le_bytes())?;
            for &dim in &info.dims {
                counter.write_all(&(dim as u64).to_le_bytes())?;
            }
            counter.write_all(&info.ggml_type.id().to_le_bytes())?;
            counter.write_all(&(info.offset as u64).to_le_bytes())?;
        }
        Ok(counter.n)
    }
}

/// A writer that counts the bytes through it.
struct Counting<'a, W: Write> {
    out: &'a mut W,
    n: usize,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.n += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A GGUF string: u64 length, then the UTF-8 bytes.
fn write_string(out: &mut impl Write, s: &str) -> io::Result<()> {
    out.write_all(&(s.len() as u64).to_le_bytes())?;
    out.write_all(s.as_bytes())
}

/// A value without its type id (an array writes its element type and count).
fn write_value(out: &mut impl Write, value: &MetadataValue) -> io::Result<()> {
    match value {
        MetadataValue::U8(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::I8(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::U16(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::I16(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::U32(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::I32(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::U64(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::I64(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::F32(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::F64(v) => out.write_all(&v.to_le_bytes()),
        MetadataValue::Bool(v) => out.write_all(&[u8::from(*v)]),
        MetadataValue::String(s) => write_string(out, s),
        MetadataValue::Array(items) => {
            // An empty array's element type is not recorded: ggml's writer
            // gives such arrays the type of what they would hold; u8 reads back
            // as the same empty array.
            let element_type = items.first().map_or(0, MetadataValue::type_id);
            out.write_all(&element_type.to_le_bytes())?;
            out.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|item| write_value(out, item))
        }
    }
}

/// Whether every array in `value` (nested ones too) holds items of one type.
fn homogeneous(value: &MetadataValue) -> bool {
    match value {
        MetadataValue::Array(items) => {
            let first = items.first().map(MetadataValue::type_id);
            items
                .iter()
                .all(|item| Some(item.type_id()) == first && homogeneous(item))
        }
        _ => true,
    }
}

/// Zeros from `written` up to the next multiple of `alignment`.
fn pad(out: &mut impl Write, written: usize, alignment: usize) -> io::Result<()> {
    let padding = written.next_multiple_of(alignment) - written;
    const ZEROS: [u8; 64] = [0; 64];
    let mut left = padding;
    while left > 0 {
        let n = left.min(ZEROS.len());
        out.write_all(&ZEROS[..n])?;
        left -= n;
    }
    Ok(())
}

/// `.NAME.PID.tmp` beside `path`.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "out.gguf".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

fn io_error(path: &Path, source: io::Error) -> WriteError {
    WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufFile;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gguf-writer-{tag}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Every value type, nested arrays, an alignment of 64 and tensors of
    /// several types read back through the crate's reader as written.
    #[test]
    fn round_trip_through_the_reader() {
        let dir = temp_dir("round-trip");
        let path = dir.join("all.gguf");
        let values = vec![
            ("u8", MetadataValue::U8(200)),
            ("i8", MetadataValue::I8(-100)),
            ("u16", MetadataValue::U16(60_000)),
            ("i16", MetadataValue::I16(-30_000)),
            ("u32", MetadataValue::U32(4_000_000_000)),
            ("i32", MetadataValue::I32(-2_000_000_000)),
            ("u64", MetadataValue::U64(u64::MAX)),
            ("i64", MetadataValue::I64(i64::MIN)),
            ("f32", MetadataValue::F32(1.5)),
            ("f64", MetadataValue::F64(-2.25e300)),
            ("bool", MetadataValue::Bool(true)),
            ("string", MetadataValue::String("héllo".into())),
            ("empty", MetadataValue::Array(vec![])),
            (
                "nested",
                MetadataValue::Array(vec![
                    MetadataValue::Array(vec![MetadataValue::I32(1), MetadataValue::I32(-2)]),
                    MetadataValue::Array(vec![MetadataValue::String("x".into())]),
                ]),
            ),
            ("general.alignment", MetadataValue::U32(64)),
        ];
        let mut writer = GgufWriter::new();
        for (key, value) in &values {
            writer.set(key, value.clone());
        }
        writer.set("u8", MetadataValue::U8(201)); // replaced in place
        writer.add_tensor("a", &[5], GgmlType::F32).unwrap();
        writer.add_tensor("b", &[32, 3], GgmlType::Q8_0).unwrap();
        writer
            .add_tensor("c", &[2, 3, 4, 1], GgmlType::F16)
            .unwrap();
        let payload = |idx: usize, info: &TensorInfo| -> Result<Vec<u8>, SourceError> {
            Ok((0..info.n_bytes).map(|i| (i * 7 + idx) as u8).collect())
        };
        writer.write(&path, payload).unwrap();

        let file = GgufFile::map(&path).unwrap();
        assert_eq!(file.version(), 3);
        assert_eq!(file.alignment(), 64);
        assert_eq!(file.data_offset() % 64, 0);
        let mut expected: Vec<(String, MetadataValue)> = values
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        expected[0].1 = MetadataValue::U8(201);
        assert_eq!(file.metadata(), &expected[..]);
        for (idx, (name, n_bytes)) in [("a", 20), ("b", 102), ("c", 48)].into_iter().enumerate() {
            let view = file.tensor(name).unwrap();
            assert_eq!(view.info.n_bytes, n_bytes);
            assert_eq!(view.info.offset % 64, 0);
            let want: Vec<u8> = (0..n_bytes).map(|i| (i * 7 + idx) as u8).collect();
            assert_eq!(view.data, &want[..], "{name}");
        }
        assert_eq!(file.tensor("c").unwrap().info.dims, [2, 3, 4, 1]);
        assert_eq!(file.bytes().len() % 64, 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A failing source or wrong data length leaves an existing file as it was
    /// and no temporary file behind.
    #[test]
    fn errors_never_damage_the_destination() {
        let dir = temp_dir("errors");
        let path = dir.join("out.gguf");
        fs::write(&path, b"precious").unwrap();
        let mut writer = GgufWriter::new();
        writer.add_tensor("t", &[32], GgmlType::Q4_0).unwrap();
        let error = writer
            .write(&path, |_, _| Err("the source broke".into()))
            .unwrap_err();
        assert_eq!(error.to_string(), "tensor \"t\"");
        let error = writer.write(&path, |_, _| Ok(vec![0; 17])).unwrap_err();
        assert_eq!(
            error.to_string(),
            "tensor \"t\" takes 18 bytes, its data has 17"
        );
        assert_eq!(fs::read(&path).unwrap(), b"precious");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);

        assert!(matches!(
            writer.add_tensor("t", &[32], GgmlType::F32),
            Err(WriteError::DuplicateTensor { .. })
        ));
        let error = writer.add_tensor("odd", &[33], GgmlType::Q4_0).unwrap_err();
        assert!(error.to_string().contains("multiple of 32"), "{error}");
        assert!(writer.add_tensor("none", &[], GgmlType::F32).is_err());
        assert!(writer.add_tensor("five", &[1; 5], GgmlType::F32).is_err());
        let error = writer
            .add_tensor("huge", &[usize::MAX / 2, 4], GgmlType::F32)
            .unwrap_err();
        assert!(error.to_string().contains("too large"), "{error}");
        writer.set("general.alignment", MetadataValue::U32(48));
        let error = writer.write(&path, |_, _| Ok(vec![0; 18])).unwrap_err();
        assert_eq!(
            error.to_string(),
            "general.alignment must be a power of two, got 48"
        );
        writer.set("general.alignment", MetadataValue::U32(32));
        let mixed = MetadataValue::Array(vec![MetadataValue::U8(1), MetadataValue::I8(1)]);
        writer.set("mixed", mixed);
        let error = writer.write(&path, |_, _| Ok(vec![0; 18])).unwrap_err();
        assert!(matches!(error, WriteError::MixedArray { .. }), "{error}");
        assert_eq!(fs::read(&path).unwrap(), b"precious");
        fs::remove_dir_all(&dir).unwrap();
    }
}
