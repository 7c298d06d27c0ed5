//! `lm-cli quantize` against llama.cpp's `llama_model_quantize`: the same
//! file byte for byte (fixtures/quantize/, Q8_0 to Q6_K and the K mixes, written by
//! scripts/reference/quantize_reference.py, and SmolLM2 Q8_0 requantized to
//! Q4_0 by llama.cpp during the test), llama.cpp's greedy ids on our Q4_0
//! file equal to ours, and the output file protected on every error.
//!
//! The SmolLM2 test needs the model (`cargo xtask fetch-model smollm2-q8_0`) and
//! the reference Python with llama-cpp-python 0.3.36 (`cargo xtask
//! reference-fixtures` builds `<target>/reference-venv`; or set
//! `LM_REFERENCE_PYTHON`); without them it fails saying so.

use std::path::{Path, PathBuf};
use std::process::Command;

use lm_model::catalog::SMOLLM2_Q8_0;
use serde_json::Value;

use crate::common::{Cli, fixture, ids};

/// A logit gap below which two tokens are a near-tie.
const NEAR_TIE: f64 = 0.3;

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

/// Every type's file equals llama-quantize's byte for byte: metadata (order
/// included), tensor order, types (the tied embedding to Q8_0, the output
/// to Q6_K where its rows allow) and blocks.
#[test]
fn fixture_files_equal_llama_quantize_byte_for_byte() {
    let dir = scratch("fixture");
    let input = fixture("quantize/input.f16.gguf");
    for ty in ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"] {
        let out = dir.join(format!("{ty}.gguf"));
        let run = quantize(&input, &out, &ty.to_uppercase()).ok();
        let lines = summary(&run.stdout);
        let embedding = "token_embd.weight 1 x f16 -> q8_0 quantized";
        assert!(lines.iter().any(|l| l == embedding), "{lines:#?}");
        let down = format!("blk.*.ffn_down.weight 1 x f16 -> {ty} quantized");
        assert!(lines.contains(&down), "{lines:#?}");
        let norm =
            "blk.*.ffn_norm.weight 1 x f32 -> f32 copied (not quantized by llama.cpp's rules)";
        assert!(lines.iter().any(|l| l == norm), "{lines:#?}");
        let ours = std::fs::read(&out).unwrap();
        let theirs = std::fs::read(fixture(&format!("quantize/{ty}.gguf"))).unwrap();
        assert!(
            ours == theirs,
            "{ty}: the file differs from llama-quantize's"
        );
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
    ] {
        let out = dir.join(format!("{file}.gguf"));
        let lines = summary(&quantize(&input, &out, ty).ok().stdout);
        assert!(lines.iter().any(|l| l == line), "{lines:#?}");
        let theirs = std::fs::read(fixture(&format!("quantize/{file}.gguf"))).unwrap();
        assert!(
            std::fs::read(&out).unwrap() == theirs,
            "{file}: the file differs"
        );
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
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("is the input"), "{}", run.stderr);
    assert_eq!(std::fs::read(&input).unwrap(), before);

    let out = dir.join("out.gguf");
    std::fs::write(&out, b"keep me").unwrap();
    let not_gguf = dir.join("not.gguf");
    std::fs::write(&not_gguf, b"hello, world").unwrap();
    let run = quantize(&not_gguf, &out, "q4_0").run();
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("not a gguf file"), "{}", run.stderr);
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");

    let run = quantize(&input, &out, "q3_k").run();
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("q3_k"), "{}", run.stderr);
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["in.gguf", "not.gguf", "out.gguf"]);
}

