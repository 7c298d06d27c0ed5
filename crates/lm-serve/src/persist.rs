//! `--cache-dir DIR`: the prefix cache's states on disk, so a restarted
//! server answers the next turn of a conversation from where it was
//! (llama-server's slot save and restore, for the whole cache at once).
//!
//! ```text
//! DIR/prefix-cache.lmstate
//!   "LMPREFIX"  version (u32)  state count (u32)
//!   state 1 .. state n    (lm-model's state files, least recently used first:
//!                          each with its model's fingerprint, its tokens and
//!                          a checksum)
//! ```
//!
//! Written on shutdown and on `POST /slots/save`, atomically: a temporary
//! file in the same directory, synced, renamed over the old one, and the
//! directory synced, so a crash leaves the old file or the new one, never
//! half of one. Read once at start: a file that is not a cache file, of
//! another model or precision, cut short or damaged is refused whole with a
//! warning (in the log and in [`CacheNotes`], which `lm-cli serve` prints),
//! and the server starts with an empty cache.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lm::lm_model::{DecoderState, ModelFingerprint, NgramState, StateFileError};
use lm_core::{LanguageModel, Prefix, SequenceState, TokenId};
use lm_decode::PrefixCache;

use crate::error::ServeError;
use crate::metrics::Metrics;
use crate::routes::App;
use crate::{ServeConfig, StateSize};

/// The cache file's name in the cache directory.
pub const CACHE_FILE: &str = "prefix-cache.lmstate";
/// The cache file's first bytes.
const MAGIC: [u8; 8] = *b"LMPREFIX";
/// The cache file's format version.
const VERSION: u32 = 1;

/// Where the prefix cache is kept across restarts (`--cache-dir`), and the
/// fingerprint of the model served, which every saved state must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDir {
    /// The directory (created at start if missing).
    pub path: PathBuf,
    /// The served model's fingerprint (`ModelFingerprint::of_path` of its file).
    pub model: ModelFingerprint,
}

impl CacheDir {
    /// The cache file.
    pub fn file(&self) -> PathBuf {
        self.path.join(CACHE_FILE)
    }
}

/// Why the prefix cache could not be saved or was not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PersistError {
    /// The model's states have no file format (only a transformer's do).
    #[error("this model's states cannot be saved (only a transformer's can)")]
    NotSavable,
    /// The file does not start with the cache file's magic.
    #[error("not a prefix cache file")]
    NotACacheFile,
    /// Another version of the format.
    #[error("prefix cache format version {found}, this build reads version {VERSION}")]
    UnsupportedVersion {
        /// The file's version.
        found: u32,
    },
    /// The path is a directory, a FIFO or a device, not a file.
    #[error("not a regular file")]
    NotRegularFile,
    /// One of the states was refused.
    #[error("state {index}: {source}")]
    State {
        /// Which state (from 0).
        index: u32,
        /// Why.
        #[source]
        source: StateFileError,
    },
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A sequence state the prefix cache can save and load: lm-model's
/// transformer state. The others (n-gram histories, `Prefix`) keep the
/// defaults, `SAVABLE = false`, and a server with `--cache-dir` refuses them.
pub trait SavedState: Sized {
    /// Whether [`SavedState::write_state`] and [`SavedState::read_state`] work.
    const SAVABLE: bool = false;

    /// Writes the state and the `tokens` it read, stamped with `model`.
    fn write_state(
        &self,
        _w: &mut dyn Write,
        _model: ModelFingerprint,
        _tokens: &[TokenId],
    ) -> Result<(), StateFileError> {
        Err(not_savable())
    }

    /// Reads a state written by [`SavedState::write_state`] into `self`,
    /// a fresh state of the model (its shape and precision are checked
    /// against the file's), with `available` bytes left in `r`; returns the
    /// tokens it read.
    fn read_state(
        &mut self,
        _r: &mut dyn Read,
        _available: u64,
        _model: ModelFingerprint,
    ) -> Result<Vec<TokenId>, StateFileError> {
        Err(not_savable())
    }
}

fn not_savable() -> StateFileError {
    StateFileError::Io(io::Error::new(
        io::ErrorKind::Unsupported,
        PersistError::NotSavable.to_string(),
    ))
}

impl SavedState for DecoderState {
    const SAVABLE: bool = true;

