//! Fuzz target: the text side of a GGUF file (the byte-level BPE tokenizer,
//! the chat template and the end tokens) built from its `tokenizer.*`
//! metadata by the `lm` crate's loader, as lm-cli builds it, then a short
//! text encoded, decoded, and streamed back token by token.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lm::GgufText;
use lm::lm_model::GgufFile;

/// Texts every tokenizer is asked to encode: ASCII, digits, a multi-byte
/// character, a control token of SmolLM2's kind.
const TEXTS: &[&str] = &["ab ab 42", "héllo\n<|im_end|> x", ""];

fuzz_target!(|bytes: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(bytes.to_vec()) else {
        return;
    };
    let Ok(text) = GgufText::from_file(&file) else {
        return;
    };
    let tokenizer = &text.tokenizer;
    let vocab_size = tokenizer.vocab_size();
    for sample in TEXTS {
        let Ok(ids) = tokenizer.encode(sample) else {
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
    for id in &text.end_ids {
        assert!((*id as usize) < vocab_size);
        let _ = tokenizer.token_text(*id);
    }
});
