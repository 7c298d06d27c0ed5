//! Model specs (`toy`, `count:FILE`, `FILE.gguf`, a known model's name such as
//! `smollm2` or `gemma3-270m`, or the embedded
//! default): parsing, loading, and running one generic command on whichever
//! model was loaded.
//!
//! Each command is written once, generic over [`LanguageModel`], as a
//! [`ModelTask`]; [`LoadedModel::run`] picks the concrete type once (and the
//! `--no-cache` and `--context-length` adapters), so no command is copied per
//! model type:
//!
//! ```text
//! "toy" ─parse─> ModelSpec::Toy ─load─> LoadedModel { Backend::Toy, TextCodec::Toy }
//!                                          │ run(task)
//!                                          ▼
//!                      task.run(&Bounded<Decoder> or &Bounded<Uncached<Decoder>>, &codec)
//! ```

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, Result};
use lm_core::{Bounded, LanguageModel, Uncached};
use lm_model::catalog::{KNOWN_MODELS, KnownModel};
use lm_model::ngram::{self, COMPACT_MAGIC, NgramModel, TrainOptions, Utf8Policy};
use lm_model::{Decoder, Toy};

use crate::files::{self, Input};
use crate::text::TextCodec;

/// Which model the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// The lessons' seven-token decoder.
    Toy,
    /// A count model from an ARPA file (or a compact model file), or a text
    /// corpus trained on the fly.
    Count(PathBuf),
    /// A llama-architecture GGUF file, or a Hugging Face model directory.
    Gguf(PathBuf),
    /// A model known by name (`smollm2`, `gemma3-270m`, ...) from the models
    /// folder (`cargo xtask fetch-model NAME` puts it there).
    Known(&'static KnownModel),
    /// The embedded KJV trigram model (no `--model`).
    Embedded,
}

/// A model spec that names nothing we know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Not one of the spec forms.
    #[error(
        "unknown model spec '{spec}' (expected toy, count:FILE, FILE.gguf or a known model: {})",
        known_names()
    )]
    Unknown {
        /// What was typed.
        spec: String,
    },
    /// `count:` without a file.
    #[error("model spec 'count:' needs a file, e.g. count:model.arpa")]
    EmptyCountPath,
    /// A directory, device or FIFO given as a model file.
    #[error("model spec '{spec}' is a {kind}, not a model file")]
    NotAFile {
        /// What was typed.
        spec: String,
        /// What it is: `directory`, `fifo`, ...
        kind: &'static str,
    },
    /// An ARPA file given without `count:`.
    #[error("model spec '{spec}' is an ARPA file: a count model is given as count:{spec}")]
    ArpaWithoutCount {
        /// What was typed.
        spec: String,
    },
}

impl FromStr for ModelSpec {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, SpecError> {
        if spec == "toy" {
            return Ok(Self::Toy);
        }
        if let Ok(known) = KnownModel::find(spec) {
            return Ok(Self::Known(known));
        }
        if let Some(path) = spec.strip_prefix("count:") {
            if path.is_empty() {
                return Err(SpecError::EmptyCountPath);
            }
            return Ok(Self::Count(PathBuf::from(path)));
        }
        let lowercase = spec.to_ascii_lowercase();
        if lowercase.ends_with(".gguf") || starts_with_gguf_magic(Path::new(spec)) {
            return Ok(Self::Gguf(PathBuf::from(spec)));
        }
        // A Hugging Face model directory loads through the same loader.
        if is_hf_dir(Path::new(spec)) {
            return Ok(Self::Gguf(PathBuf::from(spec)));
        }
        if let Ok(metadata) = std::fs::metadata(spec)
            && !metadata.is_file()
        {
            return Err(SpecError::NotAFile {
                spec: spec.to_owned(),
                kind: files::kind_name(metadata.file_type()),
            });
        }
        if lowercase.ends_with(".arpa") || lowercase.ends_with(".arpa.gz") {
            return Err(SpecError::ArpaWithoutCount {
                spec: spec.to_owned(),
            });
        }
        Err(SpecError::Unknown {
            spec: spec.to_owned(),
        })
    }
}

/// The names of the known models, comma-separated.
fn known_names() -> String {
    let names: Vec<&str> = KNOWN_MODELS.iter().map(|model| model.name).collect();
    names.join(", ")
}

