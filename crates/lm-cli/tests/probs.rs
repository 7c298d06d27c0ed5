//! `lm-cli probs`: the policy distribution for typed logits, against the
//! lesson's worked numbers and softmax computed here.

use crate::common::{Cli, check, floats};

fn probs(args: &[&str]) -> Vec<f64> {
    floats(&Cli::new("probs").args(args).json()["probs"])
}

/// softmax(z / t) computed independently.
fn softmax(logits: &[f64], t: f64) -> Vec<f64> {
    let exps: Vec<f64> = logits.iter().map(|z| (z / t).exp()).collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

fn check_probs(args: &[&str], expected: &[f64]) {
    let got = probs(args);
    assert_eq!(got.len(), expected.len(), "{args:?}");
    for (g, e) in got.iter().zip(expected) {
        assert!(
            (g - e).abs() < 1e-6,
            "{args:?}: got {got:?}, expected {expected:?}"
        );
    }
}

#[test]
fn lesson_000_temperature_table() {
    let rounded: Vec<String> = probs(&["--logits", "2,1,0", "--temperature", "0.5"])
        .iter()
        .map(|p| format!("{p:.3}"))
        .collect();
    assert_eq!(rounded, ["0.867", "0.117", "0.016"]);
    for t in [0.5, 1.0, 2.0] {
        check_probs(
            &["--logits", "2,1,0", "--temperature", &t.to_string()],
            &softmax(&[2.0, 1.0, 0.0], t),
        );
    }
}

#[test]
fn probabilities_keep_the_input_order() {
    check_probs(&["--logits", "0,1,2"], &softmax(&[0.0, 1.0, 2.0], 1.0));
    check_probs(
        &["--logits", "-1,3,1,1"],
        &softmax(&[-1.0, 3.0, 1.0, 1.0], 1.0),
    );
}

#[test]
fn temperature_zero_is_one_hot_at_the_argmax() {
    check_probs(
        &["--logits", "1,3,2", "--temperature", "0"],
        &[0.0, 1.0, 0.0],
    );
}

#[test]
fn filters_renormalise_what_they_keep() {
    // top-k 2 keeps 2 and 1: renormalised softmax of those two.
    let kept = softmax(&[2.0, 1.0], 1.0);
    check_probs(
        &["--logits", "2,1,0", "--top-k", "2"],
        &[kept[0], kept[1], 0.0],
    );
    // top-p 0.7: 0.665 < 0.7, so the second token is needed too.
    check_probs(
        &["--logits", "2,1,0", "--top-p", "0.7"],
        &[kept[0], kept[1], 0.0],
    );
    check_probs(&["--logits", "2,1,0", "--top-p", "0.6"], &[1.0, 0.0, 0.0]);
    // min-p 0.2: token 2 has e^-2 = 0.135 of the best's probability.
    check_probs(
        &["--logits", "2,1,0", "--min-p", "0.2"],
        &[kept[0], kept[1], 0.0],
    );
    // -inf masks a token.
    check_probs(&["--logits", "1,-inf,1"], &[0.5, 0.0, 0.5]);
}

#[test]
fn text_output_lists_every_token() {
    let lesson = Cli::new("probs")
        .opt("--logits", "2,1,0")
        .opt("--temperature", 0.5);
    let run = check("probs_lesson_000_text", &lesson);
    assert!(run.stdout.contains("0.8668"), "{}", run.stdout);
    // The chain in the flags' words, not Rust's `Debug` of the sampler.
    assert!(
        run.stdout.starts_with("policy: temperature 0.5 > sample\n"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains('{'), "{}", run.stdout);
}

#[test]
fn json_output_lists_logits_probabilities_and_the_policy() {
    let filtered = Cli::new("probs")
        .opt("--logits", "2,1,0,-inf")
        .opt("--temperature", 0.5)
        .opt("--top-k", 2)
        .arg("--json");
    let report = check("probs_top_k_json", &filtered).json();
    assert_eq!(floats(&report["probs"]).len(), 4);
}

#[test]
fn the_policy_line_names_every_stage_in_the_chains_order() {
    let report = Cli::new("probs")
        .opt("--logits", "2,1,0")
        .opt("--min-p", 0.05)
        .opt("--xtc-probability", 0.5)
        .opt("--top-p", 0.95)
        .opt("--typical", 0.9)
        .opt("--top-k", 3)
        .opt("--top-nsigma", 1.5)
        .opt("--min-keep", 2)
        .json();
    assert_eq!(
        report["policy"],
        "temperature 1 > top-nsigma 1.5 > top-k 3 > typical 0.9 > top-p 0.95 > min-p 0.05 \
         > xtc 0.5 threshold 0.1 > sample, min-keep 2"
    );
    // Off values set no stage: top-n-sigma 0 or less, XTC at probability 0.
    let off = Cli::new("probs")
        .opt("--logits", "2,1,0")
        .opt("--top-nsigma", -1)
        .opt("--xtc-probability", 0)
        .opt("--xtc-threshold", 0.3)
        .json();
    assert_eq!(off["policy"], "temperature 1 > sample");
}

#[test]
fn typical_keeps_the_tokens_closest_to_the_entropy() {
    // q = softmax(2, 1, 0) = (0.665, 0.245, 0.090), H = 0.832; the
    // surprises -ln q = (0.408, 1.408, 2.408) are 0.424, 0.576 and 1.576
    // from H, so the order is 0, 1, 2. Mass 0.665 exceeds 0.6 alone; 0.7
    // needs token 1 too.
    let q = softmax(&[2.0, 1.0, 0.0], 1.0);
    let entropy: f64 = -q.iter().map(|p| p * p.ln()).sum::<f64>();
    assert!((entropy - 0.832).abs() < 1e-3, "{entropy}");
    check_probs(&["--logits", "2,1,0", "--typical", "0.6"], &[1.0, 0.0, 0.0]);
    let kept = softmax(&[2.0, 1.0], 1.0);
    check_probs(
        &["--logits", "2,1,0", "--typical", "0.7"],
        &[kept[0], kept[1], 0.0],
    );
}
