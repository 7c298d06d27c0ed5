//! `lm-cli chat --session FILE`: the conversation and its KV state saved
//! after each reply and resumed by the next run, whose first reply reads
//! only the new message's tokens and is the reply one long chat gives; a
//! file that is not this model's session is refused with a note and left
//! alone; a device or a FIFO is an error before the model runs. On the tiny
//! chat model of `fixtures/hostile/gguf/` (no download), and on SmolLM2.

use std::path::Path;

use lm_model::catalog::SMOLLM2;
use serde_json::Value;

use crate::common::{BOUNDED, Cli, assert_contains, fixture};

const TINY: &str = "hostile/gguf/valid-chat-tiny-llama.gguf";

/// A greedy chat of three tokens a reply with `--json`, on `model`.
fn chat(model: &Path) -> Cli {
    Cli::new("chat")
        .model(model.display())
        .arg("--greedy")
        .n(3)
        .arg("--json")
}

fn with_session(cli: Cli, session: &Path) -> Cli {
    cli.arg("--session").arg(session.display())
}

/// Runs `cli` on `input`: its report and stderr.
fn run(cli: &Cli, input: &str) -> (Value, String) {
    let run = cli.run_wrapped(&BOUNDED, input);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    (run.json(), run.stderr)
}

fn reply(report: &Value, idx: usize) -> &Value {
    &report["replies"][idx]
}

/// Tokens the reply's prompt shares with what the model read before: the
/// first reply's prompt and its tokens but the last (never fed).
fn n_fed(reply: &Value) -> u64 {
    reply["prompt_tokens"].as_u64().unwrap() + reply["ids"].as_array().unwrap().len() as u64 - 1
}

/// Two runs of one message each on `session`, and one run of both messages:
/// the second run's reply is the long chat's second, and reads only the new
/// message's tokens.
fn check_resume(model: &Path, first: &str, second: &str) {
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("chat.session");
    let (run1, _) = run(&with_session(chat(model), &session), &format!("{first}\n"));
    assert!(session.is_file(), "saved after the reply");
    let (run2, stderr) = run(&with_session(chat(model), &session), &format!("{second}\n"));
    assert!(stderr.contains("(resumed 2 messages from"), "{stderr}");
    let (both, _) = run(&chat(model), &format!("{first}\n{second}\n"));
    assert_eq!(run2["messages"], both["messages"]);
    assert_eq!(reply(&run2, 0)["ids"], reply(&both, 1)["ids"]);
    assert_eq!(
        reply(&run2, 0)["reused_tokens"].as_u64(),
        Some(n_fed(reply(&run1, 0)))
    );
    assert_eq!(
        reply(&run2, 0)["reused_tokens"],
        reply(&both, 1)["reused_tokens"]
    );
}

#[test]
fn a_second_run_resumes_the_chat_reading_only_the_new_message() {
    check_resume(&fixture(TINY), "hi ab", "ab hi hi");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_resumes_a_chat_reading_only_the_new_message() {
    let path = SMOLLM2.path().unwrap_or_else(|err| panic!("{err}"));
    check_resume(&path, "What is the capital of France?", "And of Italy?");
}

/// A chat on `session` that must refuse it: the note, a fresh first reply,
/// and the file left as it was.
fn check_refused(model: &Path, session: &Path, reason: &str) {
    let before = std::fs::read(session).unwrap();
    let (report, stderr) = run(&with_session(chat(model), session), "hi\n");
    assert_contains(&stderr, "not resumed");
    assert!(stderr.contains(reason), "{reason:?} not in {stderr}");
    assert_eq!(reply(&report, 0)["reused_tokens"], 0);
    assert_eq!(std::fs::read(session).unwrap(), before, "left alone");
}

#[test]
fn a_truncated_foreign_or_other_models_session_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = fixture(TINY);
    let session = dir.path().join("chat.session");
    run(&with_session(chat(&tiny), &session), "hi ab\n");
    let saved = std::fs::read(&session).unwrap();

    std::fs::write(&session, &saved[..saved.len() - 7]).unwrap();
    check_refused(&tiny, &session, "truncated");
    std::fs::write(&session, b"{\"messages\": []}").unwrap();
    check_refused(&tiny, &session, "not a chat session file");

    // The same model with its last weight byte changed is another model.
    let mut other = std::fs::read(&tiny).unwrap();
    *other.last_mut().unwrap() ^= 1;
    let other_model = dir.path().join("other.gguf");
    std::fs::write(&other_model, other).unwrap();
    std::fs::write(&session, &saved).unwrap();
    check_refused(&other_model, &session, "saved for another model");
}

#[test]
fn a_device_or_a_fifo_as_the_session_is_an_error_before_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo (coreutils) makes the FIFO");
    assert!(status.success());
    for (path, kind) in [
        (Path::new("/dev/zero"), "character device"),
        (fifo.as_path(), "fifo"),
        (dir.path(), "directory"),
    ] {
        let run = with_session(chat(&fixture(TINY)), path).run_wrapped(&BOUNDED, "hi\n");
        assert_ne!(run.code, Some(0));
        assert!(run.stderr.contains(kind), "{kind:?} not in {}", run.stderr);
    }
}
