//! `lm-cli serve`: the binary serves the model it loads (the toy here, the
//! embedded count model too, which has no vocabulary for `response_format`),
//! answers OpenAI's completions, and on SIGTERM
//! finishes the request in flight, then exits 0.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};

use serde_json::Value;

use crate::common::{Cli, assert_contains};

/// A running `lm-cli serve`, killed if a test fails before it stops it.
pub(crate) struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `lm-cli serve` on a free port; returns the child and its address
/// (read from the line it prints on stderr).
fn start(model: Option<&str>) -> (Served, String) {
    let mut cli = Cli::new("serve");
    if let Some(model) = model {
        cli = cli.model(model);
    }
    start_with(cli)
}

/// Starts `cli` (an `lm-cli serve` command line) on a free port.
pub(crate) fn start_with(cli: Cli) -> (Served, String) {
    let (child, addr) = cli.opt("--parallel", 2).spawn_server();
    (Served(child), addr)
}

pub(crate) fn post(addr: &str, path: &str, body: &str) -> (u16, Value) {
    post_with_key(addr, path, body, None)
}

/// [`post`], with `Authorization: Bearer KEY` when a key is given.
fn post_with_key(addr: &str, path: &str, body: &str, key: Option<&str>) -> (u16, Value) {
    let auth = key.map_or(String::new(), |key| {
        format!("Authorization: Bearer {key}\r\n")
    });
    let (status, body) = exchange(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// `GET path`'s body; the answer must be a 200.
pub(crate) fn get(addr: &str, path: &str) -> String {
    let (status, body) = exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// Sends `request` (a whole HTTP/1.1 request that closes the connection)
/// and returns the answer's status and body.
fn exchange(addr: &str, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response[response.find("\r\n\r\n").unwrap() + 4..].to_owned();
    (status, body)
}

fn terminate(served: &Served) {
    let status = Command::new("kill")
        .args(["-TERM", &served.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn serve_answers_completions_and_drains_on_sigterm() {
    let (mut child, addr) = start(Some("toy"));
    let (status, body) = post(
        &addr,
        "/v1/completions",
        r#"{"prompt": "<start> the cat", "max_tokens": 3, "temperature": 0, "logit_bias": {"6": -100}}"#,
    );
    assert_eq!(status, 200, "{body}");
    // The same greedy run through `lm-cli generate`.
    let generate = Cli::generate("<start> the cat")
        .model("toy")
        .n(3)
        .arg("--greedy")
        .opt("--logit-bias", "6=-inf")
        .ok();
    assert_eq!(
        format!(
            "<start> the cat{}",
            body["choices"][0]["text"].as_str().unwrap()
        ),
        generate.stdout.trim_end()
    );
    // SIGTERM while a request runs: it completes, then the server exits 0.
    let request_addr = addr.clone();
    let running = std::thread::spawn(move || {
        post(
            &request_addr,
            "/v1/completions",
            r#"{"prompt": "<start>", "max_tokens": 12, "logit_bias": {"6": -100}, "seed": 1}"#,
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    terminate(&child);
    let (status, body) = running.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 12);
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

/// The libraries' log lines reach standard error in lm-cli's own form: a
/// request still running when `--shutdown-grace 0` is over is cancelled
/// with a 503, and lm-serve's warning says so.
#[test]
fn serve_prints_the_libraries_warnings() {
    let (child, addr, stderr) = Cli::new("serve")
        .model("toy")
        .opt("--context-length", 100_000)
        .opt("--shutdown-grace", 0)
        .spawn_server_reading_stderr();
    let mut served = Served(child);
    let running = std::thread::spawn(move || {
        post(
            &addr,
            "/v1/completions",
            r#"{"prompt": "<start>", "max_tokens": 50000, "logit_bias": {"6": -100}}"#,
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    terminate(&served);
    let (status, body) = running.join().unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(served.0.wait().unwrap().code(), Some(0));
    let stderr = stderr.join().unwrap();
    assert_contains(
        &stderr,
        "warning: shutdown grace of 0ns over: cancelling the requests still running",
    );
}

#[test]
fn serve_serves_the_embedded_count_model() {
    let (mut child, addr) = start(None);
    let (status, body) = post(
        &addr,
        "/v1/completions",
        r#"{"prompt": "And God said", "max_tokens": 5, "seed": 3}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    // A count model has no tokenizer vocabulary to hold the output to.
    let (status, body) = post(
        &addr,
        "/v1/completions",
        r#"{"prompt": "And God said", "response_format": {"type": "json_object"}}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "response_format");
    terminate(&child);
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

#[test]
fn serve_takes_its_api_key_from_lm_api_key_and_the_flag_wins() {
    let body = r#"{"prompt": "<start> the cat", "max_tokens": 1}"#;
    let (mut child, addr) = start_with(Cli::new("serve").model("toy").env("LM_API_KEY", "sesame"));
    let (status, answer) = post(&addr, "/v1/completions", body);
    assert_eq!(status, 401, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_api_key");
    let (status, answer) = post_with_key(&addr, "/v1/completions", body, Some("sesame"));
    assert_eq!(status, 200, "{answer}");
    terminate(&child);
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
    // The flag overrides the environment.
    let (mut child, addr) = start_with(
        Cli::new("serve")
            .model("toy")
            .opt("--api-key", "open")
            .env("LM_API_KEY", "sesame"),
    );
    let (status, _) = post_with_key(&addr, "/v1/completions", body, Some("sesame"));
    assert_eq!(status, 401);
    let (status, answer) = post_with_key(&addr, "/v1/completions", body, Some("open"));
    assert_eq!(status, 200, "{answer}");
    terminate(&child);
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

#[test]
fn serve_help_names_lm_api_key_without_showing_its_value() {
    let help = Cli::new("serve")
        .arg("--help")
        .env("LM_API_KEY", "sesame")
        .ok();
    assert_contains(&help.stdout, "[env: LM_API_KEY]");
    assert!(!help.stdout.contains("sesame"), "{}", help.stdout);
}

#[test]
fn a_cors_origin_with_a_path_is_a_usage_error() {
    let run = Cli::new("serve")
        .model("toy")
        .opt("--cors", "https://app.example/")
        .run();
    run.assert_usage_error("expected '*' or an origin: scheme://host[:port], without a path");
}

#[test]
fn an_empty_api_key_is_a_usage_error() {
    let run = Cli::new("serve").model("toy").env("LM_API_KEY", "").run();
    run.assert_usage_error("the API key must not be empty");
}
