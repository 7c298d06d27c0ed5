//! Every kernel path this CPU runs (`LM_KERNEL`: portable, avx2, avxvnni,
//! avx512) gives a real model the same numbers, bit for bit: the same
//! prompt ids, greedy ids and per-step log-probabilities from `generate
//! --json`. lm-model's dot products perform the same f32 operations in the
//! same order on every path, and so does attention, so nothing in a
//! forward pass depends on the machine; the kernel tests check each
//! product alone, this checks them composed (a batched prefill, then decode
//! steps) on the weight types of the real files: Q4_1 and Q8_0 (SmolLM2),
//! and Q5_0, Q8_0, Q4_K and Q6_K (Gemma 3 Q4_K_M). Ignored until the models
//! are fetched; with `--include-ignored` and no model each test fails
//! naming the fetch command.

use lm_model::Kernel;
use lm_model::catalog::{GEMMA3_270M, KnownModel, SMOLLM2};
use serde_json::Value;

use crate::common::Cli;

/// A prompt of a few dozen tokens, so prefill runs the batched kernels.
const PROMPT: &str = "The history of computing begins with the abacus, the slide rule and \
                      the mechanical calculators of Pascal and Leibniz, and then";

/// `generate --greedy -n 8 --json` on `model` with each kernel this CPU
/// runs; the reports (timing removed) of every path equal the portable
/// path's.
fn check_every_path_agrees(model: &KnownModel) {
    let path = model.path().unwrap_or_else(|err| panic!("{err}"));
    let kernels = Kernel::available();
    assert!(kernels.contains(&Kernel::Portable), "{kernels:?}");
    let reports: Vec<(Kernel, Value)> = kernels
        .iter()
        .map(|&kernel| {
            let mut report = Cli::new("generate")
                .model(path.display())
                .opt("--prompt", PROMPT)
                .arg("--greedy")
                .n(8)
                .env("LM_KERNEL", kernel.name())
                .json();
            report
                .as_object_mut()
                .expect("a JSON object")
                .remove("timing");
            (kernel, report)
        })
        .collect();
    let (_, portable) = &reports[0];
    assert!(
        portable["steps"].as_array().is_some_and(|s| s.len() == 8),
        "{portable}"
    );
    for (kernel, report) in &reports[1..] {
        assert_eq!(
            report, portable,
            "{}: the {kernel} path's report differs from the portable path's",
            model.name
        );
    }
    eprintln!(
        "{}: {} paths agree bit for bit ({kernels:?}), sequence log-prob {}",
        model.name,
        reports.len(),
        portable["sequence_logprob"]
    );
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