    fn write_state(
        &self,
        mut w: &mut dyn Write,
        model: ModelFingerprint,
        tokens: &[TokenId],
    ) -> Result<(), StateFileError> {
        self.write_to(&mut w, model, tokens)
    }

    fn read_state(
        &mut self,
        mut r: &mut dyn Read,
        available: u64,
        model: ModelFingerprint,
    ) -> Result<Vec<TokenId>, StateFileError> {
        self.read_into(&mut r, available, model)
    }
}

impl SavedState for NgramState {}

impl SavedState for Prefix {}

/// What a save wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveReport {
    /// States written.
    pub n_states: usize,
    /// The file's length.
    pub n_bytes: u64,
}

/// Saves a prefix cache of some state type: what the server keeps of it
/// (for `POST /slots/save` and shutdown) without naming the type.
pub(crate) trait SaveCache: Send + Sync {
    /// Writes every kept state to the cache file, atomically.
    fn save(&self) -> Result<SaveReport, PersistError>;

    /// The cache file.
    fn file(&self) -> PathBuf;

    /// What loading and saving came to.
    fn notes(&self) -> &CacheNotes;
}

/// The prefix cache of states `S` and where it is saved.
pub(crate) struct Saver<S> {
    pub(crate) cache: Arc<Mutex<PrefixCache<S>>>,
    pub(crate) dir: CacheDir,
    /// Held while a save runs, so two saves never share the temporary file.
    pub(crate) writing: Mutex<()>,
    pub(crate) notes: CacheNotes,
}

impl<S: SavedState + SequenceState + Send> SaveCache for Saver<S> {
    fn save(&self) -> Result<SaveReport, PersistError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        std::fs::create_dir_all(&self.dir.path)?;
        let states = kept_states(&self.cache);
        let model = self.dir.model;
        let n_bytes = write_atomically(&self.dir.file(), |w| -> Result<(), PersistError> {
            w.write_all(&MAGIC)?;
            w.write_all(&VERSION.to_le_bytes())?;
            let n_states = u32::try_from(states.len()).unwrap_or(u32::MAX);
            w.write_all(&n_states.to_le_bytes())?;
            for (index, (tokens, state)) in (0..n_states).zip(&states) {
                state
                    .write_state(w, model, tokens)
                    .map_err(|source| PersistError::State { index, source })?;
            }
            Ok(())
        })?;
        Ok(SaveReport {
            n_states: states.len(),
            n_bytes,
        })
    }

    fn file(&self) -> PathBuf {
        self.dir.file()
    }

    fn notes(&self) -> &CacheNotes {
        &self.notes
    }
}

/// Refuses `--cache-dir` for a model whose states cannot be saved.
pub(crate) fn check<S: SavedState>(config: &ServeConfig) -> Result<(), ServeError> {
    if config.cache_dir.is_some() && !S::SAVABLE {
        return Err(ServeError::InvalidSetting {
            name: "cache-dir",
            reason: PersistError::NotSavable.to_string(),
        });
    }
    Ok(())
}

/// Reads `dir`'s cache file into `cache` (a refused file is a warning in
/// the log, and the cache starts empty) and returns what saves it; both
/// note what they did in `notes`.
pub(crate) fn open<M>(
    dir: CacheDir,
    model: &M,
    cache: &Arc<Mutex<PrefixCache<M::State>>>,
    metrics: &Metrics,
    notes: CacheNotes,
) -> Arc<dyn SaveCache>
where
    M: LanguageModel,
    M::State: SavedState + StateSize + Send + 'static,
{
    let file = dir.file().display().to_string();
    {
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        match load(&dir, || model.new_state(), &mut cache) {
            Ok(0) => {}
            Ok(n_states) => notes.info(format!(
                "{file}: {n_states} states read into the prefix cache ({} kept, {} bytes)",
                cache.len(),
                cache.used_bytes()
            )),
            Err(error) => notes.warn(format!(
                "{file}: not loaded, the prefix cache starts empty: {error}"
            )),
        }
        metrics.record_cache_usage(cache.len(), cache.used_bytes());
    }
    Arc::new(Saver {
        cache: Arc::clone(cache),
        dir,
        writing: Mutex::new(()),
        notes,
    })
}

/// What the cache directory's reads and writes at start and at shutdown
/// came to, one line each, for the program to show ([`crate::Server::cache_notes`]);
/// each line is also logged (a refusal or a failure as a warning).
#[derive(Debug, Clone, Default)]
pub struct CacheNotes(Arc<Mutex<Vec<String>>>);

