//! `cargo xtask bench`: end-to-end speed of decode and prefill, ours and
//! llama.cpp's, measured interleaved in the same run, on a machine the report
//! names, with decode against the machine's memory bandwidth and peak RSS
//! against its budget (issue 35).
//!
//! ```text
//! cargo xtask bench [--runs N] [--threads 1,2] [--model <gguf>]... [--prompts 128,512]
//!                   [--contexts 512,4096] [--peer-python <python>] [--install-peer] [--no-peer]
//! cargo xtask bench --serve [--clients 16] [--threads 2] [--model <gguf>] [--no-peer]
//! ```
//!
//! `--serve` measures lm-serve's continuous batching instead (`serve.rs`),
//! against llama-server with as many slots unless `--no-peer`
//! (`llama_server.rs`, built on first use).
//!
//! The task builds this package in release and runs the release binary as a
//! worker process (`xtask bench --worker ...`), one process per phase and
//! measurement, so that each has a fresh rayon pool of the requested size and
//! its own peak RSS (`VmHWM` from `/proc/self/status`, read at the end of the run: the
//! mapped model pages that were touched, the KV cache, the scratch buffers and
//! the small xtask binary itself). The worker reproduces the settings of
//! `scripts/reference/llama_cpp_bench.py`:
//!
//! - decode: an 11-token prompt, then 128 new tokens chosen greedily through
//!   `lm_decode::generate_streaming` (no end tokens, so all 128 are made),
//!   timed from the first chosen token to the last: 128 single-token forward
//!   passes plus 128 selections;
//! - prefill at each prompt length (`--prompts`, 128 and 512 by default;
//!   2,048 on request, about 40 s a run for a 1B model at one thread): the
//!   prompt into an empty cache, plus the argmax of the last row, all
//!   lengths in one process after one warm-up at the shortest;
//! - each long context N (`--contexts`, 512 and 4,096 by default): an
//!   N-token prompt prefilled into an empty cache, then 128 tokens decoded
//!   after it, both timed, in one process (its prefill is reported only
//!   when `--prompts` does not already measure that length);
//! - prompts are read in pieces of [`PREFILL_PIECE`] tokens, as `lm-cli`
//!   reads them and as llama.cpp's default micro-batch does;
//! - one untimed warm-up (a decode, the shortest prefill, or a 128-token
//!   prefill before the long contexts) before each process's timed runs;
//!   F16 KV cache.
//!
//! Just before each of our runs, a worker measures the machine's read
//! bandwidth at that run's thread count (`bandwidth.rs`: a STREAM-like sum
//! of a buffer of at least 1 GiB and 8x the last-level cache, best of 5
//! passes): on a shared host what two threads can read swings by half
//! between minutes, so a decode is set against the reading taken beside
//! it. Our run starts 5 s after that worker ends, once the machine has
//! settled from freeing its buffer ([`SETTLE_AFTER_BANDWIDTH`]). Each
//! decode figure is then also given as a share of its bound, bandwidth /
//! bytes read per token (`footprint.rs`: every weight tensor
//! but the token embedding table, of which one row, unless the output is
//! tied to it; plus the KV cache the token attends to), the median of the
//! rounds' shares, and our peak RSS is set
//! against issue 35's budget: 1.1 x (file size + the KV cache of the
//! longest run, from the model's configuration and our cache's f16
//! layout). Both come from the GGUF header, read without the weights.
//!
//! `xtask bench --worker --phase decode --threads 1 --model <gguf>` (phases
//! `decode`, `prefill` with `--prompts N,M`, `context` with `--contexts N`,
//! and `bandwidth` with `--threads 1,2` and no model) measures one phase
//! alone, for `perf record` (docs/performance-log.md has the profile).
//!
//! The prompt tokens are the `history_of_computing` case of
//! `fixtures/smollm2/greedy.json` (llama.cpp's token ids of the text the peer
//! script uses, followed by its greedy continuation), repeated to the length
//! needed, so no tokenizer is needed here; the speed does not depend on
//! which tokens are read.
//!
//! llama.cpp runs through llama-cpp-python (`--peer-python`, the interpreter
//! of a previous `--install-peer`, or none), with `--runs 1` per process and
//! the same prompt lengths; its peak RSS comes from `resource.getrusage` in
//! a small wrapper. Each round runs ours then the peer for each model and
//! thread count, and every figure is the median over the rounds, so load
//! from other processes hits both sides and every model alike. With several
//! models, a last table gives each one's speed over the first's (Q4_K_M
//! over Q4_1 by default); the report itself is `report.rs`.
//!
//! The report names the machine (`machine.rs`): the CPU model, the
//! instruction sets it lists, the kernel path our worker chose (and
//! `LM_KERNEL` when set), the thread count of each row, llama.cpp's own
//! `llama_print_system_info()` and the read bandwidth.

