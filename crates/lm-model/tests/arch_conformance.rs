//! Conformance with llama.cpp on each supported architecture: the small
//! seeded random-weight GGUF files of `fixtures/arch/` (llama with Llama 3
//! `rope_freqs`, qwen2, qwen3, gemma3 with a sliding window of 12) and
//! llama.cpp's logits of every position of a 40-id input, written by
//! `scripts/reference/random_gguf.py` (`cargo xtask reference-fixtures
//! --arch`; see that folder's README).
//!
//! Every logit of every position is within [`LOGIT_TOLERANCE`] of
//! llama.cpp's, and every position's argmax is llama.cpp's unless
//! llama.cpp's own top-1/top-2 gap is within twice that tolerance (a
//! near-tie two correct implementations may break either way: the random
//! gemma3 file has one of 0.0004 at position 28). The files are committed,
//! so nothing is downloaded.

use std::path::PathBuf;

use lm_core::{LanguageModel, Rows, SequenceState, TokenId, argmax};
use lm_model::{AttentionKind, Decoder, Llama};

use crate::common::{FixtureJson, fixture_path, max_abs_diff, read_json};

/// Largest allowed difference of one logit from llama.cpp's. Both sides
/// keep an f16 KV cache and round queries and attention weights alike;
/// llama.cpp also rounds activations to f16 before products with f16
/// weights, GELU through an f16 table, and sums in another order. Measured
/// (largest over all positions): see `ARCH_MAX_DIFFS`.
const LOGIT_TOLERANCE: f32 = 1e-2;

fn arch_dir() -> PathBuf {
    fixture_path("arch")
}

/// The fixture's input ids.
fn ids() -> Vec<TokenId> {
    read_json(&arch_dir().join("manifest.json"))
        .field("ids")
        .ids()
}

/// llama.cpp's logits for `arch`: `[ids.len()][vocab]`.
fn llama_cpp_logits(arch: &str) -> Vec<f32> {
    let bytes = std::fs::read(arch_dir().join(format!("{arch}.logits.f32le.bin"))).unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn load(arch: &str) -> Decoder {
    Llama::from_gguf(arch_dir().join(format!("{arch}.gguf")))
        .unwrap_or_else(|e| panic!("{arch}: {e}"))
}

/// Our logits of every position of `ids`, read in one pass.
fn all_positions(model: &Decoder, ids: &[TokenId]) -> Vec<f32> {
    let mut logits = Vec::new();
    model
        .forward(&mut model.new_state(), ids, Rows::All, &mut logits)
        .unwrap();
    logits
}

/// Compares every position with llama.cpp's and returns the largest
/// difference.
fn check_against_llama_cpp(arch: &str) -> f32 {
    let model = load(arch);
    let ids = ids();
    let vocab = model.vocab_size();
    let ours = all_positions(&model, &ids);
    let theirs = llama_cpp_logits(arch);
    assert_eq!(ours.len(), theirs.len(), "{arch}: one row per id");
    let mut largest = 0.0f32;
    for (pos, (a, b)) in ours
        .chunks_exact(vocab)
        .zip(theirs.chunks_exact(vocab))
        .enumerate()
    {
        let diff = max_abs_diff(a, b);
        largest = largest.max(diff);
        assert!(
            diff <= LOGIT_TOLERANCE,
            "{arch}: position {pos} differs by {diff}"
        );
        let best = argmax(b).unwrap();
        let runner_up = b
            .iter()
            .enumerate()
            .filter(|&(id, _)| id != best as usize)
            .map(|(_, &v)| v)
            .fold(f32::NEG_INFINITY, f32::max);
        if b[best as usize] - runner_up > 2.0 * LOGIT_TOLERANCE {
            assert_eq!(argmax(a).unwrap(), best, "{arch}: argmax at position {pos}");
        }
    }
    eprintln!("{arch}: largest logit difference {largest}");
    largest
}

#[test]
fn llama_with_llama3_rope_freqs_matches_llama_cpp() {
    let model = load("llama");
    assert!(model.config().options.rope.freq_factors.is_some());
    check_against_llama_cpp("llama");
}

#[test]
fn qwen2_matches_llama_cpp() {
    assert!(load("qwen2").config().options.qkv_bias);
    check_against_llama_cpp("qwen2");
}

#[test]
fn qwen3_matches_llama_cpp() {
    let model = load("qwen3");
    let c = model.config();
    assert!(c.options.qk_norm);
    // The head width comes from attention.key_length: 4 heads of 32 over a
    // width of 64.
    assert_eq!((c.n_embd, c.n_head, c.head_dim), (64, 4, 32));
    check_against_llama_cpp("qwen3");
}

#[test]
fn gemma3_matches_llama_cpp() {
    let model = load("gemma3");
    let c = model.config();
    let kinds: Vec<AttentionKind> = (0..c.n_layer).map(|i| c.attention_kind(i)).collect();
    let sliding = AttentionKind::Sliding { window: 12 };
    assert_eq!(
        kinds,
        [
            sliding,
            sliding,
            sliding,
            sliding,
            sliding,
            AttentionKind::Global
        ]
    );
    check_against_llama_cpp("gemma3");
}

/// Every architecture's cached pass agrees with the uncached reference
/// (plain ndarray products and an explicit mask, sliding windows included)
/// and with feeding the ids one at a time.
#[test]
fn cached_pass_matches_the_reference_and_token_by_token() {
    let ids = ids();
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        let model = load(arch).with_kv_precision(lm_model::KvPrecision::F32);
        let vocab = model.vocab_size();
        let batch = all_positions(&model, &ids);
        let reference = model.reference_logits(&ids).unwrap();
        let reference = reference.as_slice().unwrap();
        let diff = max_abs_diff(&batch, reference);
        assert!(diff < 1e-3, "{arch}: batch vs reference {diff}");
        let mut state = model.new_state();
        let mut logits = Vec::new();
        for (pos, &id) in ids.iter().enumerate() {
            model
                .forward(&mut state, &[id], Rows::Last, &mut logits)
                .unwrap();
            let row = &batch[pos * vocab..(pos + 1) * vocab];
            let diff = max_abs_diff(&logits, row);
            assert!(diff < 1e-3, "{arch}: position {pos} one at a time {diff}");
        }
        assert_eq!(state.pos(), ids.len());
    }
}
