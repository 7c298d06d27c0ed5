//! `--cache-dir`: the prefix cache saved on shutdown and on
//! `POST /slots/save`, read back by the next server, which then answers the
//! next turn of a conversation reading only its new tokens, with the ids a
//! server without a cache gives; a file that is not this model's cache is
//! refused (the server starts with an empty cache), never loaded.

use std::path::Path;

use lm::lm_model::ModelFingerprint;
use lm_core::Uncached;
use lm_serve::{CACHE_FILE, CacheDir, ServeConfig, ServeError, Server};
use serde_json::{Value, json};

use crate::common::{TestServer, ToyText, smollm2_path, toy_model};

const PROMPT: &str = "<start> the cat sat the dog slept the cat";

fn toy_fingerprint() -> ModelFingerprint {
    ModelFingerprint::of_bytes(b"the toy decoder, llama, context 1024")
}

fn config(dir: &Path, model: ModelFingerprint) -> ServeConfig {
    ServeConfig {
        cache_dir: Some(CacheDir {
            path: dir.to_path_buf(),
            model,
        }),
        ..ServeConfig::default()
    }
}

fn first_turn() -> Value {
    json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0.9, "seed": 3, "logit_bias": {"6": -100}})
}

/// The next turn after `answer` to [`first_turn`].
fn next_turn(answer: &Value) -> Value {
    let text = answer["choices"][0]["text"].as_str().unwrap();
    json!({"prompt": format!("{PROMPT}{text} the"), "max_tokens": 8, "temperature": 0.9, "seed": 4})
}

/// Runs the first turn on a server with `config` and stops it (which saves
/// its cache): the answer.
fn first_turn_then_stop(config: ServeConfig) -> Value {
    let server = TestServer::toy(config);
    let (status, answer) = server.post("/v1/completions", &first_turn());
    assert_eq!(status, 200, "{answer}");
    server.stop().unwrap();
    answer
}

#[test]
fn a_restarted_server_answers_the_next_turn_from_the_saved_cache() {
    let dir = tempfile::tempdir().unwrap();
    let answer = first_turn_then_stop(config(dir.path(), toy_fingerprint()));
    assert!(dir.path().join(CACHE_FILE).is_file(), "saved on shutdown");

    let restarted = TestServer::toy(config(dir.path(), toy_fingerprint()));
    assert_eq!(restarted.metric("lm_prefix_cache_entries"), 1.0);
    let (_, with_cache) = restarted.post("/v1/completions", &next_turn(&answer));
    let n_prompt = with_cache["usage"]["prompt_tokens"].as_f64().unwrap();
    // The first run fed all but its last token: that one and " the" are new.
    assert_eq!(restarted.metric("lm_prefill_tokens_total"), 2.0);
    assert_eq!(
        restarted.metric("lm_prefix_cache_hit_tokens_total"),
        n_prompt - 2.0
    );
    let uncached = TestServer::toy(ServeConfig {
        cache_bytes: 0,
        ..ServeConfig::default()
    });
    let (_, without_cache) = uncached.post("/v1/completions", &next_turn(&answer));
    assert_eq!(with_cache["choices"], without_cache["choices"]);
    assert_eq!(uncached.metric("lm_prefill_tokens_total"), n_prompt);
}

#[test]
fn slots_save_writes_the_cache_now_and_needs_a_cache_dir() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::toy(config(dir.path(), toy_fingerprint()));
    let (_, empty) = server.post("/slots/save", &json!({}));
    assert_eq!(empty["n_saved"], 0, "{empty}");
    server.post("/v1/completions", &first_turn());
    let (status, saved) = server.post("/slots/save", &json!({}));
    assert_eq!(status, 200, "{saved}");
    assert_eq!(saved["n_saved"], 1);
    assert_eq!(saved["filename"], CACHE_FILE);
    let file_len = std::fs::metadata(dir.path().join(CACHE_FILE))
        .unwrap()
        .len();
    assert_eq!(saved["n_written"], file_len);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, [CACHE_FILE], "no temporary file is left");

    let without = TestServer::toy(ServeConfig::default());
    let (status, refused) = without.post("/slots/save", &json!({}));
    assert_eq!(status, 400);
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("--cache-dir"), "{message}");
}

