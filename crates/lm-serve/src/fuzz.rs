//! A seeded fuzzer of the HTTP API, shared by lm-serve's fuzz test (a few
//! thousand requests) and `cargo xtask fuzz-serve` (100,000): not part of
//! the crate's API.
//!
//! ```text
//! fuzzer (this process)                     server (a child process)
//!   case(seed, idx): a request from  ──HTTP──>  the toy decoder behind
//!   OpenAI's schema, then mutated    <──────    lm-serve, on loopback
//!   every answer must be 2xx or 4xx; after the run the server still
//!   serves, holds no sequence, printed no panic, and its RSS is at most
//!   twice what it was idle
//! ```
//!
//! The server runs in a process of its own so its RSS is its own (the
//! test harness runs other servers in the fuzzer's process). Case `idx` of
//! seed `s` is ChaCha8 stream `idx` of `s`, so a failure replays alone.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lm::lm_model::{Decoder, TOY_VOCAB, Toy, ToyArchitecture};
use lm_core::{Detokenize, TokenId};
use lm_tokenize::Message;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::{Map, Value, json};

use crate::{ServeConfig, ServeError, ServedText, Server, TextFailure};

/// The toy decoder with room for long runs (1,024 positions).
pub fn toy_model() -> Decoder {
    Toy::with_options(ToyArchitecture::Llama, 1024, Toy::SEED)
        .expect("the toy's built-in options are valid")
}

/// The toy's seven words; its "chat template" is the last message's text
/// after `<start>`.
#[derive(Debug)]
pub struct ToyText;

impl ServedText for ToyText {
    fn detokenizer(&self) -> &dyn Detokenize {
        &Toy
    }

    fn encode(&self, text: &str) -> Result<Vec<TokenId>, TextFailure> {
        Toy::encode(text).map_err(|word| format!("unknown toy word '{word}'").into())
    }

    fn chat_prompt(&self, messages: &[Message]) -> Result<String, TextFailure> {
        let last = messages.last().map_or("", |m| m.content.as_str());
        Ok(format!("<start> {last}"))
    }

    fn end_tokens(&self) -> Vec<TokenId> {
        vec![Toy::END]
    }
}

/// The fuzzed server's settings: the defaults but a loopback port of its
/// own and no prefix cache (the cache keeps finished states up to its
/// budget by design, 256 MiB by default; the run looks for growth that no
/// setting bounds).
pub fn server_config() -> ServeConfig {
    ServeConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        cache_bytes: 0,
        ..ServeConfig::default()
    }
}

/// The server side, set up as `lm-cli serve` is: serves the toy decoder,
/// calls `announce` with its address, and stops (as on a signal) once
/// `wait` returns.
pub fn serve_toy(announce: impl FnOnce(SocketAddr), wait: impl FnOnce()) -> Result<(), ServeError> {
    // As `lm-cli` does at its start: freed large blocks (request bodies)
    // go back to the system, so the RSS is what the server holds.
    lm::lm_model::map_large_allocations();
    let server = Server::bind(Arc::new(toy_model()), Arc::new(ToyText), server_config())?;
    announce(server.local_addr());
    let running = server.spawn()?;
    wait();
    running.stop()
}

/// The line a server process prints (on stdout) before the address.
pub const LISTENING: &str = "lm-serve fuzz target listening on ";

/// A server process started by [`ServerProcess::spawn`]: it serves until its
/// stdin closes.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Where it listens.
    pub addr: SocketAddr,
    stderr: std::thread::JoinHandle<String>,
}

