//! Conformance with llama.cpp on SmolLM2-135M-Instruct Q4_1: the committed
//! reference fixtures in `fixtures/smollm2/` (written by
//! `scripts/reference/llama_cpp_reference.py` from llama-cpp-python; the
//! format is in that folder's README) against this crate's llama backend.
//!
//! For every greedy case:
//! - greedy continuations are identical up to the first step where
//!   llama.cpp's own top-1/top-2 gap is below [`TIE_GAP`] (near-ties may go
//!   either way between two correct implementations; see SMOLLM2.md);
//! - teacher-forced along llama.cpp's ids, our top-1 is llama.cpp's at every
//!   step whose gap is at least [`TIE_GAP`], but the few where one of
//!   llama.cpp's own settings picks another token ([`LLAMA_CPP_SPLITS`]);
//! - at the last prompt position, every logit is within [`LOGIT_TOLERANCE`]
//!   of llama.cpp's, the KL divergence from llama.cpp's distribution is below
//!   [`MAX_KL`], and the chosen token's log-probability is within
//!   [`LOGPROB_TOLERANCE`] nats.
//!
//! Needs the model file from the models folder (`cargo xtask fetch-model
//! smollm2`); ignored without it.

use std::path::{Path, PathBuf};

use lm_core::{LanguageModel, Rows, TokenId, argmax, kl_divergence, log_softmax, softmax};
use lm_model::{Decoder, Llama};
use serde_json::Value;

use crate::common::{FixtureJson, fixture_path, read_json, smollm2_path};

/// Below this top-1/top-2 logit gap, a step is a near-tie.
const TIE_GAP: f32 = 0.3;
/// Largest allowed difference of one logit.
const LOGIT_TOLERANCE: f32 = 1.0;
/// Largest allowed KL divergence at the last prompt position.
const MAX_KL: f64 = 1e-2;
/// Largest allowed difference of a log-probability, in nats.
const LOGPROB_TOLERANCE: f64 = 0.25;

/// Teacher-forced steps whose gap in the fixture is at least [`TIE_GAP`]
/// but where llama.cpp itself picks another token under a setting that
/// changes only rounding (llama-cpp-python 0.3.36, the case's prompt and
/// continuation read in one batch): a near-tie in fact, which two correct
/// implementations may break either way. `history_of_computing` step 27
/// (0.336 in the fixture): gap 0.150 read in one batch, -0.041 with flash
/// attention and -0.146 with an F32 KV cache (Q4_1 panels pick the other
/// token too).
const LLAMA_CPP_SPLITS: &[(&str, usize)] = &[("history_of_computing", 27)];

fn fixtures_dir() -> PathBuf {
    fixture_path("smollm2")
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn llama_cpp_conformance() {
    let model = Llama::from_gguf(smollm2_path()).unwrap();
    let fixture = read_json(&fixtures_dir().join("greedy.json"));
    let cases = fixture.field("cases").array();
    assert!(!cases.is_empty());
    for case in cases {
        check_case(&model, case);
    }
}

fn check_case(model: &Decoder, case: &Value) {
    let name = case.field("name").str();
    let prompt = case.field("prompt_ids").ids();
    let expected = case.field("continuation_ids").ids();
    let gaps = case.field("top1_minus_top2").f32s();
    assert_eq!(expected.len(), gaps.len(), "{name}: one gap per step");

    let mut prefilled = model.new_state();
    let mut last = Vec::new();
    model
        .forward(&mut prefilled, &prompt, Rows::Last, &mut last)
        .unwrap();
    if let Some(file) = case
        .field_opt("last_logits")
        .and_then(|logits| logits.field_opt("file"))
    {
        check_last_logits(name, &last, &fixtures_dir().join(file.str()), expected[0]);
    }

    // Greedy: identical up to llama.cpp's first near-tie.
    let first_tie = gaps
        .iter()
        .position(|&gap| gap < TIE_GAP)
        .unwrap_or(expected.len());
    let mut state = prefilled.clone();
    let mut logits = last.clone();
    let mut ours = Vec::new();
    for step in 0..first_tie {
        let token = argmax(&logits).unwrap();
        ours.push(token);
        if step + 1 < first_tie {
            model
                .forward(&mut state, &[token], Rows::Last, &mut logits)
                .unwrap();
        }
    }
    assert_eq!(
        ours,
        expected[..first_tie],
        "{name}: greedy continuation differs before llama.cpp's first near-tie (step {first_tie})"
    );

    // Teacher forcing along llama.cpp's ids.
    let mut state = prefilled;
    let mut logits = last;
    for (step, (&token, &gap)) in expected.iter().zip(&gaps).enumerate() {
        if gap >= TIE_GAP && !LLAMA_CPP_SPLITS.contains(&(name, step)) {
            assert_eq!(
                argmax(&logits).unwrap(),
                token,
                "{name}: teacher-forced step {step}: llama.cpp's top-1 leads by {gap}"
            );
        }
        if step + 1 < expected.len() {
            model
                .forward(&mut state, &[token], Rows::Last, &mut logits)
                .unwrap();
        }
    }
    eprintln!(
        "{name}: greedy identical for the {first_tie} steps before llama.cpp's first near-tie; \
         top-1 agrees at the {} teacher-forced steps with a gap >= {TIE_GAP} (but llama.cpp's \
         own splits)",
        gaps.iter()
            .enumerate()
            .filter(|&(step, &gap)| gap >= TIE_GAP && !LLAMA_CPP_SPLITS.contains(&(name, step)))
            .count()
    );
}

fn check_last_logits(name: &str, ours: &[f32], path: &Path, chosen: TokenId) {
    let bytes = std::fs::read(path).unwrap();
    let theirs: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(theirs.len(), ours.len(), "{name}: logits length");
    let (worst_idx, worst) = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold(
            (0, 0.0),
            |best, (i, d)| if d > best.1 { (i, d) } else { best },
        );
    assert!(
        worst < LOGIT_TOLERANCE,
        "{name}: logit {worst_idx} differs by {worst} from llama.cpp's"
    );
    let p = softmax(&theirs, 1.0).unwrap();
    let q = softmax(ours, 1.0).unwrap();
    let kl = kl_divergence(&p, &q).unwrap();
    assert!(kl < MAX_KL, "{name}: KL(llama.cpp || ours) = {kl}");
    let chosen_ours = f64::from(log_softmax(ours, 1.0).unwrap()[chosen as usize]);
    let chosen_theirs = f64::from(log_softmax(&theirs, 1.0).unwrap()[chosen as usize]);
    assert!(
        (chosen_ours - chosen_theirs).abs() < LOGPROB_TOLERANCE,
        "{name}: log p(chosen) {chosen_ours} vs llama.cpp {chosen_theirs}"
    );
    eprintln!(
        "{name}: last logits max diff {worst}, KL {kl:.2e}, log p(chosen) diff {:.3}",
        chosen_ours - chosen_theirs
    );
}
