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
//! - our greedy ids are llama.cpp's up to the first near-tie (a step whose
//!   top-1/top-2 gap is below [`TIE_GAP`] in llama.cpp's logits or the exact
//!   ones: two correct implementations may break it either way);
//! - teacher-forced along llama.cpp's greedy ids, each chosen token's
//!   log-probability is within [`LOGPROB_TOLERANCE`] nats of llama.cpp's, up
//!   to and including that first near-tie (the rest is only reported);
//! - where the fixture keeps the last-position logits row, every logit is
//!   within [`LOGIT_TOLERANCE`] and KL(llama.cpp || ours) < [`MAX_KL`].
//!
//! llama.cpp is itself an approximation (8-bit activations before every
//! quantized product, an F16 KV cache), and on some prompts it is farther from the model's exact
//! math than these tolerances. So each fixture has an exact twin,
//! `<stem>.exact.json` (`scripts/reference/exact_forward.py`: the same GGUF
//! dequantized and run in float64, teacher-forced along llama.cpp's ids), and
//! each numeric check passes either way it can honestly pass: close to
//! llama.cpp, or no farther from the exact value than llama.cpp itself may be.
//!
//! How far llama.cpp may be is measured, not guessed: `<stem>.envelope.json`
//! (`scripts/reference/llama_cpp_envelope.py`) replays every case with the
//! same llama.cpp build under sixteen settings that change only rounding
//! (the prompt in micro-batches of 1, 7, 32 or 1,024 tokens, flash attention
//! off or on, an F16 or F32 KV cache). On the most sensitive rows they
//! disagree with each other by more than the tolerances (SmolLM2 Q2_K's chat
//! row: KL(exact || llama.cpp) from 0.005 to 0.031). A check passes when ours
//! is within that envelope:
//! - a chosen token's log-probability: within [`LOGPROB_TOLERANCE`] of the
//!   fixture's, or `|ours - exact|` no larger than the largest
//!   `|llama.cpp - exact|` over the fixture and the sixteen settings;
//! - the last row: max |ours - llama.cpp| < [`LOGIT_TOLERANCE`], or max
//!   |ours - exact| within the envelope's largest; KL(llama.cpp || ours) <
//!   [`MAX_KL`], or KL(exact || ours) within the envelope's largest;
//! - greedy ids: equal up to the first near-tie, which is the first step
//!   with a top-1/top-2 gap below [`TIE_GAP`] in llama.cpp's logits or in the
//!   exact ones, or where one of llama.cpp's own settings already picks
//!   another token.
//!
//! Both distances are measured here, against the same stored (f16) exact
//! row, and a check that fails reports every distance.
//!
//! Ten checks leave the envelope by a little, always the same way (ours
//! slightly farther from exact than every llama.cpp setting): they are
//! listed in [`KNOWN_DEVIATIONS`], each bounded just above what was measured
//! (`fixtures/smollm2-requant/README.md`), so they cannot grow unnoticed; any
//! other failure, or one past its bound, fails the test. Six of them are
//! checks that weights packed in panels (the default on SIMD paths:
//! `lm_model::Kernel::packs`; Q4_0, Q4_1 and Q8_0, and Q5_0, Q4_K and Q6_K
//! on AVX-512) move:
//! one single logit of the row, the row's KL within llama.cpp's settings,
//! or a chosen token's log-probability at a near-tie. Which rows leave the
//! envelope is rounding noise: the row-major kernels with an F32 KV cache
//! (exact in principle) leave it on six models.
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

use crate::common::{error_chain, fixture_json, fixture_path};

/// Below this top-1/top-2 logit gap, a greedy step is a near-tie.
const TIE_GAP: f32 = 0.3;
/// Largest allowed difference of one last-position logit.
const LOGIT_TOLERANCE: f32 = 1.0;
/// Largest allowed KL divergence at the last prompt position.
const MAX_KL: f64 = 1e-2;
/// Largest allowed difference of a chosen token's log-probability, in nats.
const LOGPROB_TOLERANCE: f64 = 0.25;

/// Which numeric check a known deviation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// max |ours - exact| over the last row.
    LastLogits,
    /// KL(exact || ours) at the last row.
    LastKl,
    /// |ours - exact| of a chosen token's log-probability.
    ChosenLogprob,
}