/// Whether `path` is a file that starts with GGUF's magic bytes, so a GGUF
/// file is recognised whatever its name (an unreadable path is not, and a
/// FIFO is never opened: that would wait for a writer).
fn starts_with_gguf_magic(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    files::open_input(path, Input::File)
        .is_ok_and(|mut file| file.read_exact(&mut magic).is_ok() && &magic == b"GGUF")
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Toy => f.write_str("toy"),
            Self::Count(path) => write!(f, "count:{}", path.display()),
            Self::Gguf(path) => write!(f, "{}", path.display()),
            Self::Known(model) => f.write_str(model.name),
            Self::Embedded => f.write_str("embedded KJV trigram"),
        }
    }
}

/// Why a model could not be loaded (the causes come from lm-model).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A model file that does not exist.
    #[error("model file {} not found", path.display())]
    FileMissing {
        /// The path given.
        path: PathBuf,
    },
}

/// A loaded model and the text codec that goes with it.
#[derive(Debug)]
pub struct LoadedModel {
    /// The weights or counts.
    pub backend: Backend,
    /// Text <-> ids for this model.
    pub codec: TextCodec,
}

/// The concrete model types.
#[derive(Debug)]
pub enum Backend {
    /// The toy decoder (built with the context bound asked for).
    Toy(Box<Decoder>),
    /// A count model.
    Count(NgramModel),
    /// A llama model from GGUF.
    Llama(Box<Decoder>),
}

/// How a model is loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// A context bound the toy decoder is built with (its weights do not
    /// depend on it).
    pub context_length: Option<usize>,
    /// Map a GGUF file read-only instead of copying it (`--mmap`,
    /// [`lm::map_gguf`]).
    pub mmap: bool,
}

/// How a command wants the model run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Re-read the whole prefix at every step ([`Uncached`]).
    pub no_cache: bool,
    /// A context bound to impose (the toy decoder is built with it).
    pub context_length: Option<usize>,
}

/// A command written once for every model type.
pub trait ModelTask {
    /// What the command returns.
    type Output;

    /// Runs the command on `model`, reading and writing text with `codec`.
    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<Self::Output>;
}

impl ModelSpec {
    /// `Some(spec)` or the embedded default.
    pub fn or_default(spec: Option<&ModelSpec>) -> ModelSpec {
        spec.cloned().unwrap_or(ModelSpec::Embedded)
    }

    /// Loads the model as `options` say; `--mmap` is refused for a model
    /// that is not a GGUF file.
    pub fn load(&self, options: LoadOptions) -> Result<LoadedModel> {
        let gguf_path = match self {
            Self::Gguf(path) => Some(path.clone()),
            Self::Known(model) => Some(model.path()?),
            Self::Toy | Self::Count(_) | Self::Embedded => None,
        };
        if options.mmap && gguf_path.as_deref().is_none_or(is_hf_dir) {
            anyhow::bail!("--mmap maps a GGUF file; {self} is not one");
        }
        let (backend, codec) = match self {
            Self::Toy => {
                let toy = match options.context_length {
                    Some(n) => Toy::with_context_length(n).with_context(|| {
                        format!("building the toy decoder with context length {n}")
                    })?,
                    None => Toy::decoder(),
                };
                (Backend::Toy(Box::new(toy)), TextCodec::Toy)
            }
            Self::Count(path) => {
                let model = load_count_model(path)?;
                let codec = TextCodec::Words(model.vocab().clone());
                (Backend::Count(model), codec)
            }
            Self::Embedded => {
                let model =
                    ngram::embedded_default().context("loading the embedded default model")?;
                let codec = TextCodec::Words(model.vocab().clone());
                (Backend::Count(model), codec)
            }
            Self::Gguf(_) | Self::Known(_) => {
                load_gguf(&gguf_path.expect("a GGUF spec's path"), options.mmap)?
            }
        };
        Ok(LoadedModel { backend, codec })
    }
}

impl ModelSpec {
    /// Only the text codec (a GGUF model's weights are not built).
    pub fn load_codec(&self) -> Result<TextCodec> {
        match self {
            Self::Gguf(path) => codec_of_gguf(path),
            Self::Known(model) => codec_of_gguf(&model.path()?),
            _ => Ok(self.load(LoadOptions::default())?.codec),
        }
    }
}

/// The text side of a GGUF file, without building its weights.
fn codec_of_gguf(path: &Path) -> Result<TextCodec> {
    if is_hf_dir(path) {
        return Ok(TextCodec::Bpe(Box::new(lm::GgufText::from_hf_dir(path)?)));
    }
    open(path)?;
    Ok(TextCodec::Bpe(Box::new(lm::GgufText::open(path)?)))
}

