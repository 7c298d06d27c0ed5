//! Ctrl-C during `lm-cli generate` in every output mode, pressed
//! deterministically by the test hook `LM_CLI_TEST_INTERRUPT_AFTER=N` (the
//! same press as the real handler, right after the N-th generated token).
//! An interrupted run must print what it generated in its mode's normal
//! format and exit 130 with one `note: interrupted ...` line. The expected
//! output is an independent run of the same seed that stops on its own
//! after N tokens (`-n N`): the same tokens, only the stop reason differs.
//! Beam search likewise prints its hypotheses so far, the live ones cancelled.
//! `LM_CLI_TEST_INTERRUPT_AFTER=prefill:N` presses it after the N-th chunk of
//! a long prompt: the run stops there, before any token.
//! (`hostile_inputs.rs` sends a real SIGINT to a streaming run.)

use crate::common::{Cli, Run, assert_contains, ids};

/// The test hook's environment variable.
const HOOK: &str = "LM_CLI_TEST_INTERRUPT_AFTER";

/// Runs `cli` with Ctrl-C pressed after `n_tokens` generated tokens.
fn interrupted_after(n_tokens: usize, cli: &Cli) -> Run {
    cli.clone().env(HOOK, n_tokens).run()
}

/// The tokens an interrupted run asks for: far more than it gets.
const MANY: usize = 50;

/// A generate command on the embedded KJV model that runs for
/// `max_new_tokens` tokens (it has no end token); `extra` picks the mode.
/// Sampling runs are seeded; beam search draws nothing and takes no seed.
fn embedded(max_new_tokens: usize, extra: &[&str]) -> Cli {
    let cli = Cli::generate("And God said")
        .arg("--no-end-token")
        .n(max_new_tokens)
        .args(extra);
    if extra.contains(&"--num-beams") {
        cli
    } else {
        cli.seed(42)
    }
}

/// Exit 130 and exactly the one stderr line naming the token count.
fn check_interrupted(run: &Run, n_tokens: usize) {
    assert_eq!(run.code, Some(130), "{}", run.stderr);
    assert_eq!(
        run.stderr,
        format!("note: interrupted after {n_tokens} generated tokens\n")
    );
}

#[test]
fn json_interrupted_after_seven_tokens_reports_them_as_cancelled() {
    let mode = ["--json", "--no-timing"];
    let run = interrupted_after(7, &embedded(MANY, &mode));
    check_interrupted(&run, 7);
    let report = run.json();
    assert_eq!(report["stop_reason"], "cancelled");
    assert!(report.get("stop_token").is_none(), "{report}");
    assert_eq!(ids(&report["ids"]).len(), 7);
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 7);
    let step_sum: f64 = steps.iter().map(|s| s["logprob"].as_f64().unwrap()).sum();
    assert!((report["sequence_logprob"].as_f64().unwrap() - step_sum).abs() < 1e-9);

    // The same seed stopping on its own after seven tokens drew the same ones.
    let reference = embedded(7, &mode).run();
    assert_eq!(reference.code, Some(0), "{}", reference.stderr);
    let reference = reference.json();
    assert_eq!(reference["stop_reason"], "max_new_tokens");
    for field in ["prompt_ids", "ids", "text", "steps", "sequence_logprob"] {
        assert_eq!(report[field], reference[field], "{field}");
    }
    assert_eq!(report["settings"]["max_new_tokens"], 50);
}

#[test]
fn json_timing_of_an_interrupted_run_counts_the_tokens_done() {
    let run = interrupted_after(4, &embedded(MANY, &["--json"]));
    check_interrupted(&run, 4);
    let timing = &run.json()["timing"];
    assert_eq!(timing["prefill_tokens"], 3, "the prompt And God said");
    assert_eq!(timing["decode_tokens"], 3, "the fourth token is never fed");
}

