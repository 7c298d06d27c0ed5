//! A bounds-checked, memory-mapped reader for GGUF files, versions 2 and 3.
//!
//! ```text
//! | magic "GGUF" | version: u32 | n_tensors: u64 | n_kv: u64 |
//! | n_kv metadata pairs (key, type, value)                    |
//! | n_tensors tensor infos (name, dims, type, offset)         |
//! | padding to general.alignment (default 32)                 |
//! | data section: each tensor at its (aligned) offset         |
//! ```
//!
//! All integers are little-endian. Every count, length, offset and size is
//! checked against the file before use, so a malformed or hostile file yields
//! a [`GgufError`] naming the problem, never a panic or an allocation sized by
//! an unchecked header field. [`GgufFile::open`] reads the file into memory
//! backed by huge pages, where the weights stream fastest;
//! [`GgufFile::map`] maps it instead (nothing copied). Either way the
//! metadata is decoded eagerly and tensor data is borrowed from the bytes.
//!
//! ```
//! # fn main() -> Result<(), lm_model::GgufError> {
//! use lm_model::GgufFile;
//! // The smallest valid file: header only, no metadata, no tensors.
//! let mut bytes = b"GGUF".to_vec();
//! bytes.extend(3u32.to_le_bytes());
//! bytes.extend(0u64.to_le_bytes());
//! bytes.extend(0u64.to_le_bytes());
//! let file = GgufFile::from_bytes(bytes)?;
//! assert_eq!(file.version(), 3);
//! assert!(file.tensors().is_empty());
//! assert!(file.get_u32("llama.block_count").is_err());
//! # Ok(())
//! # }
//! ```

mod cursor;
mod error;
mod metadata;
mod pieces;
mod summary;
mod tensor;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::Path;

use memmap2::{Mmap, MmapMut, MmapOptions};
use rayon::prelude::*;

use cursor::Cursor;
pub use error::GgufError;
pub use metadata::MetadataValue;
pub(crate) use pieces::{Piece, PieceSource, Pieces};
pub use summary::Summary;
pub use tensor::{TensorInfo, TensorView};
pub use writer::{GgufWriter, SourceError, WriteError};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Smallest possible metadata pair: empty key (8), type (4), one-byte value (1).
const MIN_KV_BYTES: u64 = 13;

/// Smallest possible tensor info: empty name (8), n_dims (4), one dim (8), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 32;

/// A parsed GGUF file that owns its bytes (read into memory, a read-only
/// memory map, or a buffer).
pub struct GgufFile {
    storage: Storage,
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Which tensors [`GgufFile::pack_tensors`] repacked in panels (one
    /// flag per entry of `tensors`).
    packed: Vec<bool>,
    alignment: usize,
    data_offset: usize,
}

/// How much of a file [`GgufFile::parse`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contents {
    /// Every tensor, each of a type this crate reads.
    All,
    /// Tensors of types this crate cannot read left out.
    SkipUnknownTypes,
}

/// Where the file's bytes live.
enum Storage {
    /// The file mapped read-only: nothing copied, pages shared with the
    /// page cache (and with other processes mapping the file).
    Mapped(Mmap),
    /// The file read into anonymous memory advised for huge pages: `len`
    /// bytes of `map` from `start` (the map's length rounded up to a whole
    /// number of huge pages, so the kernel aligns it to one; `start` puts
    /// the data section on a cache line, [`Storage::read`]). Private, so
    /// weights can be repacked in it.
    Read {
        map: MmapMut,
        start: usize,
        len: usize,
    },
    /// A buffer handed over by the caller.
    Owned(Vec<u8>),
    /// A header and tensors borrowed from other files' maps
    /// ([`GgufFile::from_pieces`]); `bytes` is the header alone.
    Assembled(Pieces),
    /// A mixture of experts ([`GgufFile::open`]): the file mapped, its
    /// experts read from the map, every other tensor from a copy in huge
    /// pages.
    Split(Box<Split>),
}

