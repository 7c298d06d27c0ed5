//! `cargo xtask bench --speculative`: decode speed with and without
//! speculative decoding (prompt lookup) on SmolLM2, with the same ids.
//!
//! ```text
//! cargo xtask bench --speculative [--runs N] [--threads 1,2] [--model <gguf>]
//!                                 [--draft-tokens K] [--max-new-tokens N]
//! ```
//!
//! Two tasks, each a user message in the model's chat template, greedy:
//!
//! - `grounded`: a paragraph of about 300 tokens with three misspellings,
//!   then "Repeat the paragraph above, correcting any spelling mistakes:",
//!   the case prompt lookup is for (the answer copies the input);
//! - `free`: a short story from a one-line request, where the context has
//!   little to copy and the drafter must back off.
//!
//! Each round runs, per thread count and task, the plain loop
//! (`generate_streaming`) and then the speculative one
//! (`generate_speculative` with `PromptLookup`), back to back, so load from
//! other processes hits both alike; the figures are medians over the
//! rounds. Decode is timed from the first chosen token to the last (the
//! prompt's prefill is the same for both and left out), on the wall clock
//! and in the process's CPU time: on a machine shared with other work the
//! CPU-time ratio is the steadier one (at one thread; at two, rayon's
//! waiting threads spin and add CPU time of their own). A speculative run
//! whose ids differ from the plain run's is an error: the speed is only
//! worth reporting for the same output.
//!
//! After the table, what a verifying pass over n tokens costs in plain
//! steps on this machine (the plain step reads one token and unembeds one
//! row; the verifying pass unembeds all n): a round pays only when it emits
//! more tokens than its pass costs, which is what prompt lookup's bar on
//! the match length is for.
//!
//! Like `cargo xtask bench`, the task builds xtask in release and runs the
//! measurement in that binary (`--worker`), one rayon pool per thread count.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use lm::lm_tokenize::Message;
use lm_core::{LanguageModel, Rows, SequenceState, TokenId};
use lm_decode::{
    GenerationConfig, PromptLookup, SamplingConfig, SpeculationStats, Step, generate_speculative,
    generate_streaming,
};
use lm_model::Decoder;

use crate::bench::flags::{Flags, Rounds};
use crate::{bench, fetch_model};

/// The usage line printed with option errors.
pub(crate) const USAGE: &str = "usage: cargo xtask bench --speculative [--runs N] [--threads 1,2] [--model <gguf>] [--draft-tokens K] [--max-new-tokens N]";

/// The input-grounded task's paragraph (three words misspelled on purpose:
/// calculater, preciseley, powerfull).
const PARAGRAPH: &str = "The history of computing began long before the first electronic machines. In the seventeenth century, Blaise Pascal built a mechanical calculater that could add and subtract, and Gottfried Leibniz improved it so that it could also multiply. Two centuries later, Charles Babbage designed the Analytical Engine, a general purpose machine that would have read its programs from punched cards, an idea he borrowed from the Jacquard loom. Ada Lovelace wrote notes on the engine that included what many consider the first computer program, and she saw that such a machine could manipulate symbols of any kind, not only numbers. The engine was never finished, because the engineering of the time could not make its parts preciseley enough. In the twentieth century, Alan Turing described an abstract machine that could compute anything computable, and during the Second World War his work on breaking codes led to some of the first electronic computers. After the war, machines such as ENIAC filled whole rooms, used thousands of vacuum tubes, and consumed enormous amounts of power. The invention of the transistor in 1947 made computers smaller, faster and more reliable, and the integrated circuit, which placed many transistors on a single chip, made them smaller still. By the nineteen seventies, the microprocessor had put an entire central processing unit on one chip, and personal computers began to appear in homes and offices. Today a telephone in a pocket is far more powerfull than the machines that once filled buildings, and the ideas of Babbage, Lovelace and Turing live on in every device we use.";

/// The instruction after the paragraph.
const INSTRUCTION: &str = "Repeat the paragraph above, correcting any spelling mistakes:";

/// The free-generation task's request.
const FREE_REQUEST: &str =
    "Write a short story about a lighthouse keeper who finds a message in a bottle.";

