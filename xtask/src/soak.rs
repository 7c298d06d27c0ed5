//! `cargo xtask soak --minutes M [--clients 32]`: an `lm-cli serve` on
//! SmolLM2 driven for M minutes by C clients on loopback, then stopped with
//! SIGTERM while requests run, to check the drain.
//!
//! ```text
//! each client, in turn: streaming chat (its own conversation, 3 turns, so
//!   the prefix cache is used) | non-streaming chat | streaming completion |
//!   structured chat (json_schema) | a stream dropped after its first token |
//!   too many tokens (400) | a body over --max-body-bytes (413)
//! meanwhile: the server's RSS every 500 ms (/proc/PID/status)
//! then: C requests at once (long streams that cannot finish in the grace,
//!   short answers that can), SIGTERM, and late requests during the drain
//! ```
//!
//! It fails on any 5xx but the drain's 503s, an answer that breaks the
//! protocol (a stream without `[DONE]`, structured output that is not the
//! schema's JSON, an oversized request not refused), RSS after warm-up
//! growing 5% or more, p99 time to first token at 2 s or more, or a drain
//! that lets a cut-off request finish normally. Warm-up lasts until every
//! client has sent one round of its cycle (a whole conversation, so the
//! longest states have been held and the prefix cache has filled) and at
//! least a fifth of the run: its RSS peak is compared with the peak after it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::serve_cluster::{Replica, lm_cli};

pub(crate) const USAGE: &str = "\
usage: cargo xtask soak [--minutes M (1)] [--clients C (32)] [--parallel P (32)] [--threads T (2)]
                        [--model M (smollm2)] [--max-requests N (1000000)] [--no-latency-limit]
                        [--lm-cli PATH (a release build made now)] [--max-rss-growth PCT (5)]
drives `lm-cli serve` with streaming, non-streaming, structured, cancelled and oversized requests
from C clients for M minutes, then SIGTERMs it mid-run; fails on a 5xx, RSS growth >= PCT% after
warm-up, p99 time to first token >= 2 s (unless --no-latency-limit: reported only) or a broken drain";

/// The limits the run is judged by (RSS growth: the default of
/// `--max-rss-growth`, a fraction).
const MAX_RSS_GROWTH: f64 = 0.05;
const MAX_P99_TTFT: Duration = Duration::from_secs(2);
/// A request that takes longer is counted as a timeout (an error).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The server's drain grace, and its body cap (the oversized body is 1.5x).
const GRACE_SECONDS: f64 = 3.0;
const MAX_BODY_BYTES: usize = 1 << 20;
/// Tokens the drain's long streams ask for: far more than fit in the grace.
const LONG_TOKENS: u64 = 2000;
/// SmolLM2's end tokens (`<|endoftext|>`, `<|im_end|>`), banned in the
/// drain's long streams so that only the grace can end them.
const END_TOKEN_BIAS: [(&str, i32); 2] = [("0", -100), ("2", -100)];

/// The settings of one run.
#[derive(Debug, Clone)]
struct Settings {
    minutes: f64,
    n_clients: usize,
    parallel: usize,
    threads: usize,
    model: String,
    max_requests: u64,
    /// Whether p99 time to first token is judged (`--no-latency-limit`
    /// reports it only: CI's two-minute run checks behaviour, and a
    /// latency bar on a shared machine belongs to a benchmark).
    latency_limit: bool,
    /// The `lm-cli` to serve with (`--lm-cli`): CI passes the dev build
    /// its tests just made rather than compiling a release build for one
    /// minute of load (its compute crates are optimised in the dev profile).
    binary: Option<PathBuf>,
    /// The RSS growth after warm-up that fails the run, a fraction
    /// (`--max-rss-growth` in percent): CI's two-minute run allows more than
    /// the long soak's 5%, since its peaks swing by several percent between
    /// tenths of the run (docs/serving.md).
    max_rss_growth: f64,
}