impl ServerProcess {
    /// Runs `command`, which must call [`serve_toy`], print [`LISTENING`]
    /// and the address on stdout, and wait for its stdin to close.
    pub fn spawn(mut command: Command) -> Result<Self, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the server process: {e}"))?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut stderr = child.stderr.take().ok_or("no stderr")?;
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut line = String::new();
        let addr = loop {
            line.clear();
            if stdout.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                let _ = child.wait();
                let err = stderr.join().unwrap_or_default();
                return Err(format!("the server process ended before listening: {err}"));
            }
            // Anywhere in the line: a test harness may have begun it.
            if let Some(addr) = line.trim().split(LISTENING).nth(1) {
                break addr
                    .parse()
                    .map_err(|e| format!("bad address {addr:?}: {e}"))?;
            }
        };
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        Ok(Self {
            child,
            stdin,
            addr,
            stderr,
        })
    }

    /// The process id, for its RSS.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes its stdin and waits: `Err` unless it exits 0 without a panic.
    pub fn stop(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        let status = self.child.wait().map_err(|e| e.to_string())?;
        let stderr = std::mem::replace(&mut self.stderr, std::thread::spawn(String::new))
            .join()
            .unwrap_or_default();
        // The first lines say where; the backtraces after them can run long.
        let head: String = stderr.lines().take(12).collect::<Vec<_>>().join("\n");
        if stderr.contains("panicked") {
            return Err(format!("the server panicked:\n{head}"));
        }
        if !status.success() {
            return Err(format!("the server exited with {status}:\n{head}"));
        }
        Ok(())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One fuzzed request.
#[derive(Debug, Clone)]
pub struct Case {
    /// `POST` mostly.
    pub method: &'static str,
    /// The endpoint.
    pub path: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<&'static str>,
    /// The body, not always JSON nor UTF-8.
    pub body: Vec<u8>,
}

/// The largest body a case holds (above the server's 1 MiB cap, for 413s).
const MAX_CASE_BYTES: usize = (1 << 20) + 4096;

/// Case `idx` of `seed`.
pub fn case(seed: u64, idx: u64) -> Case {
    let mut r = Rng(ChaCha8Rng::seed_from_u64(seed));
    r.0.set_stream(idx);
    let chat = r.chance(1, 2);
    let mut value = if chat {
        valid_chat(&mut r)
    } else {
        valid_completion(&mut r)
    };
    let mut path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    }
    .to_owned();
    let mut method = "POST";
    // Other endpoints now and then.
    match r.below(20) {
        0 => path = "/tokenize".into(),
        1 => {
            path = "/detokenize".into();
            value = json!({"tokens": token_ids(&mut r)});
        }
        2 => method = "GET",
        3 => {
            path = r
                .pick(&[
                    "/v1/models",
                    "/health",
                    "/metrics",
                    "/v1/../v1/models",
                    "/%ff%fe",
                    "/v1/completions?x=1",
                ])
                .to_string()
        }
        _ => {}
    }
    // 1 in 3 valid; the others mutated, some of them several times.
    if !r.chance(1, 3) {
        for _ in 0..=r.below(3) {
            mutate_value(&mut r, &mut value);
        }
    }
    let mut body = serde_json::to_vec(&value).unwrap_or_default();
    if r.chance(1, 4) {
        mutate_bytes(&mut r, &mut body);
    }
    body.truncate(MAX_CASE_BYTES);
    let content_type = match r.below(10) {
        0 => None,
        1 => Some(*r.pick(&[
            "text/plain",
            "application/json; charset=utf-16",
            "multipart/form-data; boundary=x",
            "application/x-www-form-urlencoded",
            "application/json\u{0}",
        ])),
        _ => Some("application/json"),
    };
    Case {
        method,
        path,
        content_type,
        body,
    }
}

/// A ChaCha8 stream with the few draws the generator needs.
struct Rng(ChaCha8Rng);