/// A check that fails both ways (farther than the tolerance from llama.cpp
/// and slightly farther from exact than any of llama.cpp's settings), with
/// the largest distance from exact it may have: about 10% above the value
/// measured (2026-12-01 on AVX2, 2026-12-05 on AVX-512: the same; the
/// row-major kernels give the portable path's integer sums; 2026-12-06 for
/// the two rows that Q4_0 and Q8_0 panels move, which give the same bits on
/// AVX2, AVX-VNNI and AVX-512), the value in the comment, next to
/// llama.cpp's own.
struct KnownDeviation {
    model: &'static str,
    case: &'static str,
    check: Check,
    max_from_exact: f64,
}

/// Every known deviation; see the module docs.
const KNOWN_DEVIATIONS: &[KnownDeviation] = &[
    // Q4_0 panels: 1.802 (row-major 1.314; llama.cpp 1.215, up to 1.391 over
    // its settings; KL(exact || ours) 0.0218 is within its 0.0375).
    KnownDeviation {
        model: "smollm2-q2_k",
        case: "chat",
        check: Check::LastLogits,
        max_from_exact: 1.98,
    },
    // Q8_0 panels: 0.905 (row-major 0.488; llama.cpp 0.586, up to 0.716;
    // KL(exact || ours) 0.0043 is within its 0.0048).
    KnownDeviation {
        model: "smollm2-q5_k_m",
        case: "long_document",
        check: Check::LastLogits,
        max_from_exact: 1.0,
    },
    // 0.0199 (llama.cpp 0.0099 in the fixture, up to 0.0188 over its settings).
    KnownDeviation {
        model: "smollm2-q6_k",
        case: "chat",
        check: Check::LastKl,
        max_from_exact: 0.022,
    },
    // 1.022 (llama.cpp 0.846, up to 0.869 over its settings).
    KnownDeviation {
        model: "gemma3-270m",
        case: "long_document",
        check: Check::LastLogits,
        max_from_exact: 1.13,
    },
    // Step 0: 0.142 (llama.cpp 0.134 in the fixture and at most over its settings).
    KnownDeviation {
        model: "smollm2-q5_0",
        case: "code",
        check: Check::ChosenLogprob,
        max_from_exact: 0.16,
    },
    // Step 2: 0.240 (llama.cpp 0.111, at most over its settings).
    KnownDeviation {
        model: "smollm2-q4_k_m",
        case: "code",
        check: Check::ChosenLogprob,
        max_from_exact: 0.27,
    },
    // Q4_K and Q6_K panels: 2.057 (row-major 1.193; llama.cpp 1.688, up to
    // 1.682 over its settings; KL(exact || ours) 0.0091 is within its 0.0094).
    KnownDeviation {
        model: "gemma3-270m",
        case: "chat",
        check: Check::LastLogits,
        max_from_exact: 2.2,
    },
    // Q4_K and Q6_K panels: 1.954 (llama.cpp 1.031, up to 1.660 over its
    // settings; KL(exact || ours) 0.0133 is within its 0.0199).
    KnownDeviation {
        model: "smollm2-q5_k_m",
        case: "chat",
        check: Check::LastLogits,
        max_from_exact: 2.1,
    },
    // Q4_1 panels with a q8_0 KV cache (`kv_q8_0.rs`): KL(exact || ours)
    // 0.0208 (llama.cpp 0.0090 in the fixture, up to 0.0158 over its
    // settings; KL(llama.cpp || ours) 0.0202); row-major passes.
    KnownDeviation {
        model: "smollm2",
        case: "chat",
        check: Check::LastKl,
        max_from_exact: 0.023,
    },
    // Q4_K and Q6_K panels, step 1, a near-tie (gap 0.016): 0.248 (llama.cpp
    // 0.005; row-major 0.203 from llama.cpp, within the tolerance).
    KnownDeviation {
        model: "smollm2-q3_k_m",
        case: "long_document",
        check: Check::ChosenLogprob,
        max_from_exact: 0.27,
    },
];