/// Runs the task.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let settings = parse(args)?;
    let lm_cli = match &settings.binary {
        Some(path) => path.clone(),
        None => lm_cli()?,
    };
    let mut command = Command::new(&lm_cli);
    command.args(["serve", "--model", &settings.model, "--port", "0"]);
    command.args(["--parallel", &settings.parallel.to_string()]);
    command.args(["--threads", &settings.threads.to_string()]);
    command.args(["--queue", "256", "--cache-mb", "64"]);
    command.args(["--shutdown-grace", &GRACE_SECONDS.to_string()]);
    command.args(["--max-body-bytes", &MAX_BODY_BYTES.to_string()]);
    let mut server = Replica::start(command, "server", false)?;
    server.wait_healthy(Duration::from_secs(180))?;
    println!(
        "soak: {} min, {} clients, lm-cli serve --model {} --parallel {} --threads {} (pid {}) on {}",
        settings.minutes,
        settings.n_clients,
        settings.model,
        settings.parallel,
        settings.threads,
        server.pid(),
        server.addr
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the client runtime")?;
    let rss = RssSampler::start(server.pid());
    let started = Instant::now();
    let duration = Duration::from_secs_f64(settings.minutes * 60.0);
    let (log, warm) = runtime.block_on(drive(server.addr, &settings, started + duration));
    let driven = started.elapsed();
    let metrics = runtime
        .block_on(client::get(server.addr, "/metrics"))
        .map(|answer| String::from_utf8_lossy(&answer.body).into_owned())
        .unwrap_or_default();
    let samples = rss.stop();
    let drain = runtime.block_on(drain(&mut server, settings.n_clients))?;
    let warm_end = warm.map(|clients| clients.max(started + driven / 5));
    let report = Report::new(
        &log,
        &samples,
        driven,
        warm_end,
        drain,
        &metrics,
        &server.log(),
    );
    println!("{report}");
    report.check(settings.latency_limit, settings.max_rss_growth)
}

fn parse(args: &[String]) -> Result<Settings> {
    let mut settings = Settings {
        minutes: 1.0,
        n_clients: 32,
        parallel: 32,
        threads: 2,
        model: "smollm2".to_owned(),
        max_requests: 1_000_000,
        latency_limit: true,
        binary: None,
        max_rss_growth: MAX_RSS_GROWTH,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if flag == "--no-latency-limit" {
            settings.latency_limit = false;
            continue;
        }
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n > 0.0)
                .with_context(|| format!("{flag} needs a positive number, got `{value}`"))
        };
        match flag.as_str() {
            "--minutes" => settings.minutes = number()?,
            "--clients" => settings.n_clients = number()? as usize,
            "--parallel" => settings.parallel = number()? as usize,
            "--threads" => settings.threads = number()? as usize,
            "--max-requests" => settings.max_requests = number()? as u64,
            "--max-rss-growth" => settings.max_rss_growth = number()? / 100.0,
            "--model" => settings.model.clone_from(value),
            "--lm-cli" if Path::new(value).is_file() => settings.binary = Some(value.into()),
            "--lm-cli" => {
                bail!("--lm-cli: `{value}` is not a file (build it with `cargo build -p lm-cli`)")
            }
            other => bail!("unknown option `{other}`\n{USAGE}"),
        }
    }
    if settings.n_clients == 0 || settings.parallel == 0 || settings.threads == 0 {
        bail!("--clients, --parallel and --threads must be at least 1");
    }
    Ok(settings)
}

/// The kinds of request, in the order each client cycles through them
/// (streams weigh most, as in a chat service).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    ChatStream,
    Chat,
    CompletionStream,
    Structured,
    Cancelled,
    TooManyTokens,
    TooLarge,
}

const CYCLE: [Kind; 10] = [
    Kind::ChatStream,
    Kind::Chat,
    Kind::CompletionStream,
    Kind::ChatStream,
    Kind::Structured,
    Kind::Cancelled,
    Kind::ChatStream,
    Kind::TooManyTokens,
    Kind::CompletionStream,
    Kind::TooLarge,
];

/// What one request got.
#[derive(Debug, Clone)]
struct Outcome {
    kind: Kind,
    /// The HTTP status, or `None` when no answer came (refused, reset,
    /// timed out).
    status: Option<u16>,
    /// From sending to the first token (streams only).
    ttft: Option<Duration>,
    /// A broken expectation, with what was seen.
    problem: Option<String>,
}

/// The system prompt every chat shares (so the cache has a common prefix).
const SYSTEM: &str = "You are a concise assistant. Answer in one short sentence.";

const QUESTIONS: [&str; 12] = [
    "What is the capital of France?",
    "Name a primary colour.",
    "How many legs does a spider have?",
    "What is water made of?",
    "Why is the sky blue?",
    "What is a prime number?",
    "Who wrote Hamlet?",
    "What does a compiler do?",
    "How far is the Moon?",
    "What is photosynthesis?",
    "Name a large ocean.",
    "What is the boiling point of water?",
];

