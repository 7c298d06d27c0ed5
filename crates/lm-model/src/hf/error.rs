//! [`HfError`]: why a Hugging Face model directory gave no model. Every
//! variant names the file, and the field or tensor, on one line.

use std::path::PathBuf;

use lm_core::error_chain;

use crate::gguf::{GgufError, WriteError};

/// Why [`open_hf_dir`](crate::open_hf_dir) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HfError {
    /// A file that is missing or could not be read or mapped.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file that does not parse, or a field of the wrong type.
    #[error("{}: invalid JSON", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// serde_json's reason (with line and column).
        #[source]
        source: serde_json::Error,
    },
    /// A required field absent.
    #[error("{}: field `{field}` is missing", path.display())]
    MissingField {
        /// The file.
        path: PathBuf,
        /// The field.
        field: String,
    },
    /// A field present but unusable.
    #[error("{}: field `{field}`: {reason}", path.display())]
    BadField {
        /// The file.
        path: PathBuf,
        /// The field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// In-situ quantization asked for a type weights are not quantized to.
    #[error("{}: cannot quantize at load: {reason}", path.display())]
    Quantize {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// `architectures` names no class this loader maps.
    #[error(
        "{}: field `architectures`: {found:?} is not supported (supported: {})",
        path.display(),
        super::config::SUPPORTED_CLASSES.join(", ")
    )]
    UnsupportedArchitecture {
        /// `config.json`.
        path: PathBuf,
        /// The classes named.
        found: Vec<String>,
    },
    /// A safetensors file whose header the safetensors crate refuses
    /// (too large, lying offsets, not JSON, not the file's length).
    #[error("{}: bad safetensors header: {reason}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The safetensors crate's reason.
        reason: String,
    },
    /// A shard named by `model.safetensors.index.json` that is missing, or
    /// a tensor the index places in a shard that does not hold it.
    #[error("{}: `weight_map`: {reason}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// A tensor of the wrong shape or dtype, one with a name this loader
    /// does not map, one present twice or one missing.
    #[error("{}: tensor `{name}`: {reason}", path.display())]
    Tensor {
        /// The safetensors file holding it (or the directory for a missing one).
        path: PathBuf,
        /// The Hugging Face name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The assembled GGUF could not be written or read back (a bug, or a
    /// shape GGUF cannot hold).
    #[error("assembling the GGUF of {}: {reason}", path.display())]
    Assemble {
        /// The directory.
        path: PathBuf,
        /// The writer's or reader's reason.
        reason: String,
    },
}

impl HfError {
    pub(crate) fn assemble(path: &std::path::Path, error: impl Into<AssembleError>) -> Self {
        let reason = match error.into() {
            AssembleError::Write(e) => error_chain(&e),
            AssembleError::Read(e) => error_chain(&e),
        };
        HfError::Assemble {
            path: path.to_path_buf(),
            reason,
        }
    }
}

/// The two ways assembling can fail.
pub(crate) enum AssembleError {
    Write(WriteError),
    Read(GgufError),
}

impl From<WriteError> for AssembleError {
    fn from(e: WriteError) -> Self {
        AssembleError::Write(e)
    }
}

impl From<GgufError> for AssembleError {
    fn from(e: GgufError) -> Self {
        AssembleError::Read(e)
    }
}