/// [`Storage::Split`]: the experts (3-d tensors) are read on first use and
/// only the chosen ones become resident; the tensors every token reads
/// (attention, norms, router, embeddings, output) stream from huge pages,
/// as a dense file's do ([`Storage::read`]).
struct Split {
    map: Mmap,
    copy: MmapMut,
    /// The copied ranges of the file, ascending, each with where it starts
    /// in `copy`.
    copied: Vec<(std::ops::Range<usize>, usize)>,
}

impl Split {
    /// Copies every tensor of `tensors` that is not 3-d (at `data_offset`
    /// of the mapped `file`) into one buffer of huge pages, each at a
    /// multiple of 64 bytes. The bytes are read from the file, not through
    /// the map, so loading leaves no page of the map resident.
    fn new(
        map: Mmap,
        file: &File,
        tensors: &[TensorInfo],
        data_offset: usize,
    ) -> io::Result<Split> {
        let mut copied: Vec<(std::ops::Range<usize>, usize)> = Vec::new();
        let mut len = 0usize;
        let mut dense: Vec<&TensorInfo> = tensors.iter().filter(|t| t.dims.len() != 3).collect();
        dense.sort_by_key(|t| t.offset);
        for info in dense {
            let start = data_offset + info.offset;
            copied.push((start..start + info.n_bytes, len));
            len = (len + info.n_bytes).next_multiple_of(CACHE_LINE);
        }
        let mut copy = huge_page_buffer(len)?;
        for (range, at) in &copied {
            let out = &mut copy[*at..*at + range.len()];
            #[cfg(unix)]
            std::os::unix::fs::FileExt::read_exact_at(file, out, range.start as u64)?;
            #[cfg(not(unix))]
            out.copy_from_slice(map.get(range.clone()).ok_or(io::ErrorKind::UnexpectedEof)?);
        }
        #[cfg(not(unix))]
        let _ = file;
        Ok(Split { map, copy, copied })
    }

    /// The bytes of `range`: from the copy when a copied tensor holds them,
    /// else from the map.
    fn slice(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        match self.in_copy(&range) {
            Some(start) => self.copy.get(start..start + range.len()),
            None => self.map.get(range),
        }
    }

    /// The bytes of `range` in the copy, writable (so that its tensors can
    /// be packed in panels), or `None` when no copied tensor holds them.
    fn slice_mut(&mut self, range: std::ops::Range<usize>) -> Option<&mut [u8]> {
        let start = self.in_copy(&range)?;
        self.copy.get_mut(start..start + range.len())
    }

    /// Where `range` of the file starts in the copy, when one copied
    /// tensor holds it.
    fn in_copy(&self, range: &std::ops::Range<usize>) -> Option<usize> {
        let i = self
            .copied
            .partition_point(|(copied, _)| copied.start <= range.start)
            .checked_sub(1)?;
        let (copied, at) = &self.copied[i];
        (range.end <= copied.end).then(|| at + (range.start - copied.start))
    }
}

/// The size of an x86-64 (and arm64 with 4 KB base pages) huge page.
const HUGE_PAGE: usize = 2 << 20;