mod bandwidth;
mod footprint;
mod machine;
mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use lm_core::{LanguageModel, Rows, TokenId, argmax};
use lm_decode::{GenerationConfig, SamplingConfig, generate_streaming};
use lm_model::{Decoder, Llama};
use serde_json::Value;

use crate::{fetch_model, project_root, reference};

pub(crate) mod flags;
mod llama_server;
mod serve;

use bandwidth::Bandwidth;

use flags::{Flags, Rounds, positive_list};

/// Tokens of the decode prompt (as the peer script).
const N_DECODE_PROMPT: usize = 11;
/// Tokens generated and timed in a decode run.
const N_DECODE_NEW: usize = 128;
/// Tokens of the prompt that warms a process up before its timed runs,
/// and the fewest the prompt fixture must give.
const N_WARM_UP: usize = 128;
/// The prefill prompt lengths measured unless `--prompts` says otherwise.
const DEFAULT_PROMPTS: [usize; 2] = [128, 512];
/// The long contexts measured unless `--contexts` says otherwise.
const DEFAULT_CONTEXTS: [usize; 2] = [512, 4096];
/// Tokens per forward pass when a prompt is read (lm-cli's prefill chunk,
/// llama.cpp's default `n_ubatch`).
const PREFILL_PIECE: usize = 512;
/// The pause between the bandwidth worker and our run. On the Xeon
/// (2026-12-07, 1B Q4_K_M, two threads) a decode started right after that
/// worker freed its 3.8 GB buffer ran at 30.6-32.8 tok/s, one started 5 s
/// later at 30.9-34.8: 1.2 tok/s faster on average over 10 interleaved
/// pairs (7 of them faster). The peer, which runs after ours, never
/// followed the buffer directly.
const SETTLE_AFTER_BANDWIDTH: std::time::Duration = std::time::Duration::from_secs(5);
/// The models measured when no `--model` is given: SmolLM2 in Q4_1 and
/// llama.cpp's Q4_K_M mix of it (catalog names).
const DEFAULT_MODELS: [&str; 2] = ["smollm2", "smollm2-q4_k_m"];
/// The peer benchmark script, relative to the project root.
const PEER_SCRIPT: &str = "scripts/reference/llama_cpp_bench.py";
/// The fixture whose token ids make the prompts, relative to the project root.
const PROMPT_FIXTURE: &str = "fixtures/smollm2/greedy.json";
/// The fixture case that holds a long prompt.
const PROMPT_CASE: &str = "history_of_computing";
/// Runs the peer script and prints its peak RSS (KiB on Linux) on stderr as
/// `peak_rss_kib=N`: `argv = [script, script args...]`.
const PEER_WRAPPER: &str = "\
import resource, runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
print('peak_rss_kib=%d' % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
";
/// The usage line printed with option errors.
pub(crate) const USAGE: &str = "usage: cargo xtask bench [--runs N] [--threads 1,2] [--model <gguf>]... [--prompts 128,512] [--contexts 512,4096] [--peer-python <python>] [--install-peer] [--no-peer] | --serve [--clients N] [--threads 2] [--model <gguf>] [--no-peer] | --speculative";

/// Runs the task (or, with `--worker`, one measurement).
pub(crate) fn run(args: &[String]) -> Result<()> {
    if args.iter().any(|arg| arg == "--speculative") {
        return crate::bench_speculative::run(args);
    }
    let options = Options::parse(args)?;
    if options.rounds.worker {
        return run_worker(&options);
    }
    if options.serve {
        // The serving benchmark's model: the first given, or SmolLM2 Q4_1.
        let model = match options.models.first() {
            Some(model) => model.clone(),
            None => fetch_model::ensure_model(fetch_model::find_known(DEFAULT_MODELS[0])?, None)?,
        };
        let peer = if options.no_peer {
            None
        } else {
            Some(llama_server::binary()?)
        };
        let worker = build_release_worker()?;
        for &n_threads in &options.rounds.threads {
            let mut command = Command::new(&worker);
            command
                .args(["bench", "--worker", "--phase", "serve"])
                .args(["--threads", &n_threads.to_string()])
                .args(["--clients", &options.clients.to_string()])
                .arg("--model")
                .arg(&model);
            if let Some(peer) = &peer {
                command.arg("--peer-server").arg(peer);
            }
            let status = command
                .status()
                .context("running the serve benchmark worker")?;
            if !status.success() {
                bail!("the serve benchmark failed ({status})");
            }
        }
        return Ok(());
    }
    let models = if options.models.is_empty() {
        DEFAULT_MODELS
            .iter()
            .map(|name| fetch_model::ensure_model(fetch_model::find_known(name)?, None))
            .collect::<Result<Vec<_>>>()?
    } else {
        options.models.clone()
    };
    let peer = peer_python(&options)?;
    let worker = build_release_worker()?;
    // Rounds are the outer loop, so every model sees the same drift of a
    // shared host and the models' figures compare as well as the sides do.
    let mut rows_by_model: Vec<Vec<Row>> = models
        .iter()
        .map(|_| {
            options
                .rounds
                .threads
                .iter()
                .map(|&n_threads| Row {
                    n_threads,
                    ours: Samples::default(),
                    peer: Samples::default(),
                    bandwidth: Vec::new(),
                })
                .collect()
        })
        .collect();
    for round in 0..options.rounds.runs {
        for (model, rows) in models.iter().zip(&mut rows_by_model) {
            for row in rows {
                eprintln!(
                    "round {}/{}: {}: {} thread(s)",
                    round + 1,
                    options.rounds.runs,
                    model.file_name().unwrap_or_default().to_string_lossy(),
                    row.n_threads
                );
                row.bandwidth
                    .push(measure_bandwidth(&worker, row.n_threads)?);
                std::thread::sleep(SETTLE_AFTER_BANDWIDTH);
                row.ours
                    .push(run_ours(&worker, model, row.n_threads, &options)?);
                if let Some(python) = &peer {
                    row.peer
                        .push(run_peer(python, model, row.n_threads, &options)?);
                }
            }
        }
    }
    let mut report_text = String::new();
    for (model, rows) in models.iter().zip(&rows_by_model) {
        report_text.push_str(&report::report(model, &options, peer.is_some(), rows)?);
    }
    if models.len() > 1 {
        report_text.push_str(&report::between_models(
            &models,
            &rows_by_model,
            &options.metrics(),
        )?);
    }
    print!("{report_text}");
    Ok(())
}

/// Command-line options.
#[derive(Debug)]
struct Options {
    /// Rounds (processes per side and thread count), thread counts, and
    /// whether this process is the worker that runs one measurement and
    /// prints it as JSON.
    rounds: Rounds,
    /// GGUF files instead of [`DEFAULT_MODELS`].
    models: Vec<PathBuf>,
    /// Prefill prompt lengths, ascending.
    prompts: Vec<usize>,
    /// Long-context prompt lengths.
    contexts: Vec<usize>,
    /// An interpreter that has llama-cpp-python.
    peer_python: Option<PathBuf>,
    /// Install llama-cpp-python into `<target>/reference-venv` if needed.
    install_peer: bool,
    /// Measure only ours.
    no_peer: bool,
    /// Internal: the llama-server binary the serve worker runs as its peer.
    peer_server: Option<PathBuf>,
    /// Internal: which phase the worker measures (`decode`, `prefill` at
    /// each of `prompts`, `context` at each of `contexts`, `bandwidth` at
    /// each thread count, or `serve`, the serving benchmark).
    phase: String,
    /// Measure lm-serve's continuous batching (`serve.rs`).
    serve: bool,
    /// Clients at once for `--serve`.
    clients: usize,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self> {
        let mut options = Self {
            rounds: Rounds::new(5),
            models: Vec::new(),
            prompts: DEFAULT_PROMPTS.to_vec(),
            contexts: DEFAULT_CONTEXTS.to_vec(),
            peer_python: None,
            install_peer: false,
            no_peer: false,
            peer_server: None,
            phase: "decode".to_owned(),
            serve: false,
            clients: 16,
        };
        let mut threads_given = false;
        let mut flags = Flags::new(args, USAGE);
        while let Some(flag) = flags.next_flag() {
            threads_given |= flag == "--threads";
            if options.rounds.read(flag, &mut flags)? {
                continue;
            }
            match flag {
                "--prompts" => {
                    options.prompts = positive_list(flags.value(flag)?, flag)?;
                    options.prompts.sort_unstable();
                    options.prompts.dedup();
                }
                "--contexts" => {
                    let text = flags.value(flag)?;
                    options.contexts = if text == "none" {
                        Vec::new()
                    } else {
                        positive_list(text, flag)?
                    };
                }
                "--model" => options.models.push(PathBuf::from(flags.value(flag)?)),
                "--peer-python" => options.peer_python = Some(PathBuf::from(flags.value(flag)?)),
                "--install-peer" => options.install_peer = true,
                "--no-peer" => options.no_peer = true,
                "--peer-server" => options.peer_server = Some(PathBuf::from(flags.value(flag)?)),
                "--serve" => options.serve = true,
                "--clients" => options.clients = flags.count(flag)?,
                "--phase" => options.phase = flags.value(flag)?.to_owned(),
                other => return Err(flags.unknown(other)),
            }
        }
        // The serving benchmark's bar is set at two threads.
        if options.serve && !threads_given {
            options.rounds.threads = vec![2];
        }
        Ok(options)
    }

    /// Every metric of a run, in report order: the short decode, prefill at
    /// each prompt length, then at each long context its prefill (unless a
    /// prompt length already measures it) and the decode after it.
    fn metrics(&self) -> Vec<Metric> {
        let mut metrics = vec![Metric::Decode(N_DECODE_PROMPT)];
        metrics.extend(self.prompts.iter().map(|&n| Metric::Prefill(n)));
        for &n in &self.contexts {
            if !self.prompts.contains(&n) {
                metrics.push(Metric::Prefill(n));
            }
            metrics.push(Metric::Decode(n));
        }
        metrics
    }

    /// The most positions any measured run's cache holds: the longest
    /// prompt, or a prompt (the decode prompt or a long context) plus the
    /// tokens decoded after it.
    fn longest_run(&self) -> usize {
        let decoded = self
            .contexts
            .iter()
            .chain(&[N_DECODE_PROMPT])
            .map(|&n| n + N_DECODE_NEW + 1);
        self.prompts
            .iter()
            .copied()
            .chain(decoded)
            .max()
            .unwrap_or(0)
    }
}

/// What one figure measures: a phase at a prompt length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Metric {
    /// 128 new tokens after a prompt of this many tokens.
    Decode(usize),
    /// One prompt of this many tokens into an empty cache.
    Prefill(usize),
}

