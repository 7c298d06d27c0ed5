//! The flags llama.cpp and HF users look for (issue 17): the prompt from a
//! file or stdin, the penalties and logit bias the library has, and the
//! llama.cpp spellings of existing flags.

use crate::common::{Cli, PROMPT, ids};

/// `generate` on the toy decoder, greedy, three tokens, JSON without timing,
/// with the prompt given by `prompt_args`.
fn toy_greedy_json(prompt_args: &[&str]) -> Cli {
    Cli::new("generate")
        .model("toy")
        .args(prompt_args)
        .n(3)
        .args(["--greedy", "--json", "--no-timing"])
}

#[test]
fn the_prompt_comes_from_a_file_stdin_or_a_dash() {
    let expected = toy_greedy_json(&["--prompt", PROMPT]).ok().stdout;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, format!("{PROMPT}\n")).unwrap();
    let file = file.display().to_string();
    for flag in ["-f", "--file"] {
        let run = toy_greedy_json(&[flag, &file]).ok();
        assert_eq!(run.stdout, expected, "{flag} FILE");
    }
    let piped = [toy_greedy_json(&["--prompt", "-"]), toy_greedy_json(&[])];
    for cli in piped {
        let run = cli.run_with_stdin(&format!("{PROMPT}\n"));
        assert_eq!(run.code, Some(0), "lm-cli {}: {}", cli.line(), run.stderr);
        assert_eq!(run.stdout, expected, "lm-cli {} < prompt", cli.line());
    }
    // An empty pipe is no prompt: a usage error, nothing printed.
    let run = toy_greedy_json(&[]).run_with_stdin("");
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.starts_with("error: no prompt"), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}

#[test]
fn llama_cpp_spellings_give_the_same_run() {
    let run = |args: &[&str]| {
        Cli::toy("generate")
            .args(args)
            .args(["--json", "--no-timing"])
            .ok()
            .stdout
    };
    let long = run(&[
        "--temperature",
        "0",
        "--max-new-tokens",
        "3",
        "--repetition-penalty",
        "1.5",
        "--no-end-token",
        "--top-logprobs",
        "2",
        "--context-length",
        "5",
    ]);
    let llama = [
        "--temp",
        "0",
        "--n-predict",
        "3",
        "--repeat-penalty",
        "1.5",
        "--ignore-eos",
        "--n-probs",
        "2",
    ];
    for context in ["--ctx-size", "-c"] {
        let spelled = run(&[&llama[..], &[context, "5"]].concat());
        assert_eq!(long, spelled, "{context}");
    }
    let report: serde_json::Value = serde_json::from_str(&long).unwrap();
    assert_eq!(report["settings"]["context_length"], 5);
    assert_eq!(report["settings"]["repetition_penalty"], 1.5);
}

#[test]
fn score_takes_c_as_the_context_size_not_the_continuation() {
    let run = Cli::new("score")
        .model("toy")
        .opt("--prompt", PROMPT)
        .opt("-c", "dog")
        .run();
    run.assert_usage_error("--context-length");
}

/// The greedy toy run of `PROMPT` with `extra` flags, as JSON.
fn toy_greedy_with(extra: &[&str]) -> serde_json::Value {
    Cli::toy("generate")
        .n(4)
        .args(["--greedy", "--no-end-token"])
        .args(extra)
        .json()
}

#[test]
fn a_logit_bias_of_minus_inf_bans_a_token_by_id_or_text() {
    let plain = ids(&toy_greedy_with(&[])["ids"]);
    let favourite = plain[0];
    for token in [
        favourite.to_string(),
        lm_model::Toy::word(favourite).unwrap().to_owned(),
    ] {
        let report = toy_greedy_with(&["--logit-bias", &format!("{token}=-inf")]);
        let chosen = ids(&report["ids"]);
        assert!(
            !chosen.contains(&favourite),
            "{token}=-inf chose {chosen:?}"
        );
        assert_eq!(ids(&report["settings"]["banned_tokens"]), vec![favourite]);
    }
    // A finite bias moves the logit by that much: +50 makes `<start>` (id 0)
    // the greedy choice at every step.
    let report = toy_greedy_with(&["--logit-bias", "0=50"]);
    assert_eq!(ids(&report["ids"]), vec![0; 4]);
    assert_eq!(
        report["settings"]["logit_bias"],
        serde_json::json!([[0, 50.0]])
    );
}

