//! `lm-cli quantize` against llama.cpp's `llama_model_quantize`: the same
//! file byte for byte (fixtures/quantize/, Q8_0 to Q6_K and the K mixes
//! from Q2_K to Q5_K_S, written by scripts/reference/quantize_reference.py,
//! and SmolLM2 Q8_0 requantized to Q4_0, Q2_K, Q3_K_M and IQ4_XS (their SHA-256 and
//! llama.cpp's greedy ids and logits on them in
//! fixtures/quantize/smollm2-TYPE.json, written by
//! scripts/reference/quantize_smollm2_reference.py), and the output file
//! protected on every error.
//!
//! The SmolLM2 test needs the model (`cargo xtask fetch-model smollm2-q8_0`);
//! without it it fails saying so.

use std::path::{Path, PathBuf};

use lm::lm_core::{LanguageModel, Rows, argmax, kl_divergence, softmax};
use lm_model::catalog::SMOLLM2_Q8_0;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::{Cli, fixture, ids};

/// A logit gap below which two tokens are a near-tie.
const NEAR_TIE: f64 = 0.3;

/// How far our logits may be from llama.cpp's on the same quantized file
/// (the conformance tolerance per logit).
const TOP_LOGIT_TOLERANCE: f64 = 1.0;

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("quantize-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The summary lines of a run, each with its runs of spaces made one.
fn summary(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn quantize(input: &Path, output: &Path, ty: &str) -> Cli {
    Cli::new("quantize")
        .arg(input.display())
        .arg(output.display())
        .arg(ty)
}

/// `lm-cli quantize` of `input` to `ty` into `dir/FILE.gguf`: the summary
/// has each of `lines`, and the file equals llama-quantize's
/// `fixtures/quantize/FILE.gguf` byte for byte.
fn check_equals_llama_quantize(input: &Path, dir: &Path, ty: &str, file: &str, lines: &[&str]) {
    let out = dir.join(format!("{file}.gguf"));
    let shown = summary(&quantize(input, &out, ty).ok().stdout);
    for line in lines {
        assert!(shown.iter().any(|l| l == line), "{ty}: {line}\n{shown:#?}");
    }
    let theirs = std::fs::read(fixture(&format!("quantize/{file}.gguf"))).unwrap();
    assert!(
        std::fs::read(&out).unwrap() == theirs,
        "{file}: the file differs from llama-quantize's"
    );
}

/// Every type's file equals llama-quantize's byte for byte: metadata (order
/// included), tensor order, types (the tied embedding to Q8_0, the output
/// to Q6_K where its rows allow) and blocks.
#[test]
fn fixture_files_equal_llama_quantize_byte_for_byte() {
    let dir = scratch("fixture");
    let input = fixture("quantize/input.f16.gguf");
    for ty in ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"] {
        let embedding = "token_embd.weight 1 x f16 -> q8_0 quantized";
        let down = format!("blk.*.ffn_down.weight 1 x f16 -> {ty} quantized");
        let norm =
            "blk.*.ffn_norm.weight 1 x f32 -> f32 copied (not quantized by llama.cpp's rules)";
        let lines = [embedding, &down, norm];
        check_equals_llama_quantize(&input, &dir, &ty.to_uppercase(), ty, &lines);
    }
    // Rows of 256: the K-quants everywhere but ffn_down's rows of 32 (their
    // fallbacks), and output.weight Q6_K in the Q4_0 file.
    let input = fixture("quantize/input-k.f16.gguf");
    for (ty, file, line) in [
        (
            "q6_k",
            "q6_k",
            "blk.*.ffn_down.weight 1 x f16 -> q8_0 quantized",
        ),
        ("q4_0", "q4_0-k", "output.weight 1 x f16 -> q6_K quantized"),
        (
            "q4_k_s",
            "q4_k_s",
            "blk.*.ffn_down.weight 1 x f16 -> q5_0 quantized",
        ),
        (
            "q5_k_s",
            "q5_k_s",
            "blk.*.attn_q.weight 1 x f16 -> q5_K quantized",
        ),
        (
            "q2_k",
            "q2_k-k",
            "blk.*.ffn_down.weight 1 x f16 -> q4_0 quantized",
        ),
        (
            "iq4_xs",
            "iq4_xs-k",
            "blk.*.ffn_down.weight 1 x f16 -> iq4_nl quantized",
        ),
    ] {
        check_equals_llama_quantize(&input, &dir, ty, file, &[line]);
    }
}

/// The 2-, 3-bit and IQ4 mixes on 16 layers (fixtures/quantize/input-mix.f16.gguf,
/// 8 query heads per 2 key-value heads): each file equals llama-quantize's
/// byte for byte, with llama.cpp's per-layer types (the summary's lines).
#[test]
fn low_bit_mixes_equal_llama_quantize_byte_for_byte() {
    let dir = scratch("mix");
    let input = fixture("quantize/input-mix.f16.gguf");
    #[rustfmt::skip]
    let cases = [
        ("q2_k", &[
            "blk.*.attn_q.weight 16 x f16 -> q2_K quantized",
            "blk.*.attn_v.weight 16 x f16 -> q4_K quantized",
            "blk.*.attn_output.weight 16 x f16 -> q3_K quantized",
            "blk.*.ffn_down.weight 16 x f16 -> q3_K quantized",
            "output.weight 1 x f16 -> q6_K quantized",
        ][..]),
        ("Q3_K_S", &[
            "blk.*.attn_v.weight 16 x f16 -> q3_K quantized",
            "blk.*.ffn_down.weight 16 x f16 -> q3_K quantized",
            "token_embd.weight 1 x f16 -> q3_K quantized",
        ]),
        ("q3_k_m", &[
            "blk.*.attn_v.weight 2 x f16 -> q5_K quantized",
            "blk.*.attn_v.weight 14 x f16 -> q4_K quantized",
            "blk.*.ffn_down.weight 1 x f16 -> q5_K quantized",
            "blk.*.ffn_down.weight 15 x f16 -> q4_K quantized",
            "blk.*.attn_output.weight 16 x f16 -> q4_K quantized",
            "blk.*.ffn_up.weight 16 x f16 -> q3_K quantized",
        ]),
        ("q3_k_l", &[
            "blk.*.attn_v.weight 16 x f16 -> q5_K quantized",
            "blk.*.attn_output.weight 16 x f16 -> q5_K quantized",
            "blk.*.ffn_down.weight 16 x f16 -> q5_K quantized",
            "blk.*.attn_k.weight 16 x f16 -> q3_K quantized",
        ]),
        ("iq4_nl", &[
            "blk.*.attn_v.weight 16 x f16 -> q5_K quantized",
            "blk.*.ffn_down.weight 2 x f16 -> q5_K quantized",
            "blk.*.ffn_down.weight 14 x f16 -> iq4_nl quantized",
            "output.weight 1 x f16 -> q6_K quantized",
        ]),
        ("iq4_xs", &[
            "blk.*.attn_q.weight 16 x f16 -> iq4_xs quantized",
            "blk.*.attn_v.weight 16 x f16 -> q5_K quantized",
            "blk.*.ffn_down.weight 2 x f16 -> q5_K quantized",
            "token_embd.weight 1 x f16 -> iq4_xs quantized",
        ]),
    ];
    for (ty, expected) in cases {
        check_equals_llama_quantize(&input, &dir, ty, &ty.to_lowercase(), expected);
    }
}

/// OUT == IN, a bad input and a bad type: an error, and an existing OUT
/// (or IN) untouched, no temporary file left.
#[test]
fn errors_leave_files_alone() {
    let dir = scratch("errors");
    let input = dir.join("in.gguf");
    std::fs::copy(fixture("quantize/input.f16.gguf"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let run = quantize(&input, &dir.join(".").join("in.gguf"), "q4_0").run();
    run.assert_exit(1, "is the input");
    assert_eq!(std::fs::read(&input).unwrap(), before);

    let out = dir.join("out.gguf");
    std::fs::write(&out, b"keep me").unwrap();
    let not_gguf = dir.join("not.gguf");
    std::fs::write(&not_gguf, b"hello, world").unwrap();
    let run = quantize(&not_gguf, &out, "q4_0").run();
    run.assert_exit(1, "not a gguf file");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");

    let run = quantize(&input, &out, "q2_k_s").run();
    run.assert_usage_error("q2_k_s");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["in.gguf", "not.gguf", "out.gguf"]);
}

/// SmolLM2 Q8_0 to Q4_0: the file's SHA-256 is that of llama-quantize's
/// (`fixtures/quantize/smollm2-q4_0.json`, written by
/// scripts/reference/quantize_smollm2_reference.py), and our greedy ids on
/// it are llama.cpp's on its own file up to llama.cpp's first near-tie, its
/// largest last-position logits within the conformance tolerance of ours.
#[test]
fn smollm2_q4_0_equals_llama_quantize_and_runs_as_in_llama_cpp() {
    check_smollm2(
        "q4_0",
        &[
            "token_embd.weight 1 x q8_0 -> q8_0 copied (already the target type)",
            "blk.*.attn_q.weight 30 x q8_0 -> q4_0 quantized",
        ],
    );
}

/// SmolLM2 Q8_0 to Q2_K and Q3_K_M (rows of 576 fall back to Q4_0, so the
/// K-quants are ffn_down's: Q3_K in Q2_K's mix, Q5_K then Q4_K in
/// Q3_K_M's): each file is llama-quantize's byte for byte, and llama.cpp's
/// last-position logits on it (its 32 largest) are within the conformance
/// tolerance of ours.
#[test]
fn smollm2_q2_k_and_q3_k_m_equal_llama_quantize_and_run_as_in_llama_cpp() {
    check_smollm2(
        "q2_k",
        &[
            "blk.*.ffn_down.weight 30 x q8_0 -> q3_K quantized",
            "blk.*.attn_v.weight 30 x q8_0 -> q4_0 quantized",
        ],
    );
    check_smollm2(
        "q3_k_m",
        &[
            "blk.*.ffn_down.weight 1 x q8_0 -> q5_K quantized",
            "blk.*.ffn_down.weight 29 x q8_0 -> q4_K quantized",
        ],
    );
}

/// SmolLM2 Q8_0 to IQ4_XS (rows of 576 fall back to IQ4_NL; the first
/// eighth of ffn_down Q5_K): llama-quantize's file byte for byte, running
/// as in llama.cpp.
#[test]
fn smollm2_iq4_xs_equals_llama_quantize_and_runs_as_in_llama_cpp() {
    check_smollm2(
        "iq4_xs",
        &[
            "blk.*.ffn_down.weight 3 x q8_0 -> q5_K quantized",
            "blk.*.ffn_down.weight 27 x q8_0 -> iq4_xs quantized",
            "blk.*.attn_q.weight 30 x q8_0 -> iq4_nl quantized",
        ],
    );
}

/// `model`'s logits after `ids`, read from a fresh sequence.
fn last_logits(model: &lm::GgufModel, ids: &[lm::lm_core::TokenId]) -> Vec<f32> {
    let mut logits = Vec::new();
    (model.decoder)
        .forward(&mut model.decoder.new_state(), ids, Rows::Last, &mut logits)
        .unwrap();
    logits
}

/// `lm-cli quantize` of SmolLM2 Q8_0 to `ty` against llama.cpp's side in
/// `fixtures/quantize/smollm2-TY.json`: the summary has `lines`, the
/// file's SHA-256 is llama-quantize's, our greedy ids on it are llama.cpp's
/// up to its first near-tie, and our logits of the prompt's last position
/// are within [`TOP_LOGIT_TOLERANCE`] of llama.cpp's on its largest 32.
fn check_smollm2(ty: &str, lines: &[&str]) {
    let source = SMOLLM2_Q8_0.path().unwrap_or_else(|err| panic!("{err}"));
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(&format!("quantize/smollm2-{ty}.json"))).unwrap(),
    )
    .unwrap();
    let dir = scratch(&format!("smollm2-{ty}"));
    let ours = dir.join(format!("ours-{ty}.gguf"));
    let run = quantize(&source, &ours, ty).ok();
    let summary = summary(&run.stdout);
    for line in lines {
        assert!(summary.iter().any(|l| l == line), "{line}\n{summary:#?}");
    }
    let digest = Sha256::digest(std::fs::read(&ours).unwrap());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        reference[format!("{ty}_sha256")],
        "the {ty} file differs from llama-quantize's"
    );
    let model = lm::load(&ours).unwrap();
    for case in reference["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let report = Cli::generate(prompt)
            .model(ours.display())
            .n(24)
            .arg("--greedy")
            .arg("--no-timing")
            .json();
        let prompt_ids = ids(&case["prompt_ids"]);
        assert_eq!(ids(&report["prompt_ids"]), prompt_ids, "{prompt:?}");
        let got = ids(&report["ids"]);
        let expected = ids(&case["ids"]);
        let gaps: Vec<f64> = case["gaps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        // Up to llama.cpp's first near-tie the ids must agree (its own
        // batched and one-by-one Q4_0 logits differ by up to ~0.1 on
        // SmolLM2's flat steps).
        let firm = gaps.iter().take_while(|&&gap| gap >= NEAR_TIE).count();
        assert_eq!(
            got[..firm],
            expected[..firm],
            "{prompt:?}: {got:?}\n{expected:?}"
        );
        let top = case["top_logits"].as_array().unwrap();
        let logits = last_logits(&model, &prompt_ids);
        let largest = top
            .iter()
            .map(|pair| {
                let id = pair[0].as_u64().unwrap() as usize;
                (f64::from(logits[id]) - pair[1].as_f64().unwrap()).abs()
            })
            .fold(0.0, f64::max);
        assert!(
            largest < TOP_LOGIT_TOLERANCE,
            "{ty} {prompt:?}: a top logit {largest} from llama.cpp's"
        );
        eprintln!(
            "{ty} {prompt:?}: llama.cpp's 32 largest last-position logits within {largest:.4} of ours"
        );
    }
}

