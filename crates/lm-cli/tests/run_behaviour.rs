//! How a run behaves when its reader, its signals or its flags are hostile
//! (issue 33): a pipe closed early, two Ctrl-C close together, truncation
//! that must leave room for the reply, huge enumeration limits, a context
//! beyond the model's trained length, and the small flags users expect.

use crate::common::{Cli, assert_contains, close_stdout_after, shell, spawn_shell};

#[test]
fn a_closed_pipe_stops_an_unstreamed_text_run_at_its_first_failed_write() {
    // `generate ... | head -c 10` without `--stream`: the text is written a
    // token at a time to a pipe too, so the closed pipe is seen at the next
    // write. Before, the text was held to the end, and a run asked for 100
    // million tokens kept going until the CPU limit (`ulimit -t 10`) killed
    // it (no exit code).
    let child = spawn_shell(
        "ulimit -t 10; exec \"$LM_CLI\" generate --prompt 'And God said' \
         -n 100000000 --no-end-token --seed 0",
    );
    assert_eq!(close_stdout_after(child, 20), b"And God said unto th");
}

#[test]
fn an_unstreamed_text_run_prints_the_bytes_of_a_streamed_one() {
    let run = |mode: &str| {
        Cli::generate("And God said")
            .n(40)
            .seed(3)
            .arg(mode)
            .ok()
            .stdout
    };
    let default = Cli::generate("And God said").n(40).seed(3).ok().stdout;
    assert!(
        default.starts_with("And God said") && default.len() > 40,
        "{default}"
    );
    assert_eq!(run("--stream"), default);
    assert_eq!(run("--no-stream"), default);
}

#[test]
fn keep_head_truncation_leaves_room_for_max_new_tokens() {
    // 13 toy tokens in a context of 10, 4 new tokens asked for: before, the
    // prompt was cut to 9 tokens and `--max-new-tokens 4 clipped to 1`.
    let prompt = "<start> the cat sat the dog slept the cat sat the dog slept";
    let run = Cli::new("generate")
        .model("toy")
        .opt("--prompt", prompt)
        .opt("--context-length", 10)
        .opt("--truncate", "keep-head:1")
        .n(4)
        .args(["--no-end-token", "--greedy", "--json"])
        .ok();
    assert!(!run.stderr.contains("clipped"), "{}", run.stderr);
    assert_contains(&run.stderr, "dropped 7");
    let report = run.json();
    // <start>, then the 5 most recent tokens (the dog slept... : ids 3 1 3 1 5
    // is "sat the dog slept"), then 4 new ones.
    assert_eq!(crate::common::ids(&report["prompt_ids"]).len(), 6);
    assert_eq!(crate::common::ids(&report["prompt_ids"])[0], 0);
    assert_eq!(report["n_prompt_dropped"], 7);
    assert_eq!(crate::common::ids(&report["ids"]).len(), 4);
    assert_eq!(report["stop_reason"], "max_new_tokens");
}

/// `lm-cli enumerate` on the 29-word count model of `fixtures/ngram/tiny.txt`
/// (29^5 = 20,511,149 continuations of 5 words) with `extra` arguments,
/// under a 600 MB address-space limit (`ulimit -v`): holding every
/// continuation would take more than 1 GB.
fn enumerate_tiny_bounded(extra: &str) -> std::process::Output {
    let model = crate::common::count_fixture("ngram/tiny.txt");
    shell(&format!(
        "ulimit -v 600000; ulimit -t 60; exec \"$LM_CLI\" enumerate --model '{model}' \
         --prompt the --steps 5 --limit 10000000000 {extra}"
    ))
    .output()
    .unwrap()
}

#[test]
fn enumerate_holds_only_the_continuations_it_shows() {
    // Regression (issue 33): `--top 5 --limit 10000000000` on SmolLM2
    // aborted with a 77 GB `Vec::with_capacity` and a backtrace; a heap of
    // `--top` is all that is kept.
    let output = enumerate_tiny_bounded("--top 3 --json");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["total"], 20_511_149);
    let ranks: Vec<_> = report["continuations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["rank"].as_u64().unwrap(),
                c["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        ranks,
        [
            (1, "cat sat on the mat".to_owned()),
            (2, "dog sat on the mat".to_owned()),
            (3, "cat sat on the log".to_owned())
        ]
    );
    assert_eq!(report["greedy_rank"], 1);
    assert_eq!(report["greedy_prob"], report["continuations"][0]["prob"]);
    // Asking for all of them is refused with a clear error, not an abort.
    let output = enumerate_tiny_bounded("--top 0");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].ends_with("cannot hold 20511149 continuations in memory"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}

