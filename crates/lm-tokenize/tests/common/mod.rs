//! Shared test helpers: finding the SmolLM2 file and building its tokenizer
//! through lm-model's GGUF reader, as lm-cli does.
#![allow(dead_code)]

use std::path::PathBuf;

use lm_model::GgufFile;
use lm_tokenize::{BpeVocab, Tokenizer};

/// The SmolLM2 file name inside the models directory.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$LM_MODELS_DIR`, or `$HOME/.cache/lm/models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LM_MODELS_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/lm/models")
}

/// The SmolLM2 GGUF, or `None` after printing a visible skip message.
pub fn smollm2_gguf(test_name: &str) -> Option<GgufFile> {
    let path = models_dir().join(SMOLLM2_FILE);
    if !path.exists() {
        eprintln!(
            "SKIPPED {test_name}: {} not found (set LM_MODELS_DIR)",
            path.display()
        );
        return None;
    }
    Some(GgufFile::open(&path).expect("the SmolLM2 GGUF parses"))
}

/// The GGUF tokenizer keys as plain data.
pub fn bpe_vocab(file: &GgufFile) -> BpeVocab {
    let owned = |items: Vec<&str>| items.into_iter().map(str::to_owned).collect();
    BpeVocab {
        model: file
            .get_str("tokenizer.ggml.model")
            .expect("model")
            .to_owned(),
        pre: file.get_str("tokenizer.ggml.pre").ok().map(str::to_owned),
        tokens: owned(
            file.get_string_array("tokenizer.ggml.tokens")
                .expect("tokens"),
        ),
        token_types: file
            .get_i32_array("tokenizer.ggml.token_type")
            .unwrap_or_default(),
        merges: owned(
            file.get_string_array("tokenizer.ggml.merges")
                .expect("merges"),
        ),
        bos_id: file.get_u32("tokenizer.ggml.bos_token_id").ok(),
        eos_id: file.get_u32("tokenizer.ggml.eos_token_id").ok(),
        unk_id: file.get_u32("tokenizer.ggml.unknown_token_id").ok(),
        add_bos: file
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(false),
        chat_template: file
            .get_str("tokenizer.chat_template")
            .ok()
            .map(str::to_owned),
    }
}

/// SmolLM2's tokenizer, or `None` (with a skip message) without the model.
pub fn smollm2_tokenizer(test_name: &str) -> Option<Tokenizer> {
    let file = smollm2_gguf(test_name)?;
    Some(Tokenizer::from_bpe_vocab(bpe_vocab(&file)).expect("SmolLM2 vocabulary builds"))
}

/// A path under the workspace's `fixtures/` directory.
pub fn fixture_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(relative)
}
