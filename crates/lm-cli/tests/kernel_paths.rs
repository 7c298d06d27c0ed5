//! Every kernel path this CPU runs (`LM_KERNEL`: portable, avx2, avxvnni,
//! avx512) gives a real model the same numbers, bit for bit: the same
//! prompt ids, greedy ids and per-step log-probabilities from `generate
//! --json`. lm-model's row-major dot products perform the same f32
//! operations in the same order on every path, and so does attention, so
//! nothing in a forward pass depends on the machine; the kernel tests check
//! each product alone, this checks them composed (a batched prefill, then
//! decode steps) on the weight types of the real files: Q4_1 and Q8_0
//! (SmolLM2), and Q5_0, Q8_0, Q4_K and Q6_K (Gemma 3 Q4_K_M). Weights packed
//! in panels (the default on the SIMD paths, `lm_model::Packing`) sum in
//! another order, the same on every SIMD path: so the paths agree with
//! `LM_PACK=0` (all row-major) and, with `LM_PACK=1`, the SIMD paths that
//! pack the same types (`Kernel::packs_under`) agree with each other. Ignored until the models are fetched; with
//! `--include-ignored` and no model each test fails naming the fetch
//! command.

use lm_model::catalog::{GEMMA3_270M, KnownModel, SMOLLM2};
use lm_model::{GgufFile, Kernel, Packing, SUPPORTED_TYPES};
use serde_json::Value;

use crate::common::Cli;

/// A prompt of a few dozen tokens, so prefill runs the batched kernels.
const PROMPT: &str = "The history of computing begins with the abacus, the slide rule and \
                      the mechanical calculators of Pascal and Leibniz, and then";

/// `generate --greedy -n 8 --json` on `model` with each kernel this CPU
/// runs, all weights row-major (`LM_PACK=0`): every path's report (timing
/// removed) equals the portable path's; then with the default packing:
/// every SIMD path's equals the first's.
fn check_every_path_agrees(model: &KnownModel) {
    let path = model.path().unwrap_or_else(|err| panic!("{err}"));
    let kernels = Kernel::available();
    assert!(kernels.contains(&Kernel::Portable), "{kernels:?}");
    let report = |kernel: Kernel, pack: &str| {
        let mut report = Cli::new("generate")
            .model(path.display())
            .opt("--prompt", PROMPT)
            .arg("--greedy")
            .n(8)
            .env("LM_KERNEL", kernel.name())
            .env("LM_PACK", pack)
            .json();
        report
            .as_object_mut()
            .expect("a JSON object")
            .remove("timing");
        (kernel, report)
    };
    let row_major: Vec<(Kernel, Value)> = kernels.iter().map(|&k| report(k, "0")).collect();
    // The SIMD paths that pack the same of the file's types as the fastest.
    let file = GgufFile::map(&path).unwrap();
    let packed_types = |k: Kernel| {
        SUPPORTED_TYPES
            .into_iter()
            .filter(|&ty| k.packs_under(Packing::Blocks, ty))
            .filter(|&ty| file.tensors().iter().any(|t| t.ggml_type == ty))
            .collect::<Vec<_>>()
    };
    let fastest = *kernels.last().expect("at least the portable kernel");
    let packed: Vec<(Kernel, Value)> = kernels
        .iter()
        .filter(|&&k| k.has_panel_kernel() && packed_types(k) == packed_types(fastest))
        .map(|&k| report(k, "1"))
        .collect();
    for (what, reports) in [("row-major", &row_major), ("packed", &packed)] {
        let Some(((first_kernel, first), rest)) = reports.split_first() else {
            continue;
        };
        assert!(
            first["steps"].as_array().is_some_and(|s| s.len() == 8),
            "{first}"
        );
        for (kernel, report) in rest {
            assert_eq!(
                report, first,
                "{}, {what}: the {kernel} path's report differs from the {first_kernel} path's",
                model.name
            );
        }
        eprintln!(
            "{}, {what}: {} path(s) agree bit for bit, sequence log-prob {}",
            model.name,
            reports.len(),
            first["sequence_logprob"]
        );
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_q4_1_is_the_same_on_every_kernel_path() {
    check_every_path_agrees(&SMOLLM2);
}

#[test]
#[ignore = "needs Gemma 3: cargo xtask fetch-model gemma3-270m"]
fn gemma3_q4_k_m_is_the_same_on_every_kernel_path() {
    check_every_path_agrees(&GEMMA3_270M);
}
