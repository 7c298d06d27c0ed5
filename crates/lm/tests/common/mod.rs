//! Shared test helpers: the committed fixtures, and SmolLM2 and Gemma 3's
//! tokenizer through the loader (found by lm-model's catalog).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lm::lm_core::TokenId;
use lm::lm_model::catalog::{GEMMA3_270M, SMOLLM2};
use lm::lm_tokenize::Tokenizer;
use lm::{GgufModel, GgufText};

/// An error and its sources, joined by ": " as lm-cli prints them (the
/// loader's errors name the stage; the cause, such as an unsupported weight
/// type, is in a source).
pub use lm::lm_core::error_chain;

/// `ln softmax(row)[token]` in f64, written out here (an independent check of the crates'
/// log-probabilities).
pub fn log_softmax_at(row: &[f32], token: TokenId) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&z| (z as f64 - max).exp()).sum();
    row[token as usize] as f64 - max - sum.ln()
}

/// A path under the workspace's `fixtures/` directory.
pub fn fixture_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(relative)
}

/// The fixture `relative` (a path under `fixtures/`) read as JSON into `T`;
/// panics naming the file when it is missing or has another shape.
pub fn fixture_json<T: serde::de::DeserializeOwned>(relative: &str) -> T {
    let path = fixture_path(relative);
    let json = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    serde_json::from_str(&json)
        .unwrap_or_else(|err| panic!("{} has the wrong shape: {err}", path.display()))
}

/// The little-endian f32 values of the file at `path` (llama.cpp's logits
/// rows in the fixtures); panics naming the file when it cannot be read.
pub fn read_f32le(path: &Path) -> Vec<f32> {
    let bytes =
        std::fs::read(path).unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
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

/// Streams `text`'s ids through `tokenizer`'s [`lm::lm_tokenize::TextStream`]
/// and checks that no chunk holds a replacement character and that the
/// chunks add up to `text`. Returns the ids and how many of them the stream
/// withheld (a character not yet whole).
#[track_caller]
pub fn check_stream(
    tokenizer: &Tokenizer,
    text: &str,
    skip_special: bool,
) -> (Vec<TokenId>, usize) {
    let ids = tokenizer.encode(text).unwrap();
    let mut stream = tokenizer.text_stream(skip_special);
    let mut chunks = Vec::new();
    let mut n_withheld = 0;
    for &id in &ids {
        match stream.push(id).unwrap() {
            Some(chunk) => chunks.push(chunk),
            None => n_withheld += 1,
        }
    }
    chunks.push(stream.finish().unwrap());
    assert!(
        chunks
            .iter()
            .all(|c| !c.contains(char::REPLACEMENT_CHARACTER)),
        "{chunks:?}"
    );
    assert_eq!(chunks.concat(), text);
    (ids, n_withheld)
}
