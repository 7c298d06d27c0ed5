//! Files the user names, read and written so that no path can hang the
//! program, eat its memory or damage what it points to.
//!
//! Inputs (models, corpora, saved conversations) are checked to be regular
//! files before they are opened, so a directory, `/dev/zero` or a FIFO
//! without a writer is named instead of being read forever or waited on.
//! Outputs are written as `cp` would leave them, never replacing what the
//! path points to:
//!
//! ```text
//! path ─follow symlinks─> target
//!   missing or regular file ─> temporary file beside the target, renamed
//!                              onto it when complete (an old file's mode kept)
//!   device, FIFO, ...       ─> written through, as `echo > /dev/null` does
//!   directory               ─> refused before any work
//! ```

use std::fs::{self, File, FileType, Metadata, OpenOptions};
use std::io::{self, BufRead, BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// A named file that cannot be used as asked.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Nothing at the path.
    #[error("{} not found", path.display())]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// A directory where a file was expected.
    #[error("{} is a directory", path.display())]
    Directory {
        /// The path given.
        path: PathBuf,
    },
    /// A device, FIFO or socket where a regular file was expected.
    #[error("{} is not a regular file (it is a {kind})", path.display())]
    NotRegular {
        /// The path given.
        path: PathBuf,
        /// What it is: `character device`, `fifo`, ...
        kind: &'static str,
    },
    /// A file larger than what is read of its kind.
    #[error("{} is {len} bytes, more than the {max} bytes read at most", path.display())]
    TooLarge {
        /// The path given.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The cap.
        max: u64,
    },
    /// A stream (a pipe, stdin) that goes on past what is read of its kind.
    #[error("{} goes on past the {max} bytes read at most", path.display())]
    TooLong {
        /// The path given (`stdin` for standard input).
        path: PathBuf,
        /// The cap.
        max: u64,
    },
    /// Text that is not UTF-8.
    #[error("{} is not UTF-8 text (an invalid byte at offset {offset})", path.display())]
    NotUtf8 {
        /// The path given.
        path: PathBuf,
        /// Where the first invalid byte is.
        offset: u64,
    },
    /// A NUL byte near the start: no text file holds one.
    #[error("{} is binary (a NUL byte at offset {offset}), not text", path.display())]
    Binary {
        /// The path given.
        path: PathBuf,
        /// Where the first NUL is.
        offset: u64,
    },
    /// The output path names the input file (the same file, or a link to it).
    #[error("the output {} is the input {}: writing it would destroy the input", output.display(), input.display())]
    OutputIsInput {
        /// The output path given.
        output: PathBuf,
        /// The input path given.
        input: PathBuf,
    },
    /// The operating system refused (a permission, a full disk, ...).
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done: `opening`, `writing`, ...
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

/// Which inputs besides regular files an input may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Only a regular file: the reader opens it more than once or needs its size.
    File,
    /// A regular file or a pipe (`--corpus /dev/stdin`, `<(...)`), read once.
    FileOrPipe,
}

/// What a file type is called in messages.
pub fn kind_name(file_type: FileType) -> &'static str {
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_fifo() {
        "fifo"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "regular file"
    }
}

/// Refuses a directory, and any other non-regular file `allowed` does not admit.
fn check_kind(path: &Path, metadata: &Metadata, allowed: Input) -> Result<(), FileError> {
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        return Err(FileError::Directory {
            path: path.to_path_buf(),
        });
    }
    let admitted = file_type.is_file() || (allowed == Input::FileOrPipe && file_type.is_fifo());
    if admitted {
        Ok(())
    } else {
        Err(FileError::NotRegular {
            path: path.to_path_buf(),
            kind: kind_name(file_type),
        })
    }
}

/// The metadata of `path` (symlinks followed), a missing path named as such.
fn metadata(path: &Path) -> Result<Metadata, FileError> {
    fs::metadata(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => FileError::Missing {
            path: path.to_path_buf(),
        },
        _ => FileError::Io {
            what: "reading the metadata of",
            path: path.to_path_buf(),
            source,
        },
    })
}