impl Metric {
    /// The key in the workers' and the peer's JSON (`decode@11`).
    fn key(self) -> String {
        match self {
            Metric::Decode(n) => format!("decode@{n}"),
            Metric::Prefill(n) => format!("prefill@{n}"),
        }
    }

    /// The phase's name and the prompt length, as the report's columns.
    fn phase_and_prompt(self) -> (&'static str, usize) {
        match self {
            Metric::Decode(n) => ("decode", n),
            Metric::Prefill(n) => ("prefill", n),
        }
    }

    /// Tokens the timed part makes or reads.
    fn n_tokens(self) -> usize {
        match self {
            Metric::Decode(_) => N_DECODE_NEW,
            Metric::Prefill(n) => n,
        }
    }
}

/// One process's (or one set of processes') measurement.
#[derive(Debug, Clone, Default)]
struct Measurement {
    /// Seconds of each timed run, by [`Metric::key`].
    seconds: BTreeMap<String, f64>,
    peak_rss_bytes: u64,
    /// Our worker's kernel path, or llama.cpp's system info.
    system: String,
}

/// The measurements of one side at one thread count.
#[derive(Debug, Default)]
struct Samples {
    seconds: BTreeMap<String, Vec<f64>>,
    peak_rss_bytes: Vec<u64>,
    system: String,
}

