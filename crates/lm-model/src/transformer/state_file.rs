//! A [`DecoderState`] as bytes, so a sequence's KV cache outlives the
//! process: lm-serve's `--cache-dir` (the prefix cache across restarts) and
//! lm-cli's `chat --session` (llama.cpp's `--prompt-cache`).
//!
//! ```text
//! offset  bytes  field (integers little-endian)
//!      0      8  magic "LMKVSTAT"
//!      8      4  format version (1)
//!     12     32  the model's fingerprint (ModelFingerprint)
//!     44      4  KV precision (0 f32, 1 f16, 2 q8_0), then 3 zero bytes
//!     48     16  n_layer, n_kv_head, head_dim, ring layers (u32 each)
//!     64      8  capacity (the context length)
//!     72      8  ring chunks (0: no ring)
//!     80      8  pos
//!     88      8  the ring's floor
//!     96      8  full-store chunks saved
//!    104      8  ring chunks saved
//!    112  4*pos  the tokens read (u32 each)
//!      …      …  the chunks' values, full store then ring (kv_cache.rs's layout)
//!      …     32  sha256 of every byte before it
//! ```
//!
//! Reading checks the header against the model's own fresh state (shape,
//! precision, ring) and every count against the bytes there are before
//! allocating anything, so a hostile file cannot ask for more memory than
//! its own length; the checksum is checked before the state is built, so a
//! damaged file is refused, never half loaded.

use std::io::{self, Read, Write};
use std::path::Path;

use lm_core::{LanguageModel, TokenId};
use sha2::{Digest, Sha256};

use super::config::KvPrecision;
use super::model::{Decoder, DecoderState};

/// The first bytes of a state file.
pub const STATE_MAGIC: [u8; 8] = *b"LMKVSTAT";
/// The format version this build writes and reads.
pub const STATE_VERSION: u32 = 1;
/// Bytes before the tokens.
const HEADER_LEN: usize = 112;
/// Bytes of the trailing checksum.
const CHECKSUM_LEN: usize = 32;
/// Bytes of a model file's head, middle and tail a fingerprint reads.
const FINGERPRINT_SAMPLE: u64 = 1 << 20;

/// Which model file a state belongs to: a sha256 of the file's size, its
/// GGUF header, metadata and tensor table (whole), and the first and last
/// MiB of its tensor data. Cheap at start (a few MB read, not the whole
/// file) and different for a model whose configuration, tokenizer or
/// weights differ (a fine-tune changes the first and last tensors' bytes
/// too); a directory (a Hugging Face model) hashes each regular file's
/// name, size, head and tail.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelFingerprint([u8; 32]);

impl ModelFingerprint {
    /// The fingerprint of the model at `path` (a GGUF file or a directory).
    pub fn of_path(path: &Path) -> io::Result<Self> {
        let mut hasher = Sha256::new();
        hasher.update(b"lm-model fingerprint v1");
        if path.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(path)?
                .filter_map(Result::ok)
                .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
                .map(|entry| entry.file_name())
                .collect();
            names.sort();
            for name in names {
                hasher.update(name.as_encoded_bytes());
                hash_file(&mut hasher, &path.join(name), 0)?;
            }
        } else {
            let header_len = crate::gguf::GgufFile::open_metadata(path)
                .map_or(0, |file| file.data_offset() as u64);
            hash_file(&mut hasher, path, header_len)?;
        }
        Ok(Self(hasher.finalize().into()))
    }

    /// The fingerprint of a model known by `bytes` (a name, a
    /// configuration): for models without a file, such as the toy.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Display for ModelFingerprint {
    /// The first 8 bytes in hex: enough to tell two models apart in a note.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0[..8].iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::fmt::Debug for ModelFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelFingerprint({self})")
    }
}

/// Hashes the size of the regular file at `path`, its first `header_len`
/// bytes, and the first and last [`FINGERPRINT_SAMPLE`] bytes after them.
fn hash_file(hasher: &mut Sha256, path: &Path, header_len: u64) -> io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    hasher.update(len.to_le_bytes());
    let head = header_len
        .min(len)
        .saturating_add(FINGERPRINT_SAMPLE)
        .min(len);
    hash_range(hasher, &mut file, 0, head)?;
    let tail_start = len.saturating_sub(FINGERPRINT_SAMPLE).max(head);
    hash_range(hasher, &mut file, tail_start, len)
}

