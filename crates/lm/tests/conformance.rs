//! Conformance with llama.cpp on every real model file we test with: one
//! harness over (model, fixture) pairs, through the loader (`lm::load_gguf`),
//! so the weight types, the architecture and the tokenizer are checked
//! together.
//!
//! The fixtures (`fixtures/smollm2/conformance.json`,
//! `fixtures/smollm2-requant/<type>.json`, `fixtures/gemma3/conformance.json`)
//! are llama.cpp's outputs, written by `cargo xtask reference-fixtures`; their
//! format is in `fixtures/smollm2-requant/README.md`. For every prompt:
//! - our prompt ids (BOS when the vocabulary asks for it, special tokens
//!   parsed) are llama.cpp's;
//! - our greedy ids are llama.cpp's up to its first near-tie (a step whose
//!   top-1/top-2 gap is below [`TIE_GAP`]: two correct implementations may
//!   break it either way);
//! - teacher-forced along llama.cpp's greedy ids, each chosen token's
//!   log-probability is within [`LOGPROB_TOLERANCE`] nats of llama.cpp's, up
//!   to and including its first near-tie (the rest is only reported);
//! - where the fixture keeps the last-position logits row, every logit is
//!   within [`LOGIT_TOLERANCE`] and KL(llama.cpp || ours) < [`MAX_KL`].
//!
//! All failures of a model are collected and reported together. Each model's
//! test is ignored until its file is fetched; with `--include-ignored` and no
//! file it fails naming the fetch command.

use std::path::PathBuf;

use lm::GgufModel;
use lm::lm_core::{LanguageModel, Rows, TokenId, argmax, kl_divergence, log_softmax, softmax};
use lm::lm_model::catalog::{
    GEMMA3_270M, KnownModel, SMOLLM2, SMOLLM2_IQ4_XS, SMOLLM2_Q2_K, SMOLLM2_Q3_K_M, SMOLLM2_Q4_K_M,
    SMOLLM2_Q5_0, SMOLLM2_Q5_K_M, SMOLLM2_Q6_K, SMOLLM2_Q8_0,
};
use serde::Deserialize;

use crate::common::fixture_path;

/// Below this top-1/top-2 logit gap, a greedy step is a near-tie.
const TIE_GAP: f32 = 0.3;
/// Largest allowed difference of one last-position logit.
const LOGIT_TOLERANCE: f32 = 1.0;
/// Largest allowed KL divergence at the last prompt position.
const MAX_KL: f64 = 1e-2;
/// Largest allowed difference of a chosen token's log-probability, in nats.
const LOGPROB_TOLERANCE: f64 = 0.25;