/// Runs the task (or, with `--worker`, the measurements).
pub(crate) fn run(args: &[String]) -> Result<()> {
    let options = Options::parse(args)?;
    if options.rounds.worker {
        return run_worker(&options);
    }
    let model = match &options.model {
        Some(model) => model.clone(),
        None => fetch_model::ensure_model(fetch_model::find_known("smollm2")?, None)?,
    };
    let worker = bench::build_release_worker()?;
    // The same options, with `--model` the fetched path when none was given.
    let mut worker_args: Vec<&str> = args.iter().map(String::as_str).collect();
    if options.model.is_none() {
        worker_args.push("--model");
        worker_args.push(model.to_str().context("the model path is not UTF-8")?);
    }
    let status = Command::new(worker)
        .arg("bench")
        .args(worker_args)
        .arg("--worker")
        .status()
        .context("cannot run the release worker")?;
    if !status.success() {
        bail!("the speculative bench worker failed ({status})");
    }
    Ok(())
}

/// Command-line options.
#[derive(Debug)]
struct Options {
    /// Rounds, thread counts, and the worker switch.
    rounds: Rounds,
    /// A GGUF file instead of the fetched SmolLM2.
    model: Option<PathBuf>,
    /// The most tokens prompt lookup proposes per pass.
    draft_tokens: usize,
    /// The most tokens each run generates.
    max_new_tokens: usize,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self> {
        let mut options = Self {
            rounds: Rounds::new(3),
            model: None,
            draft_tokens: 8,
            max_new_tokens: 256,
        };
        let mut flags = Flags::new(args, USAGE);
        while let Some(flag) = flags.next_flag() {
            if options.rounds.read(flag, &mut flags)? {
                continue;
            }
            match flag {
                "--speculative" => {}
                "--draft-tokens" => options.draft_tokens = flags.count(flag)?,
                "--max-new-tokens" => options.max_new_tokens = flags.count(flag)?,
                "--model" => options.model = Some(PathBuf::from(flags.value(flag)?)),
                other => return Err(flags.unknown(other)),
            }
        }
        Ok(options)
    }
}

/// One task: its name and its prompt's ids.
struct Task {
    name: &'static str,
    prompt: Vec<TokenId>,
}

/// One timed run: decode seconds (wall-clock and the process's CPU time),
/// tokens chosen, and (speculative) its stats.
struct Timed {
    seconds: f64,
    cpu_seconds: Option<f64>,
    tokens: Vec<TokenId>,
    stats: Option<SpeculationStats>,
}

impl Timed {
    /// Decoded tokens (the first token comes from the prefill).
    fn n_decoded(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64
    }
}

/// The measurements and counts of one task at one thread count.
#[derive(Default)]
struct Cell {
    /// Wall-clock tokens per second of each round.
    plain: Vec<f64>,
    speculative: Vec<f64>,
    /// CPU tokens per second of each round (decoded tokens over the
    /// process's CPU seconds), which load from other processes disturbs less.
    plain_cpu: Vec<f64>,
    speculative_cpu: Vec<f64>,
    n_tokens: usize,
    stats: SpeculationStats,
}

/// This process's CPU time (user and system, every thread) in seconds, from
/// `/proc/self/stat` (Linux; its clock ticks are 1/100 s), or `None`
/// elsewhere.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces), from field 3.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some((ticks(14)? + ticks(15)?) as f64 / 100.0)
}

