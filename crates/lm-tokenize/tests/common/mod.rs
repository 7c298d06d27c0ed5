//! Shared test helpers: finding the SmolLM2 file (through lm-model's
//! catalog) and building its tokenizer through lm-model's GGUF reader, as
//! lm-cli does.

use std::path::PathBuf;

use lm_model::GgufFile;
use lm_model::catalog::SMOLLM2;
use lm_tokenize::{BpeVocab, Tokenizer};

/// The SmolLM2 GGUF. Panics with the command that fetches it when it is
/// missing: a real-model test asked for by `--include-ignored` never passes
/// without running.
pub fn smollm2_gguf() -> GgufFile {
    let path = SMOLLM2.path().unwrap_or_else(|err| panic!("{err}"));
    GgufFile::open(&path).expect("the SmolLM2 GGUF parses")
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

/// SmolLM2's tokenizer (panics without the model, as [`smollm2_gguf`]).
pub fn smollm2_tokenizer() -> Tokenizer {
    Tokenizer::from_bpe_vocab(bpe_vocab(&smollm2_gguf())).expect("SmolLM2 vocabulary builds")
}

/// A path under the workspace's `fixtures/` directory.
pub fn fixture_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(relative)
}