#[test]
fn presence_and_frequency_penalties_reach_the_sampler() {
    let plain = ids(&toy_greedy_with(&[])["ids"]);
    // The toy decoder repeats its greedy choice; a large penalty on every
    // token already in the text makes each step choose a new one.
    assert!(plain.windows(2).any(|w| w[0] == w[1]), "{plain:?}");
    for flag in ["--presence-penalty", "--frequency-penalty"] {
        let report = toy_greedy_with(&[flag, "100"]);
        let chosen = ids(&report["ids"]);
        let prompt = ids(&report["prompt_ids"]);
        for (i, id) in chosen.iter().enumerate() {
            let earlier = [&prompt[..], &chosen[..i]].concat();
            assert!(!earlier.contains(id), "{flag}: {chosen:?} repeats {id}");
        }
        let key = flag.trim_start_matches("--").replace('-', "_");
        assert_eq!(report["settings"][key.as_str()], 100.0, "{flag}");
    }
}

#[test]
fn repeat_last_n_limits_the_penalties_to_the_last_tokens() {
    let penalised = |extra: &[&str]| {
        let report = toy_greedy_with(&[&["--presence-penalty", "100"], extra].concat());
        (
            ids(&report["ids"]),
            report["settings"]["penalty_last_n"].clone(),
        )
    };
    let (whole, window) = penalised(&[]);
    assert_eq!(window, serde_json::Value::Null);
    assert_eq!(penalised(&["--repeat-last-n", "-1"]).0, whole);
    // A window of one token: only the token just before is penalised, so
    // each step differs from the last and may repeat the one before it.
    let (last_one, window) = penalised(&["--repeat-last-n", "1"]);
    assert_eq!(window, 1);
    assert!(last_one.windows(2).all(|w| w[0] != w[1]), "{last_one:?}");
    assert!(last_one.windows(3).any(|w| w[0] == w[2]), "{last_one:?}");
    assert_ne!(last_one, whole);
    // A window of none: no penalty, the plain run.
    assert_eq!(
        penalised(&["--repeat-last-n", "0"]).0,
        ids(&toy_greedy_with(&[])["ids"])
    );
    let run = Cli::toy("generate").opt("--repeat-last-n", "-2").run();
    run.assert_usage_error("--repeat-last-n");
}

#[test]
fn min_new_tokens_holds_back_the_end_tokens() {
    let run = |extra: &[&str]| {
        Cli::toy("generate")
            .n(6)
            .args(["--greedy", "--end-token", "slept"])
            .args(extra)
            .json()
    };
    // "slept" (id 5) is the toy's greedy choice: as an end token it ends the
    // run at once.
    let plain = run(&[]);
    assert_eq!(ids(&plain["ids"]), vec![5]);
    let held = run(&["--min-new-tokens", "3"]);
    let chosen = ids(&held["ids"]);
    assert!(chosen.len() > 3, "{chosen:?}");
    assert!(!chosen[..3].contains(&5), "{chosen:?}");
    assert_eq!(held["settings"]["min_new_tokens"], 3);
    // The trace keeps the model's probability of each token.
    let steps = held["best"]["steps"]
        .as_array()
        .or(held["steps"].as_array());
    assert!(steps.is_some_and(|steps| steps.len() == chosen.len()));
}

/// Each sampling flag of issue 38 with a value out of its range: a usage
/// error (exit 2) naming the flag and, in lm-decode's words, the setting.
#[test]
fn out_of_range_sampler_settings_are_usage_errors_naming_the_flag() {
    let cases: [(&str, &str, &str); 15] = [
        (
            "--dry-multiplier",
            "-1",
            "dry_multiplier must be finite and at least 0",
        ),
        (
            "--dry-base",
            "0.5",
            "dry_base must be finite and at least 1",
        ),
        ("--dry-allowed-length", "-1", "'-1' is not a number"),
        (
            "--dry-penalty-last-n",
            "-2",
            "dry_penalty_last_n must be -1",
        ),
        (
            "--dry-sequence-breaker",
            "",
            "DRY sequence breaker 0 is empty",
        ),
        ("--no-repeat-ngram-size", "-1", "'-1' is not a number"),
        (
            "--dynatemp-range",
            "-0.5",
            "dynatemp_range must be finite and at least 0",
        ),
        (
            "--dynatemp-exp",
            "-1",
            "dynatemp_exponent must be finite and at least 0",
        ),
        ("--mirostat", "3", "mirostat must be 0, 1 or 2, got 3"),
        (
            "--mirostat-lr",
            "-0.1",
            "mirostat_eta must be finite and at least 0",
        ),
        (
            "--mirostat-ent",
            "nan",
            "mirostat_tau must be finite and at least 0",
        ),
        (
            "--epsilon-cutoff",
            "1",
            "epsilon_cutoff must be in (0, 1), got 1",
        ),
        (
            "--eta-cutoff",
            "-0.5",
            "eta_cutoff must be in (0, 1), got -0.5",
        ),
        (
            "--samplers",
            "top_k;tail_free",
            "unknown sampler \"tail_free\"",
        ),
        (
            "--samplers",
            "top_k;top-k",
            "sampler \"top-k\" is named twice",
        ),
    ];
    let filter_flags = [
        "--dynatemp-range",
        "--dynatemp-exp",
        "--mirostat",
        "--mirostat-lr",
        "--mirostat-ent",
        "--epsilon-cutoff",
        "--eta-cutoff",
        "--samplers",
    ];
    for (flag, value, message) in cases {
        let mut commands = vec![Cli::toy("generate"), Cli::new("chat").model("toy")];
        if filter_flags.contains(&flag) {
            commands.push(Cli::new("probs").opt("--logits", "2,1,0"));
        }
        for cli in commands {
            let run = cli.opt(flag, value).run();
            run.assert_usage_error(&format!("invalid value '{value}' for '{flag} <"));
            run.assert_usage_error(message);
            assert!(run.stdout.is_empty(), "{flag} {value}: {}", run.stdout);
        }
    }
    // The aliases are the same flags.
    for (alias, flag) in [
        ("--mirostat-eta", "--mirostat-lr"),
        ("--mirostat-tau", "--mirostat-ent"),
    ] {
        let run = Cli::toy("generate").opt(alias, "-1").run();
        run.assert_usage_error(&format!("invalid value '-1' for '{flag} <"));
    }
    // A raw-logit stage named after a filter is refused too.
    let run = Cli::toy("generate").opt("--samplers", "top_k,dry").run();
    run.assert_usage_error("\"dry\" runs on the raw logits: name it before \"top_k\"");
}

