//! Shared test helpers: the committed fixtures, and SmolLM2 and Gemma 3's
//! tokenizer through the loader (found by lm-model's catalog).

use std::path::PathBuf;
use std::sync::OnceLock;

use lm::lm_model::catalog::{GEMMA3_270M, SMOLLM2};
use lm::{GgufModel, GgufText};

/// A path under the workspace's `fixtures/` directory.
pub fn fixture_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(relative)
}

/// The SmolLM2 file's path. Panics with the command that fetches it when it
/// is missing: a real-model test asked for by `--include-ignored` never
/// passes without running.
pub fn smollm2_path() -> PathBuf {
    SMOLLM2.path().unwrap_or_else(|err| panic!("{err}"))
}

/// SmolLM2 loaded once for the whole test binary (panics without the model,
/// as [`smollm2_path`]).
pub fn smollm2() -> &'static GgufModel {
    static MODEL: OnceLock<GgufModel> = OnceLock::new();
    MODEL.get_or_init(|| lm::load_gguf(smollm2_path()).expect("SmolLM2 loads"))
}

/// SmolLM2's text side alone (panics without the model).
pub fn smollm2_text() -> GgufText {
    GgufText::open(smollm2_path()).expect("SmolLM2's tokenizer builds")
}

/// Gemma 3's text side alone, read once for the whole test binary (its
/// weights are not built). Panics with the fetch command when the file is
/// missing, as [`smollm2_path`].
pub fn gemma3_text() -> &'static GgufText {
    static TEXT: OnceLock<GgufText> = OnceLock::new();
    TEXT.get_or_init(|| {
        let path = GEMMA3_270M.path().unwrap_or_else(|err| panic!("{err}"));
        GgufText::open(path).expect("Gemma 3's tokenizer builds")
    })
}