impl Rng {
    /// Uniform in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n
    }

    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// Uniform in `[lo, hi)`.
    fn float(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Toy words (now and then one the toy does not know).
fn prompt_text(r: &mut Rng) -> String {
    let mut words = vec!["<start>"];
    for _ in 0..r.below(12) {
        words.push(if r.chance(1, 30) {
            *r.pick(&["hello", "<|im_end|>", "é", "\u{1F642}", ""])
        } else {
            *r.pick(&TOY_VOCAB[1..6])
        });
    }
    words.join(" ")
}

fn token_ids(r: &mut Rng) -> Vec<u64> {
    (0..1 + r.below(10)).map(|_| r.below(7)).collect()
}

/// The sampling fields both endpoints take, each present at random.
fn sampling_fields(r: &mut Rng, m: &mut Map<String, Value>) {
    let mut maybe = |r: &mut Rng, key: &str, value: Value| {
        if r.chance(1, 3) {
            m.insert(key.to_owned(), value);
        }
    };
    let (temperature, top_p, seed) = (r.float(0.0, 2.0), r.float(0.01, 1.0), r.0.next_u64());
    maybe(r, "temperature", json!(temperature));
    maybe(r, "top_p", json!(top_p));
    let n = 1 + r.below(2);
    maybe(r, "n", json!(n));
    let stop = if r.chance(1, 2) {
        json!("cat")
    } else {
        json!(["dog", "sat"])
    };
    maybe(r, "stop", stop);
    maybe(r, "seed", json!(seed));
    let stream = r.chance(1, 2);
    maybe(r, "stream", json!(stream));
    let usage = r.chance(1, 2);
    maybe(r, "stream_options", json!({"include_usage": usage}));
    let (presence, frequency) = (r.float(-2.0, 2.0), r.float(-2.0, 2.0));
    maybe(r, "presence_penalty", json!(presence));
    maybe(r, "frequency_penalty", json!(frequency));
    maybe(r, "logit_bias", json!({"6": -100}));
    let (top_k, min_p, repetition) = (r.below(8), r.float(0.0, 1.0), r.float(1.0, 2.0));
    maybe(r, "top_k", json!(top_k));
    maybe(r, "min_p", json!(min_p));
    maybe(r, "repetition_penalty", json!(repetition));
    let model = if r.chance(9, 10) { "lm" } else { "gpt-4o" };
    maybe(r, "model", json!(model));
    // The toy has no vocabulary to hold output to JSON: json_object is a 400.
    let format = if r.chance(9, 10) {
        json!({"type": "text"})
    } else {
        json!({"type": "json_object"})
    };
    maybe(r, "response_format", format);
    maybe(r, "user", json!("fuzz"));
    later_stage_fields(r, m);
}

/// llama-server's and HF's sampler fields (issue 38), each present at
/// random with a value in range.
fn later_stage_fields(r: &mut Rng, m: &mut Map<String, Value>) {
    let mut maybe = |r: &mut Rng, key: &str, value: Value| {
        if r.chance(1, 4) {
            m.insert(key.to_owned(), value);
        }
    };
    let (dry, mirostat, ngram) = (r.float(0.0, 2.0), r.below(3), r.below(4));
    let window = r.below(64) as i64 - 1;
    maybe(r, "dry_multiplier", json!(dry));
    maybe(r, "dry_penalty_last_n", json!(window));
    maybe(r, "dry_sequence_breakers", json!(["cat", "\n"]));
    maybe(r, "mirostat", json!(mirostat));
    maybe(r, "no_repeat_ngram_size", json!(ngram));
    let (epsilon, range) = (r.float(0.0, 0.5), r.float(0.0, 1.0));
    maybe(r, "epsilon_cutoff", json!(epsilon));
    maybe(r, "dynatemp_range", json!(range));
    let order = if r.chance(1, 2) {
        json!("top_k;min_p;temperature")
    } else {
        json!(["penalties", "dry", "temperature", "xtc"])
    };
    maybe(r, "samplers", order);
}

fn valid_completion(r: &mut Rng) -> Value {
    let mut m = Map::new();
    let prompt = match r.below(3) {
        0 => json!(prompt_text(r)),
        1 => json!([prompt_text(r)]),
        _ => {
            let mut ids = token_ids(r);
            ids.insert(0, 0);
            json!(ids)
        }
    };
    m.insert("prompt".into(), prompt);
    if r.chance(9, 10) {
        m.insert("max_tokens".into(), json!(1 + r.below(8)));
    }
    if r.chance(1, 4) {
        m.insert("logprobs".into(), json!(r.below(6)));
    }
    if r.chance(1, 10) {
        m.insert("echo".into(), json!(false));
    }
    sampling_fields(r, &mut m);
    Value::Object(m)
}

fn valid_chat(r: &mut Rng) -> Value {
    let mut m = Map::new();
    let messages: Vec<Value> = (0..1 + r.below(4))
        .map(|_| {
            let role = *r.pick(&["system", "user", "user", "assistant", "developer"]);
            let words = prompt_text(r);
            let text = words.trim_start_matches("<start>").trim();
            let content = if r.chance(1, 5) {
                json!([{"type": "text", "text": text}])
            } else {
                json!(text)
            };
            json!({"role": role, "content": content})
        })
        .collect();
    m.insert("messages".into(), Value::Array(messages));
    let key = if r.chance(1, 2) {
        "max_tokens"
    } else {
        "max_completion_tokens"
    };
    if r.chance(19, 20) {
        m.insert(key.into(), json!(1 + r.below(8)));
    }
    if r.chance(1, 4) {
        m.insert("logprobs".into(), json!(true));
        m.insert("top_logprobs".into(), json!(r.below(6)));
    }
    sampling_fields(r, &mut m);
    Value::Object(m)
}

/// A value of any type, some at the edges of what JSON numbers and
/// strings hold, some large.
fn weird_value(r: &mut Rng) -> Value {
    match r.below(24) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(-1),
        3 => json!(0),
        4 => json!(u64::MAX),
        5 => json!(i64::MIN),
        6 => json!(1e308),
        7 => json!(-1e308),
        8 => json!(f64::MIN_POSITIVE),
        9 => json!(1.5),
        10 => json!(""),
        11 => json!("\u{0}\u{FFFF}\u{10FFFF}"),
        12 => json!("x".repeat(1 + r.below(200_000) as usize)),
        13 => json!([]),
        14 => json!({}),
        15 => json!([1, "a", null, {}]),
        16 => json!({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}),
        17 => Value::Array((0..r.below(20_000)).map(|i| json!(i)).collect()),
        18 => Value::Array((0..r.below(5_000)).map(|_| json!("cat")).collect()),
        19 => Value::Object(
            (0..r.below(5_000))
                .map(|i| (i.to_string(), json!(-100)))
                .collect(),
        ),
        20 => nested(r.below(200) as usize),
        21 => json!([{"role": "user"}, {"content": 3}, "x", {"role": "tool", "content": null}]),
        22 => json!("<start> the cat"),
        _ => json!(r.0.next_u64()),
    }
}