/// Opens an input file after checking what it is, so that a directory, a
/// device such as `/dev/zero` or (unless `allowed`) a FIFO is refused by
/// name before anything is read or waited on. The type is checked again on
/// the opened file, in case the path changed in between.
pub fn open_input(path: &Path, allowed: Input) -> Result<File, FileError> {
    check_kind(path, &metadata(path)?, allowed)?;
    let file = File::open(path).map_err(|source| FileError::Io {
        what: "opening",
        path: path.to_path_buf(),
        source,
    })?;
    let opened = file.metadata().map_err(|source| FileError::Io {
        what: "reading the metadata of",
        path: path.to_path_buf(),
        source,
    })?;
    check_kind(path, &opened, allowed)?;
    Ok(file)
}

/// What is read at most of a text input (a prompt, a text to score, a
/// schema or a grammar): far beyond any context, and a bound on what an
/// endless producer (`cat /dev/zero |`) can make the program hold.
pub const MAX_TEXT_BYTES: u64 = 256 << 20;

/// Reads an input of at most `max` bytes whole: a regular file larger than
/// that is refused by its size before it is read, and a pipe (or a file
/// that grows while it is read) is cut off at `max + 1` bytes and refused.
pub fn read_capped(path: &Path, allowed: Input, max: u64) -> Result<Vec<u8>, FileError> {
    let file = open_input(path, allowed)?;
    let metadata = file.metadata().map_err(|source| FileError::Io {
        what: "reading the metadata of",
        path: path.to_path_buf(),
        source,
    })?;
    if metadata.is_file() && metadata.len() > max {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
            len: metadata.len(),
            max,
        });
    }
    read_stream_capped(file, path, max)
}