#[test]
fn a_context_length_beyond_the_models_is_a_warning_and_in_the_json() {
    // Regression (issue 33): `-c 100000` on a model trained for 16 tokens
    // was silently clamped to 16.
    let model = crate::common::fixture("hostile/gguf/valid-tiny-llama.gguf");
    let warning = "warning: --context-length 100000 is beyond the model's trained length of 16; the context stays 16";
    let with_context = |context_length: usize| {
        Cli::new("generate")
            .model(model.display())
            .opt("--prompt", "hello")
            .opt("-c", context_length)
            .n(2)
            .seed(1)
            .arg("--json")
            .ok()
    };
    let run = with_context(100_000);
    assert!(run.stderr.lines().any(|l| l == warning), "{}", run.stderr);
    let report = run.json();
    assert_eq!(report["settings"]["context_length"], 16);
    assert_eq!(report["settings"]["context_length_requested"], 100_000);
    // Within the model's length: no warning, no field.
    let run = with_context(8);
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    assert_eq!(run.json()["settings"]["context_length"], 8);
    assert!(
        run.json()["settings"]
            .get("context_length_requested")
            .is_none()
    );
    // score and enumerate warn the same way.
    for cli in [
        Cli::new("score")
            .model(model.display())
            .opt("--prompt", "hello")
            .opt("--continuation", " world"),
        Cli::new("enumerate")
            .model(model.display())
            .opt("--prompt", "hello")
            .opt("--steps", 1),
    ] {
        let run = cli.opt("-c", 100_000).ok();
        assert!(run.stderr.lines().any(|l| l == warning), "{}", run.stderr);
    }
    // chat too: the warning comes from where the bound is applied.
    let chat = crate::common::fixture("hostile/gguf/valid-chat-tiny-llama.gguf");
    let run = Cli::new("chat")
        .model(chat.display())
        .opt("-c", 100_000)
        .n(1)
        .run_with_stdin("hi\n");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let warning = warning.replace("16", "4096");
    assert!(run.stderr.lines().any(|l| l == warning), "{}", run.stderr);
}

#[test]
fn top_k_0_is_off_as_in_llama_cpp_and_hf() {
    // Regression (issue 33): `--top-k 0` was exit 2 "top_k must be at least 1".
    let run = |extra: &[&str]| {
        Cli::toy("generate")
            .n(5)
            .seed(9)
            .args(extra)
            .arg("--json")
            .ok()
            .json()
    };
    let off = run(&["--top-k", "0"]);
    let plain = run(&[]);
    assert_eq!(off["ids"], plain["ids"]);
    assert_eq!(off["settings"]["top_k"], serde_json::Value::Null);
    let probs = |extra: &[&str]| {
        Cli::new("probs")
            .opt("--logits", "2,1,0")
            .args(extra)
            .arg("--json")
            .ok()
            .json()
    };
    assert_eq!(probs(&["--top-k", "0"]), probs(&[]));
    assert_eq!(probs(&["--top-k", "0"])["policy"], "temperature 1 > sample");
    // Beam search refuses a filter it cannot apply, but 0 is no filter.
    Cli::toy("generate")
        .opt("--num-beams", 2)
        .opt("--top-k", 0)
        .n(2)
        .ok();
}

#[test]
fn tokenize_reads_its_text_from_stdin_as_generate_does() {
    // Regression (issue 33): `tokenize` required --text.
    let given = Cli::new("tokenize")
        .opt("--text", "And God said")
        .ok()
        .stdout;
    assert!(given.starts_with("3 tokens\n"), "{given}");
    let piped = Cli::new("tokenize").run_with_stdin("And God said\n");
    assert_eq!(
        (piped.code, piped.stdout.as_str()),
        (Some(0), given.as_str())
    );
    let dash = Cli::new("tokenize")
        .opt("--text", "-")
        .run_with_stdin("And God said");
    assert_eq!((dash.code, dash.stdout.as_str()), (Some(0), given.as_str()));
    let empty = Cli::new("tokenize").run_with_stdin("");
    assert_eq!(empty.code, Some(2), "{}", empty.stderr);
    assert_eq!(
        empty.stderr.lines().next(),
        Some("error: no text: give --text TEXT, or pipe text on stdin")
    );
    assert!(empty.stdout.is_empty());
}