const COMPLETION_PROMPTS: [&str; 4] = [
    "Once upon a time, in a small village by the sea,",
    "The three most important rules of cooking are",
    "def fibonacci(n):\n",
    "A list of fruits: apple, banana,",
];

/// Sends requests from every client until `deadline` (or the request cap).
async fn drive(
    addr: SocketAddr,
    settings: &Settings,
    deadline: Instant,
) -> (Vec<(Instant, Outcome)>, Option<Instant>) {
    let issued = Arc::new(AtomicU64::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for client_idx in 0..settings.n_clients {
        let (issued, log, max) = (Arc::clone(&issued), Arc::clone(&log), settings.max_requests);
        tasks.push(tokio::spawn(async move {
            let mut history: Vec<Value> = Vec::new();
            let (mut turn_idx, mut warm) = (client_idx, None);
            while Instant::now() < deadline && issued.fetch_add(1, Ordering::Relaxed) < max {
                let kind = CYCLE[turn_idx % CYCLE.len()];
                let outcome = one(addr, kind, client_idx, turn_idx, &mut history).await;
                if let Ok(mut log) = log.lock() {
                    log.push((Instant::now(), outcome));
                }
                turn_idx += 1;
                if turn_idx == client_idx + CYCLE.len() {
                    warm = Some(Instant::now());
                }
            }
            warm
        }));
    }
    // Warm once the last client has finished its first round.
    let mut warm = Some(Instant::now() - Duration::from_secs(1 << 20));
    for task in tasks {
        let client_warm = task.await.ok().flatten();
        warm = warm.zip(client_warm).map(|(a, b)| a.max(b));
    }
    let log = std::mem::take(
        &mut *log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    (log, warm)
}

/// Sends one request of `kind` and checks its answer. `history` is the
/// client's conversation, which its streaming chats extend (and restart
/// after three turns).
async fn one(
    addr: SocketAddr,
    kind: Kind,
    client_idx: usize,
    turn_idx: usize,
    history: &mut Vec<Value>,
) -> Outcome {
    let question = QUESTIONS[(client_idx * 5 + turn_idx) % QUESTIONS.len()];
    let chat = |messages: Vec<Value>, extra: Value| {
        let mut body = json!({"messages": messages, "max_tokens": 24, "temperature": 0});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        body
    };
    let single = || {
        vec![
            json!({"role": "system", "content": SYSTEM}),
            json!({"role": "user", "content": question}),
        ]
    };
    let (path, body) = match kind {
        Kind::ChatStream => {
            if history.len() >= 7 || history.is_empty() {
                history.clear();
                history.push(json!({"role": "system", "content": SYSTEM}));
            }
            history.push(json!({"role": "user", "content": question}));
            (
                "/v1/chat/completions",
                chat(history.clone(), json!({"stream": true})),
            )
        }
        Kind::Chat => ("/v1/chat/completions", chat(single(), json!({}))),
        Kind::CompletionStream | Kind::Cancelled => {
            let prompt = COMPLETION_PROMPTS[turn_idx % COMPLETION_PROMPTS.len()];
            let n = if kind == Kind::Cancelled { 200 } else { 24 };
            let body = json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": true});
            ("/v1/completions", body)
        }
        Kind::Structured => (
            "/v1/chat/completions",
            chat(
                single(),
                json!({"max_tokens": 64, "response_format": {"type": "json_schema", "json_schema": {
                    "name": "answer", "strict": true, "schema": {
                        "type": "object",
                        "properties": {"answer": {"type": "string", "maxLength": 60}},
                        "required": ["answer"], "additionalProperties": false}}}}),
            ),
        ),
        Kind::TooManyTokens => (
            "/v1/chat/completions",
            chat(single(), json!({"max_tokens": 10_000_000})),
        ),
        Kind::TooLarge => {
            let words = "lorem ipsum ".repeat(MAX_BODY_BYTES * 3 / 2 / 12);
            ("/v1/completions", json!({"prompt": words, "max_tokens": 1}))
        }
    };
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let sent = Instant::now();
    let exchange = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut response = client::post(addr, path, body).await?;
        let status = response.status;
        let answer = match kind {
            Kind::ChatStream | Kind::CompletionStream | Kind::Cancelled if status == 200 => {
                let stop_early = kind == Kind::Cancelled;
                Answer::Stream(read_stream(&mut response, sent, stop_early).await?)
            }
            _ => Answer::Whole(response.collect().await?),
        };
        Ok::<_, client::Error>((status, answer))
    })
    .await;
    let (status, answer) = match exchange {
        Ok(Ok(pair)) => pair,
        Ok(Err(err)) => return Outcome::failed(kind, None, format!("no answer: {err}")),
        Err(_) => return Outcome::failed(kind, None, "timed out".into()),
    };
    let mut outcome = Outcome {
        kind,
        status: Some(status),
        ttft: None,
        problem: None,
    };
    let expected = match kind {
        Kind::TooManyTokens => 400,
        Kind::TooLarge => 413,
        _ => 200,
    };
    if status != expected {
        outcome.problem = Some(format!("{kind:?}: status {status}, expected {expected}"));
        if kind == Kind::ChatStream {
            history.pop();
        }
        return outcome;
    }
    match answer {
        Answer::Stream(stream) => {
            outcome.ttft = stream.first_token;
            if kind != Kind::Cancelled {
                outcome.problem = stream.problem(kind);
                if kind == Kind::ChatStream {
                    history.push(json!({"role": "assistant", "content": stream.text}));
                }
            }
        }
        Answer::Whole(bytes) if expected == 200 => outcome.problem = check_whole(kind, &bytes),
        Answer::Whole(_) => {}
    }
    outcome
}