/// The worker: every round, thread count and task, plain then speculative;
/// then the table.
fn run_worker(options: &Options) -> Result<()> {
    let path = options.model.as_ref().context("--worker needs --model")?;
    let lm::GgufModel { decoder, text } =
        lm::load_gguf(path).with_context(|| format!("cannot load {}", path.display()))?;
    let chat = |message: String| -> Result<Vec<TokenId>> {
        let prompt = text.chat_prompt(&[Message::new("user", message)])?;
        Ok(text.tokenizer.encode(&prompt)?)
    };
    let tasks = [
        Task {
            name: "grounded",
            prompt: chat(format!("{PARAGRAPH}\n\n{INSTRUCTION}"))?,
        },
        Task {
            name: "free",
            prompt: chat(FREE_REQUEST.to_owned())?,
        },
    ];
    let config = GenerationConfig {
        max_new_tokens: options.max_new_tokens,
        sampling: SamplingConfig::greedy(),
        end_tokens: text.end_ids.clone(),
        ..GenerationConfig::default()
    };
    let pools = options
        .rounds
        .threads
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .context("cannot start a thread pool")
        })
        .collect::<Result<Vec<_>>>()?;
    let mut cells: Vec<Vec<Cell>> = options
        .rounds
        .threads
        .iter()
        .map(|_| tasks.iter().map(|_| Cell::default()).collect())
        .collect();
    for round in 0..=options.rounds.runs {
        // Round 0 warms up (page cache, pools) and is not counted.
        for ((pool, &n_threads), row) in pools.iter().zip(&options.rounds.threads).zip(&mut cells) {
            for (task, cell) in tasks.iter().zip(row.iter_mut()) {
                eprintln!(
                    "round {round}/{}: {}, {n_threads} thread(s)",
                    options.rounds.runs, task.name
                );
                let (plain, speculative) = pool.install(|| {
                    let plain = time_run(&decoder, &task.prompt, &config, None)?;
                    let speculative =
                        time_run(&decoder, &task.prompt, &config, Some(options.draft_tokens))?;
                    anyhow::Ok((plain, speculative))
                })?;
                if speculative.tokens != plain.tokens {
                    bail!(
                        "{}: the speculative ids differ from the plain ones ({} and {} tokens)",
                        task.name,
                        speculative.tokens.len(),
                        plain.tokens.len()
                    );
                }
                if round > 0 {
                    cell.plain.push(plain.n_decoded() / plain.seconds);
                    cell.speculative
                        .push(speculative.n_decoded() / speculative.seconds);
                    if let (Some(plain_cpu), Some(speculative_cpu)) =
                        (plain.cpu_seconds, speculative.cpu_seconds)
                    {
                        cell.plain_cpu.push(plain.n_decoded() / plain_cpu);
                        cell.speculative_cpu
                            .push(speculative.n_decoded() / speculative_cpu);
                    }
                    cell.n_tokens = plain.tokens.len();
                    cell.stats = speculative.stats.unwrap_or_default();
                }
            }
        }
    }
    print!("{}", report(path, options, &tasks, &cells));
    print!(
        "{}",
        pass_cost_table(&decoder, &tasks[0].prompt, options, &pools)?
    );
    Ok(())
}