fn nested(depth: usize) -> Value {
    let mut value = json!(1);
    for level in 0..depth {
        value = if level % 2 == 0 {
            json!([value])
        } else {
            json!({ "a": value })
        };
    }
    value
}

/// One change to the JSON: a field set to a value of another type or
/// size, removed, added, or the whole body replaced.
fn mutate_value(r: &mut Rng, value: &mut Value) {
    let Value::Object(m) = value else {
        *value = weird_value(r);
        return;
    };
    let keys: Vec<String> = m.keys().cloned().collect();
    match r.below(10) {
        0..=4 if !keys.is_empty() => {
            let key = r.pick(&keys).clone();
            m.insert(key, weird_value(r));
        }
        5 if !keys.is_empty() => {
            let key = r.pick(&keys).clone();
            m.remove(&key);
        }
        6 => {
            // A known field the valid request did not set.
            let key = *r.pick(&[
                "n",
                "max_tokens",
                "logprobs",
                "top_logprobs",
                "stop",
                "logit_bias",
                "seed",
                "temperature",
                "messages",
                "prompt",
                "stream_options",
                "response_format",
                "dry_sequence_breakers",
                "samplers",
                "mirostat",
                "dry_multiplier",
                "best_of",
                "suffix",
                "tools",
                "functions",
            ]);
            m.insert(key.to_owned(), weird_value(r));
        }
        7 => {
            // Inside messages or the prompt array.
            let key = if m.contains_key("messages") {
                "messages"
            } else {
                "prompt"
            };
            if let Some(Value::Array(items)) = m.get_mut(key)
                && !items.is_empty()
            {
                let idx = r.below(items.len() as u64) as usize;
                items[idx] = match &items[idx] {
                    Value::Object(msg) => {
                        let mut msg = msg.clone();
                        let key = *r.pick(&["role", "content", "name"]);
                        msg.insert(key.to_owned(), weird_value(r));
                        Value::Object(msg)
                    }
                    _ => weird_value(r),
                };
            }
        }
        8 => *value = nested(1 + r.below(150) as usize),
        _ => *value = weird_value(r),
    }
}

/// Byte strings [`mutate_bytes`] inserts: bad UTF-8 (a stray continuation
/// byte, a cut sequence, an overlong `/`, an encoded surrogate, a code point
/// past U+10FFFF), then JSON escapes (lone surrogates, NUL, a pair, a short
/// and a foreign escape).
const INSERTIONS: [[&[u8]; 6]; 2] = [
    [
        b"\xff",
        b"\xc3",
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe2\x82",
    ],
    [
        b"\\ud800",
        b"\\udfff",
        b"\\u0000",
        b"\\uD83D\\uDE00",
        b"\\u12",
        b"\\x41",
    ],
];