impl Outcome {
    fn failed(kind: Kind, status: Option<u16>, problem: String) -> Self {
        Self {
            kind,
            status,
            ttft: None,
            problem: Some(format!("{kind:?}: {problem}")),
        }
    }
}

enum Answer {
    Stream(Stream),
    Whole(Vec<u8>),
}

/// What a server-sent-events answer held.
#[derive(Debug, Default)]
struct Stream {
    first_token: Option<Duration>,
    text: String,
    finish_reason: Option<String>,
    error: Option<String>,
    done: bool,
    /// Events after `[DONE]`, or that are not JSON.
    malformed: Vec<String>,
}

impl Stream {
    /// How a stream that ran to its end broke the protocol, if it did.
    fn problem(&self, kind: Kind) -> Option<String> {
        if let Some(error) = &self.error {
            return Some(format!("{kind:?}: an error event: {error}"));
        }
        if !self.malformed.is_empty() {
            return Some(format!("{kind:?}: malformed events {:?}", self.malformed));
        }
        if !self.done || self.finish_reason.is_none() {
            return Some(format!(
                "{kind:?}: ended without a finish_reason and [DONE] (done {}, finish {:?})",
                self.done, self.finish_reason
            ));
        }
        None
    }
}

/// Reads a stream's events (stopping after the first token when
/// `stop_early`, which drops the connection: a client that goes away).
async fn read_stream(
    response: &mut client::Response,
    sent: Instant,
    stop_early: bool,
) -> Result<Stream, client::Error> {
    let mut stream = Stream::default();
    let mut pending = Vec::new();
    while let Some(chunk) = response.next_chunk().await? {
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if stream.done {
                stream.malformed.push(data.to_owned());
                continue;
            }
            if data == "[DONE]" {
                stream.done = true;
                continue;
            }
            let Ok(value) = serde_json::from_str::<Value>(data) else {
                stream.malformed.push(data.to_owned());
                continue;
            };
            if let Some(error) = value.get("error") {
                stream.error = Some(error.to_string());
                continue;
            }
            let choice = &value["choices"][0];
            let text = choice["text"]
                .as_str()
                .or_else(|| choice["delta"]["content"].as_str())
                .unwrap_or("");
            if !text.is_empty() && stream.first_token.is_none() {
                stream.first_token = Some(sent.elapsed());
                if stop_early {
                    return Ok(stream);
                }
            }
            stream.text.push_str(text);
            if let Some(reason) = choice["finish_reason"].as_str() {
                stream.finish_reason = Some(reason.to_owned());
            }
        }
    }
    Ok(stream)
}

/// Checks a 200 answer that came whole: a finish reason, and for
/// structured output, JSON of the schema (unless cut by `max_tokens`).
fn check_whole(kind: Kind, bytes: &[u8]) -> Option<String> {
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        Err(err) => return Some(format!("{kind:?}: not JSON ({err})")),
    };
    let choice = &value["choices"][0];
    let Some(reason) = choice["finish_reason"].as_str() else {
        return Some(format!("{kind:?}: no finish_reason in {value}"));
    };
    if kind == Kind::Structured && reason == "stop" {
        let content = choice["message"]["content"].as_str().unwrap_or("");
        let parsed: Option<Value> = serde_json::from_str(content).ok();
        let valid = parsed.as_ref().is_some_and(|v| {
            v.as_object().is_some_and(|o| o.len() == 1) && v["answer"].is_string()
        });
        if !valid {
            return Some(format!(
                "{kind:?}: content is not the schema's JSON: {content:?}"
            ));
        }
    }
    None
}