/// The size of a cache line, and of the kernels' widest load.
const CACHE_LINE: usize = 64;

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Read { map, start, len } => &map[*start..*start + *len],
            Storage::Owned(bytes) => bytes,
            Storage::Assembled(pieces) => pieces.head(),
            Storage::Split(split) => &split.map,
        }
    }

    /// The file's length (an assembled file's included).
    fn len(&self) -> usize {
        match self {
            Storage::Assembled(pieces) => pieces.len(),
            other => other.bytes().len(),
        }
    }

    /// The bytes of `range`, when they are in the file (and, assembled, in
    /// one piece).
    fn slice(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        match self {
            Storage::Assembled(pieces) => pieces.slice(range),
            Storage::Split(split) => split.slice(range),
            other => other.bytes().get(range),
        }
    }

    /// The bytes of `range`, writable when they are this process's own
    /// (read, handed over, or a mixture's copied tensor), `None` for a map
    /// of the file (a mixture's experts included) or a range outside it.
    fn slice_mut(&mut self, range: std::ops::Range<usize>) -> Option<&mut [u8]> {
        match self {
            Storage::Mapped(_) | Storage::Assembled(_) => None,
            Storage::Read { map, start, len } => map[*start..*start + *len].get_mut(range),
            Storage::Owned(bytes) => bytes.get_mut(range),
            Storage::Split(split) => split.slice_mut(range),
        }
    }

    /// Maps `file` read-only ([`map_read_only`]).
    fn map(file: &File) -> io::Result<Storage> {
        map_read_only(file).map(Storage::Mapped)
    }

    /// Reads `file` whole into fresh anonymous memory that the kernel is
    /// asked to back with 2 MB pages (Linux's transparent huge pages, which
    /// a process gets by `madvise` on most distributions).
    ///
    /// Decode streams every weight once per token, and from 4 KB pages it
    /// runs about 20% slower (SmolLM2 Q4_1, one and two threads, on an
    /// AMD EPYC; see docs/performance-log.md): each page costs a TLB miss, and
    /// the hardware prefetchers stop at every page boundary. The kernel
    /// cannot give a mapped file huge pages unless it was built with
    /// `READ_ONLY_THP_FOR_FS`, hence the copy. Where huge pages are refused
    /// the bytes are the same and only the speed differs.
    ///
    /// The bytes start where the data section (at `data_offset` of the
    /// file) falls on a cache line, so that a tensor the file puts a
    /// multiple of 64 bytes into its data section (every tensor of the
    /// files met so far) is aligned for the kernels' 64-byte loads. GGUF
    /// aligns tensors to 32 bytes: llama.cpp's requantized 1B files start
    /// their data section 32 bytes past a line, and read at the buffer's
    /// start every 64-byte piece of their weights straddled two lines
    /// (1B Q4_K_M one-thread decode read its products 3% slower so).
    fn read(file: &File, data_offset: usize) -> io::Result<Storage> {
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| too_large())?;
        let start = data_offset.wrapping_neg() % CACHE_LINE;
        let mut map = huge_page_buffer(start.checked_add(len).ok_or_else(too_large)?)?;
        read_in_pieces(file, &mut map[start..start + len])?;
        Ok(Storage::Read { map, start, len })
    }
}

/// Bytes of the file each of [`read_in_pieces`]'s tasks reads.
const READ_PIECE: usize = 16 * HUGE_PAGE;