impl CacheNotes {
    /// The lines noted since the last call.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn info(&self, line: String) {
        log::info!("{line}");
        self.push(line);
    }

    fn warn(&self, line: String) {
        log::warn!("{line}");
        self.push(line);
    }

    fn push(&self, line: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
}

/// Saves the prefix cache when the server stops (with `--cache-dir`); a
/// failure is a warning in the log.
pub(crate) fn save_on_shutdown(app: &App) {
    let Some(saver) = &app.saved_cache else {
        return;
    };
    let file = saver.file().display().to_string();
    match saver.save() {
        Ok(report) => saver.notes().info(format!(
            "{file}: {} states saved ({} bytes)",
            report.n_states, report.n_bytes
        )),
        Err(error) => saver
            .notes()
            .warn(format!("{file}: the prefix cache was not saved: {error}")),
    }
}

/// Copies of the kept states (their chunks shared, not copied) and the
/// tokens each read, least recently used first; their order of use is
/// left as it was.
fn kept_states<S: SequenceState>(cache: &Mutex<PrefixCache<S>>) -> Vec<(Vec<TokenId>, S)> {
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    let kept: Vec<Vec<TokenId>> = cache.kept().into_iter().rev().map(<[_]>::to_vec).collect();
    kept.into_iter()
        .filter_map(|tokens| {
            // Looking up each in order of use, oldest first, keeps the order.
            let (state, n_shared) = cache.longest_prefix(&tokens)?;
            (n_shared == tokens.len()).then_some((tokens, state))
        })
        .collect()
}

/// Writes `path` through `write`: into a new temporary file beside it,
/// synced, then renamed over `path`, and the directory synced. Returns the
/// bytes written. A symlink at `path` is replaced, never written through.
pub(crate) fn write_atomically<E: From<io::Error>>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> Result<(), E>,
) -> Result<u64, E> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    // A file left by a crash of this process id goes first; `create_new`
    // never opens what is already there (a symlink, a FIFO).
    let _ = std::fs::remove_file(&temp);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)?;
    let written = (|| {
        let mut w = BufWriter::new(file);
        write(&mut w)?;
        let file = w.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        let n_bytes = file.metadata()?.len();
        std::fs::rename(&temp, path)?;
        File::open(dir)?.sync_all()?;
        Ok(n_bytes)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// Reads the cache file of `dir` into `cache` (fresh states from
/// `new_state`), least recently used first: the number of states read.
/// `Ok(0)` when there is no file; an error when any part of it is refused,
/// in which case the cache (empty at start) is left empty.
pub(crate) fn load<S: SavedState + SequenceState>(
    dir: &CacheDir,
    new_state: impl Fn() -> S,
    cache: &mut PrefixCache<S>,
) -> Result<usize, PersistError> {
    let path = dir.file();
    // Checked before opening (opening a FIFO waits for a writer), and again
    // on the open file.
    match std::fs::metadata(&path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(err) => return Err(err.into()),
        Ok(meta) if !meta.is_file() => return Err(PersistError::NotRegularFile),
        Ok(_) => {}
    }
    let file = File::open(&path)?;
    let len = file.metadata()?.len();
    let mut r = BufReader::new(file);
    let mut head = [0u8; 16];
    if len < head.len() as u64 {
        return Err(PersistError::NotACacheFile);
    }
    r.read_exact(&mut head)?;
    if head[..8] != MAGIC {
        return Err(PersistError::NotACacheFile);
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if version != VERSION {
        return Err(PersistError::UnsupportedVersion { found: version });
    }
    let n_states = u32::from_le_bytes([head[12], head[13], head[14], head[15]]);
    let mut r = Counting {
        inner: r,
        n_read: 16,
    };
    for index in 0..n_states {
        let mut state = new_state();
        let available = len - r.n_read;
        match state.read_state(&mut r, available, dir.model) {
            Ok(tokens) => cache.insert(tokens, state),
            Err(source) => {
                cache.clear();
                return Err(PersistError::State { index, source });
            }
        }
    }
    Ok(n_states as usize)
}

/// A reader that counts the bytes read through it.
struct Counting<R> {
    inner: R,
    n_read: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n_read += n as u64;
        Ok(n)
    }
}
