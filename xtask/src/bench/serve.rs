//! `cargo xtask bench --serve`: continuous batching on SmolLM2, measured
//! in one release worker process: an lm-serve server on loopback, the same
//! 128-token streaming completions sent one at a time and then by N clients
//! at once, against the model's prefill rate in the same process.
//!
//! ```text
//! solo:      N requests one after another     -> single-client tok/s, N outputs
//! together:  the N requests at once           -> aggregate tok/s, outputs == solo?
//! loop:      after each solo request, its prompt through lm-decode's loop in
//!            this process (what `lm-cli generate` runs) -> the server's overhead
//! prefill:   one 16-token and one 128-token forward pass -> the batching bound
//! ```
//!
//! The server's overhead per token is (solo time - loop time) / tokens: the
//! HTTP request, the worker, scheduler and HTTP threads each token crosses,
//! and the JSON of each event. Both sides read the same prompt, sample at
//! the same temperature with the same seed and decode the text with the
//! same detokenizer; the loop has no end tokens where the server biases
//! them away, so both make all their tokens.
//!
//! Issue 15's bar: aggregate >= 2x single-client and >= 70% of the prefill
//! rate (a step of 16 sequences costs about what a 16-token prefill does).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use lm_core::TokenId;
use lm_decode::{GenerationConfig, SamplingConfig, generate};
use lm_model::{Decoder, Llama};
use lm_serve::{ServeConfig, ServedText, Server};
use serde_json::{Value, json};

use super::llama_server::LlamaServer;
use super::{prompt_tokens, time_prefill};

/// Tokens each request generates.
const N_NEW: usize = 128;
/// Tokens of each request's prompt (different windows of the fixture).
const N_PROMPT: usize = 11;
/// The temperature every request samples at.
const TEMPERATURE: f32 = 0.8;

/// Runs the measurement and prints a markdown report.
pub(super) fn run_worker(
    model_path: &Path,
    n_threads: usize,
    n_clients: usize,
    peer: Option<&Path>,
) -> Result<()> {
    let tokens = prompt_tokens(128)?;
    let model = Llama::from_gguf(model_path)
        .with_context(|| format!("cannot load {}", model_path.display()))?;
    let mut prefill_rates = Vec::new();
    for n in [16, 128] {
        let prompt = tokens.get(..n).context("prompt too short")?;
        time_prefill(&model, prompt)?;
        prefill_rates.push((n, n as f64 / time_prefill(&model, prompt)?));
    }
    let model = Arc::new(model);
    let text = Arc::new(lm::GgufText::open(model_path)?);
    let end_ids = text.end_ids.clone();
    let config = ServeConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        parallel: n_clients,
        queue_len: n_clients,
        // Every request reads its prompt: the cache would hide prefills.
        cache_bytes: 0,
        model_name: "smollm2".into(),
        ..ServeConfig::default()
    };
    let server = Server::bind(Arc::clone(&model), text.clone(), config)?.spawn()?;
    let addr = server.local_addr();
    let prompts: Vec<&[TokenId]> = (0..n_clients)
        .map(|i| {
            let start = (i * 3) % (tokens.len() - N_PROMPT);
            &tokens[start..start + N_PROMPT]
        })
        .collect();
    let bodies: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let bias: serde_json::Map<String, Value> = end_ids
                .iter()
                .map(|id| (id.to_string(), json!(-100)))
                .collect();
            json!({"prompt": prompt, "max_tokens": N_NEW, "temperature": TEMPERATURE,
                   "seed": i, "stream": true, "logit_bias": bias})
            .to_string()
        })
        .collect();
    // Warm-up, then each request alone, each followed by the same run
    // through the loop in this process (back to back, so load from other
    // processes hits both alike).
    stream(addr, &bodies[0])?;
    let mut solo = Vec::new();
    let (mut solo_seconds, mut loop_seconds) = (0.0, 0.0);
    for (i, (body, prompt)) in bodies.iter().zip(&prompts).enumerate() {
        let started = Instant::now();
        solo.push(stream(addr, body)?.text);
        solo_seconds += started.elapsed().as_secs_f64();
        loop_seconds += time_loop(&model, text.detokenizer(), prompt, i as u64)?;
    }
    let together = all_at_once(addr, &bodies)?;
    server.stop()?;
    let n_equal = together
        .streams
        .iter()
        .zip(&solo)
        .filter(|(a, b)| a.text == **b)
        .count();
    let n_tokens = (n_clients * N_NEW) as f64;
    let single = n_tokens / solo_seconds;
    let aggregate = n_tokens / together.seconds;
    let in_loop = n_tokens / loop_seconds;
    println!(
        "SmolLM2 {}, {n_threads} thread(s), {n_clients} streaming clients x {N_NEW} tokens\n",
        model_path.display()
    );
    println!("| measure | tok/s |\n|---|---:|");
    println!("| one client at a time | {single:.1} |");
    println!("| the loop in this process, one at a time (lm-cli generate's) | {in_loop:.1} |");
    println!("| {n_clients} clients at once (aggregate) | {aggregate:.1} |");
    for (n, rate) in &prefill_rates {
        println!("| prefill, {n}-token prompt | {rate:.1} |");
    }
    println!();
    println!(
        "aggregate / single client: {:.2}x (issue 15: >= 2x)",
        aggregate / single
    );
    let (_, prefill16) = prefill_rates[0];
    println!(
        "aggregate / 16-token prefill rate: {:.0}% (issue 15: >= 70%)",
        100.0 * aggregate / prefill16
    );
    println!(
        "server overhead per token, one client: {:.2} ms ({:.1}% of the loop's time per token)",
        1e3 * (solo_seconds - loop_seconds) / n_tokens,
        100.0 * (solo_seconds - loop_seconds) / loop_seconds
    );
    println!("outputs equal to their solo runs: {n_equal} of {n_clients}");
    if let Some(binary) = peer {
        // llama-server's slots each hold a prompt, its tokens and room to spare.
        let llama_server = LlamaServer::start(
            binary,
            model_path,
            n_clients,
            2 * (N_PROMPT + N_NEW),
            n_threads,
        )?;
        stream(llama_server.addr(), &bodies[0])?;
        let theirs = all_at_once(llama_server.addr(), &bodies)?;
        drop(llama_server);
        let their_aggregate = n_tokens / theirs.seconds;
        println!(
            "\n{n_clients} streaming clients at once, against llama-server ({n_clients} slots, continuous batching, {n_threads} thread(s)):\n"
        );
        println!(
            "| server | aggregate tok/s | time to first token, median | p90 |\n|---|---:|---:|---:|"
        );
        for (name, run, rate) in [
            ("lm-serve", &together, aggregate),
            ("llama-server", &theirs, their_aggregate),
        ] {
            let [median, p90] = [0.5, 0.9].map(|q| run.first_event_quantile(q).as_secs_f64() * 1e3);
            println!("| {name} | {rate:.1} | {median:.0} ms | {p90:.0} ms |");
        }
        println!(
            "\naggregate, lm-serve / llama-server: {:.2}x (issue 40: >= 1.2x)",
            aggregate / their_aggregate
        );
    }
    if n_equal != n_clients {
        bail!(
            "{} outputs differ from their solo runs",
            n_clients - n_equal
        );
    }
    Ok(())
}