impl Samples {
    fn push(&mut self, m: Measurement) {
        for (key, seconds) in m.seconds {
            self.seconds.entry(key).or_default().push(seconds);
        }
        self.peak_rss_bytes.push(m.peak_rss_bytes);
        self.system = m.system;
    }

    /// Median speed of `metric` in tokens per second.
    fn tok_per_s(&self, metric: Metric) -> Option<f64> {
        let seconds = self.seconds.get(&metric.key())?;
        median(seconds).map(|s| metric.n_tokens() as f64 / s)
    }

    fn max_rss_bytes(&self) -> Option<u64> {
        self.peak_rss_bytes.iter().copied().max()
    }
}

/// Both sides at one thread count, and the read bandwidth at that count
/// measured just before each round's run of ours.
#[derive(Debug)]
struct Row {
    n_threads: usize,
    ours: Samples,
    peer: Samples,
    bandwidth: Vec<Bandwidth>,
}

/// The median of `values` (mean of the middle two for an even count).
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => sorted.get(mid).copied(),
        _ => Some((sorted[mid - 1] + sorted[mid]) / 2.0),
    }
}

/// The worker: loads the model, measures one phase after a warm-up, and
/// prints one JSON object.
fn run_worker(options: &Options) -> Result<()> {
    if options.phase == "bandwidth" {
        let bandwidth = Bandwidth::measure(&options.rounds.threads)?;
        println!("{}", bandwidth.to_json());
        return Ok(());
    }
    let [n_threads] = options.rounds.threads[..] else {
        bail!(
            "--worker measures one thread count, got {:?}",
            options.rounds.threads
        );
    };
    let [model_path] = &options.models[..] else {
        bail!("--worker needs one --model");
    };
    // As lm-cli does, so the peak RSS is what the model uses.
    lm_model::map_large_allocations();
    rayon::ThreadPoolBuilder::new()
        .num_threads(n_threads)
        .build_global()
        .context("cannot start the thread pool")?;
    if options.phase == "serve" {
        return serve::run_worker(
            model_path,
            n_threads,
            options.clients,
            options.peer_server.as_deref(),
        );
    }
    let model = Llama::from_gguf(model_path)
        .with_context(|| format!("cannot load {}", model_path.display()))?;
    let mut seconds = BTreeMap::new();
    match options.phase.as_str() {
        "decode" => {
            let prompt = prompt_tokens(N_DECODE_PROMPT)?;
            time_generation(&model, &prompt, || ())?;
            let (_, decode) = time_generation(&model, &prompt, || ())?;
            seconds.insert(Metric::Decode(N_DECODE_PROMPT).key(), decode);
        }
        "prefill" => {
            // One warm-up at the shortest length pages the weights in.
            if let Some(&shortest) = options.prompts.first() {
                time_prefill(&model, &prompt_tokens(shortest)?)?;
            }
            for &n in &options.prompts {
                let prompt = prompt_tokens(n)?;
                seconds.insert(Metric::Prefill(n).key(), time_prefill(&model, &prompt)?);
            }
        }
        "context" => {
            // The warm-up pages the weights in; a long prompt is long
            // enough to be measured once.
            time_prefill(&model, &prompt_tokens(N_WARM_UP)?)?;
            for &n in &options.contexts {
                let cpu_start = cpu_seconds();
                let mut cpu_first = f64::NAN;
                let (prefill, decode) = time_generation(&model, &prompt_tokens(n)?, || {
                    cpu_first = cpu_seconds();
                })?;
                eprintln!(
                    "context {n}: CPU seconds of this process: prefill {:.2}, decode {:.2}",
                    cpu_first - cpu_start,
                    cpu_seconds() - cpu_first
                );
                seconds.insert(Metric::Prefill(n).key(), prefill);
                seconds.insert(Metric::Decode(n).key(), decode);
            }
        }
        other => bail!("--phase is decode, prefill, context or bandwidth, got `{other}`"),
    }
    println!(
        "{}",
        serde_json::json!({
            "seconds": seconds,
            "peak_rss_bytes": peak_rss_bytes()?,
            "system": machine::our_kernel(),
        })
    );
    Ok(())
}