/// Whether `path` is a Hugging Face model directory (it has a
/// `config.json`); any other directory is refused as one by [`open`].
fn is_hf_dir(path: &Path) -> bool {
    path.join("config.json").is_file()
}

/// A GGUF file or a Hugging Face directory through the one loader; a GGUF
/// file mapped instead of copied with `mmap`.
fn load_gguf(path: &Path, mmap: bool) -> Result<(Backend, TextCodec)> {
    if !is_hf_dir(path) {
        open(path)?;
    }
    let lm::GgufModel { decoder, text } = if mmap {
        lm::map_gguf(path)?
    } else {
        lm::load(path)?
    };
    Ok((
        Backend::Llama(Box::new(decoder)),
        TextCodec::Bpe(Box::new(text)),
    ))
}

/// What a `count:FILE` holds, judged from its (decompressed) content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CountFileKind {
    /// A line `\data\` or an n-gram section header anywhere: read as ARPA
    /// (text before `\data\` is skipped, as KenLM does), never trained on.
    Arpa,
    Compact,
    Corpus,
}

/// A `count:FILE` that is neither a model nor text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountFileError {
    /// A NUL byte: no text or ARPA file holds one.
    #[error("{} is binary (a NUL byte at offset {offset}), not an ARPA file or a text corpus", path.display())]
    Binary {
        /// The file.
        path: PathBuf,
        /// Byte offset of the first NUL (in the decompressed stream for `.gz`).
        offset: u64,
    },
    /// More bytes that are not UTF-8 than characters that are, in its first
    /// [`SNIFF_BYTES`] bytes: the lossy policy is for a stray bad byte in text.
    #[error("{} is binary ({n_invalid} invalid utf-8 sequences in its first {n_read} bytes), not an ARPA file or a text corpus", path.display())]
    NotText {
        /// The file.
        path: PathBuf,
        /// Invalid UTF-8 sequences among the first bytes.
        n_invalid: usize,
        /// Bytes read.
        n_read: usize,
    },
}

/// How much of a file the text-or-binary check reads.
const SNIFF_BYTES: u64 = files::SNIFF_BYTES as u64;

/// The gzip magic number (RFC 1952).
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];

/// The file's bytes, through gzip when it starts with the gzip magic.
fn open_count_file(path: &Path) -> Result<Box<dyn BufRead>> {
    let mut file = BufReader::new(open(path)?);
    let head = file
        .fill_buf()
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(if head.starts_with(GZIP_MAGIC) {
        Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file)))
    } else {
        Box::new(file)
    })
}

/// Whether a line (without its terminator) marks an ARPA file: `\data\` or
/// an `\N-grams:` section header.
fn is_arpa_marker(line: &[u8]) -> bool {
    let line = line.trim_ascii();
    line == b"\\data\\"
        || line
            .strip_prefix(b"\\")
            .and_then(|rest| rest.strip_suffix(b"-grams:"))
            .is_some_and(|order| !order.is_empty() && order.iter().all(u8::is_ascii_digit))
}

/// Reads the whole file once: binary input is refused (a NUL in the first
/// [`SNIFF_BYTES`] before anything reads on, so a file of zeros is not held
/// whole as one line), a file with an ARPA marker on any line is ARPA,
/// anything else is a corpus.
fn count_file_kind(path: &Path) -> Result<CountFileKind> {
    let context = || format!("reading {}", path.display());
    let mut reader = open_count_file(path)?;
    if reader
        .fill_buf()
        .with_context(context)?
        .starts_with(COMPACT_MAGIC)
    {
        return Ok(CountFileKind::Compact);
    }
    files::refuse_binary(&mut reader, path)?;
    let mut line = Vec::new();
    let mut offset: u64 = 0;
    let mut head = Vec::new();
    let mut is_arpa = false;
    loop {
        line.clear();
        let n_read = reader.read_until(b'\n', &mut line).with_context(context)?;
        if n_read == 0 {
            break;
        }
        if let Some(nul) = line.iter().position(|&b| b == 0) {
            return Err(CountFileError::Binary {
                path: path.to_path_buf(),
                offset: offset + nul as u64,
            }
            .into());
        }
        if offset < SNIFF_BYTES {
            let room = (SNIFF_BYTES - offset) as usize;
            head.extend_from_slice(&line[..line.len().min(room)]);
        }
        is_arpa |= is_arpa_marker(line.strip_suffix(b"\n").unwrap_or(&line));
        offset += n_read as u64;
    }
    let n_invalid = String::from_utf8_lossy(&head)
        .chars()
        .filter(|&c| c == char::REPLACEMENT_CHARACTER)
        .count();
    if n_invalid * 2 > head.len() {
        return Err(CountFileError::NotText {
            path: path.to_path_buf(),
            n_invalid,
            n_read: head.len(),
        }
        .into());
    }
    Ok(if is_arpa {
        CountFileKind::Arpa
    } else {
        CountFileKind::Corpus
    })
}