/// `quantize DIR` writes the tokenizer keys llama.cpp needs: llama.cpp
/// loads the Q8_0 file made from SmolLM2's F32 Hugging Face directory,
/// tokenizes the prompts as we do, and its last-row logits are within the
/// conformance tolerances of ours on the same file (every logit within
/// 1.0, KL below 1e-2, the same argmax where its top two are 0.3 apart).
/// llama.cpp's side was measured once on this very file, whose SHA-256 the
/// fixture names (`fixtures/quantize/smollm2-hf-q8_0.json`, written by
/// scripts/reference/quantize_hf_reference.py), so the test needs no
/// llama-cpp-python.
#[test]
#[ignore = "needs SmolLM2 as HF directories: cargo xtask fetch-model smollm2-hf"]
fn quantize_dir_output_runs_in_llama_cpp() {
    let models = lm_model::catalog::models_dir().unwrap();
    let source = models.join("SmolLM2-135M-Instruct-hf-f32");
    assert!(
        source.is_dir(),
        "{} is missing; make it with `cargo xtask fetch-model smollm2-hf`",
        source.display()
    );
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("quantize/smollm2-hf-q8_0.json")).unwrap(),
    )
    .unwrap();
    let dir = scratch("hf-tokenizer");
    let out = dir.join("smollm2-hf-q8_0.gguf");
    quantize(&source, &out, "q8_0").ok();
    let digest = Sha256::digest(std::fs::read(&out).unwrap());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex, reference["q8_0_sha256"],
        "the Q8_0 file is not the one llama.cpp was measured on: rerun \
         scripts/reference/quantize_hf_reference.py on it"
    );
    let model = lm::load(&out).unwrap();
    for case in reference["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = ids(&case["prompt_ids"]);
        assert_eq!(
            model.text.tokenizer.encode(prompt).unwrap(),
            prompt_ids,
            "{prompt:?}"
        );
        let row = std::fs::read(fixture(&format!(
            "quantize/{}",
            case["last_logits"].as_str().unwrap()
        )))
        .unwrap();
        let theirs: Vec<f32> = row
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let ours = last_logits(&model, &prompt_ids);
        let largest = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let kl = kl_divergence(
            &softmax(&theirs, 1.0).unwrap(),
            &softmax(&ours, 1.0).unwrap(),
        )
        .unwrap();
        assert!(
            largest < 1.0 && kl < 1e-2,
            "{prompt:?}: {largest} from llama.cpp, KL {kl}"
        );
        eprintln!(
            "{prompt:?}: {} ids, last row within {largest:.4} of llama.cpp's, KL {kl:.2e}",
            prompt_ids.len()
        );
        let mut sorted = theirs.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if f64::from(sorted[0] - sorted[1]) >= NEAR_TIE {
            assert_eq!(
                argmax(&ours).unwrap(),
                argmax(&theirs).unwrap(),
                "{prompt:?}"
            );
        }
    }
}
