//! Shared test helpers: the committed fixtures. (Tests on the real SmolLM2
//! file build its tokenizer through the GGUF loader, so they live in the
//! `lm` crate: lm-tokenize reads no model file, not even in tests.)

use std::path::PathBuf;

/// A path under the workspace's `fixtures/` directory.
pub fn fixture_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(relative)
}
