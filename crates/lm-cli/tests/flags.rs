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