/// The drain check's result.
#[derive(Debug, Default)]
struct Drain {
    /// In-flight requests that finished normally (the short ones can).
    finished: usize,
    /// In-flight requests cut off by the grace with an error (a 503, or an
    /// error event before `[DONE]`).
    cut_with_error: usize,
    /// Requests sent during the drain that got a 503 (or found the
    /// socket closed once the server had exited).
    refused_late: usize,
    /// Broken promises: a long stream that ended normally without its
    /// tokens, a stream cut without an error, an answer lost.
    violations: Vec<String>,
    exit: String,
    took: Duration,
}

/// Starts `n` requests (half long streams that cannot finish within the
/// grace, half short answers that can), sends SIGTERM once they run, sends
/// late requests during the drain and checks every answer.
async fn drain(server: &mut Replica, n: usize) -> Result<Drain> {
    let addr = server.addr;
    let mut tasks = Vec::new();
    for idx in 0..n.max(2) {
        let long = idx % 2 == 0;
        tasks.push(tokio::spawn(async move {
            let bias: serde_json::Map<String, Value> = END_TOKEN_BIAS
                .iter()
                .map(|(id, b)| ((*id).to_owned(), json!(b)))
                .collect();
            let body = if long {
                json!({"prompt": COMPLETION_PROMPTS[idx % 4], "max_tokens": LONG_TOKENS,
                       "temperature": 0, "stream": true, "logit_bias": bias})
            } else {
                json!({"prompt": COMPLETION_PROMPTS[idx % 4], "max_tokens": 4, "temperature": 0})
            };
            let body = serde_json::to_vec(&body).unwrap_or_default();
            let result = async {
                let mut response = client::post(addr, "/v1/completions", body).await?;
                let status = response.status;
                if long && status == 200 {
                    let stream = read_stream(&mut response, Instant::now(), false).await?;
                    Ok::<_, client::Error>((status, Some(stream), Vec::new()))
                } else {
                    Ok((status, None, response.collect().await?))
                }
            };
            (long, tokio::time::timeout(REQUEST_TIMEOUT, result).await)
        }));
    }
    // Let every request start, then stop the server.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.signal("TERM")?;
    let signalled = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut report = Drain::default();
    for _ in 0..4 {
        let body =
            serde_json::to_vec(&json!({"prompt": "late", "max_tokens": 2})).unwrap_or_default();
        match client::post(addr, "/v1/completions", body).await {
            Ok(response) if response.status == 503 => report.refused_late += 1,
            Err(_) if server.wait_exit(Duration::ZERO).is_ok() => report.refused_late += 1,
            Ok(response) => report.violations.push(format!(
                "a request during the drain got {}",
                response.status
            )),
            Err(err) => report
                .violations
                .push(format!("a request during the drain got no answer: {err}")),
        }
    }
    for task in tasks {
        let (long, result) = task.await.context("a drain client panicked")?;
        match result {
            Err(_) => report.violations.push("a drain request timed out".into()),
            Ok(Err(err)) => report.violations.push(format!("no answer: {err}")),
            Ok(Ok((503, None, _))) => report.cut_with_error += 1,
            Ok(Ok((200, None, _))) if !long => report.finished += 1,
            Ok(Ok((200, Some(stream), _))) => {
                if stream.error.is_some() && stream.done {
                    report.cut_with_error += 1;
                } else if stream.finish_reason.is_some() && stream.done {
                    // With end tokens banned, only max_tokens ends it.
                    if stream.finish_reason.as_deref() == Some("length") {
                        report.finished += 1;
                    } else {
                        report.violations.push(format!(
                            "a long stream ended normally ({:?}) before its {LONG_TOKENS} tokens",
                            stream.finish_reason
                        ));
                    }
                } else {
                    report
                        .violations
                        .push(format!("a stream was cut without an error: {stream:?}"));
                }
            }
            Ok(Ok((status, _, body))) => report.violations.push(format!(
                "a drain request got {status}: {}",
                String::from_utf8_lossy(&body)
            )),
        }
    }
    let status = server.wait_exit(Duration::from_secs_f64(GRACE_SECONDS + 30.0))?;
    report.took = signalled.elapsed();
    report.exit = status.to_string();
    if !status.success() {
        report
            .violations
            .push(format!("the server exited with {status}"));
    }
    if report.cut_with_error == 0 {
        report
            .violations
            .push("no request was cut off by the grace: the check did not run".into());
    }
    Ok(report)
}