/// Whether a check that failed both ways is a known deviation within its
/// bound (`from_exact`: our distance from exact); says so on stderr.
fn known_deviation(model: &str, case: &str, check: Check, from_exact: f64) -> bool {
    let known = KNOWN_DEVIATIONS
        .iter()
        .find(|known| known.model == model && known.case == case && known.check == check);
    match known {
        Some(known) if from_exact <= known.max_from_exact => {
            eprintln!(
                "{model} {case}: known deviation {check:?}: {from_exact:.4} from exact \
                 (bound {})",
                known.max_from_exact
            );
            true
        }
        _ => false,
    }
}

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

/// One prompt of a fixture: llama.cpp's ids, greedy continuation, gaps,
/// chosen log-probabilities and, for some, its last prompt row (also the
/// shape of `smollm2_hf`'s runs of the HF twins).
#[derive(Debug, Deserialize)]
pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) prompt: String,
    pub(crate) prompt_ids: Vec<TokenId>,
    pub(crate) continuation_ids: Vec<TokenId>,
    pub(crate) top1_minus_top2: Vec<f32>,
    pub(crate) chosen_logprobs: Vec<f64>,
    pub(crate) last_logits: Option<LogitsFile>,
}

/// The exact twin of a fixture (`<stem>.exact.json`): the same cases
/// recomputed in float64 from the same GGUF.
#[derive(Debug, Deserialize)]
struct ExactFixture {
    model: FixtureModel,
    cases: Vec<ExactCase>,
}

#[derive(Debug, Deserialize)]
struct ExactCase {
    name: String,
    /// Per step, teacher-forced along llama.cpp's greedy ids.
    chosen_logprobs: Vec<f64>,
    /// Per step, the exact top-1/top-2 logit gap.
    top1_minus_top2: Vec<f32>,
    /// The exact last-position row, where the fixture keeps llama.cpp's.
    last_logits: Option<LogitsFile>,
}

/// llama.cpp's own variation (`<stem>.envelope.json`): every case replayed
/// along the fixture's ids under settings that change only rounding.
#[derive(Debug, Deserialize)]
struct Envelope {
    model: FixtureModel,
    variants: Vec<serde_json::Value>,
    cases: Vec<EnvelopeCase>,
}

#[derive(Debug, Deserialize)]
struct EnvelopeCase {
    name: String,
    /// Per setting, per step: the log-probability of the fixture's id.
    chosen_logprobs: Vec<Vec<f64>>,
    /// Per setting, per step: that setting's own argmax.
    argmax_ids: Vec<Vec<TokenId>>,
    /// Per setting, the last prompt row's distances from the exact row.
    last_row: Option<Vec<RowDistances>>,
}

#[derive(Debug, Deserialize)]
struct RowDistances {
    kl_from_exact: f64,
    max_abs_from_exact: f32,
}

impl EnvelopeCase {
    /// The first step at which one of llama.cpp's settings picks a token other
    /// than `expected`'s.
    fn first_split(&self, expected: &[TokenId]) -> usize {
        self.argmax_ids
            .iter()
            .filter_map(|ids| ids.iter().zip(expected).position(|(a, b)| a != b))
            .min()
            .unwrap_or(expected.len())
    }

    /// The largest |llama.cpp - exact| of step `step`'s chosen log-probability
    /// over the settings.
    fn logprob_from_exact(&self, step: usize, exact: f64) -> f64 {
        self.chosen_logprobs
            .iter()
            .map(|row| (row[step] - exact).abs())
            .fold(0.0, f64::max)
    }

    /// The largest max |llama.cpp - exact| and KL(exact || llama.cpp) of the
    /// last row over the settings.
    fn last_row_from_exact(&self) -> (f32, f64) {
        let rows = self.last_row.iter().flatten();
        let abs = rows.clone().map(|row| row.max_abs_from_exact);
        let kl = rows.map(|row| row.kl_from_exact);
        (abs.fold(0.0, f32::max), kl.fold(0.0, f64::max))
    }
}