/// One greedy run of 129 chosen tokens after `prompt` through the
/// generation loop (no end tokens, the prompt read in pieces of
/// [`PREFILL_PIECE`]): the seconds until the first token was chosen (the
/// prompt read and one selection) and from the first chosen token to the
/// last (128 single-token forward passes and 128 selections).
/// `at_first` runs when the first token is chosen.
fn time_generation(
    model: &Decoder,
    prompt: &[TokenId],
    mut at_first: impl FnMut(),
) -> Result<(f64, f64)> {
    let config = GenerationConfig {
        max_new_tokens: N_DECODE_NEW + 1,
        sampling: SamplingConfig::greedy(),
        prefill_chunk_len: std::num::NonZeroUsize::new(PREFILL_PIECE),
        ..GenerationConfig::default()
    };
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let start = Instant::now();
    let generation = generate_streaming(model, prompt, &config, None, |_| {
        let now = Instant::now();
        if first.is_none() {
            first = Some(now);
            at_first();
        }
        last = Some(now);
        Ok::<_, anyhow::Error>(std::ops::ControlFlow::Continue(()))
    })?;
    if generation.tokens.len() != N_DECODE_NEW + 1 {
        bail!(
            "decode made {} tokens, expected {}",
            generation.tokens.len(),
            N_DECODE_NEW + 1
        );
    }
    match (first, last) {
        (Some(first), Some(last)) => {
            Ok(((first - start).as_secs_f64(), (last - first).as_secs_f64()))
        }
        _ => bail!("decode chose no token"),
    }
}

