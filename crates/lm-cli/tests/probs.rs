//! `lm-cli probs`: the policy distribution for typed logits, against the
//! lesson's worked numbers and softmax computed here.

mod common;

use common::{floats, json, lm_cli};

fn probs(args: &[&str]) -> Vec<f64> {
    let mut all = vec!["probs", "--json"];
    all.extend_from_slice(args);
    floats(&json(&all)["probs"])
}

/// softmax(z / t) computed independently.
fn softmax(logits: &[f64], t: f64) -> Vec<f64> {
    let exps: Vec<f64> = logits.iter().map(|z| (z / t).exp()).collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

fn check(args: &[&str], expected: &[f64]) {
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
        check(
            &["--logits", "2,1,0", "--temperature", &t.to_string()],
            &softmax(&[2.0, 1.0, 0.0], t),
        );
    }
}

#[test]
fn probabilities_keep_the_input_order() {
    check(&["--logits", "0,1,2"], &softmax(&[0.0, 1.0, 2.0], 1.0));
    check(
        &["--logits", "-1,3,1,1"],
        &softmax(&[-1.0, 3.0, 1.0, 1.0], 1.0),
    );
}

#[test]
fn temperature_zero_is_one_hot_at_the_argmax() {
    check(
        &["--logits", "1,3,2", "--temperature", "0"],
        &[0.0, 1.0, 0.0],
    );
}

#[test]
fn filters_renormalise_what_they_keep() {
    // top-k 2 keeps 2 and 1: renormalised softmax of those two.
    let kept = softmax(&[2.0, 1.0], 1.0);
    check(
        &["--logits", "2,1,0", "--top-k", "2"],
        &[kept[0], kept[1], 0.0],
    );
    // top-p 0.7: 0.665 < 0.7, so the second token is needed too.
    check(
        &["--logits", "2,1,0", "--top-p", "0.7"],
        &[kept[0], kept[1], 0.0],
    );
    check(&["--logits", "2,1,0", "--top-p", "0.6"], &[1.0, 0.0, 0.0]);
    // min-p 0.2: token 2 has e^-2 = 0.135 of the best's probability.
    check(
        &["--logits", "2,1,0", "--min-p", "0.2"],
        &[kept[0], kept[1], 0.0],
    );
    // -inf masks a token.
    check(&["--logits", "1,-inf,1"], &[0.5, 0.0, 0.5]);
}

#[test]
fn text_output_lists_every_token() {
    let run = lm_cli(&["probs", "--logits", "2,1,0", "--temperature", "0.5"]);
    assert_eq!(run.code, Some(0));
    assert!(run.stdout.contains("0.8668"), "{}", run.stdout);
    assert!(run.stdout.contains("Temperature(0.5)"), "{}", run.stdout);
}