/// The new settings reach the `--json` settings under lm-decode's names;
/// their off values (llama.cpp's and HF's defaults) set nothing.
#[test]
fn the_new_sampler_flags_reach_the_settings() {
    let settings = |extra: &[&str]| toy_greedy_with(extra)["settings"].clone();
    let on = settings(&[
        "--dry-multiplier",
        "0.8",
        "--dry-base",
        "2",
        "--dry-allowed-length",
        "3",
        "--dry-penalty-last-n",
        "16",
        "--no-repeat-ngram-size",
        "3",
        "--dynatemp-range",
        "0.5",
        "--dynatemp-exp",
        "1.5",
        "--epsilon-cutoff",
        "0.0003",
        "--eta-cutoff",
        "0.002",
        "--mirostat",
        "2",
        "--mirostat-lr",
        "0.2",
        "--mirostat-ent",
        "4",
        "--samplers",
        "penalties;dry;top_k;temperature",
    ]);
    let expected = serde_json::json!({
        "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3,
        "dry_penalty_last_n": 16, "no_repeat_ngram_size": 3, "dynatemp_range": 0.5,
        "dynatemp_exponent": 1.5, "epsilon_cutoff": 0.0003, "eta_cutoff": 0.002,
        "mirostat": 2, "mirostat_eta": 0.2, "mirostat_tau": 4.0,
        "order": ["penalties", "dry", "top_k", "temperature"],
    });
    for (key, value) in expected.as_object().unwrap() {
        let got = &on[key.as_str()];
        match value.as_f64() {
            Some(v) => assert!((got.as_f64().unwrap() - v).abs() < 1e-6, "{key}: {got}"),
            None => assert_eq!(got, value, "{key}"),
        }
    }
    let off = settings(&[
        "--dry-multiplier",
        "0",
        "--no-repeat-ngram-size",
        "0",
        "--dynatemp-range",
        "0",
        "--epsilon-cutoff",
        "0",
        "--eta-cutoff",
        "0",
        "--mirostat",
        "0",
    ]);
    assert_eq!(off, settings(&[]));
}

/// `--dry-sequence-breaker`, as llama.cpp reads it: the first one replaces
/// the default list, later ones add to it, and `none` empties it.
#[test]
fn dry_sequence_breakers_replace_the_defaults_and_none_clears_them() {
    let breakers = |extra: &[&str]| {
        let dry = [&["--dry-multiplier", "0.8"], extra].concat();
        toy_greedy_with(&dry)["settings"]["dry_sequence_breakers"].clone()
    };
    // None given: the default list (not written, lm-decode's default).
    assert_eq!(breakers(&[]), serde_json::Value::Null);
    let flag = "--dry-sequence-breaker";
    assert_eq!(
        breakers(&[flag, "cat", flag, "the"]),
        serde_json::json!(["cat", "the"])
    );
    assert_eq!(breakers(&[flag, "none"]), serde_json::json!([]));
    assert_eq!(
        breakers(&[flag, "cat", flag, "none", flag, "dog"]),
        serde_json::json!(["dog"])
    );
}