/// Seconds for reading `prompt` into an empty cache (in pieces of
/// [`PREFILL_PIECE`]), plus the argmax of its last row.
fn time_prefill(model: &Decoder, prompt: &[TokenId]) -> Result<f64> {
    let mut state = model.new_state();
    let mut logits = Vec::new();
    let start = Instant::now();
    for piece in prompt.chunks(PREFILL_PIECE) {
        model.forward(&mut state, piece, Rows::Last, &mut logits)?;
    }
    argmax(&logits)?;
    Ok(start.elapsed().as_secs_f64())
}

/// The first `n` of the long fixture prompt's token ids followed by its
/// greedy continuation, repeated as often as needed.
fn prompt_tokens(n: usize) -> Result<Vec<TokenId>> {
    let path = project_root().join(PROMPT_FIXTURE);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let fixture: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let case = fixture["cases"]
        .as_array()
        .and_then(|cases| cases.iter().find(|case| case["name"] == PROMPT_CASE))
        .with_context(|| format!("{} has no case `{PROMPT_CASE}`", path.display()))?;
    let mut tokens = Vec::new();
    for key in ["prompt_ids", "continuation_ids"] {
        for id in case[key].as_array().into_iter().flatten() {
            let id = id
                .as_u64()
                .and_then(|id| TokenId::try_from(id).ok())
                .with_context(|| format!("bad token id {id} in {}", path.display()))?;
            tokens.push(id);
        }
    }
    if tokens.len() < N_WARM_UP {
        bail!(
            "{} gives {} tokens, the prompts need {N_WARM_UP}",
            path.display(),
            tokens.len()
        );
    }
    Ok(tokens.iter().copied().cycle().take(n).collect())
}

/// CPU seconds this process has used (user and system, from
/// `/proc/self/stat`, in clock ticks of 10 ms; NaN off Linux): printed next
/// to a long context's wall-clock figures, since on a loaded machine the
/// CPU time of a one-thread run is the steadier measure.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the command name (which is in parentheses): state is
    // field 3, utime 14 and stime 15.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

/// This process's peak resident set size (`VmHWM`), Linux only.
fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .context("cannot read /proc/self/status (peak RSS is measured on Linux only)")?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .context("/proc/self/status has no VmHWM line")?;
    Ok(kib * 1024)
}

/// Builds this package in release and returns the binary's path.
pub(crate) fn build_release_worker() -> Result<PathBuf> {
    release_binary("xtask")
}

/// Builds the binary `name` of the package of that name in release (a
/// whole-process measurement needs the optimised HTTP and grammar crates
/// too, which the dev profile leaves unoptimised) and returns its path, as
/// cargo reports it.
pub(crate) fn release_binary(name: &str) -> Result<PathBuf> {
    eprintln!("building {name} in release");
    crate::cargo_build(&["--release", "--package", name, "--bin", name])?
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|message| message["target"]["name"] == name)
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo reported no {name} executable"))
}

/// One measurement of ours: the short decode, the prefills and the long
/// contexts, each in a fresh release process (so each peak RSS is that
/// phase's alone, as in a real run). A prefill measured both at a prompt
/// length and as a long context keeps the former's figure (taken after a
/// warm-up at that process's shortest prompt).
fn run_ours(
    worker: &Path,
    model: &Path,
    n_threads: usize,
    options: &Options,
) -> Result<Measurement> {
    let mut phases = vec![("decode", None)];
    if !options.prompts.is_empty() {
        phases.push(("prefill", Some(("--prompts", &options.prompts))));
    }
    if !options.contexts.is_empty() {
        phases.push(("context", Some(("--contexts", &options.contexts))));
    }
    let mut all = Measurement::default();
    for (phase, lengths) in phases {
        let one = run_worker_process(worker, model, n_threads, phase, lengths)?;
        for (key, seconds) in one.seconds {
            all.seconds.entry(key).or_insert(seconds);
        }
        all.peak_rss_bytes = all.peak_rss_bytes.max(one.peak_rss_bytes);
        all.system = one.system;
    }
    Ok(all)
}