/// One change to the bytes: bad UTF-8, a lone surrogate, a NUL, a cut, a
/// flipped byte, UTF-16, a BOM, or noise.
fn mutate_bytes(r: &mut Rng, body: &mut Vec<u8>) {
    let at = r.below(body.len() as u64 + 1) as usize;
    match r.below(10) {
        kind @ (0 | 1) => {
            let inserted = *r.pick(&INSERTIONS[kind as usize]);
            body.splice(at..at, inserted.iter().copied());
        }
        2 => body.insert(at, 0),
        3 => body.truncate(at),
        4 => {
            if let Some(byte) = body.get_mut(at) {
                *byte ^= 1 << r.below(8);
            }
        }
        5 => {
            let text = String::from_utf8_lossy(body).into_owned();
            *body = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        }
        6 => {
            body.splice(0..0, *b"\xef\xbb\xbf");
        }
        7 => *body = (0..r.below(4096)).map(|_| r.below(256) as u8).collect(),
        8 => body.resize((1 << 20) + 1 + r.below(4096) as usize, b' '),
        // Deep nesting, built as bytes (a `Value` this deep would overflow
        // the fuzzer's own stack when serialized or dropped).
        _ => {
            let depth = 1 + r.below(100_000) as usize;
            let balanced = r.chance(1, 2);
            let mut deep = b"{\"prompt\":".repeat(depth);
            if balanced {
                deep.extend_from_slice(b"1");
                deep.extend(std::iter::repeat_n(b'}', depth));
            }
            *body = deep;
        }
    }
}

/// How a fuzz run went.
#[derive(Debug, Default)]
pub struct Report {
    /// Requests sent.
    pub n_requests: u64,
    /// Answers by status; 0 counts oversized bodies the server dropped the
    /// connection on (its documented answer is 413 or a drop).
    pub statuses: BTreeMap<u16, u64>,
    /// What went wrong, with the seed and index that replay it (the first
    /// 20 kept).
    pub failures: Vec<String>,
    /// How many went wrong.
    pub n_failures: u64,
    /// The server's RSS (KiB) right after start and a few answers.
    pub rss_fresh_kib: u64,
    /// Its RSS at rest after a warm-up (see [`run`]): the baseline.
    pub rss_idle_kib: u64,
    /// Its RSS once the run is over and every sequence has ended.
    pub rss_after_kib: u64,
    /// Its RSS (KiB) as the run went, every tenth of the requests: growth
    /// that flattens is the allocator settling, growth that keeps on is a
    /// leak.
    pub rss_trace_kib: Vec<(u64, u64)>,
    /// The run's wall time.
    pub elapsed: Duration,
}

