//! Fuzz target: the byte-level BPE tokenizer built from a GGUF file's
//! `tokenizer.*` metadata, as lm-cli builds it, then a short text encoded,
//! decoded, and streamed back token by token.
//!
//! The GGUF -> `BpeVocab` mapping below mirrors `bpe_vocab_from_gguf` in
//! `crates/lm-cli/src/text.rs` (lm-cli is a binary crate, so it is repeated
//! here in its smallest form: the same keys, the same optional handling).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lm_model::{GgufError, GgufFile};
use lm_tokenize::{BpeVocab, Tokenizer};

/// Texts every tokenizer is asked to encode: ASCII, digits, a multi-byte
/// character, a control token of SmolLM2's kind.
const TEXTS: &[&str] = &["ab ab 42", "héllo\n<|im_end|> x", ""];

fuzz_target!(|bytes: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(bytes.to_vec()) else {
        return;
    };
    let Ok(vocab) = bpe_vocab_from_gguf(&file) else {
        return;
    };
    let Ok(tokenizer) = Tokenizer::from_bpe_vocab(vocab) else {
        return;
    };
    let vocab_size = tokenizer.vocab_size();
    for text in TEXTS {
        let Ok(ids) = tokenizer.encode(text) else {
            continue;
        };
        assert!(ids.iter().all(|&id| (id as usize) < vocab_size));
        let _ = tokenizer.decode(&ids);
        let _ = tokenizer.decode_skipping_special(&ids);
        let mut stream = tokenizer.text_stream(false);
        for &id in &ids {
            let _ = stream.push(id);
        }
        let _ = stream.finish();
    }
    // Ids at and past the end of the vocabulary are errors, not panics.
    let edge = u32::try_from(vocab_size).unwrap_or(u32::MAX);
    let _ = tokenizer.decode(&[0, edge.saturating_sub(1), edge, u32::MAX]);
    let mut stream = tokenizer.text_stream(true);
    let _ = stream.push(edge);
    let _ = stream.finish();
    for id in tokenizer.end_ids() {
        let _ = tokenizer.token_text(*id);
    }
});

/// `Some(value)` when `key` is present, `None` when absent.
fn optional<'f, T>(
    file: &'f GgufFile,
    key: &str,
    get: impl FnOnce(&'f GgufFile, &str) -> Result<T, GgufError>,
) -> Result<Option<T>, GgufError> {
    file.get(key).map(|_| get(file, key)).transpose()
}

/// The vocabulary from the `tokenizer.*` keys, as lm-cli reads it.
fn bpe_vocab_from_gguf(file: &GgufFile) -> Result<BpeVocab, GgufError> {
    let owned = |items: Vec<&str>| items.into_iter().map(str::to_owned).collect::<Vec<_>>();
    Ok(BpeVocab {
        model: file.get_str("tokenizer.ggml.model")?.to_owned(),
        pre: optional(file, "tokenizer.ggml.pre", GgufFile::get_str)?.map(str::to_owned),
        tokens: owned(file.get_string_array("tokenizer.ggml.tokens")?),
        token_types: optional(file, "tokenizer.ggml.token_type", GgufFile::get_i32_array)?
            .unwrap_or_default(),
        merges: optional(file, "tokenizer.ggml.merges", GgufFile::get_string_array)?
            .map(owned)
            .unwrap_or_default(),
        bos_id: optional(file, "tokenizer.ggml.bos_token_id", GgufFile::get_u32)?,
        eos_id: optional(file, "tokenizer.ggml.eos_token_id", GgufFile::get_u32)?,
        unk_id: optional(file, "tokenizer.ggml.unknown_token_id", GgufFile::get_u32)?,
        add_bos: optional(file, "tokenizer.ggml.add_bos_token", GgufFile::get_bool)?
            .unwrap_or(false),
        chat_template: optional(file, "tokenizer.chat_template", GgufFile::get_str)?
            .map(str::to_owned),
    })
}