/// The interpreter with llama-cpp-python; panics naming how to get it.
fn reference_python() -> PathBuf {
    if let Some(python) = std::env::var_os("LM_REFERENCE_PYTHON").filter(|v| !v.is_empty()) {
        return PathBuf::from(python);
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target folder")
        .to_owned();
    let python = target.join("reference-venv/bin/python");
    assert!(
        python.exists(),
        "no {}: run `cargo xtask reference-fixtures` (it builds the venv with \
         llama-cpp-python 0.3.36 and gguf 0.19.0), or set LM_REFERENCE_PYTHON",
        python.display()
    );
    python
}

/// llama.cpp's side: quantize argv[1] to Q4_0 as argv[3]; then, on argv[2],
/// feed the prompt ids of argv[4] and our greedy ids of argv[5] one by one
/// (teacher forcing) and give, before each of ours, llama.cpp's argmax and
/// how far below it our token's logit is ("regret", 0 when it is the argmax).
const LLAMA_CPP: &str = r#"
import ctypes, json, sys
import numpy as np
import llama_cpp
src, ours, theirs = sys.argv[1], sys.argv[2], sys.argv[3]
prompt, chosen = json.loads(sys.argv[4]), json.loads(sys.argv[5])
params = llama_cpp.llama_model_quantize_default_params()
params.nthread = 2
params.ftype = 2  # LLAMA_FTYPE_MOSTLY_Q4_0
params.allow_requantize = True
assert llama_cpp.llama_model_quantize(src.encode(), theirs.encode(), ctypes.byref(params)) == 0
llm = llama_cpp.Llama(model_path=ours, n_ctx=256, n_threads=1, n_threads_batch=1,
                      logits_all=True, verbose=False)
llm.eval(prompt)
ids, regrets = [], []
for token in chosen:
    logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    ids.append(int(np.argmax(logits)))
    regrets.append(float(logits.max() - logits[token]))
    llm.eval([token])
print(json.dumps({"ids": ids, "regrets": regrets}))
"#;

/// SmolLM2 Q8_0 to Q4_0: the file equals llama-quantize's, and llama.cpp
/// running it picks our greedy ids (up to its first near-tie).
#[test]
fn smollm2_q4_0_equals_llama_quantize_and_runs_in_llama_cpp() {
    let source = SMOLLM2_Q8_0.path().unwrap_or_else(|err| panic!("{err}"));
    let python = reference_python();
    let dir = scratch("smollm2");
    let ours = dir.join("ours-q4_0.gguf");
    let theirs = dir.join("llama-q4_0.gguf");
    let run = quantize(&source, &ours, "q4_0").ok();
    let lines = summary(&run.stdout);
    let embedding = "token_embd.weight 1 x q8_0 -> q8_0 copied (already the target type)";
    assert!(lines.iter().any(|l| l == embedding), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l == "blk.*.attn_q.weight 30 x q8_0 -> q4_0 quantized"),
        "{lines:#?}"
    );
    for prompt in ["The capital of France is", "def fibonacci(n):"] {
        let report = Cli::generate(prompt)
            .model(ours.display())
            .n(24)
            .arg("--greedy")
            .arg("--no-timing")
            .json();
        let prompt_ids = ids(&report["prompt_ids"]);
        let got = ids(&report["ids"]);
        let output = Command::new(&python)
            .arg("-c")
            .arg(LLAMA_CPP)
            .arg(&source)
            .arg(&ours)
            .arg(&theirs)
            .arg(serde_json::to_string(&prompt_ids).unwrap())
            .arg(serde_json::to_string(&got).unwrap())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let reference: Value = serde_json::from_slice(&output.stdout).unwrap();
        let expected = ids(&reference["ids"]);
        let regrets: Vec<f64> = reference["regrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_f64().unwrap())
            .collect();
        // Each of our tokens is llama.cpp's argmax, or within a near-tie of
        // it (llama.cpp's own batched and one-by-one Q4_0 logits differ by
        // up to ~0.1 on SmolLM2's flat steps).
        for (step, (&regret, (a, b))) in regrets.iter().zip(got.iter().zip(&expected)).enumerate() {
            assert!(
                a == b || regret < NEAR_TIE,
                "{prompt:?} step {step}: ours {a}, llama.cpp {b}, {regret} below it\n{got:?}\n{expected:?}"
            );
        }
        let agree = got.iter().zip(&expected).filter(|(a, b)| a == b).count();
        assert!(
            agree >= got.len() - 2,
            "{prompt:?}: {agree} of {} agree",
            got.len()
        );
        assert!(
            std::fs::read(&ours).unwrap() == std::fs::read(&theirs).unwrap(),
            "the Q4_0 file differs from llama-quantize's"
        );
    }
}