/// Starts a server on `dir` and checks it kept nothing of the file there,
/// then that its shutdown replaced the file with its own cache.
fn check_refused(dir: &Path, model: ModelFingerprint) {
    let server = TestServer::toy(config(dir, model));
    assert_eq!(server.metric("lm_prefix_cache_entries"), 0.0);
    let (_, answer) = server.post("/v1/completions", &first_turn());
    let n_prompt = answer["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(server.metric("lm_prefix_cache_hit_tokens_total"), 0.0);
    assert_eq!(server.metric("lm_prefill_tokens_total"), n_prompt);
    server.stop().unwrap();
    let reread = TestServer::toy(config(dir, model));
    assert_eq!(reread.metric("lm_prefix_cache_entries"), 1.0);
}

#[test]
fn another_models_cache_is_refused_and_the_server_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    first_turn_then_stop(config(dir.path(), toy_fingerprint()));
    check_refused(dir.path(), ModelFingerprint::of_bytes(b"another model"));
}

#[test]
fn a_truncated_or_foreign_cache_file_is_refused_and_the_server_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    first_turn_then_stop(config(dir.path(), toy_fingerprint()));
    let file = dir.path().join(CACHE_FILE);
    let saved = std::fs::read(&file).unwrap();
    let damaged: [&[u8]; 4] = [
        &saved[..saved.len() - 1],
        &saved[..20],
        b"not a cache file at all",
        &[],
    ];
    for bytes in damaged {
        std::fs::write(&file, bytes).unwrap();
        check_refused(dir.path(), toy_fingerprint());
    }
}

#[test]
fn the_program_is_told_what_reading_and_saving_the_cache_came_to() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(CACHE_FILE), b"not a cache file").unwrap();
    let bind = || {
        let config = ServeConfig {
            addr: ([127, 0, 0, 1], 0).into(),
            ..config(dir.path(), toy_fingerprint())
        };
        let model = std::sync::Arc::new(toy_model());
        Server::bind(model, std::sync::Arc::new(ToyText), config).unwrap()
    };
    let server = bind();
    let notes = server.cache_notes().unwrap();
    let started = notes.take();
    assert_eq!(started.len(), 1, "{started:?}");
    assert!(
        started[0].ends_with("not loaded, the prefix cache starts empty: not a prefix cache file"),
        "{started:?}"
    );
    server.spawn().unwrap().stop().unwrap();
    let stopped = notes.take();
    assert!(
        stopped[0].ends_with("0 states saved (16 bytes)"),
        "{stopped:?}"
    );
    // The empty cache it saved reads back as no states: nothing to tell.
    let again = bind();
    assert_eq!(again.cache_notes().unwrap().take(), Vec::<String>::new());
    again.spawn().unwrap().stop().unwrap();
}

/// A several-model server tells every model's reads and saves, each line
/// naming its model's file.
#[test]
fn a_several_model_server_tells_each_model_s_cache_notes() {
    let dir = tempfile::tempdir().unwrap();
    let models = ["a", "b"].map(|id| {
        let folder = dir.path().join(id);
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join(CACHE_FILE), b"not a cache file").unwrap();
        let config = config(&folder, toy_fingerprint());
        let load: lm_serve::LoadModel = std::sync::Arc::new(move || {
            let model = std::sync::Arc::new(toy_model());
            lm_serve::LoadedModel::new(model, std::sync::Arc::new(ToyText), config.clone())
        });
        lm_serve::ModelSource {
            id: id.into(),
            load,
        }
    });
    let front = ServeConfig {
        addr: ([127, 0, 0, 1], 0).into(),
        ..ServeConfig::default()
    };
    let server = Server::bind_models(models.into(), front, None).unwrap();
    let notes = server.cache_notes().unwrap();
    let file = |id: &str| dir.path().join(id).join(CACHE_FILE).display().to_string();
    let started = notes.take();
    assert_eq!(started.len(), 2, "{started:?}");
    for (line, id) in started.iter().zip(["a", "b"]) {
        assert!(
            line.starts_with(&file(id)) && line.ends_with("not a prefix cache file"),
            "{started:?}"
        );
    }
    server.spawn().unwrap().stop().unwrap();
    let mut stopped = notes.take();
    stopped.sort();
    assert_eq!(stopped.len(), 2, "{stopped:?}");
    for (line, id) in stopped.iter().zip(["a", "b"]) {
        assert!(
            line.starts_with(&file(id)) && line.ends_with("0 states saved (16 bytes)"),
            "{stopped:?}"
        );
    }
}