/// One model's conformance fixture.
#[derive(Debug, Deserialize)]
struct Fixture {
    model: FixtureModel,
    settings: Settings,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct FixtureModel {
    file: String,
    sha256: String,
}

#[derive(Debug, Deserialize)]
struct Settings {
    add_bos: bool,
    end_of_generation_ids: Vec<TokenId>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    prompt: String,
    prompt_ids: Vec<TokenId>,
    continuation_ids: Vec<TokenId>,
    top1_minus_top2: Vec<f32>,
    chosen_logprobs: Vec<f64>,
    last_logits: Option<LogitsFile>,
}

/// A logits row stored next to the fixture as little-endian f16.
#[derive(Debug, Deserialize)]
struct LogitsFile {
    file: String,
    dtype: String,
    len: usize,
}

/// Defines one ignored conformance test per (model, fixture) pair.
macro_rules! conformance_tests {
    ($($test:ident: $model:expr, $fixture:literal, $reason:literal;)*) => {$(
        #[test]
        #[ignore = $reason]
        fn $test() {
            check_model(&$model, $fixture);
        }
    )*};
}

conformance_tests! {
    smollm2_q4_1: SMOLLM2, "smollm2/conformance.json",
        "needs SmolLM2: cargo xtask fetch-model smollm2";
    smollm2_q4_k_m: SMOLLM2_Q4_K_M, "smollm2-requant/q4_k_m.json",
        "needs SmolLM2 Q4_K_M: cargo xtask fetch-model smollm2-q4_k_m";
    smollm2_q5_k_m: SMOLLM2_Q5_K_M, "smollm2-requant/q5_k_m.json",
        "needs SmolLM2 Q5_K_M: cargo xtask fetch-model smollm2-q5_k_m";
    smollm2_q6_k: SMOLLM2_Q6_K, "smollm2-requant/q6_k.json",
        "needs SmolLM2 Q6_K: cargo xtask fetch-model smollm2-q6_k";
    smollm2_q3_k_m: SMOLLM2_Q3_K_M, "smollm2-requant/q3_k_m.json",
        "needs SmolLM2 Q3_K_M: cargo xtask fetch-model smollm2-q3_k_m";
    smollm2_q2_k: SMOLLM2_Q2_K, "smollm2-requant/q2_k.json",
        "needs SmolLM2 Q2_K: cargo xtask fetch-model smollm2-q2_k";
    smollm2_q5_0: SMOLLM2_Q5_0, "smollm2-requant/q5_0.json",
        "needs SmolLM2 Q5_0: cargo xtask fetch-model smollm2-q5_0";
    smollm2_q8_0: SMOLLM2_Q8_0, "smollm2-requant/q8_0.json",
        "needs SmolLM2 Q8_0: cargo xtask fetch-model smollm2-q8_0";
    smollm2_iq4_xs: SMOLLM2_IQ4_XS, "smollm2-requant/iq4_xs.json",
        "needs SmolLM2 IQ4_XS: cargo xtask fetch-model smollm2-iq4_xs";
    gemma3_270m: GEMMA3_270M, "gemma3/conformance.json",
        "needs Gemma 3 270M: cargo xtask fetch-model gemma3-270m";
}

/// Every fixture was made from exactly the file the catalog names, so a
/// catalog change cannot silently pair a model with another file's outputs.
#[test]
fn every_fixture_was_made_from_its_catalog_file() {
    for (model, fixture) in [
        (SMOLLM2, "smollm2/conformance.json"),
        (SMOLLM2_Q4_K_M, "smollm2-requant/q4_k_m.json"),
        (SMOLLM2_Q5_K_M, "smollm2-requant/q5_k_m.json"),
        (SMOLLM2_Q6_K, "smollm2-requant/q6_k.json"),
        (SMOLLM2_Q3_K_M, "smollm2-requant/q3_k_m.json"),
        (SMOLLM2_Q2_K, "smollm2-requant/q2_k.json"),
        (SMOLLM2_Q5_0, "smollm2-requant/q5_0.json"),
        (SMOLLM2_Q8_0, "smollm2-requant/q8_0.json"),
        (SMOLLM2_IQ4_XS, "smollm2-requant/iq4_xs.json"),
        (GEMMA3_270M, "gemma3/conformance.json"),
    ] {
        let fixture = read_fixture(fixture);
        assert_eq!(fixture.model.file, model.file_name, "{}", model.name);
        assert_eq!(fixture.model.sha256, model.sha256, "{}", model.name);
        let long = fixture
            .cases
            .iter()
            .find(|case| case.name == "long_document")
            .unwrap();
        assert!(long.prompt_ids.len() > 512, "{}: long prompt", model.name);
        let with_logits = fixture
            .cases
            .iter()
            .filter(|case| case.last_logits.is_some());
        assert_eq!(with_logits.count(), 2, "{}", model.name);
    }
}

/// An error and its sources, joined by ": " (the loader's errors name the
/// stage; the cause, such as an unsupported weight type, is in a source).
fn chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn read_fixture(relative: &str) -> Fixture {
    let path = fixture_path(relative);
    let json = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    serde_json::from_str(&json).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Loads `model` (panicking with the fetch command when it is missing) and
/// checks every case of its fixture, reporting all failures at once.
fn check_model(model: &KnownModel, fixture_file: &str) {
    let path = model.path().unwrap_or_else(|err| panic!("{err}"));
    let fixture = read_fixture(fixture_file);
    assert_eq!(
        fixture.model.sha256, model.sha256,
        "{fixture_file} is for another file"
    );
    let loaded = lm::load_gguf(&path)
        .unwrap_or_else(|err| panic!("{}: lm::load_gguf fails: {}", model.name, chain(&err)));
    let logits_dir = fixture_path(fixture_file)
        .parent()
        .map(PathBuf::from)
        .unwrap();

    let mut failures = Vec::new();
    if loaded.text.tokenizer.add_bos() != fixture.settings.add_bos {
        failures.push(format!(
            "add_bos is {}, llama.cpp's is {}",
            loaded.text.tokenizer.add_bos(),
            fixture.settings.add_bos
        ));
    }
    if loaded.text.end_ids != fixture.settings.end_of_generation_ids {
        failures.push(format!(
            "end ids {:?}, llama.cpp's {:?}",
            loaded.text.end_ids, fixture.settings.end_of_generation_ids
        ));
    }
    for case in &fixture.cases {
        if let Err(case_failures) = check_case(&loaded, case, &logits_dir) {
            failures.extend(
                case_failures
                    .into_iter()
                    .map(|failure| format!("{}: {failure}", case.name)),
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} differs from llama.cpp ({fixture_file}):\n  {}",
        model.name,
        failures.join("\n  ")
    );
}

/// The checks of one prompt; `Err` lists every one that failed.
fn check_case(
    model: &GgufModel,
    case: &Case,
    logits_dir: &std::path::Path,
) -> Result<(), Vec<String>> {
    let mut failures = Vec::new();
    let decoder = &model.decoder;
    let tokenizer = &model.text.tokenizer;

    // `encode` prepends the bos token when the vocabulary asks for it (Gemma).
    let ours = tokenizer.encode(&case.prompt).unwrap_or_else(|err| {
        failures.push(format!("cannot tokenize the prompt: {err}"));
        Vec::new()
    });
    if ours != case.prompt_ids {
        let first = ours
            .iter()
            .zip(&case.prompt_ids)
            .position(|(a, b)| a != b)
            .unwrap_or(ours.len().min(case.prompt_ids.len()));
        failures.push(format!(
            "prompt ids differ from position {first} (ours {} ids, llama.cpp's {})",
            ours.len(),
            case.prompt_ids.len()
        ));
    }

    // Everything below reads llama.cpp's ids, so a tokenizer difference does
    // not hide a model difference.
    let mut prefilled = decoder.new_state();
    let mut last = Vec::new();
    if let Err(err) = decoder.forward(&mut prefilled, &case.prompt_ids, Rows::Last, &mut last) {
        failures.push(format!("forward over the prompt fails: {err}"));
        return Err(failures);
    }
    if let Some(logits) = &case.last_logits {
        failures.extend(check_last_logits(&last, logits, logits_dir));
    }

    // Greedy, identical up to llama.cpp's first near-tie.
    let expected = &case.continuation_ids;
    let first_tie = case
        .top1_minus_top2
        .iter()
        .position(|&gap| gap < TIE_GAP)
        .unwrap_or(expected.len());
    let mut state = prefilled.clone();
    let mut logits = last.clone();
    let mut greedy = Vec::new();
    for step in 0..first_tie {
        let token = argmax(&logits).unwrap();
        greedy.push(token);
        if step + 1 < first_tie {
            decoder
                .forward(&mut state, &[token], Rows::Last, &mut logits)
                .unwrap();
        }
    }
    if greedy != expected[..first_tie] {
        let step = greedy
            .iter()
            .zip(expected)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        failures.push(format!(
            "greedy token {} at step {step}, llama.cpp's {} (gap {}; first near-tie at step {first_tie})",
            greedy[step], expected[step], case.top1_minus_top2[step]
        ));
    }

    // Chosen-token log-probabilities, teacher-forced along llama.cpp's ids:
    // asserted up to and including llama.cpp's first near-tie (at least step
    // 0, the last prompt position), the window in which the greedy ids must
    // agree; past it the worst difference is only reported, because small
    // differences in the KV cache grow over a long teacher-forced tail (two
    // llama.cpp configurations, F16 and F32 cache, already part ways there;
    // fixtures/smollm2/README.md).
    let checked_steps = (first_tie + 1).min(expected.len());
    let mut state = prefilled;
    let mut logits = last;
    let mut worst_checked: Option<(usize, f64, f64)> = None;
    let mut worst_tail = 0.0_f64;
    for (step, (&token, &theirs)) in expected.iter().zip(&case.chosen_logprobs).enumerate() {
        let ours = f64::from(log_softmax(&logits, 1.0).unwrap()[token as usize]);
        let difference = (ours - theirs).abs();
        if step < checked_steps {
            if worst_checked.is_none_or(|(_, worst, _)| difference > worst) {
                worst_checked = Some((step, difference, ours));
            }
        } else {
            worst_tail = worst_tail.max(difference);
        }
        if step + 1 < expected.len() {
            decoder
                .forward(&mut state, &[token], Rows::Last, &mut logits)
                .unwrap();
        }
    }
    if let Some((step, difference, ours)) = worst_checked
        && difference >= LOGPROB_TOLERANCE
    {
        failures.push(format!(
            "log p(chosen) at step {step} is {ours:.4}, llama.cpp's {:.4} (gap {})",
            case.chosen_logprobs[step], case.top1_minus_top2[step]
        ));
    }
    eprintln!(
        "{}: greedy compared over {first_tie} steps; log p(chosen) worst difference {:.4} \
         over {checked_steps} checked steps, {worst_tail:.4} over the rest",
        case.name,
        worst_checked.map_or(0.0, |(_, difference, _)| difference)
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}

/// Every logit within [`LOGIT_TOLERANCE`] and KL below [`MAX_KL`].
fn check_last_logits(ours: &[f32], file: &LogitsFile, dir: &std::path::Path) -> Vec<String> {
    assert_eq!(file.dtype, "f16", "{}", file.file);
    let bytes = std::fs::read(dir.join(&file.file)).unwrap();
    let theirs: Vec<f32> = bytes
        .chunks_exact(2)
        .map(|pair| half::f16::from_le_bytes([pair[0], pair[1]]).to_f32())
        .collect();
    assert_eq!(theirs.len(), file.len, "{}", file.file);
    if theirs.len() != ours.len() {
        return vec![format!(
            "{} logits, llama.cpp has {}",
            ours.len(),
            theirs.len()
        )];
    }
    let mut failures = Vec::new();
    let (worst_idx, worst) = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0.0_f32), |best, (idx, difference)| {
            if difference > best.1 || difference.is_nan() {
                (idx, difference)
            } else {
                best
            }
        });
    if worst.is_nan() || worst >= LOGIT_TOLERANCE {
        failures.push(format!(
            "last logit {worst_idx} differs by {worst} (ours {}, llama.cpp {})",
            ours[worst_idx], theirs[worst_idx]
        ));
    }
    let p = softmax(&theirs, 1.0).unwrap();
    let kl = softmax(ours, 1.0)
        .ok()
        .and_then(|q| kl_divergence(&p, &q).ok());
    match kl {
        Some(kl) if kl < MAX_KL => {}
        _ => failures.push(format!(
            "KL(llama.cpp || ours) = {kl:?} at the last position"
        )),
    }
    eprintln!("{}: last logits max diff {worst}, KL {kl:?}", file.file);
    failures
}