#[test]
fn trace_interrupted_after_five_tokens_prints_their_rows_and_cancelled() {
    let run = interrupted_after(5, &embedded(MANY, &["--trace"]));
    check_interrupted(&run, 5);
    let rows: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(char::is_numeric))
        .collect();
    let steps: Vec<&str> = rows
        .iter()
        .map(|row| row.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(steps, ["1", "2", "3", "4", "5"], "{}", run.stdout);
    let stop = "stop: cancelled after 5 new tokens: the run was interrupted (truncated)";
    assert!(run.stdout.lines().any(|l| l == stop), "{}", run.stdout);

    // Everything but the stop line is the trace of the same five tokens.
    let reference = embedded(5, &["--trace"]).run();
    assert_eq!(reference.code, Some(0), "{}", reference.stderr);
    let without_stop = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with("stop: "))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(without_stop(&run.stdout), without_stop(&reference.stdout));
    assert!(
        reference
            .stdout
            .contains("stop: max_new_tokens after 5 new tokens"),
        "{}",
        reference.stdout
    );
}

#[test]
fn text_interrupted_after_six_tokens_prints_them_streamed_or_not() {
    for mode in ["--stream", "--no-stream"] {
        let run = interrupted_after(6, &embedded(MANY, &[mode]));
        check_interrupted(&run, 6);
        let reference = embedded(6, &[mode]).run();
        assert_eq!(reference.code, Some(0), "{}", reference.stderr);
        assert_eq!(run.stdout, reference.stdout, "{mode}");
        assert!(run.stdout.starts_with("And God said"), "{}", run.stdout);
        assert!(run.stdout.ends_with('\n'), "the text so far ends its line");
    }
}

#[test]
fn json_with_sequences_lists_those_run_the_last_cancelled() {
    // Four tokens each: the interruption's count is over all sequences.
    let args = embedded(4, &["--json", "--no-timing", "--num-return-sequences", "3"]);
    let reference = args.run();
    assert_eq!(reference.code, Some(0), "{}", reference.stderr);
    let reference = reference.json();
    let all = reference["sequences"].as_array().unwrap();
    assert_eq!(all.len(), 3);

    // Six tokens: sequence 1 ran its four, sequence 2 was cut after two.
    let run = interrupted_after(6, &args);
    check_interrupted(&run, 6);
    let report = run.json();
    let sequences = report["sequences"].as_array().unwrap();
    assert_eq!(sequences.len(), 2, "sequence 3 never started");
    assert_eq!(sequences[0], all[0]);
    assert_eq!(sequences[0]["stop_reason"], "max_new_tokens");
    assert_eq!(sequences[1]["stop_reason"], "cancelled");
    let cut = ids(&sequences[1]["ids"]);
    assert_eq!(cut, ids(&all[1]["ids"])[..2]);
    assert_eq!(sequences[1]["steps"].as_array().unwrap().len(), 2);
    assert_eq!(report["ids"], all[0]["ids"], "the first is the best");

    // Four tokens: sequence 1 ended on its own, and no other started.
    let run = interrupted_after(4, &args);
    check_interrupted(&run, 4);
    let report = run.json();
    let sequences = report["sequences"].as_array().unwrap();
    assert_eq!(sequences.len(), 1);
    assert_eq!(sequences[0], all[0]);
}

#[test]
fn beam_search_interrupted_prints_its_hypotheses_so_far() {
    // Ctrl-C after the third step: the beams of a search limited to three
    // tokens, the live ones cancelled instead of stopped by the limit.
    let beams = |max_new_tokens| embedded(max_new_tokens, &["--num-beams", "3", "--json"]);
    let run = interrupted_after(3, &beams(MANY));
    check_interrupted(&run, 3);
    let (got, want) = (run.json(), beams(3).run().json());
    let got_beams = got["beams"].as_array().expect("a beams list");
    let want_beams = want["beams"].as_array().expect("a beams list");
    assert_eq!(got_beams.len(), want_beams.len());
    for (got, want) in got_beams.iter().zip(want_beams) {
        assert_eq!(got["ids"], want["ids"]);
        assert_eq!(got["logprob"], want["logprob"]);
        assert_eq!(got["stop_reason"], "cancelled");
    }
    // The best beam is flattened into the top level (there is no "best").
    assert!(got.get("best").is_none(), "{got}");
    assert_eq!(got["ids"], want["ids"]);
    assert_eq!(ids(&got["ids"]).len(), 3);
    // The trace and the text show the same best hypothesis.
    let trace = interrupted_after(3, &embedded(MANY, &["--num-beams", "3", "--trace"]));
    check_interrupted(&trace, 3);
    assert_contains(&trace.stdout, "stop: cancelled after 3 new tokens");
    let text = interrupted_after(3, &embedded(MANY, &["--num-beams", "3", "--no-stream"]));
    check_interrupted(&text, 3);
    assert_eq!(
        text.stdout,
        embedded(3, &["--num-beams", "3", "--no-stream"])
            .run()
            .stdout
    );
}