/// Reads at most `max` bytes of `reader` (named `path` in messages) whole;
/// one byte more is [`FileError::TooLong`].
pub fn read_stream_capped(reader: impl Read, path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    let mut bytes = Vec::new();
    reader
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| FileError::Io {
            what: "reading",
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > max {
        return Err(FileError::TooLong {
            path: path.to_path_buf(),
            max,
        });
    }
    Ok(bytes)
}

/// Reads a text input whole (a regular file or a pipe, at most
/// [`MAX_TEXT_BYTES`], UTF-8), so `-f /dev/zero` is refused by name and
/// `-f <(yes)` by length instead of filling the memory.
pub fn read_text(path: &Path) -> Result<String, FileError> {
    utf8(read_capped(path, Input::FileOrPipe, MAX_TEXT_BYTES)?, path)
}

/// Reads standard input whole as text, with [`read_text`]'s bounds.
pub fn read_stdin_text() -> Result<String, FileError> {
    let path = Path::new("stdin");
    utf8(
        read_stream_capped(io::stdin().lock(), path, MAX_TEXT_BYTES)?,
        path,
    )
}

/// `bytes` as a string, or the offset of the first byte that is not UTF-8.
fn utf8(bytes: Vec<u8>, path: &Path) -> Result<String, FileError> {
    String::from_utf8(bytes).map_err(|error| FileError::NotUtf8 {
        path: path.to_path_buf(),
        offset: error.utf8_error().valid_up_to() as u64,
    })
}

/// How much of a text input [`refuse_binary`] looks at.
pub const SNIFF_BYTES: usize = 4096;

/// Refuses an input that holds a NUL byte in its first [`SNIFF_BYTES`]
/// bytes, before anything reads on: a binary file has no lines, so a
/// line-by-line reader would otherwise hold all of it at once.
pub fn refuse_binary(reader: &mut impl BufRead, path: &Path) -> Result<(), FileError> {
    let head = reader.fill_buf().map_err(|source| FileError::Io {
        what: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    match head.iter().take(SNIFF_BYTES).position(|&b| b == 0) {
        Some(offset) => Err(FileError::Binary {
            path: path.to_path_buf(),
            offset: offset as u64,
        }),
        None => Ok(()),
    }
}

/// The path `path` names once every symlink in its last component is
/// followed (relative targets taken from the link's folder), so that a
/// rename replaces the file the link points to and the link stays. A loop
/// stops after 40 links (Linux's limit); opening the path then reports it.
fn follow_links(path: &Path) -> PathBuf {
    let mut path = path.to_path_buf();
    for _ in 0..40 {
        match fs::read_link(&path) {
            Ok(target) => {
                let folder = path.parent().unwrap_or(Path::new("")).to_path_buf();
                path = folder.join(target);
            }
            Err(_) => break,
        }
    }
    path
}

/// An output file, opened before the work that fills it, so that a path
/// that cannot be written is refused before a long run (see the module doc
/// for what each kind of target gets).
#[derive(Debug)]
pub struct OutputFile {
    /// The path as given, for messages.
    path: PathBuf,
    /// The identity (device, inode) of what the path named, if it existed.
    existing: Option<(u64, u64)>,
    sink: Sink,
}

#[derive(Debug)]
enum Sink {
    /// Standard output (`-`).
    Stdout,
    /// A temporary file in the target's folder, renamed onto `target`.
    Replace {
        target: PathBuf,
        temp: NamedTempFile,
    },
    /// An existing device, FIFO or socket, written through.
    Through(File),
}

impl OutputFile {
    /// Prepares to write `path`: `-` is standard output when `dash_is_stdout`.
    pub fn create(path: &Path, dash_is_stdout: bool) -> Result<Self, FileError> {
        if dash_is_stdout && path.as_os_str() == "-" {
            return Ok(Self {
                path: path.to_path_buf(),
                existing: None,
                sink: Sink::Stdout,
            });
        }
        let io_error = |what| {
            move |source| FileError::Io {
                what,
                path: path.to_path_buf(),
                source,
            }
        };
        let target = follow_links(path);
        let existing = match fs::metadata(&target) {
            Ok(metadata) => Some(metadata),
            Err(error) if error.kind() == io::ErrorKind::NotFound => None,
            Err(error) => return Err(io_error("reading the metadata of")(error)),
        };
        let identity = existing.as_ref().map(|m| (m.dev(), m.ino()));
        let sink = match &existing {
            Some(metadata) if metadata.is_dir() => {
                return Err(FileError::Directory {
                    path: path.to_path_buf(),
                });
            }
            Some(metadata) if !metadata.is_file() => Sink::Through(
                OpenOptions::new()
                    .write(true)
                    .open(&target)
                    .map_err(io_error("opening"))?,
            ),
            _ => {
                let folder = match target.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => parent,
                    _ => Path::new("."),
                };
                // Temporary files are private (0600); a new output is an
                // ordinary file (0644 less the umask), a replaced one keeps
                // its mode.
                let mut builder = tempfile::Builder::new();
                builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
                let temp = builder
                    .tempfile_in(folder)
                    .map_err(io_error("creating a temporary file beside"))?;
                if let Some(metadata) = &existing {
                    temp.as_file()
                        .set_permissions(metadata.permissions())
                        .map_err(io_error("keeping the mode of"))?;
                }
                Sink::Replace { target, temp }
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            existing: identity,
            sink,
        })
    }

    /// Refuses to write over `input` (the same file by device and inode,
    /// so also through a symlink or a hard link).
    pub fn refuse_input(&self, input: &Path, input_metadata: &Metadata) -> Result<(), FileError> {
        if self.existing == Some((input_metadata.dev(), input_metadata.ino())) {
            return Err(FileError::OutputIsInput {
                output: self.path.clone(),
                input: input.to_path_buf(),
            });
        }
        Ok(())
    }

    /// Whether this is standard output.
    pub fn is_stdout(&self) -> bool {
        matches!(self.sink, Sink::Stdout)
    }

    /// Writes the output with `write` and completes it: a regular file is
    /// synced and renamed into place only after `write` succeeded, so a
    /// failed or interrupted run leaves the old file as it was.
    pub fn write(
        self,
        write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<(), FileError> {
        let path = self.path;
        let io_error = |what| {
            let path = path.clone();
            move |source| FileError::Io { what, path, source }
        };
        match self.sink {
            Sink::Stdout => {
                let mut out = BufWriter::new(io::stdout().lock());
                write(&mut out)
                    .and_then(|()| out.flush())
                    .map_err(io_error("writing"))
            }
            Sink::Through(file) => {
                let mut out = BufWriter::new(file);
                write(&mut out)
                    .and_then(|()| out.flush())
                    .map_err(io_error("writing"))
            }
            Sink::Replace { target, temp } => {
                let mut out = BufWriter::new(temp);
                write(&mut out).map_err(io_error("writing"))?;
                let temp = out
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .map_err(io_error("writing"))?;
                temp.as_file().sync_all().map_err(io_error("writing"))?;
                temp.persist(&target)
                    .map_err(|e| e.error)
                    .map_err(io_error("renaming the temporary file to"))?;
                Ok(())
            }
        }
    }
}