/// Opens a model file: a missing one is [`LoadError::FileMissing`]; a
/// directory, a device or a FIFO is refused by name before it is read.
fn open(path: &Path) -> Result<File> {
    if !path.exists() {
        return Err(LoadError::FileMissing {
            path: path.to_path_buf(),
        }
        .into());
    }
    Ok(files::open_input(path, Input::File)?)
}

/// Reads an ARPA or compact model, or trains a trigram Kneser-Ney model on a
/// corpus (with KenLM's fallback discounts, so small corpora work).
fn load_count_model(path: &Path) -> Result<NgramModel> {
    let context = || format!("loading the count model {}", path.display());
    match count_file_kind(path)? {
        CountFileKind::Arpa => NgramModel::read_arpa(open_count_file(path)?).with_context(context),
        CountFileKind::Compact => {
            let mut bytes = Vec::new();
            open_count_file(path)?
                .read_to_end(&mut bytes)
                .with_context(context)?;
            NgramModel::from_compact(&bytes).with_context(context)
        }
        CountFileKind::Corpus => {
            let options = TrainOptions {
                utf8: Utf8Policy::Lossy,
                ..TrainOptions::default()
            };
            let model = ngram::train(open_count_file(path)?, &options, |_| {})
                .with_context(|| format!("training a trigram model on {}", path.display()))?;
            eprintln!(
                "note: {} is not an ARPA file; trained a trigram Kneser-Ney model on it",
                path.display()
            );
            for fallback in model.discount_fallbacks() {
                eprintln!("note: {fallback}");
            }
            Ok(model)
        }
    }
}

impl Backend {
    /// The context bound to wrap the model in for `--context-length`
    /// (`requested`), with a `warning:` when it is beyond the model's trained
    /// length: [`Bounded`] only tightens a bound, so the context stays the
    /// model's. The toy decoder was built with the bound: none to add.
    pub fn bound(&self, requested: Option<usize>) -> Option<usize> {
        let trained = match self {
            Self::Toy(_) => return None,
            Self::Count(model) => model.context_length(),
            Self::Llama(model) => model.context_length(),
        };
        if let (Some(requested), Some(trained)) = (requested, trained)
            && requested > trained
        {
            eprintln!(
                "warning: --context-length {requested} is beyond the model's trained length of {trained}; the context stays {trained}"
            );
        }
        requested
    }
}

impl LoadedModel {
    /// Runs `task` on the model, behind the adapters `options` asks for.
    pub fn run<T: ModelTask>(self, options: RunOptions, task: T) -> Result<T::Output> {
        let Self { backend, codec } = self;
        let bound = backend.bound(options.context_length);
        macro_rules! dispatch {
            ($model:expr) => {
                if options.no_cache {
                    task.run(&Bounded::new(Uncached($model), bound), &codec)
                } else {
                    task.run(&Bounded::new($model, bound), &codec)
                }
            };
        }
        match backend {
            Backend::Toy(model) => dispatch!(*model),
            Backend::Count(model) => dispatch!(model),
            Backend::Llama(model) => dispatch!(*model),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!("toy".parse(), Ok(ModelSpec::Toy));
        assert_eq!(
            "smollm2".parse(),
            Ok(ModelSpec::Known(&lm_model::catalog::SMOLLM2))
        );
        assert_eq!(
            "gemma3-270m".parse(),
            Ok(ModelSpec::Known(&lm_model::catalog::GEMMA3_270M))
        );
        assert_eq!(
            "count:a.arpa".parse(),
            Ok(ModelSpec::Count(PathBuf::from("a.arpa")))
        );
        assert_eq!(
            "dir/m.GGUF".parse(),
            Ok(ModelSpec::Gguf(PathBuf::from("dir/m.GGUF")))
        );
        assert_eq!(
            "count:".parse::<ModelSpec>(),
            Err(SpecError::EmptyCountPath)
        );
        assert_eq!(
            "gpt5".parse::<ModelSpec>(),
            Err(SpecError::Unknown {
                spec: "gpt5".into()
            })
        );
    }
}