/// Seconds to generate `N_NEW` tokens after `prompt` through lm-decode's
/// loop, as `lm-cli generate` does (the request's sampling, `seed` and
/// detokenizer; no end tokens, so every token is made).
fn time_loop(
    model: &Decoder,
    detokenizer: &dyn lm_core::Detokenize,
    prompt: &[TokenId],
    seed: u64,
) -> Result<f64> {
    let config = GenerationConfig {
        max_new_tokens: N_NEW,
        sampling: SamplingConfig {
            temperature: TEMPERATURE,
            seed,
            ..SamplingConfig::default()
        },
        ..GenerationConfig::default()
    };
    let started = Instant::now();
    let generation = generate(model, prompt, &config, Some(detokenizer))?;
    let seconds = started.elapsed().as_secs_f64();
    if generation.tokens.len() != N_NEW {
        bail!(
            "the loop made {} tokens, not {N_NEW}",
            generation.tokens.len()
        );
    }
    Ok(seconds)
}

/// The streams of requests sent all at once, and how long they took.
struct Together {
    streams: Vec<Streamed>,
    seconds: f64,
}

impl Together {
    /// The `q` quantile (0 to 1) of the times to the first event.
    fn first_event_quantile(&self, q: f64) -> Duration {
        let mut times: Vec<Duration> = self.streams.iter().map(|s| s.first_event).collect();
        times.sort_unstable();
        let rank = ((times.len() - 1) as f64 * q).round() as usize;
        times[rank]
    }
}

/// Sends every body at once, one client thread each.
fn all_at_once(addr: SocketAddr, bodies: &[String]) -> Result<Together> {
    let started = Instant::now();
    let streams: Vec<Result<Streamed>> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|body| scope.spawn(move || stream(addr, body)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a client thread does not panic"))
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    Ok(Together {
        streams: streams.into_iter().collect::<Result<_>>()?,
        seconds,
    })
}

/// One streamed completion: its text, joined from the events, and the time
/// from sending the request to the first event's bytes.
struct Streamed {
    text: String,
    first_event: Duration,
}

/// Sends one streaming completion and reads it to the end.
fn stream(addr: SocketAddr, body: &str) -> Result<Streamed> {
    let started = Instant::now();
    let mut connection = TcpStream::connect(addr)?;
    write!(
        connection,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = Vec::new();
    let mut first_event = None;
    let mut buffer = [0u8; 4096];
    loop {
        let n = connection.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buffer[..n]);
        if first_event.is_none() && response.windows(6).any(|w| w == b"data: ") {
            first_event = Some(started.elapsed());
        }
    }
    let response = String::from_utf8_lossy(&response);
    let (head, chunked) = response.split_once("\r\n\r\n").context("no HTTP head")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("the server answered {head}: {chunked}");
    }
    let body = dechunk(chunked)?;
    let mut text = String::new();
    let mut n_chunks = 0;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let event: Value = serde_json::from_str(data)?;
        if let Some(piece) = event["choices"][0]["text"].as_str() {
            text.push_str(piece);
            n_chunks += 1;
        }
    }
    match first_event {
        Some(first_event) if n_chunks > 0 => Ok(Streamed { text, first_event }),
        _ => bail!("no text streamed: {body}"),
    }
}

/// The body of a `Transfer-Encoding: chunked` response.
fn dechunk(mut rest: &str) -> Result<String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .context("a chunk without its size line")?;
        let size = usize::from_str_radix(size.trim(), 16).context("a chunk size")?;
        if size == 0 {
            return Ok(body);
        }
        body.push_str(after.get(..size).context("a chunk shorter than its size")?);
        rest = after.get(size + 2..).context("a chunk without its CRLF")?;
    }
}