#[test]
fn a_test_hook_that_counts_no_token_is_refused() {
    for value in ["0", "seven", ""] {
        let output = Cli::generate("And God said")
            .arg("--json")
            .env(HOOK, value)
            .command()
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{value:?}: {stderr}");
        assert_eq!(
            stderr,
            format!("error: {HOOK} must be a token count of at least 1, got {value:?}\n")
        );
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn ctrl_c_during_a_long_prefill_stops_between_prompt_chunks() {
    // 1,200 prompt tokens are read in chunks of 512, 512 and 176;
    // `prefill:N` presses Ctrl-C after the N-th. The run stops at once:
    // no token is generated after the press.
    let prompt = vec!["And God said"; 400].join(" ");
    let long = |extra: &[&str]| {
        Cli::generate(&prompt)
            .seed(42)
            .arg("--no-end-token")
            .n(5)
            .args(extra)
    };
    for n_chunks in [1, 2, 3] {
        let hook = format!("prefill:{n_chunks}");
        let run = long(&["--json", "--no-timing"]).env(HOOK, &hook).run();
        check_interrupted(&run, 0);
        let report = run.json();
        assert_eq!(report["stop_reason"], "cancelled", "{hook}");
        assert_eq!(ids(&report["prompt_ids"]).len(), 1200);
        assert!(ids(&report["ids"]).is_empty(), "{hook}");
        assert!(report["steps"].as_array().unwrap().is_empty(), "{hook}");
        let text = long(&["--no-stream"]).env(HOOK, &hook).run();
        check_interrupted(&text, 0);
        assert_eq!(text.stdout, format!("{prompt}\n"));
    }
    // There is no fourth chunk: the run goes on to its five tokens.
    let run = long(&["--json", "--no-timing"])
        .env(HOOK, "prefill:4")
        .ok()
        .json();
    assert_eq!(run["stop_reason"], "max_new_tokens");
    assert_eq!(ids(&run["ids"]).len(), 5);
}

#[test]
fn two_ctrl_c_close_together_still_print_what_was_generated() {
    // Regression (issue 33): `timeout -s INT` (which signals the child and
    // then its process group) and an impatient double Ctrl-C send two
    // SIGINTs close together; the second one exited at once, in the middle
    // of writing the report (before the fix, 4 runs of 4 printed a JSON cut
    // short). Now it leaves the run `GRACE` (2 s) to print what it has, then
    // exits 130.
    use std::process::Command;
    use std::time::{Duration, Instant};

    let child = embedded(100_000_000, &["--json", "--top-logprobs", "5"]).spawn();
    std::thread::sleep(Duration::from_millis(500));
    let kill = || {
        let status = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    kill();
    std::thread::sleep(Duration::from_millis(10));
    kill();
    let started = Instant::now();
    let output = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not one whole JSON report ({e}): {stderr}"));
    assert_eq!(report["stop_reason"], "cancelled");
    let n_tokens = ids(&report["ids"]).len();
    assert_eq!(report["steps"].as_array().unwrap().len(), n_tokens);
    assert_eq!(
        stderr.trim_end(),
        format!("note: interrupted after {n_tokens} generated tokens")
    );
}