/// Runs the worker for one phase, with its prompt lengths if it takes any
/// (`--prompts` or `--contexts` and the list), and reads its JSON.
fn run_worker_process(
    worker: &Path,
    model: &Path,
    n_threads: usize,
    phase: &str,
    lengths: Option<(&str, &Vec<usize>)>,
) -> Result<Measurement> {
    let lengths = lengths.map(|(flag, lengths)| [flag.to_owned(), comma_list(lengths)]);
    let json = worker_json(worker, phase, |command| {
        command
            .args(["--threads", &n_threads.to_string()])
            .args(lengths.iter().flatten())
            .arg("--model")
            .arg(model);
    })?;
    let peak_rss_bytes = json["peak_rss_bytes"]
        .as_u64()
        .with_context(|| format!("worker output lacks `peak_rss_bytes`: {json}"))?;
    Ok(Measurement {
        seconds: seconds_by_metric(&json["seconds"])?,
        peak_rss_bytes,
        system: json["system"].as_str().unwrap_or_default().to_owned(),
    })
}

/// `1,2,3`.
fn comma_list(values: &[usize]) -> String {
    values
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The machine's read bandwidth at `n_threads`, measured by a worker
/// process (`bandwidth.rs`).
fn measure_bandwidth(worker: &Path, n_threads: usize) -> Result<Bandwidth> {
    let json = worker_json(worker, "bandwidth", |command| {
        command.args(["--threads", &n_threads.to_string()]);
    })?;
    Bandwidth::from_json(&json)
}

/// Runs `worker bench --worker --phase <phase>` with the arguments `args`
/// adds, its stderr shown, and reads the JSON it prints.
fn worker_json(worker: &Path, phase: &str, args: impl FnOnce(&mut Command)) -> Result<Value> {
    let mut command = Command::new(worker);
    command.args(["bench", "--worker", "--phase", phase]);
    args(&mut command);
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", worker.display()))?;
    if !output.status.success() {
        bail!("the {phase} worker failed ({})", output.status);
    }
    serde_json::from_slice(&output.stdout).with_context(|| format!("bad {phase} worker output"))
}

/// A JSON object of seconds by metric key.
fn seconds_by_metric(json: &Value) -> Result<BTreeMap<String, f64>> {
    json.as_object()
        .with_context(|| format!("expected seconds by metric, got {json}"))?
        .iter()
        .map(|(key, seconds)| {
            let seconds = seconds
                .as_f64()
                .with_context(|| format!("`{key}` is not a number of seconds: {seconds}"))?;
            Ok((key.clone(), seconds))
        })
        .collect()
}

/// The interpreter to measure llama.cpp with, or `None` to measure only ours.
fn peer_python(options: &Options) -> Result<Option<PathBuf>> {
    if options.no_peer {
        return Ok(None);
    }
    if let Some(python) = &options.peer_python {
        if !reference::imports_llama_cpp(python, &[]) {
            bail!(
                "{} cannot import llama_cpp {}; install it with `{} -m pip install llama-cpp-python=={}` or use --install-peer",
                python.display(),
                reference::LLAMA_CPP_PYTHON_VERSION,
                python.display(),
                reference::LLAMA_CPP_PYTHON_VERSION,
            );
        }
        return Ok(Some(python.clone()));
    }
    if options.install_peer {
        return reference::venv_python_with_llama_cpp().map(Some);
    }
    let venv_python = reference::venv_python();
    if reference::imports_llama_cpp(&venv_python, &[]) {
        Ok(Some(venv_python))
    } else {
        eprintln!(
            "llama-cpp-python not found (looked in {}); measuring ours only. Use --install-peer or --peer-python <python>",
            venv_python.display()
        );
        Ok(None)
    }
}

/// One measurement of llama.cpp: the peer script with one run, in a fresh process.
fn run_peer(
    python: &Path,
    model: &Path,
    n_threads: usize,
    options: &Options,
) -> Result<Measurement> {
    let output = Command::new(python)
        .args(["-c", PEER_WRAPPER])
        .arg(project_root().join(PEER_SCRIPT))
        .arg("--model")
        .arg(model)
        .args(["--threads", &n_threads.to_string(), "--runs", "1"])
        .arg("--prompts")
        .args(options.prompts.iter().map(usize::to_string))
        .arg("--contexts")
        .args(options.contexts.iter().map(usize::to_string))
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("{PEER_SCRIPT} failed ({}):\n{stderr}", output.status);
    }
    let json: Value = serde_json::from_slice(&output.stdout).context("bad peer output")?;
    let peak_rss_kib = stderr
        .lines()
        .find_map(|line| line.strip_prefix("peak_rss_kib="))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .context("the peer wrapper printed no peak RSS")?;
    Ok(Measurement {
        seconds: seconds_by_metric(&json["results"][0]["seconds"])?,
        peak_rss_bytes: peak_rss_kib * 1024,
        system: json["system_info"].as_str().unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn thread_list_parses_and_rejects_zero() {
        let options = Options::parse(&args(&["--threads", "1,2", "--runs", "3"])).unwrap();
        assert_eq!(
            (options.rounds.threads, options.rounds.runs),
            (vec![1, 2], 3)
        );
        assert!(Options::parse(&args(&["--threads", "0"])).is_err());
        assert!(Options::parse(&args(&["--runs"])).is_err());
    }

    #[test]
    fn the_serve_benchmark_defaults_to_16_clients_at_2_threads() {
        let options = Options::parse(&args(&["--serve"])).unwrap();
        assert_eq!(
            (options.serve, options.clients, options.rounds.threads),
            (true, 16, vec![2])
        );
        let options =
            Options::parse(&args(&["--serve", "--clients", "4", "--threads", "1"])).unwrap();
        assert_eq!((options.clients, options.rounds.threads), (4, vec![1]));
        assert!(Options::parse(&args(&["--serve", "--clients", "0"])).is_err());
    }

    #[test]
    fn prompts_contexts_and_models_parse() {
        let defaults = Options::parse(&[]).unwrap();
        assert_eq!(defaults.prompts, [128, 512]);
        assert_eq!(defaults.contexts, [512, 4096]);
        assert!(defaults.models.is_empty());
        let options = Options::parse(&args(&[
            "--contexts",
            "1024",
            "--model",
            "a.gguf",
            "--model",
            "b.gguf",
        ]))
        .unwrap();
        assert_eq!(options.contexts, [1024]);
        assert_eq!(
            options.models,
            [PathBuf::from("a.gguf"), PathBuf::from("b.gguf")]
        );
        let none = Options::parse(&args(&["--contexts", "none"])).unwrap();
        assert!(none.contexts.is_empty());
        assert!(Options::parse(&args(&["--contexts", "0"])).is_err());
        let prompts = Options::parse(&args(&["--prompts", "2048,128,512,128"])).unwrap();
        assert_eq!(prompts.prompts, [128, 512, 2048]);
        assert!(Options::parse(&args(&["--prompts", "128,0"])).is_err());
        assert!(Options::parse(&args(&["--prompts", "none"])).is_err());
    }

    #[test]
    fn metrics_in_report_order_with_their_token_counts() {
        let options = Options::parse(&args(&["--contexts", "512,4096"])).unwrap();
        let metrics = options.metrics();
        assert_eq!(
            metrics,
            [
                Metric::Decode(11),
                Metric::Prefill(128),
                Metric::Prefill(512),
                Metric::Decode(512),
                Metric::Prefill(4096),
                Metric::Decode(4096)
            ]
        );
        let keys: Vec<String> = metrics.iter().map(|m| m.key()).collect();
        assert_eq!(
            keys,
            [
                "decode@11",
                "prefill@128",
                "prefill@512",
                "decode@512",
                "prefill@4096",
                "decode@4096"
            ]
        );
        let tokens: Vec<usize> = metrics.iter().map(|m| m.n_tokens()).collect();
        assert_eq!(tokens, [128, 128, 512, 128, 4096, 128]);
        // The cache of the 4,096-token context and its 129 chosen tokens.
        assert_eq!(options.longest_run(), 4096 + 129);
        let short = Options::parse(&args(&["--prompts", "2048", "--contexts", "none"])).unwrap();
        assert_eq!(short.longest_run(), 2048);
        assert_eq!(short.metrics(), [Metric::Decode(11), Metric::Prefill(2048)]);
    }

    #[test]
    fn prompts_repeat_the_fixture_to_any_length() {
        let tokens = prompt_tokens(128).unwrap();
        assert_eq!(tokens.len(), 128);
        // "The history of computing": llama.cpp's ids in the fixture.
        assert_eq!(tokens[..4], [504, 1463, 282, 7867]);
        let long = prompt_tokens(4096).unwrap();
        assert_eq!(long.len(), 4096);
        assert_eq!(long[..128], tokens[..]);
    }
}