impl Report {
    /// `Err` naming what broke the rules: a failure, or RSS above twice idle.
    pub fn check(&self) -> Result<(), String> {
        if self.n_failures > 0 {
            return Err(format!(
                "{} of {} requests failed; the first:\n{}",
                self.n_failures,
                self.n_requests,
                self.failures.join("\n")
            ));
        }
        if self.rss_after_kib > 2 * self.rss_idle_kib {
            return Err(format!(
                "the server's RSS grew from {} KiB idle to {} KiB, more than twice",
                self.rss_idle_kib, self.rss_after_kib
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(status, n)| format!("{status}: {n}"))
            .collect();
        let trace: Vec<String> = self
            .rss_trace_kib
            .iter()
            .map(|(idx, kib)| format!("{idx}: {kib}"))
            .collect();
        write!(
            f,
            "{} requests in {:.1} s ({:.0}/s); statuses {{{}}}; failures {}; RSS fresh {} KiB, idle {} KiB, after {} KiB ({:.2}x idle); RSS by request {{{}}}",
            self.n_requests,
            self.elapsed.as_secs_f64(),
            self.n_requests as f64 / self.elapsed.as_secs_f64().max(1e-9),
            statuses.join(", "),
            self.n_failures,
            self.rss_fresh_kib,
            self.rss_idle_kib,
            self.rss_after_kib,
            self.rss_after_kib as f64 / self.rss_idle_kib.max(1) as f64,
            trace.join(", ")
        )
    }
}

/// A process's resident set (KiB), from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Cases sent, from another seed, before idle is measured.
const N_WARM_UP: u64 = 1_000;

/// Sends cases `0..n_requests` of `seed` from `n_clients` threads to the
/// server at `addr` (process `pid`) and reports.
///
/// Idle is measured at rest after a warm-up of 1,000 fuzzed cases (`N_WARM_UP`)
/// (another seed), so that it includes what any serving holds for good:
/// the allocator's arenas of every thread, the connection buffers of
/// `n_clients` at once. Right after start the toy's server holds about
/// 14 MB (no weights to speak of), and those settle at 10 to 15 MB more;
/// against a real model's hundreds of MB they are noise, against the
/// toy's they would be the whole ratio. [`Report::rss_fresh_kib`] keeps
/// the RSS right after start, and the trace shows whether it keeps
/// growing.
pub fn run(addr: SocketAddr, pid: u32, n_requests: u64, seed: u64, n_clients: u64) -> Report {
    let started = Instant::now();
    let mut report = Report::default();
    for path in ["/health", "/v1/models", "/metrics"] {
        let _ = send(addr, &get(path));
    }
    let _ = send(addr, &warm_up(0));
    report.rss_fresh_kib = rss_kib(pid).unwrap_or(0);
    let mut warm = Report::default();
    send_cases(
        addr,
        pid,
        seed ^ 0x5eed_0000,
        N_WARM_UP,
        n_clients,
        &mut warm,
    );
    let mut failures = warm.failures;
    report.n_failures += warm.n_failures;
    failures.extend(wait_at_rest(addr));
    report.rss_idle_kib = rss_kib(pid).unwrap_or(0);
    send_cases(addr, pid, seed, n_requests, n_clients, &mut report);
    // After: still serving, and every sequence ended.
    match send(addr, &warm_up(0)) {
        Ok(200) => {}
        other => failures.push(format!("after the run, a valid request got {other:?}")),
    }
    failures.extend(wait_at_rest(addr));
    report.rss_after_kib = rss_kib(pid).unwrap_or(u64::MAX);
    report.n_failures += failures.len() as u64;
    report.failures.extend(failures);
    report.elapsed = started.elapsed();
    report
}

/// Waits (30 s at most) until no sequence runs or waits; `Some` if in vain.
fn wait_at_rest(addr: SocketAddr) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let at_rest = metric(addr, "lm_active_sequences") == Some(0.0)
            && metric(addr, "lm_queue_depth") == Some(0.0);
        if at_rest {
            return None;
        }
        if Instant::now() > deadline {
            return Some("30 s after the run, sequences are still active".to_owned());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends cases `0..n_requests` of `seed` from `n_clients` threads, into
/// `report`.
fn send_cases(
    addr: SocketAddr,
    pid: u32,
    seed: u64,
    n_requests: u64,
    n_clients: u64,
    report: &mut Report,
) {
    let next = AtomicU64::new(0);
    let shared = Mutex::new(report);
    std::thread::scope(|scope| {
        for _ in 0..n_clients.max(1) {
            scope.spawn(|| {
                loop {
                    let idx = next.fetch_add(1, Ordering::Relaxed);
                    if idx >= n_requests {
                        break;
                    }
                    if idx.is_multiple_of((n_requests / 10).max(1)) {
                        let rss = rss_kib(pid).unwrap_or(0);
                        let mut report = shared.lock().unwrap_or_else(|e| e.into_inner());
                        report.rss_trace_kib.push((idx, rss));
                    }
                    let case = case(seed, idx);
                    let outcome = send(addr, &case);
                    let mut report = shared.lock().unwrap_or_else(|e| e.into_inner());
                    report.n_requests += 1;
                    match outcome {
                        Ok(status) => *report.statuses.entry(status).or_default() += 1,
                        Err(problem) => {
                            report.n_failures += 1;
                            if report.failures.len() < 20 {
                                report.failures.push(format!(
                                    "seed {seed} case {idx}: {problem}; {} {} ({:?}) {}",
                                    case.method,
                                    case.path,
                                    case.content_type,
                                    preview(&case.body)
                                ));
                            }
                        }
                    }
                }
            });
        }
    });
}

fn get(path: &str) -> Case {
    Case {
        method: "GET",
        path: path.to_owned(),
        content_type: None,
        body: Vec::new(),
    }
}

fn warm_up(idx: u64) -> Case {
    let body =
        json!({"prompt": "<start> the cat", "max_tokens": 4, "seed": idx, "stream": idx % 2 == 1});
    Case {
        method: "POST",
        path: "/v1/completions".to_owned(),
        content_type: Some("application/json"),
        body: body.to_string().into_bytes(),
    }
}

/// The start of a body, printable.
fn preview(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    format!("{} bytes: {text:?}", body.len())
}

/// A Prometheus metric of the server.
fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let (_, _, body) = exchange(addr, &get("/metrics")).ok()?;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))?
        .parse()
        .ok()
}