#[test]
fn prompt_escape_reads_escapes_and_names_an_unknown_one() {
    // Regression (issue 33): there was no `--prompt-escape` (llama.cpp's -e).
    let toy = |prompt: &str, extra: &[&str]| {
        Cli::new("generate")
            .model("toy")
            .opt("--prompt", prompt)
            .n(3)
            .seed(2)
            .args(extra)
            .arg("--json")
            .run()
    };
    let escaped = toy(r"<start>\tthe\ncat", &["-e"]);
    assert_eq!(escaped.code, Some(0), "{}", escaped.stderr);
    let report = escaped.json();
    assert_eq!(report["prompt"], "<start>\tthe\ncat");
    let plain = toy("<start> the cat", &[]).json();
    assert_eq!(report["prompt_ids"], plain["prompt_ids"]);
    assert_eq!(report["ids"], plain["ids"]);
    // Without the flag, a backslash is text (and the toy knows no such word).
    assert_eq!(toy(r"<start>\tthe", &[]).code, Some(1));
    let unknown = toy(r"<start> \q", &["--prompt-escape"]);
    assert_eq!(unknown.code, Some(2));
    assert!(unknown.stdout.is_empty());
    assert_eq!(
        unknown.stderr.lines().next(),
        Some(r#"error: --prompt-escape: unknown escape '\q' (known: \n \t \r \\ \" \' \xNN)"#)
    );
}

#[test]
fn whitespace_tokens_are_visible_in_tokenize_and_trace() {
    // Regression (issue 33): a token of spaces printed as blanks.
    let model = crate::common::fixture("hostile/gguf/valid-tiny-llama.gguf");
    let run = Cli::new("tokenize")
        .model(model.display())
        .opt("--text", "h  a")
        .ok();
    let rows: Vec<&str> = run.stdout.lines().skip(2).collect();
    assert_eq!(
        rows,
        ["       1  h", "       4  ␣", "       4  ␣", "       5  a"]
    );
    let trace = Cli::new("generate")
        .model(model.display())
        .opt("--prompt", "h")
        .opt("--logit-bias", "4=100")
        .n(1)
        .seed(1)
        .arg("--trace")
        .ok()
        .stdout;
    let row = trace.lines().find(|l| l.starts_with("   1  ")).unwrap();
    assert!(row.contains("  ␣  "), "{trace}");
}

#[test]
fn score_scores_a_text_from_bos_without_a_prompt() {
    // Regression (issue 33): `score --continuation` required `--prompt`, and
    // `--prompt ""` on a GGUF model was "the prompt is empty".
    let model = crate::common::fixture("hostile/gguf/valid-tiny-llama.gguf");
    let score = |prompt: Option<&str>| {
        let cli = Cli::new("score")
            .model(model.display())
            .opt("--continuation", "hab");
        match prompt {
            Some(prompt) => cli.opt("--prompt", prompt),
            None => cli,
        }
        .json()
    };
    let report = score(None);
    // BOS (id 0 in this file), then every token of the text is scored.
    assert_eq!(report["prompt_ids"], serde_json::json!([0]));
    assert_eq!(crate::common::ids(&report["ids"]), [1, 7]);
    assert_eq!(crate::common::floats(&report["logprobs"]).len(), 2);
    assert_eq!(score(Some("")), report);
    // A model without BOS (the toy): the first token is the context, said
    // in a note.
    let toy = Cli::new("score")
        .model("toy")
        .opt("--continuation", "<start> the cat")
        .arg("--json")
        .ok();
    assert_contains(&toy.stderr, "has no BOS token");
    assert_eq!(toy.json()["prompt_ids"], serde_json::json!([0]));
    assert_eq!(crate::common::ids(&toy.json()["ids"]), [1, 2]);
}