/// What a verifying pass costs on this machine, in plain steps, per thread
/// count: the speed-up of a round that emits t tokens from a pass over n is
/// t over the pass's cost.
fn pass_cost_table(
    decoder: &Decoder,
    prompt: &[TokenId],
    options: &Options,
    pools: &[rayon::ThreadPool],
) -> Result<String> {
    let n_max = options.draft_tokens + 1;
    let mut out = format!(
        "\nverifying pass: a pass over n tokens (every row's logits) in plain steps, after the grounded prompt (medians of {PASS_COST_REPEATS})\n\n| threads | plain step (ms) | {} |\n|---:|---:|{}\n",
        (2..=n_max)
            .map(|n| format!("n = {n}"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(n_max.saturating_sub(1)),
    );
    for (pool, &n_threads) in pools.iter().zip(&options.rounds.threads) {
        let costs = pool.install(|| pass_costs(decoder, prompt, n_max))?;
        let ratios: Vec<String> = costs[1..]
            .iter()
            .map(|cost| format!("{:.2}", cost / costs[0]))
            .collect();
        out.push_str(&format!(
            "| {n_threads} | {:.2} | {} |\n",
            costs[0] * 1e3,
            ratios.join(" | ")
        ));
    }
    Ok(out)
}

/// Passes timed per pass length by [`pass_costs`].
const PASS_COST_REPEATS: usize = 20;

/// The median seconds of a pass over n tokens after `prompt` (one token:
/// the plain loop's step, `Rows::Last`; more: a verifying pass,
/// `Rows::All`), for n = 1..=`n_max`, the lengths interleaved so load from
/// other processes hits each alike; the state is rolled back after each.
fn pass_costs(model: &Decoder, prompt: &[TokenId], n_max: usize) -> Result<Vec<f64>> {
    let mut state = model.new_state();
    let mut logits = Vec::new();
    model.forward(&mut state, prompt, Rows::Last, &mut logits)?;
    let n_read = state.pos();
    // Any ids: the cost does not depend on them.
    let tokens: Vec<TokenId> = prompt.iter().copied().cycle().take(n_max).collect();
    let mut seconds = vec![Vec::with_capacity(PASS_COST_REPEATS); n_max];
    for _ in 0..PASS_COST_REPEATS {
        for (n, times) in (1..=n_max).zip(&mut seconds) {
            let rows = if n == 1 { Rows::Last } else { Rows::All };
            let start = Instant::now();
            model.forward(&mut state, &tokens[..n], rows, &mut logits)?;
            times.push(start.elapsed().as_secs_f64());
            state.truncate(n_read);
        }
    }
    Ok(seconds
        .iter()
        .map(|times| bench::median(times).unwrap_or(f64::NAN))
        .collect())
}

/// One greedy run, plain (`draft_tokens: None`) or with prompt lookup.
fn time_run(
    model: &Decoder,
    prompt: &[TokenId],
    config: &GenerationConfig,
    draft_tokens: Option<usize>,
) -> Result<Timed> {
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut first_cpu = None;
    let mut on_step = |_: &Step| {
        let now = Instant::now();
        if first.is_none() {
            first = Some(now);
            first_cpu = process_cpu_seconds();
        }
        last = Some(now);
        Ok::<_, anyhow::Error>(ControlFlow::Continue(()))
    };
    let (generation, stats) = match draft_tokens {
        None => (
            generate_streaming(model, prompt, config, None, &mut on_step)?,
            None,
        ),
        Some(k) => {
            let (generation, stats) = generate_speculative(
                model,
                prompt,
                config,
                None,
                PromptLookup::new(k),
                &mut on_step,
            )?;
            (generation, Some(stats))
        }
    };
    let cpu_seconds = process_cpu_seconds()
        .zip(first_cpu)
        .map(|(end, start)| end - start);
    let (Some(first), Some(last)) = (first, last) else {
        bail!("the run chose no token");
    };
    Ok(Timed {
        seconds: (last - first).as_secs_f64(),
        cpu_seconds,
        tokens: generation.tokens,
        stats,
    })
}

/// The results as a Markdown table.
fn report(
    model: &std::path::Path,
    options: &Options,
    tasks: &[Task],
    cells: &[Vec<Cell>],
) -> String {
    let mut out = format!(
        "model: {}\nkernel: {:?}; greedy; prompt lookup, up to {} drafts per pass; {} rounds (medians), plain and speculative back to back\n\n",
        model.display(),
        lm_model::Kernel::detect(),
        options.draft_tokens,
        options.rounds.runs,
    );
    out.push_str("| task | threads | prompt tokens | tokens | plain tok/s | speculative tok/s | speed-up | speed-up (CPU time) | drafted | accepted | acceptance | passes | tokens per pass |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (&n_threads, row) in options.rounds.threads.iter().zip(cells) {
        for (task, cell) in tasks.iter().zip(row) {
            let median = |values: &[f64]| bench::median(values).unwrap_or(f64::NAN);
            let (plain, speculative) = (median(&cell.plain), median(&cell.speculative));
            let cpu_ratio = median(&cell.speculative_cpu) / median(&cell.plain_cpu);
            let stats = cell.stats;
            out.push_str(&format!(
                "| {} | {n_threads} | {} | {} | {plain:.1} | {speculative:.1} | {:.2}x | {cpu_ratio:.2}x | {} | {} | {:.0}% | {} | {:.2} |\n",
                task.name,
                task.prompt.len(),
                cell.n_tokens,
                speculative / plain,
                stats.drafted_tokens,
                stats.accepted_tokens,
                100.0 * stats.acceptance_rate(),
                stats.target_passes,
                cell.n_tokens.saturating_sub(1) as f64 / stats.target_passes.max(1) as f64,
            ));
        }
    }
    out
}