/// A logits row stored next to the fixture as little-endian f16.
#[derive(Debug, Deserialize)]
pub(crate) struct LogitsFile {
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
    for (model, fixture_file) in [
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
        let fixture = read_fixture(fixture_file);
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
        let exact = read_exact(fixture_file);
        assert_eq!(exact.model.sha256, model.sha256, "{}: exact", model.name);
        assert_eq!(exact.cases.len(), fixture.cases.len(), "{}", model.name);
        let envelope = read_envelope(fixture_file);
        assert_eq!(
            envelope.model.sha256, model.sha256,
            "{}: envelope",
            model.name
        );
        assert_eq!(envelope.cases.len(), fixture.cases.len(), "{}", model.name);
        let n_settings = envelope.variants.len();
        assert!(n_settings >= 16, "{}: {n_settings} settings", model.name);
        let cases = fixture.cases.iter().zip(&exact.cases).zip(&envelope.cases);
        for ((case, exact), envelope) in cases {
            assert_eq!(case.name, exact.name, "{}", model.name);
            assert_eq!(case.name, envelope.name, "{}", model.name);
            let what = format!("{}: {}", model.name, case.name);
            let n_chosen = case.continuation_ids.len();
            assert_eq!(exact.chosen_logprobs.len(), n_chosen, "{what}");
            let has_logits = case.last_logits.is_some();
            assert_eq!(exact.last_logits.is_some(), has_logits, "{what}");
            assert_eq!(envelope.last_row.is_some(), has_logits, "{what}");
            let settings = [&envelope.chosen_logprobs.len(), &envelope.argmax_ids.len()];
            assert_eq!(settings, [&n_settings; 2], "{what}");
            for (logprobs, ids) in envelope.chosen_logprobs.iter().zip(&envelope.argmax_ids) {
                assert_eq!([logprobs.len(), ids.len()], [n_chosen; 2], "{what}");
            }
        }
    }
}

fn read_fixture(relative: &str) -> Fixture {
    fixture_json(relative)
}

/// The exact twin of the fixture `relative` (`q2_k.json` -> `q2_k.exact.json`).
fn read_exact(relative: &str) -> ExactFixture {
    let stem = relative.strip_suffix(".json").unwrap();
    fixture_json(&format!("{stem}.exact.json"))
}

/// llama.cpp's own variation on the fixture `relative` (`q2_k.json` ->
/// `q2_k.envelope.json`).
fn read_envelope(relative: &str) -> Envelope {
    let stem = relative.strip_suffix(".json").unwrap();
    fixture_json(&format!("{stem}.envelope.json"))
}

/// Loads `model` (panicking with the fetch command when it is missing) and
/// checks every case of its fixture, reporting all failures at once.
fn check_model(model: &KnownModel, fixture_file: &str) {
    check_model_with_kv(model, fixture_file, None);
}

