//! `lm-cli probs`: the policy distribution for typed logits, against the
//! lesson's worked numbers and softmax computed here.

use crate::common::{Cli, assert_contains, check, floats};

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
    assert_contains(&run.stdout, "0.8668");
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

#[test]
fn the_policy_line_follows_the_samplers_order_and_names_the_new_stages() {
    let policy = |args: &[&str]| {
        Cli::new("probs").opt("--logits", "2,1,0").args(args).json()["policy"].clone()
    };
    // llama.cpp's --samplers: exactly the stages named, in that order.
    assert_eq!(
        policy(&[
            "--samplers",
            "top_k;typ_p;top_p;min_p;xtc;temperature",
            "--temperature",
            "0.7",
            "--top-k",
            "3",
            "--typical",
            "0.9",
            "--xtc-probability",
            "0.5",
        ]),
        "top-k 3 > typical 0.9 > xtc 0.5 threshold 0.1 > temperature 0.7 > sample"
    );
    // A stage set but not named does not run; commas separate too.
    assert_eq!(
        policy(&[
            "--samplers",
            "min_p,top_k",
            "--top-k",
            "2",
            "--top-p",
            "0.9"
        ]),
        "top-k 2 > sample"
    );
    // The default order: the cutoffs after XTC, mirostat choosing last,
    // dynamic temperature in temperature's place.
    assert_eq!(
        policy(&[
            "--epsilon-cutoff",
            "0.01",
            "--eta-cutoff",
            "0.02",
            "--min-p",
            "0.05",
            "--mirostat",
            "2",
            "--mirostat-ent",
            "3",
            "--dynatemp-range",
            "0.5",
        ]),
        "temperature 1 dynatemp-range 0.5 dynatemp-exp 1 > min-p 0.05 > epsilon-cutoff 0.01 \
         > eta-cutoff 0.02 > mirostat 2 ent 3 lr 0.1 > sample"
    );
    // Off values set no stage.
    assert_eq!(
        policy(&[
            "--mirostat",
            "0",
            "--epsilon-cutoff",
            "0",
            "--eta-cutoff",
            "0",
            "--dynatemp-range",
            "0",
        ]),
        "temperature 1 > sample"
    );
}

/// q = softmax(2, 1, 0) = (0.665, 0.245, 0.090), entropy H = 0.832 nats.
fn lesson_q() -> (Vec<f64>, f64) {
    let q = softmax(&[2.0, 1.0, 0.0], 1.0);
    let entropy = -q.iter().map(|p| p * p.ln()).sum::<f64>();
    (q, entropy)
}

#[test]
fn epsilon_and_eta_cut_off_the_improbable_tokens() {
    let (q, entropy) = lesson_q();
    let kept = softmax(&[2.0, 1.0], 1.0);
    // Epsilon (HF): tokens below 0.1 go, so token 2 (0.090) does.
    assert!(q[2] < 0.1 && q[1] > 0.1);
    check_probs(
        &["--logits", "2,1,0", "--epsilon-cutoff", "0.1"],
        &[kept[0], kept[1], 0.0],
    );
    // Eta (HF): the cutoff is min(eta, sqrt(eta) exp(-H)).
    let eta: f64 = 0.2;
    let cutoff = eta.min(eta.sqrt() * (-entropy).exp());
    assert!(q[2] < cutoff && cutoff < q[1], "{cutoff}");
    check_probs(
        &["--logits", "2,1,0", "--eta-cutoff", "0.2"],
        &[kept[0], kept[1], 0.0],
    );
}

#[test]
fn dynamic_temperature_follows_the_normalised_entropy() {
    // llama.cpp's temp_ext: T' = (T - r) + 2r (H / ln n)^exp, at most T + r
    // and at least max(0, T - r), on the candidates' entropy at T = 1.
    let (_, entropy) = lesson_q();
    let normalised = entropy / 3f64.ln();
    for (t, r, exponent) in [(1.0, 0.5, 1.0), (0.8, 0.3, 2.0)] {
        let dynamic = (t - r) + 2.0 * r * normalised.powf(exponent);
        check_probs(
            &[
                "--logits",
                "2,1,0",
                "--temperature",
                &t.to_string(),
                "--dynatemp-range",
                &r.to_string(),
                "--dynatemp-exp",
                &exponent.to_string(),
            ],
            &softmax(&[2.0, 1.0, 0.0], dynamic),
        );
    }
}

#[test]
fn mirostat_2_truncates_the_first_step_at_twice_the_target_surprise() {
    // mu starts at 2 tau bits; a token whose surprise -log2 q exceeds mu is
    // out. Surprises: 0.59, 2.03 and 3.47 bits.
    let (q, _) = lesson_q();
    let surprise: Vec<f64> = q.iter().map(|p| -p.log2()).collect();
    assert!(surprise[0] < 2.0 && surprise[1] > 2.0 && surprise[1] < 3.0 && surprise[2] > 3.0);
    check_probs(
        &[
            "--logits",
            "2,1,0",
            "--mirostat",
            "2",
            "--mirostat-ent",
            "1",
        ],
        &[1.0, 0.0, 0.0],
    );
    let kept = softmax(&[2.0, 1.0], 1.0);
    check_probs(
        &[
            "--logits",
            "2,1,0",
            "--mirostat",
            "2",
            "--mirostat-tau",
            "1.5",
        ],
        &[kept[0], kept[1], 0.0],
    );
}