fn hash_range(
    hasher: &mut Sha256,
    file: &mut std::fs::File,
    start: u64,
    end: u64,
) -> io::Result<()> {
    use std::io::Seek;
    file.seek(io::SeekFrom::Start(start))?;
    let mut reader = Read::by_ref(file).take(end - start);
    let mut buf = vec![0; 1 << 16];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

/// Why a state file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    /// The file does not start with [`STATE_MAGIC`].
    #[error("not a state file (its first bytes are not LMKVSTAT)")]
    NotAStateFile,
    /// Another format version.
    #[error("state format version {found}, this build reads version {STATE_VERSION}")]
    UnsupportedVersion {
        /// The file's version.
        found: u32,
    },
    /// The state was saved for another model file.
    #[error("the state was saved for another model (fingerprint {found}, this model {expected})")]
    WrongModel {
        /// This model's fingerprint.
        expected: ModelFingerprint,
        /// The file's.
        found: ModelFingerprint,
    },
    /// A precision code this build does not know.
    #[error("unknown KV precision code {code}")]
    UnknownPrecision {
        /// The file's code.
        code: u8,
    },
    /// The state's KV cache is of another precision than the model's.
    #[error("the state's KV cache is {found:?}, the model's is {expected:?}")]
    WrongPrecision {
        /// The model's.
        expected: KvPrecision,
        /// The file's.
        found: KvPrecision,
    },
    /// The state's dimensions differ from the model's.
    #[error("the state's {field} is {found}, the model's is {expected}")]
    WrongShape {
        /// Which dimension.
        field: &'static str,
        /// The model's.
        expected: u64,
        /// The file's.
        found: u64,
    },
    /// A count in the header is impossible for its shape (more positions
    /// than the context, chunks that do not match the position).
    #[error("the state file is corrupt: {reason}")]
    Corrupt {
        /// What is impossible.
        reason: String,
    },
    /// The file ends before the bytes its header promises.
    #[error("the state file is truncated: {expected} bytes needed, {found} there")]
    Truncated {
        /// Bytes the header promises.
        expected: u64,
        /// Bytes there are.
        found: u64,
    },
    /// The bytes do not match their checksum.
    #[error("the state file's checksum does not match its contents")]
    ChecksumMismatch,
    /// The tokens given with a state are not the ones it read.
    #[error("{n_tokens} tokens given for a state at position {pos}")]
    TokensDoNotMatch {
        /// Tokens given.
        n_tokens: usize,
        /// The state's position.
        pos: usize,
    },
    /// Reading or writing failed.
    #[error("state file i/o: {0}")]
    Io(#[from] io::Error),
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hasher.update(bytes);
        self.inner.write_all(bytes)
    }
}

fn precision_code(precision: KvPrecision) -> u8 {
    match precision {
        KvPrecision::F32 => 0,
        KvPrecision::F16 => 1,
        KvPrecision::Q8_0 => 2,
    }
}

fn precision_of(code: u8) -> Result<KvPrecision, StateFileError> {
    match code {
        0 => Ok(KvPrecision::F32),
        1 => Ok(KvPrecision::F16),
        2 => Ok(KvPrecision::Q8_0),
        _ => Err(StateFileError::UnknownPrecision { code }),
    }
}

/// The header's fields after the magic and version.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    model: ModelFingerprint,
    precision_code: u8,
    n_layer: u64,
    n_kv_head: u64,
    head_dim: u64,
    n_ring_layers: u64,
    capacity: u64,
    n_ring_chunks: u64,
    pos: u64,
    floor: u64,
    n_full_saved: u64,
    n_ring_saved: u64,
}

impl Header {
    fn of(state: &DecoderState, model: ModelFingerprint) -> Self {
        let cache = &state.cache;
        let shape = cache.shape();
        let (n_ring_layers, n_ring_chunks) = cache.ring_layout();
        let (n_full_saved, n_ring_saved) = cache.n_saved_chunks();
        let wide = |n: usize| n as u64;
        Self {
            model,
            precision_code: precision_code(cache.precision()),
            n_layer: wide(shape.n_layer),
            n_kv_head: wide(shape.n_kv_head),
            head_dim: wide(shape.head_dim),
            n_ring_layers: wide(n_ring_layers),
            capacity: wide(shape.capacity),
            n_ring_chunks: wide(n_ring_chunks),
            pos: wide(cache.pos()),
            floor: wide(cache.ring_floor()),
            n_full_saved: wide(n_full_saved),
            n_ring_saved: wide(n_ring_saved),
        }
    }

    fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..8].copy_from_slice(&STATE_MAGIC);
        out[8..12].copy_from_slice(&STATE_VERSION.to_le_bytes());
        out[12..44].copy_from_slice(&self.model.0);
        out[44] = self.precision_code;
        for (i, v) in [
            self.n_layer,
            self.n_kv_head,
            self.head_dim,
            self.n_ring_layers,
        ]
        .into_iter()
        .enumerate()
        {
            out[48 + 4 * i..52 + 4 * i].copy_from_slice(&(v as u32).to_le_bytes());
        }
        let longs = [
            self.capacity,
            self.n_ring_chunks,
            self.pos,
            self.floor,
            self.n_full_saved,
            self.n_ring_saved,
        ];
        for (i, v) in longs.into_iter().enumerate() {
            out[64 + 8 * i..72 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    fn from_bytes(b: &[u8; HEADER_LEN]) -> Result<Self, StateFileError> {
        if b[..8] != STATE_MAGIC {
            return Err(StateFileError::NotAStateFile);
        }
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |at: usize| {
            let mut bytes = [0; 8];
            bytes.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(bytes)
        };
        let version = u32_at(8);
        if version != STATE_VERSION {
            return Err(StateFileError::UnsupportedVersion { found: version });
        }
        let mut model = [0; 32];
        model.copy_from_slice(&b[12..44]);
        Ok(Self {
            model: ModelFingerprint(model),
            precision_code: b[44],
            n_layer: u32_at(48).into(),
            n_kv_head: u32_at(52).into(),
            head_dim: u32_at(56).into(),
            n_ring_layers: u32_at(60).into(),
            capacity: u64_at(64),
            n_ring_chunks: u64_at(72),
            pos: u64_at(80),
            floor: u64_at(88),
            n_full_saved: u64_at(96),
            n_ring_saved: u64_at(104),
        })
    }
}

impl DecoderState {
    /// Writes the state, the `tokens` it read (exactly [`DecoderState`]'s
    /// position of them) and the fingerprint of its model to `w` (module
    /// docs' layout). The writer is not flushed or synced: an atomic file
    /// write is the caller's (write a temporary file, sync, rename).
    pub fn write_to(
        &self,
        w: &mut impl Write,
        model: ModelFingerprint,
        tokens: &[TokenId],
    ) -> Result<(), StateFileError> {
        let cache = &self.cache;
        let pos = cache.pos();
        let history_disagrees = self
            .history
            .as_ref()
            .is_some_and(|history| history.get(..pos) != Some(tokens));
        if tokens.len() != pos || history_disagrees {
            return Err(StateFileError::TokensDoNotMatch {
                n_tokens: tokens.len(),
                pos,
            });
        }
        let header = Header::of(self, model);
        let mut out = Hashing {
            inner: w,
            hasher: Sha256::new(),
        };
        out.put(&header.to_bytes())?;
        let token_bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        out.put(&token_bytes)?;
        let (n_full, n_ring) = cache.n_saved_chunks();
        let mut buf = Vec::with_capacity(cache.chunk_bytes(false).max(cache.chunk_bytes(true)));
        for (ring, n) in [(false, n_full), (true, n_ring)] {
            for idx in 0..n {
                buf.clear();
                cache.put_chunk(ring, idx, &mut buf);
                out.put(&buf)?;
            }
        }
        let checksum: [u8; CHECKSUM_LEN] = out.hasher.finalize().into();
        out.inner.write_all(&checksum)?;
        Ok(())
    }

    /// The bytes [`DecoderState::write_to`] writes for this state.
    pub fn saved_len(&self) -> u64 {
        let cache = &self.cache;
        let (n_full, n_ring) = cache.n_saved_chunks();
        (HEADER_LEN + 4 * cache.pos() + CHECKSUM_LEN) as u64
            + (n_full * cache.chunk_bytes(false) + n_ring * cache.chunk_bytes(true)) as u64
    }
}

impl Decoder {
    /// Reads a state [`DecoderState::write_to`] wrote for `model` (this
    /// decoder's fingerprint) from `r`, of which `available` bytes are
    /// left (a file's length): the tokens it read and the state. See
    /// [`DecoderState::read_into`].
    pub fn read_state(
        &self,
        r: &mut impl Read,
        available: u64,
        model: ModelFingerprint,
    ) -> Result<(Vec<TokenId>, DecoderState), StateFileError> {
        let mut state = self.new_state();
        let tokens = state.read_into(r, available, model)?;
        Ok((tokens, state))
    }
}

impl DecoderState {
    /// Reads a state [`DecoderState::write_to`] wrote for `model` from `r`
    /// (of which `available` bytes are left) into this state, which must
    /// be a fresh state of the model (`Decoder::new_state`): its shape and
    /// precision are what the file is checked against. Returns the tokens
    /// the state read. Refuses a file of another model, precision, shape or
    /// format, a truncated or damaged one, before changing the state; never
    /// allocates more than `available` bytes' worth. Reads exactly the
    /// state's bytes, so states can follow one another in one stream.
    pub fn read_into(
        &mut self,
        r: &mut impl Read,
        available: u64,
        model: ModelFingerprint,
    ) -> Result<Vec<TokenId>, StateFileError> {
        let truncated = |expected: u64| StateFileError::Truncated {
            expected,
            found: available,
        };
        let mut header_bytes = [0u8; HEADER_LEN];
        if available < HEADER_LEN as u64 {
            // Read what there is: a flipped magic is named as such.
            let mut head = Vec::new();
            r.take(available).read_to_end(&mut head)?;
            if head.len() >= 8 && head[..8] != STATE_MAGIC {
                return Err(StateFileError::NotAStateFile);
            }
            return Err(truncated((HEADER_LEN + CHECKSUM_LEN) as u64));
        }
        r.read_exact(&mut header_bytes)?;
        let header = Header::from_bytes(&header_bytes)?;
        let (full_len, ring_len) = check_header(&header, self, model)?;
        let pos = header.pos as usize;
        let total = (HEADER_LEN + 4 * pos + CHECKSUM_LEN) as u64 + (full_len + ring_len) as u64;
        if total > available {
            return Err(truncated(total));
        }
        let mut hasher = Sha256::new();
        hasher.update(header_bytes);
        let mut read = |len: usize| -> Result<Vec<u8>, StateFileError> {
            let mut bytes = vec![0; len];
            r.read_exact(&mut bytes)?;
            hasher.update(&bytes);
            Ok(bytes)
        };
        let token_bytes = read(4 * pos)?;
        let full = read(full_len)?;
        let ring = read(ring_len)?;
        let mut checksum = [0u8; CHECKSUM_LEN];
        r.read_exact(&mut checksum)?;
        if <[u8; CHECKSUM_LEN]>::from(hasher.finalize()) != checksum {
            return Err(StateFileError::ChecksumMismatch);
        }
        let tokens: Vec<TokenId> = token_bytes
            .chunks_exact(4)
            .map(|b| TokenId::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        self.cache.restore(pos, header.floor as usize, &full, &ring);
        if let Some(history) = &mut self.history {
            history.clear();
            history.extend_from_slice(&tokens);
        }
        Ok(tokens)
    }
}

/// Checks `header` against `fresh`, a state of the model, and
/// returns the bytes of the full store's and the ring's saved chunks.
fn check_header(
    header: &Header,
    fresh: &DecoderState,
    model: ModelFingerprint,
) -> Result<(usize, usize), StateFileError> {
    if header.model != model {
        return Err(StateFileError::WrongModel {
            expected: model,
            found: header.model,
        });
    }
    let cache = &fresh.cache;
    let found = precision_of(header.precision_code)?;
    if found != cache.precision() {
        return Err(StateFileError::WrongPrecision {
            expected: cache.precision(),
            found,
        });
    }
    let expected = Header::of(fresh, model);
    for (field, expected, found) in [
        ("layer count", expected.n_layer, header.n_layer),
        ("key/value head count", expected.n_kv_head, header.n_kv_head),
        ("head width", expected.head_dim, header.head_dim),
        ("context length", expected.capacity, header.capacity),
        (
            "sliding-window layer count",
            expected.n_ring_layers,
            header.n_ring_layers,
        ),
        (
            "ring chunk count",
            expected.n_ring_chunks,
            header.n_ring_chunks,
        ),
    ] {
        if expected != found {
            return Err(StateFileError::WrongShape {
                field,
                expected,
                found,
            });
        }
    }
    let corrupt = |reason: String| Err(StateFileError::Corrupt { reason });
    if header.pos > header.capacity {
        return corrupt(format!(
            "position {} beyond the context length {}",
            header.pos, header.capacity
        ));
    }
    // pos <= capacity, which the model holds in memory: the products fit.
    let chunks_needed = (header.pos as usize).div_ceil(super::CHUNK_LEN) as u64;
    let ring_needed = if header.n_ring_chunks == 0 {
        0
    } else {
        chunks_needed.min(header.n_ring_chunks)
    };
    if header.n_full_saved != chunks_needed || header.n_ring_saved != ring_needed {
        return corrupt(format!(
            "{} + {} chunks saved for position {} ({chunks_needed} + {ring_needed} expected)",
            header.n_full_saved, header.n_ring_saved, header.pos
        ));
    }
    if header.floor > header.capacity {
        return corrupt(format!(
            "ring floor {} beyond the context length {}",
            header.floor, header.capacity
        ));
    }
    Ok((
        chunks_needed as usize * cache.chunk_bytes(false),
        ring_needed as usize * cache.chunk_bytes(true),
    ))
}