/// [`check_model`] with the KV cache stored at `kv` instead of the model's
/// default (`kv_q8_0.rs`: a q8_0 cache against llama.cpp's).
pub(crate) fn check_model_with_kv(
    model: &KnownModel,
    fixture_file: &str,
    kv: Option<lm::lm_model::KvPrecision>,
) {
    let path = model.path().unwrap_or_else(|err| panic!("{err}"));
    let fixture = read_fixture(fixture_file);
    assert_eq!(
        fixture.model.sha256, model.sha256,
        "{fixture_file} is for another file"
    );
    let exact = read_exact(fixture_file);
    assert_eq!(
        exact.model.sha256, model.sha256,
        "the exact twin of {fixture_file} is for another file"
    );
    let mut loaded = lm::load_gguf(&path)
        .unwrap_or_else(|err| panic!("{}: lm::load_gguf fails: {}", model.name, error_chain(&err)));
    if let Some(kv) = kv {
        loaded.decoder = loaded.decoder.with_kv_precision(kv);
    }
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
    let envelope = read_envelope(fixture_file);
    for case in &fixture.cases {
        let exact = exact
            .cases
            .iter()
            .find(|exact| exact.name == case.name)
            .unwrap_or_else(|| panic!("no exact case {}", case.name));
        let envelope = envelope
            .cases
            .iter()
            .find(|envelope| envelope.name == case.name)
            .unwrap_or_else(|| panic!("no envelope case {}", case.name));
        if let Err(case_failures) =
            check_case(model.name, &loaded, case, exact, envelope, &logits_dir)
        {
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
    model_name: &str,
    model: &GgufModel,
    case: &Case,
    exact: &ExactCase,
    envelope: &EnvelopeCase,
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
    if let (Some(theirs), Some(exact)) = (&case.last_logits, &exact.last_logits) {
        failures.extend(check_last_logits(
            (model_name, &case.name),
            &last,
            (theirs, exact, envelope),
            logits_dir,
        ));
    }

    // Greedy, identical up to the first near-tie: a small gap in llama.cpp's
    // logits or in the exact ones, or a step where one of llama.cpp's own
    // settings already parts ways.
    let expected = &case.continuation_ids;
    let first_small_gap = |gaps: &[f32]| {
        gaps.iter()
            .position(|&gap| gap < TIE_GAP)
            .unwrap_or(expected.len())
    };
    let first_tie = first_small_gap(&case.top1_minus_top2)
        .min(first_small_gap(&exact.top1_minus_top2))
        .min(envelope.first_split(expected));
    let mut state = prefilled.clone();
    let mut logits = last.clone();
    let mut greedy: Vec<TokenId> = Vec::new();
    while greedy.len() < first_tie {
        // Each token but the last is fed back before the next argmax.
        if let Some(&token) = greedy.last() {
            decoder
                .forward(&mut state, &[token], Rows::Last, &mut logits)
                .unwrap();
        }
        greedy.push(argmax(&logits).unwrap());
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
    // asserted up to and including the first near-tie (at least step
    // 0, the last prompt position), the window in which the greedy ids must
    // agree; past it the worst difference is only reported, because small
    // differences in the KV cache grow over a long teacher-forced tail (two
    // llama.cpp configurations, F16 and F32 cache, already part ways there;
    // fixtures/smollm2/README.md).
    // Each checked step passes within LOGPROB_TOLERANCE of llama.cpp, or no
    // farther from the exact value than one of llama.cpp's settings is.
    let checked_steps = (first_tie + 1).min(expected.len());
    let mut state = prefilled;
    let mut logits = last;
    let mut worst_checked = 0.0_f64;
    let mut worst_failing: Option<(usize, f64, f64)> = None;
    let mut worst_tail = 0.0_f64;
    let steps = expected
        .iter()
        .zip(&case.chosen_logprobs)
        .zip(&exact.chosen_logprobs);
    for (step, ((&token, &theirs), &exact)) in steps.enumerate() {
        let ours = f64::from(log_softmax(&logits, 1.0).unwrap()[token as usize]);
        let difference = (ours - theirs).abs();
        if step < checked_steps {
            worst_checked = worst_checked.max(difference);
            let llama_cpp_from_exact = (theirs - exact)
                .abs()
                .max(envelope.logprob_from_exact(step, exact));
            let no_farther_from_exact = (ours - exact).abs() <= llama_cpp_from_exact;
            if difference >= LOGPROB_TOLERANCE
                && !no_farther_from_exact
                && !known_deviation(
                    model_name,
                    &case.name,
                    Check::ChosenLogprob,
                    (ours - exact).abs(),
                )
                && worst_failing.is_none_or(|(_, worst, _)| difference > worst)
            {
                worst_failing = Some((step, difference, ours));
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
    if let Some((step, _, ours)) = worst_failing {
        failures.push(format!(
            "log p(chosen) at step {step} is {ours:.4}, llama.cpp's {:.4}, exact {:.4} (gap {})",
            case.chosen_logprobs[step], exact.chosen_logprobs[step], case.top1_minus_top2[step]
        ));
    }
    eprintln!(
        "{}: greedy compared over {first_tie} steps; log p(chosen) worst difference from \
         llama.cpp {worst_checked:.4} over {checked_steps} checked steps, {worst_tail:.4} over the rest",
        case.name,
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}

/// Every logit within [`LOGIT_TOLERANCE`] of llama.cpp's or no farther from
/// the exact row than llama.cpp's settings are; KL(llama.cpp || ours) below
/// [`MAX_KL`] or KL(exact || ours) within llama.cpp's.
fn check_last_logits(
    (model, case): (&str, &str),
    ours: &[f32],
    (theirs_file, exact_file, envelope): (&LogitsFile, &LogitsFile, &EnvelopeCase),
    dir: &std::path::Path,
) -> Vec<String> {
    let theirs = read_f16_row(theirs_file, dir);
    let exact = read_f16_row(exact_file, dir);
    assert_eq!(exact.len(), theirs.len(), "{}", exact_file.file);
    if theirs.len() != ours.len() {
        return vec![format!(
            "{} logits, llama.cpp has {}",
            ours.len(),
            theirs.len()
        )];
    }
    let mut failures = Vec::new();
    let (settings_from_exact, settings_kl_from_exact) = envelope.last_row_from_exact();
    let (worst_idx, worst) = max_abs_difference(ours, &theirs);
    let (_, ours_from_exact) = max_abs_difference(ours, &exact);
    let (_, theirs_from_exact) = max_abs_difference(&theirs, &exact);
    let llama_cpp_from_exact = theirs_from_exact.max(settings_from_exact);
    if !(worst < LOGIT_TOLERANCE
        || ours_from_exact <= llama_cpp_from_exact
        || known_deviation(model, case, Check::LastLogits, f64::from(ours_from_exact)))
    {
        failures.push(format!(
            "last logit {worst_idx} differs by {worst} (ours {}, llama.cpp {}); \
             max |ours - exact| {ours_from_exact}, max |llama.cpp - exact| {theirs_from_exact} \
             (up to {settings_from_exact} over its settings)",
            ours[worst_idx], theirs[worst_idx]
        ));
    }
    let kl = kl_of_rows(&theirs, ours);
    let ours_kl_from_exact = kl_of_rows(&exact, ours);
    let theirs_kl_from_exact = kl_of_rows(&exact, &theirs);
    let kl_passes = match (kl, ours_kl_from_exact, theirs_kl_from_exact) {
        (Some(kl), _, _) if kl < MAX_KL => true,
        (_, Some(ours), Some(theirs)) => {
            ours <= theirs.max(settings_kl_from_exact)
                || known_deviation(model, case, Check::LastKl, ours)
        }
        _ => false,
    };
    if !kl_passes {
        failures.push(format!(
            "KL(llama.cpp || ours) = {kl:?} at the last position; KL(exact || ours) \
             {ours_kl_from_exact:?}, KL(exact || llama.cpp) {theirs_kl_from_exact:?} \
             (up to {settings_kl_from_exact} over its settings)"
        ));
    }
    eprintln!(
        "{}: max |ours - llama.cpp| {worst:.3}, |ours - exact| {ours_from_exact:.3}, \
         |llama.cpp - exact| {theirs_from_exact:.3} (settings up to {settings_from_exact:.3}); \
         KL(llama.cpp || ours) {:.5}, KL(exact || ours) {:.5}, KL(exact || llama.cpp) {:.5} \
         (settings up to {settings_kl_from_exact:.5})",
        theirs_file.file,
        kl.unwrap_or(f64::NAN),
        ours_kl_from_exact.unwrap_or(f64::NAN),
        theirs_kl_from_exact.unwrap_or(f64::NAN)
    );
    failures
}

/// A logits row stored as little-endian f16 next to the fixture.
pub(crate) fn read_f16_row(file: &LogitsFile, dir: &std::path::Path) -> Vec<f32> {
    assert_eq!(file.dtype, "f16", "{}", file.file);
    let bytes = std::fs::read(dir.join(&file.file))
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", file.file));
    let row: Vec<f32> = bytes
        .chunks_exact(2)
        .map(|pair| half::f16::from_le_bytes([pair[0], pair[1]]).to_f32())
        .collect();
    assert_eq!(row.len(), file.len, "{}", file.file);
    row
}

/// The index and size of the largest |a - b| (a NaN counts as largest).
pub(crate) fn max_abs_difference(a: &[f32], b: &[f32]) -> (usize, f32) {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0.0_f32), |best, (idx, difference)| {
            let larger = difference > best.1 || difference.is_nan();
            if larger && !best.1.is_nan() {
                (idx, difference)
            } else {
                best
            }
        })
}

/// KL(softmax(p) || softmax(q)), or `None` when a row cannot be normalised.
pub(crate) fn kl_of_rows(p: &[f32], q: &[f32]) -> Option<f64> {
    let p = softmax(p, 1.0).ok()?;
    let q = softmax(q, 1.0).ok()?;
    kl_divergence(&p, &q).ok()
}