/// Reads the first `buf.len()` bytes of `file` into `buf`, in pieces of
/// [`READ_PIECE`] on rayon's threads. A fresh buffer's pages are allocated
/// and zeroed by the thread that first writes them, and in a virtual
/// machine whose host takes freed memory back (a balloon's free page
/// reporting) the host must back each of them again: on a 2-core Xeon VM
/// one thread took 1.2-2.0 s to first touch 1.1 GB of huge pages freed
/// seconds before, 0.15-0.37 s right after they were freed. Two threads
/// share that work and the copy.
#[cfg(unix)]
fn read_in_pieces(file: &File, buf: &mut [u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    buf.par_chunks_mut(READ_PIECE)
        .enumerate()
        .try_for_each(|(i, piece)| file.read_exact_at(piece, (i * READ_PIECE) as u64))
}

/// [`read_in_pieces`] where files have no positioned reads: in order, on
/// this thread.
#[cfg(not(unix))]
fn read_in_pieces(mut file: &File, buf: &mut [u8]) -> io::Result<()> {
    use std::io::Read;
    file.read_exact(buf)
}

fn too_large() -> io::Error {
    io::Error::new(io::ErrorKind::OutOfMemory, "file larger than memory")
}

/// Fresh anonymous memory of at least `len` bytes (a whole number of huge
/// pages, so the kernel aligns it to one), advised for huge pages: a hint,
/// refused (harmlessly) where transparent huge pages are off. The last,
/// partial huge page is left to 4 KB pages so that no more than `len`
/// bytes become resident.
fn huge_page_buffer(len: usize) -> io::Result<MmapMut> {
    let map_len = len
        .checked_next_multiple_of(HUGE_PAGE)
        .ok_or_else(too_large)?;
    let map = MmapOptions::new().len(map_len.max(HUGE_PAGE)).map_anon()?;
    #[cfg(target_os = "linux")]
    let _ = map.advise_range(memmap2::Advice::HugePage, 0, len / HUGE_PAGE * HUGE_PAGE);
    Ok(map)
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_bytes", &self.storage.len())
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Reads the file at `path` into memory and parses its header: the way
    /// to open a model that will run.
    ///
    /// The bytes go to anonymous memory backed by huge pages where the
    /// operating system grants them (Linux's transparent huge pages), from
    /// which the weights stream about 1.2x faster than from a map of the
    /// file. The memory is the file's size, as the pages a map would touch;
    /// what is given up is sharing the page cache with other processes:
    /// [`GgufFile::map`] keeps that.
    ///
    /// A mixture of experts (a file with 3-d tensors, the experts'
    /// `ffn_*_exps`) keeps its experts mapped instead: a token reads only
    /// its chosen experts, so resident memory grows with the experts used,
    /// not with the file (a 30B mixture is read a few GB at a time). Its
    /// other tensors, which every token reads, are copied into huge pages.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let mut file = GgufFile::map(path)?;
        let io_error = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let opened = File::open(path).map_err(io_error)?;
        if file.has_experts() {
            let Storage::Mapped(map) =
                std::mem::replace(&mut file.storage, Storage::Owned(Vec::new()))
            else {
                unreachable!("GgufFile::map maps the file");
            };
            let split =
                Split::new(map, &opened, &file.tensors, file.data_offset).map_err(io_error)?;
            file.storage = Storage::Split(Box::new(split));
        } else {
            let read = Storage::read(&opened, file.data_offset).map_err(io_error)?;
            // The same bytes, so the parsed offsets hold; a file changed in
            // between (which a map forbids anyway) is refused by its length.
            if read.bytes().len() != file.bytes().len() {
                return Err(io_error(io::Error::other(
                    "the file changed while it was read",
                )));
            }
            file.storage = read;
        }
        Ok(file)
    }

    /// Whether the file holds 3-d tensors (a mixture of experts' weights).
    fn has_experts(&self) -> bool {
        self.tensors.iter().any(|info| info.dims.len() == 3)
    }

    /// Whether the bytes are a read-only map of the file ([`GgufFile::map`],
    /// or [`GgufFile::open`] of a mixture of experts, whose experts are read
    /// from the map).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped(_) | Storage::Split(_))
    }

    /// Maps the file at `path` read-only and parses its header, as
    /// [`GgufFile::open`] does but copying nothing: pages are read on first
    /// use and shared with every process mapping the file, for a file
    /// larger than the memory to spare. Weights stream from 4 KB pages.
    ///
    /// The file must not be modified while the `GgufFile` lives (as with any
    /// memory map).
    pub fn map(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        GgufFile::from_path(path.as_ref(), Storage::map, Contents::All)
    }

    /// Maps the file at `path` and parses it as [`GgufFile::map`] does,
    /// except that a tensor of a type this crate cannot read is left out
    /// instead of refusing the file: its metadata (a tokenizer, say) can
    /// still be read. Every other check is made.
    pub fn open_metadata(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        GgufFile::from_path(path.as_ref(), Storage::map, Contents::SkipUnknownTypes)
    }

    /// Opens `path`, holds its bytes as `hold` does, and parses them.
    fn from_path(
        path: &Path,
        hold: fn(&File) -> io::Result<Storage>,
        contents: Contents,
    ) -> Result<GgufFile, GgufError> {
        let io_error = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Checked before opening, as opening a FIFO waits for a writer, and
        // again on the open file.
        let not_regular = || GgufError::NotRegularFile {
            path: path.to_path_buf(),
        };
        if !std::fs::metadata(path).map_err(io_error)?.is_file() {
            return Err(not_regular());
        }
        let file = File::open(path).map_err(io_error)?;
        if !file.metadata().map_err(io_error)?.is_file() {
            return Err(not_regular());
        }
        let storage = hold(&file).map_err(io_error)?;
        GgufFile::parse(storage, contents)
    }

    /// Parses a GGUF file held in memory (tests, embedded models).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::parse(Storage::Owned(bytes), Contents::All)
    }

    /// Parses a file assembled from pieces (a Hugging Face checkpoint's
    /// header written here, its tensors borrowed from the shards' maps):
    /// nothing is copied. The pieces' data was validated as it was
    /// assembled (read through the file, not the maps, so that loading
    /// leaves no page of the maps resident), so
    /// [`GgufFile::validate_tensor_data`] passes over it.
    pub(crate) fn from_pieces(pieces: Pieces) -> Result<GgufFile, GgufError> {
        GgufFile::parse(Storage::Assembled(pieces), Contents::All)
    }

    fn parse(storage: Storage, contents: Contents) -> Result<GgufFile, GgufError> {
        let bytes = storage.bytes();
        let mut cursor = Cursor::new(bytes);
        let (version, n_tensors, n_kv) = read_header(&mut cursor, bytes)?;
        let (metadata, key_index) = read_metadata(&mut cursor, n_kv)?;
        let alignment = alignment_of(&metadata, &key_index)?;
        let (tensors, tensor_index) = read_tensor_infos(&mut cursor, n_tensors, contents)?;

        // The data section starts at the next multiple of the alignment; a file
        // with no tensor data may end before it.
        let infos_end = cursor.pos() as u64;
        let data_offset = infos_end
            .div_ceil(alignment)
            .checked_mul(alignment)
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(usize::MAX);
        let data_len = storage.len().saturating_sub(data_offset);
        check_tensor_placement(&tensors, alignment, data_len)?;
        let alignment =
            usize::try_from(alignment).map_err(|_| GgufError::BadAlignment { alignment })?;
        Ok(GgufFile {
            storage,
            version,
            metadata,
            key_index,
            packed: vec![false; tensors.len()],
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Byte offset of the data section from the start of the file.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The whole file's bytes (for a file assembled from a Hugging Face
    /// checkpoint, its header: the tensors are in the checkpoint's maps).
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// All metadata pairs, in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        let idx = *self.key_index.get(key)?;
        Some(&self.metadata[idx].1)
    }

    /// The value of `key`, or `MissingKey`.
    fn require(&self, key: &str) -> Result<&MetadataValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    /// An integer of any width and signedness that fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_integer(key, "u32")
    }

    /// An integer of any width and signedness that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_integer(key, "u64")
    }

    /// An integer of any width and signedness that fits in i32.
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.get_integer(key, "i32")
    }

    fn get_integer<T: TryFrom<i128>>(
        &self,
        key: &str,
        expected: &'static str,
    ) -> Result<T, GgufError> {
        let value = self.require(key)?;
        let integer = value.as_integer().ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected: "an integer",
            found: value.type_name(),
        })?;
        T::try_from(integer).map_err(|_| GgufError::ValueOutOfRange {
            key: key.to_owned(),
            value: integer,
            expected,
        })
    }

    /// An F32, or an F64 rounded to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let value = self.require(key)?;
        value
            .as_float()
            .map(|v| v as f32)
            .ok_or_else(|| GgufError::WrongType {
                key: key.to_owned(),
                expected: "a float",
                found: value.type_name(),
            })
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let value = self.require(key)?;
        value.as_str().ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected: "a string",
            found: value.type_name(),
        })
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetadataValue::Bool(v) => Ok(*v),
            other => Err(GgufError::WrongType {
                key: key.to_owned(),
                expected: "a bool",
                found: other.type_name(),
            }),
        }
    }

    /// An array, or `WrongType`.
    fn get_array(&self, key: &str, expected: &'static str) -> Result<&[MetadataValue], GgufError> {
        let value = self.require(key)?;
        value.as_array().ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: value.type_name(),
        })
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`), borrowed.
    pub fn get_string_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_array_of(key, "an array of strings", |item| item.as_str().map(Ok))
    }

    /// An array of integers that each fit in i32 (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.get_array_of(key, "an array of integers", |item| {
            let integer = item.as_integer()?;
            Some(
                i32::try_from(integer).map_err(|_| GgufError::ValueOutOfRange {
                    key: key.to_owned(),
                    value: integer,
                    expected: "i32",
                }),
            )
        })
    }

    /// An array of F32 (or F64 rounded to f32) values (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.get_array_of(key, "an array of floats", |item| {
            item.as_float().map(|v| Ok(v as f32))
        })
    }

    /// Every item of the array at `key`, converted by `convert`: `None` (an
    /// item of another type) is `WrongType` naming the item's type.
    fn get_array_of<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl Fn(&'a MetadataValue) -> Option<Result<T, GgufError>>,
    ) -> Result<Vec<T>, GgufError> {
        self.get_array(key, expected)?
            .iter()
            .map(|item| {
                convert(item).unwrap_or_else(|| {
                    Err(GgufError::WrongType {
                        key: key.to_owned(),
                        expected,
                        found: array_of(item),
                    })
                })
            })
            .collect()
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, with its data, or `MissingTensor`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let idx = *self
            .tensor_index
            .get(name)
            .ok_or_else(|| GgufError::MissingTensor {
                name: name.to_owned(),
            })?;
        let info = &self.tensors[idx];
        // An empty tensor has no bytes to borrow: the file may end before
        // the (padded) start of its data section.
        if info.n_bytes == 0 {
            return Ok(TensorView {
                info,
                data: &[],
                packed: false,
            });
        }
        // Parsing checked `offset + n_bytes <= data_len`, the length of the
        // bytes after `data_offset`, so this range is inside the file.
        let start = self.data_offset + info.offset;
        let data = self.data(start..start + info.n_bytes);
        if data.len() != info.n_bytes {
            // Only an assembled file whose pieces miss the tensor's range.
            return Err(GgufError::TensorOutOfBounds {
                name: info.name.clone(),
                offset: info.offset as u64,
                n_bytes: info.n_bytes as u64,
                data_len: self.storage.len().saturating_sub(self.data_offset) as u64,
            });
        }
        Ok(TensorView {
            info,
            data,
            packed: self.packed[idx],
        })
    }

    /// The bytes of `range`, a tensor's (its offset plus the data
    /// section's), checked in bounds when the file was parsed; empty for any
    /// other range.
    pub(crate) fn data(&self, range: std::ops::Range<usize>) -> &[u8] {
        self.storage.slice(range).unwrap_or_default()
    }

    /// Repacks in place, into panels of 16 rows (see `quant/packed.rs`),
    /// every 2-d tensor that `select` chooses, whose type the process's
    /// kernel path packs under `LM_PACK`
    /// ([`Kernel::packs`](crate::Kernel::packs): Q4_0, Q4_1, Q8_0, and
    /// Q5_0, Q4_K and Q6_K on AVX-512) in whole panels, so that products with it run
    /// on the panel kernels; returns how many it packed. The bytes are
    /// rearranged, not copied: the memory does not grow. A mapped file
    /// ([`GgufFile::map`]) is shared with the page cache and is left as it
    /// is (0 packed); of a mixture of experts read by [`GgufFile::open`],
    /// the tensors copied into huge pages pack and the mapped experts stay
    /// as they are.
    ///
    /// A packed tensor's [`TensorView::matrix`] multiplies in panels and
    /// dequantizes rows from them; its `data` is no longer in GGUF's
    /// layout, so call this after [`GgufFile::validate_tensor_data`].
    pub fn pack_tensors(&mut self, select: impl Fn(&TensorInfo) -> bool) -> usize {
        let data_offset = self.data_offset;
        let kernel = crate::quant::Kernel::configured();
        let mut n_packed = 0;
        for (info, packed) in self.tensors.iter().zip(&mut self.packed) {
            let n_rows = info.n_rows();
            if *packed
                || info.dims.len() != 2
                || !crate::quant::packed::has_panels(info.ggml_type, n_rows)
                || !kernel.packs(info.ggml_type)
                || !select(info)
            {
                continue;
            }
            let start = data_offset + info.offset;
            let Some(data) = self.storage.slice_mut(start..start + info.n_bytes) else {
                continue;
            };
            crate::quant::packed::pack_in_place(info.ggml_type, data, info.n_bytes / n_rows);
            *packed = true;
            n_packed += 1;
        }
        n_packed
    }

    /// Errors with the first tensor (in file order) holding a block whose
    /// f16 scale or minimum, or a float value, is NaN or infinite (see
    /// [`GgmlType::validate`](crate::GgmlType::validate)): llama.cpp's
    /// `ggml_validate_row_data`, run when a model is built so that a corrupt
    /// file is named at load instead of giving NaN logits. Tensors and blocks
    /// are scanned in parallel; the cost is reading the file once (tens of
    /// milliseconds for SmolLM2 once it is in the page cache).
    ///
    /// On a mapped file the 3-d tensors (a mixture's experts) are not
    /// scanned, so that loading does not read every expert: their shapes,
    /// offsets and bounds were checked when the file was parsed, and a
    /// non-finite scale in them gives non-finite outputs for the tokens
    /// routed there, as in llama.cpp, which validates no data at load.
    pub fn validate_tensor_data(&self) -> Result<(), GgufError> {
        if matches!(self.storage, Storage::Assembled(_)) {
            return Ok(());
        }
        let mapped = self.is_mapped();
        let first_bad = self.tensors.par_iter().find_map_first(|info| {
            if mapped && info.dims.len() == 3 {
                return None;
            }
            let data = match self.tensor(&info.name) {
                // Packing happens after validation (and moves no scale).
                Ok(view) if view.packed => return None,
                Ok(view) => view.data,
                Err(error) => return Some(error),
            };
            let defect = info.ggml_type.validate(data).err()?;
            Some(GgufError::InvalidTensorData {
                name: info.name.clone(),
                defect,
            })
        });
        first_bad.map_or(Ok(()), Err)
    }

    /// A printable overview: version, counts, every metadata pair with long
    /// arrays and strings shortened, and the tensor count per type.
    pub fn summary(&self) -> Summary<'_> {
        Summary::new(self)
    }
}

/// The file's header: its version, and its tensor and metadata counts, each
/// bounded by what is left of the file.
fn read_header(cursor: &mut Cursor<'_>, bytes: &[u8]) -> Result<(u32, usize, usize), GgufError> {
    let magic = bytes.get(..4).unwrap_or(bytes);
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    cursor.take(4, "magic")?;
    let version = cursor.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors_offset = cursor.pos();
    let n_tensors = cursor.u64("tensor count")?;
    let n_kv = cursor.count("metadata pair", MIN_KV_BYTES)?;
    // The tensor count is checked against what is left after the metadata count.
    let remaining = cursor.remaining() as u64;
    let n_tensors = usize::try_from(n_tensors)
        .ok()
        .filter(|_| {
            n_tensors
                .checked_mul(MIN_TENSOR_INFO_BYTES)
                .is_some_and(|total| total <= remaining)
        })
        .ok_or(GgufError::CountBeyondFile {
            what: "tensor info",
            count: n_tensors,
            min_item_bytes: MIN_TENSOR_INFO_BYTES,
            offset: n_tensors_offset as u64,
            remaining,
        })?;
    Ok((version, n_tensors, n_kv))
}

/// The `n_kv` metadata pairs, in file order, and the index of their keys.
type Metadata = (Vec<(String, MetadataValue)>, HashMap<String, usize>);

/// Reads the `n_kv` metadata pairs; a key given twice is an error.
fn read_metadata(cursor: &mut Cursor<'_>, n_kv: usize) -> Result<Metadata, GgufError> {
    let mut metadata = Vec::with_capacity(n_kv);
    let mut key_index = HashMap::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = cursor.string("metadata key")?.to_owned();
        let type_offset = cursor.pos();
        let type_id = cursor.u32("metadata value type")?;
        metadata::check_value_type(type_id, type_offset)?;
        let value = metadata::read_value(cursor, type_id, type_offset, 0)?;
        if key_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey { key });
        }
        metadata.push((key, value));
    }
    Ok((metadata, key_index))
}

/// `general.alignment` (default [`DEFAULT_ALIGNMENT`]): a positive power of
/// two.
fn alignment_of(
    metadata: &[(String, MetadataValue)],
    key_index: &HashMap<String, usize>,
) -> Result<u64, GgufError> {
    match key_index.get(ALIGNMENT_KEY).and_then(|&i| metadata.get(i)) {
        None => Ok(DEFAULT_ALIGNMENT as u64),
        Some((key, value)) => match value.as_integer() {
            Some(v) if v > 0 && (v as u128).is_power_of_two() => {
                Ok(u64::try_from(v).unwrap_or(u64::MAX))
            }
            Some(v) => Err(GgufError::BadAlignment {
                alignment: u64::try_from(v).unwrap_or(0),
            }),
            None => Err(GgufError::WrongType {
                key: key.clone(),
                expected: "an integer",
                found: value.type_name(),
            }),
        },
    }
}

/// Reads the `n_tensors` tensor infos and indexes them by name; a name
/// given twice is an error, a type this crate cannot read is one unless
/// `contents` leaves such tensors out.
fn read_tensor_infos(
    cursor: &mut Cursor<'_>,
    n_tensors: usize,
    contents: Contents,
) -> Result<(Vec<TensorInfo>, HashMap<String, usize>), GgufError> {
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let info = match tensor::read_tensor_info(cursor) {
            // The whole info was read before its type was refused, so
            // the cursor is at the next one: leave this tensor out.
            Err(GgufError::UnknownTensorType { .. }) if contents == Contents::SkipUnknownTypes => {
                continue;
            }
            info => info?,
        };
        if tensor_index
            .insert(info.name.clone(), tensors.len())
            .is_some()
        {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        tensors.push(info);
    }
    Ok((tensors, tensor_index))
}

/// Checks that every tensor starts at a multiple of `alignment` and ends
/// inside the data section (`data_len` bytes).
fn check_tensor_placement(
    tensors: &[TensorInfo],
    alignment: u64,
    data_len: usize,
) -> Result<(), GgufError> {
    for info in tensors {
        if !(info.offset as u64).is_multiple_of(alignment) {
            return Err(GgufError::TensorMisaligned {
                name: info.name.clone(),
                offset: info.offset as u64,
                alignment,
            });
        }
        let inside = info
            .offset
            .checked_add(info.n_bytes)
            .is_some_and(|end| end <= data_len);
        if !inside {
            return Err(GgufError::TensorOutOfBounds {
                name: info.name.clone(),
                offset: info.offset as u64,
                n_bytes: info.n_bytes as u64,
                data_len: data_len as u64,
            });
        }
    }
    Ok(())
}

/// The type name of an array element that did not match, for `WrongType`.
fn array_of(item: &MetadataValue) -> &'static str {
    match item {
        MetadataValue::U8(_) => "an array of u8",
        MetadataValue::I8(_) => "an array of i8",
        MetadataValue::U16(_) => "an array of u16",
        MetadataValue::I16(_) => "an array of i16",
        MetadataValue::U32(_) => "an array of u32",
        MetadataValue::I32(_) => "an array of i32",
        MetadataValue::U64(_) => "an array of u64",
        MetadataValue::I64(_) => "an array of i64",
        MetadataValue::F32(_) => "an array of f32",
        MetadataValue::F64(_) => "an array of f64",
        MetadataValue::Bool(_) => "an array of bool",
        MetadataValue::String(_) => "an array of string",
        MetadataValue::Array(_) => "an array of arrays",
    }
}

/// Maps `file` read-only, for a `GgufFile` or a safetensors shard being
/// converted (`hf/shards.rs`): one of the crate's two operating-system calls
/// outside the kernels that cannot be safe (the other sets the allocator's
/// threshold).
#[allow(unsafe_code)]
pub(crate) fn map_read_only(file: &File) -> io::Result<Mmap> {
    // SAFETY: the map is read-only and private to its owner (a `GgufFile`,
    // or a `Shard` that lives only while its checkpoint is converted); like
    // every reader of mapped files we rely on the file not being truncated
    // or rewritten underneath us while it is open (documented on
    // `GgufFile::map`).
    unsafe { Mmap::map(file) }
}