/// The server's RSS, sampled every 500 ms on a thread of its own.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Instant, u64)>>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                if let Some(kib) = lm_serve::fuzz::rss_kib(pid) {
                    samples.push((Instant::now(), kib));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            samples
        });
        Self { stop, thread }
    }

    fn stop(self) -> Vec<(Instant, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The run's numbers and verdict.
#[derive(Debug)]
struct Report {
    driven: Duration,
    by_kind: BTreeMap<String, usize>,
    by_status: BTreeMap<String, usize>,
    problems: Vec<String>,
    ttft_ms: Vec<f64>,
    /// The share of the run that warm-up took (NaN: a client never
    /// finished its first round).
    warm_share: f64,
    /// RSS in MiB: the peak during warm-up, the peak after it (0 when no
    /// sample came after it), and one sample per tenth of the run.
    rss_warm: f64,
    rss_end: f64,
    rss_timeline: Vec<f64>,
    drain: Drain,
    metrics: Vec<(String, String)>,
    panicked: bool,
}

impl Report {
    fn new(
        log: &[(Instant, Outcome)],
        samples: &[(Instant, u64)],
        driven: Duration,
        warm_end: Option<Instant>,
        drain: Drain,
        metrics: &str,
        server_log: &str,
    ) -> Self {
        let mut by_kind = BTreeMap::new();
        let mut by_status = BTreeMap::new();
        let mut problems = Vec::new();
        let mut ttft_ms = Vec::new();
        for (_, outcome) in log {
            *by_kind.entry(format!("{:?}", outcome.kind)).or_default() += 1;
            let status = outcome.status.map_or("none".to_owned(), |s| s.to_string());
            *by_status.entry(status).or_default() += 1;
            problems.extend(outcome.problem.clone());
            ttft_ms.extend(outcome.ttft.map(|t| t.as_secs_f64() * 1e3));
        }
        ttft_ms.sort_by(f64::total_cmp);
        let mib = |kib: u64| kib as f64 / 1024.0;
        let n = samples.len();
        let peak = |keep: &dyn Fn(Instant) -> bool| {
            samples
                .iter()
                .filter(|(t, _)| keep(*t))
                .map(|(_, kib)| mib(*kib))
                .fold(0.0, f64::max)
        };
        let rss_warm = peak(&|t| warm_end.is_some_and(|end| t <= end));
        let rss_end = peak(&|t| warm_end.is_some_and(|end| t > end));
        let warm_share = match (samples.first(), samples.last(), warm_end) {
            (Some(first), Some(last), Some(end)) => {
                end.saturating_duration_since(first.0).as_secs_f64()
                    / last.0.duration_since(first.0).as_secs_f64()
            }
            _ => f64::NAN,
        };
        let rss_timeline = (0..=10)
            .filter_map(|tenth| samples.get((n.saturating_sub(1)) * tenth / 10))
            .map(|(_, kib)| mib(*kib))
            .collect();
        let wanted = [
            "lm_requests_total",
            "lm_prefix_cache_hit_tokens_total",
            "lm_prompt_tokens_total",
            "lm_prefix_cache_entries",
            "lm_prefix_cache_bytes",
            "lm_active_sequences",
        ];
        let metrics = metrics
            .lines()
            .filter_map(|line| line.split_once(' '))
            .filter(|(name, _)| wanted.contains(name))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        Self {
            driven,
            warm_share,
            by_kind,
            by_status,
            problems,
            ttft_ms,
            rss_warm,
            rss_end,
            rss_timeline,
            drain,
            metrics,
            panicked: server_log.contains("panicked"),
        }
    }

    fn percentile(&self, p: f64) -> Option<f64> {
        let n = self.ttft_ms.len();
        let idx = ((n as f64 * p).ceil() as usize).clamp(1, n.max(1)) - 1;
        self.ttft_ms.get(idx).copied()
    }

    /// NaN when the run was too short to have a sample after warm-up.
    fn rss_growth(&self) -> f64 {
        if self.rss_end > 0.0 && self.rss_warm > 0.0 {
            self.rss_end / self.rss_warm - 1.0
        } else {
            f64::NAN
        }
    }

    fn n_5xx(&self) -> usize {
        self.by_status
            .iter()
            .filter(|(status, _)| status.starts_with('5'))
            .map(|(_, n)| n)
            .sum()
    }

    /// The verdict: every limit of the module's doc.
    fn check(&self, latency_limit: bool, max_rss_growth: f64) -> Result<()> {
        let mut failures = Vec::new();
        if self.n_5xx() > 0 {
            failures.push(format!(
                "{} answers were 5xx before the drain",
                self.n_5xx()
            ));
        }
        if !self.problems.is_empty() {
            failures.push(format!(
                "{} requests broke the protocol",
                self.problems.len()
            ));
        }
        // NaN (no samples) fails too.
        if self.rss_growth().is_nan() || self.rss_growth() >= max_rss_growth {
            failures.push(format!(
                "RSS grew {:.1}% after warm-up (limit {:.0}%; NaN: no sample after warm-up, \
                 run longer)",
                self.rss_growth() * 100.0,
                max_rss_growth * 100.0
            ));
        }
        match self.percentile(0.99) {
            Some(p99) if p99 < MAX_P99_TTFT.as_secs_f64() * 1e3 || !latency_limit => {}
            p99 => failures.push(format!(
                "p99 time to first token {p99:?} ms (limit {} ms)",
                MAX_P99_TTFT.as_millis()
            )),
        }
        if !self.drain.violations.is_empty() {
            failures.push(format!(
                "the drain broke {} promises",
                self.drain.violations.len()
            ));
        }
        if self.panicked {
            failures.push("the server panicked".into());
        }
        if failures.is_empty() {
            println!("soak passed");
            Ok(())
        } else {
            bail!("soak failed: {}", failures.join("; "))
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: usize = self.by_kind.values().sum();
        let secs = self.driven.as_secs_f64();
        writeln!(
            f,
            "requests: {total} in {secs:.0} s ({:.1}/s)",
            total as f64 / secs
        )?;
        writeln!(f, "  by kind: {:?}", self.by_kind)?;
        writeln!(f, "  by status: {:?}", self.by_status)?;
        for problem in self.problems.iter().take(10) {
            writeln!(f, "  problem: {problem}")?;
        }
        let ms = |p| {
            self.percentile(p)
                .map_or("-".to_owned(), |v| format!("{v:.0} ms"))
        };
        writeln!(
            f,
            "time to first token ({} streams): p50 {}, p90 {}, p99 {}, max {}",
            self.ttft_ms.len(),
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(1.0)
        )?;
        writeln!(
            f,
            "RSS: peak in warm-up (the first {:.0}% of the run) {:.1} MiB, peak after it {:.1} MiB: \
             {:+.2}%",
            self.warm_share * 100.0,
            self.rss_warm,
            self.rss_end,
            self.rss_growth() * 100.0
        )?;
        let timeline: Vec<String> = self
            .rss_timeline
            .iter()
            .map(|m| format!("{m:.0}"))
            .collect();
        writeln!(
            f,
            "  RSS per tenth of the run (MiB): {}",
            timeline.join(" ")
        )?;
        for (name, value) in &self.metrics {
            writeln!(f, "  {name} {value}")?;
        }
        let d = &self.drain;
        writeln!(
            f,
            "drain (SIGTERM, grace {GRACE_SECONDS} s): finished {}, cut off with an error {}, \
             late requests refused {}, exit {} after {:.1} s",
            d.finished,
            d.cut_with_error,
            d.refused_late,
            d.exit,
            d.took.as_secs_f64()
        )?;
        for violation in &d.violations {
            writeln!(f, "  drain violation: {violation}")?;
        }
        Ok(())
    }
}

/// A minimal HTTP/1 client over hyper: one connection per request, closed
/// when the response is dropped (how a client that goes away looks).
pub(crate) mod client {
    use std::net::SocketAddr;

    use http_body_util::{BodyExt, Full};
    use hyper::body::{Bytes, Incoming};
    use hyper_util::rt::TokioIo;

    /// Why an exchange failed.
    pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

    /// A response whose body is still arriving.
    pub(crate) struct Response {
        pub(crate) status: u16,
        body: Incoming,
        connection: tokio::task::JoinHandle<()>,
    }

    impl Response {
        /// The next piece of the body, `None` at its end.
        pub(crate) async fn next_chunk(&mut self) -> Result<Option<Bytes>, Error> {
            while let Some(frame) = self.body.frame().await {
                if let Ok(data) = frame?.into_data() {
                    return Ok(Some(data));
                }
            }
            Ok(None)
        }

        /// The whole body.
        pub(crate) async fn collect(mut self) -> Result<Vec<u8>, Error> {
            let mut body = Vec::new();
            while let Some(chunk) = self.next_chunk().await? {
                body.extend_from_slice(&chunk);
            }
            Ok(body)
        }
    }

    impl Drop for Response {
        fn drop(&mut self) {
            self.connection.abort();
        }
    }

    /// A whole answer.
    pub(crate) struct Answer {
        pub(crate) status: u16,
        pub(crate) body: Vec<u8>,
    }

    /// `POST path` with a JSON body.
    pub(crate) async fn post(
        addr: SocketAddr,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Response, Error> {
        send(addr, hyper::Method::POST, path, body).await
    }

    /// `GET path`, read whole.
    pub(crate) async fn get(addr: SocketAddr, path: &str) -> Result<Answer, Error> {
        let response = send(addr, hyper::Method::GET, path, Vec::new()).await?;
        let status = response.status;
        Ok(Answer {
            status,
            body: response.collect().await?,
        })
    }

    async fn send(
        addr: SocketAddr,
        method: hyper::Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Response, Error> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let response = sender.send_request(request).await;
        let response = match response {
            Ok(response) => response,
            Err(err) => {
                connection.abort();
                return Err(err.into());
            }
        };
        Ok(Response {
            status: response.status().as_u16(),
            body: response.into_body(),
            connection,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;

    #[test]
    fn bad_options_are_refused() {
        crate::assert_refused(
            parse,
            &[
                &["--minutes"],
                &["--minutes", "-1"],
                &["--clients", "none"],
                &["--fast", "1"],
                &["--max-rss-growth", "0"],
                &["--lm-cli", "/no/such/lm-cli"],
            ],
        );
        let settings = parse(&args(&["--minutes", "0.5", "--clients", "4"])).unwrap();
        assert_eq!((settings.minutes, settings.n_clients), (0.5, 4));
        assert!(settings.latency_limit);
        let settings = parse(&args(&["--no-latency-limit", "--minutes", "2"])).unwrap();
        assert_eq!((settings.latency_limit, settings.minutes), (false, 2.0));
        assert_eq!(settings.max_rss_growth, MAX_RSS_GROWTH);
        let settings = parse(&args(&["--max-rss-growth", "10"])).unwrap();
        assert_eq!(settings.max_rss_growth, 0.1);
        let binary = std::env::current_exe().unwrap();
        let settings = parse(&args(&["--lm-cli", binary.to_str().unwrap()])).unwrap();
        assert_eq!(settings.binary, Some(binary));
    }

    #[test]
    fn a_stream_is_judged_by_its_last_events() {
        let done = |finish: Option<&str>, error: Option<&str>| Stream {
            finish_reason: finish.map(str::to_owned),
            error: error.map(str::to_owned),
            done: true,
            ..Stream::default()
        };
        assert_eq!(done(Some("length"), None).problem(Kind::ChatStream), None);
        assert!(done(None, None).problem(Kind::ChatStream).is_some());
        assert!(
            done(Some("stop"), Some("{}"))
                .problem(Kind::ChatStream)
                .is_some()
        );
        let cut = Stream {
            finish_reason: Some("stop".into()),
            ..Stream::default()
        };
        assert!(cut.problem(Kind::CompletionStream).is_some());
    }

    #[test]
    fn structured_answers_must_be_the_schemas_json() {
        let answer = |content: &str, reason: &str| {
            serde_json::to_vec(&json!({"choices": [{"message": {"content": content},
                                                    "finish_reason": reason}]}))
            .unwrap()
        };
        let check = |content, reason| check_whole(Kind::Structured, &answer(content, reason));
        assert_eq!(check(r#"{"answer": "Paris"}"#, "stop"), None);
        assert!(check(r#"{"answer": 3}"#, "stop").is_some());
        assert!(check("Paris", "stop").is_some());
        // Cut by max_tokens: incomplete JSON is expected.
        assert_eq!(check(r#"{"answer": "Par"#, "length"), None);
    }
}