/// Sends `case` and checks the answer: its status when the server kept
/// its promises, else what it did wrong.
pub fn send(addr: SocketAddr, case: &Case) -> Result<u16, String> {
    let oversized = case.body.len() > server_config().max_body_bytes;
    let (status, head, body) = match exchange(addr, case) {
        Ok(answer) => answer,
        Err(_) if oversized => return Ok(0),
        Err(e) => return Err(e),
    };
    if status >= 500 {
        return Err(format!("status {status}: {}", preview(&body)));
    }
    let head = head.to_ascii_lowercase();
    if status == 200 && head.contains("content-type: text/event-stream") {
        if !String::from_utf8_lossy(&body).contains("data: [DONE]") {
            return Err(format!("a stream without data: [DONE]: {}", preview(&body)));
        }
    } else if head.contains("content-type: application/json")
        && serde_json::from_slice::<Value>(&body).is_err()
    {
        return Err(format!(
            "status {status} with a body that is not JSON: {}",
            preview(&body)
        ));
    }
    Ok(status)
}

/// One request on a connection of its own: the status, the head and the
/// body (de-chunked).
fn exchange(addr: SocketAddr, case: &Case) -> Result<(u16, String, Vec<u8>), String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .map_err(|e| format!("cannot connect: {e}"))?;
    let timeout = Some(Duration::from_secs(60));
    stream
        .set_read_timeout(timeout)
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(timeout)
        .map_err(|e| e.to_string())?;
    let content_type = case
        .content_type
        .map_or(String::new(), |t| format!("Content-Type: {t}\r\n"));
    let head = format!(
        "{} {} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n{content_type}Content-Length: {}\r\n\r\n",
        case.method,
        case.path,
        case.body.len()
    );
    stream
        .write_all(head.as_bytes())
        .map_err(|e| format!("cannot send: {e}"))?;
    // The server may answer (413) and close before reading it all.
    let _ = stream.write_all(&case.body);
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    let Some(split) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Err(match read {
            Err(e) => format!("no answer ({e})"),
            Ok(_) => format!("no answer (connection closed after {} bytes)", answer.len()),
        });
    };
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {head:?}"))?;
    if let Err(e) = read {
        return Err(format!("status {status}, then the answer broke off ({e})"));
    }
    let raw = &answer[split + 4..];
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(raw).ok_or_else(|| format!("status {status}: a malformed chunked body"))?
    } else {
        raw.to_vec()
    };
    Ok((status, head, body))
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).ok()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::{case, dechunk, rss_kib};

    #[test]
    fn a_case_replays_from_its_seed_and_index() {
        let (a, b) = (case(7, 123), case(7, 123));
        assert_eq!(
            (a.method, &a.path, a.content_type, &a.body),
            (b.method, &b.path, b.content_type, &b.body)
        );
        let distinct: std::collections::HashSet<Vec<u8>> =
            (0..200).map(|idx| case(7, idx).body).collect();
        assert!(distinct.len() > 150, "{}", distinct.len());
        // Every case is bounded.
        assert!((0..500).all(|idx| case(1, idx).body.len() <= super::MAX_CASE_BYTES));
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
        assert_eq!(dechunk(b"5\r\nab"), None);
    }

    #[test]
    fn rss_is_read_for_this_process() {
        assert!(rss_kib(std::process::id()).is_some_and(|kib| kib > 0));
    }
}