#[test]
fn a_fifo_as_the_cache_file_is_refused_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(CACHE_FILE);
    let status = std::process::Command::new("mkfifo")
        .arg(&file)
        .status()
        .expect("mkfifo (coreutils) makes the FIFO");
    assert!(status.success());
    // Starting returns (opening the FIFO would wait for a writer forever),
    // with an empty cache; shutdown replaces the FIFO with a file.
    check_refused(dir.path(), toy_fingerprint());
    assert!(std::fs::metadata(&file).unwrap().is_file());
}

#[test]
fn a_model_whose_states_cannot_be_saved_refuses_a_cache_dir() {
    let dir = tempfile::tempdir().unwrap();
    let result = Server::bind(
        std::sync::Arc::new(Uncached(toy_model())),
        std::sync::Arc::new(ToyText),
        config(dir.path(), toy_fingerprint()),
    );
    let Err(ServeError::InvalidSetting { name, reason }) = result else {
        panic!("bound: {result:?}");
    };
    assert_eq!(name, "cache-dir");
    assert!(reason.contains("cannot be saved"), "{reason}");
}

/// A two-turn SmolLM2 chat: the first turn's request, and the second's
/// after `reply`.
fn chat(reply: Option<&str>) -> Value {
    let mut messages =
        vec![json!({"role": "user", "content": "Name three colours of the rainbow."})];
    if let Some(reply) = reply {
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": "And two more?"}));
    }
    json!({"messages": messages, "max_tokens": 24, "temperature": 0, "logprobs": true})
}

/// The token ids of a chat answer (as logprobs lists them: their text
/// bytes, which name each token).
fn reply_tokens(answer: &Value) -> Vec<Value> {
    answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["bytes"].clone())
        .collect()
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_restarted_answers_the_next_turn_with_the_same_tokens_from_the_cache() {
    let path = smollm2_path();
    let dir = tempfile::tempdir().unwrap();
    let model = ModelFingerprint::of_path(&path).unwrap();
    let first = TestServer::gguf(&path, config(dir.path(), model));
    let (_, answer) = first.post("/v1/chat/completions", &chat(None));
    first.stop().unwrap();
    let reply = answer["choices"][0]["message"]["content"].as_str().unwrap();
    let n_first_prompt = answer["usage"]["prompt_tokens"].as_f64().unwrap();

    let restarted = TestServer::gguf(&path, config(dir.path(), model));
    assert_eq!(restarted.metric("lm_prefix_cache_entries"), 1.0);
    let (_, cold) = restarted.post("/v1/chat/completions", &chat(Some(reply)));
    let hits = restarted.metric("lm_prefix_cache_hit_tokens_total");
    assert!(
        hits >= n_first_prompt,
        "{hits} prompt tokens from the cache, the first turn's prompt was {n_first_prompt}"
    );
    // A server that never stopped answers the second turn alike.
    let warm = TestServer::gguf(&path, ServeConfig::default());
    warm.post("/v1/chat/completions", &chat(None));
    let (_, expected) = warm.post("/v1/chat/completions", &chat(Some(reply)));
    assert!(warm.metric("lm_prefix_cache_hit_tokens_total") >= n_first_prompt);
    assert_eq!(reply_tokens(&cold), reply_tokens(&expected));
    assert_eq!(
        cold["choices"][0]["message"],
        expected["choices"][0]["message"]
    );
}
