//! The server's counters and gauges, rendered as Prometheus text for
//! `GET /metrics`: requests, tokens, queue depth, active sequences, batch
//! size per step, time to first token and speculative decoding's drafts.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use Source::{Count, QueueDepth, Seconds};

/// Every counter, updated with relaxed atomics (they are statistics).
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    requests: AtomicU64,
    requests_failed: AtomicU64,
    requests_rejected_busy: AtomicU64,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    active_sequences: AtomicU64,
    steps: AtomicU64,
    step_sequences: AtomicU64,
    last_batch_size: AtomicU64,
    step_micros: AtomicU64,
    first_token_micros: AtomicU64,
    first_tokens: AtomicU64,
    queue_wait_micros: AtomicU64,
    cache_hit_tokens: AtomicU64,
    cache_entries: AtomicU64,
    cache_bytes: AtomicU64,
    draft_tokens: AtomicU64,
    draft_accepted_tokens: AtomicU64,
    verification_passes: AtomicU64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Metrics {
    /// A request answered (any status).
    pub(crate) fn record_request(&self, status: u16) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if status == 429 || status == 503 {
            self.requests_rejected_busy.fetch_add(1, Ordering::Relaxed);
        } else if status >= 400 {
            self.requests_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn job_started(&self, enqueued: Instant) {
        self.active_sequences.fetch_add(1, Ordering::Relaxed);
        self.queue_wait_micros
            .fetch_add(micros(enqueued.elapsed()), Ordering::Relaxed);
    }

    pub(crate) fn record_generated(&self, n_prompt: usize, n_generated: usize) {
        self.prompt_tokens
            .fetch_add(n_prompt as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(n_generated as u64, Ordering::Relaxed);
    }

    pub(crate) fn job_ended(&self) {
        self.active_sequences.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn record_step(&self, n_sequences: usize, took: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_sequences
            .fetch_add(n_sequences as u64, Ordering::Relaxed);
        self.last_batch_size
            .store(n_sequences as u64, Ordering::Relaxed);
        self.step_micros.fetch_add(micros(took), Ordering::Relaxed);
    }

    pub(crate) fn record_prefill(&self, n_tokens: usize) {
        self.prefill_tokens
            .fetch_add(n_tokens as u64, Ordering::Relaxed);
    }

    /// A speculative sequence's drafts: proposed and verified, and accepted.
    pub(crate) fn record_drafts(&self, n_drafted: usize, n_accepted: usize) {
        self.draft_tokens
            .fetch_add(n_drafted as u64, Ordering::Relaxed);
        self.draft_accepted_tokens
            .fetch_add(n_accepted as u64, Ordering::Relaxed);
    }

    /// A pass that verified a sequence's drafts.
    pub(crate) fn record_verification(&self) {
        self.verification_passes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_cache_hit(&self, n_tokens: usize) {
        self.cache_hit_tokens
            .fetch_add(n_tokens as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_cache_usage(&self, entries: usize, bytes: usize) {
        self.cache_entries.store(entries as u64, Ordering::Relaxed);
        self.cache_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_first_token(&self, since_enqueued: Duration) {
        self.first_tokens.fetch_add(1, Ordering::Relaxed);
        self.first_token_micros
            .fetch_add(micros(since_enqueued), Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every metric of [`EXPOSED`], with
    /// `queue_depth` read by the caller.
    pub(crate) fn render(&self, queue_depth: usize) -> String {
        let mut out = String::new();
        for (name, kind, source, help) in EXPOSED {
            let value = match source {
                Count(field) => field(self).load(Ordering::Relaxed).to_string(),
                Seconds(field) => {
                    format!("{:.6}", field(self).load(Ordering::Relaxed) as f64 / 1e6)
                }
                QueueDepth => queue_depth.to_string(),
            };
            let _ = writeln!(out, "# HELP lm_{name} {help}");
            let _ = writeln!(out, "# TYPE lm_{name} {kind}");
            let _ = writeln!(out, "lm_{name} {value}");
        }
        out
    }
}

/// Where a metric's value comes from.
#[derive(Clone, Copy)]
enum Source {
    /// A count, shown as a whole number.
    Count(fn(&Metrics) -> &AtomicU64),
    /// A sum of microseconds, shown in seconds to six decimals.
    Seconds(fn(&Metrics) -> &AtomicU64),
    /// The queue depth the caller read.
    QueueDepth,
}

/// Every metric of `GET /metrics`, in the order shown: its name after
/// `lm_`, its Prometheus type, its source and its help text.
#[rustfmt::skip]
const EXPOSED: [(&str, &str, Source, &str); 21] = [
    ("requests_total", "counter", Count(|m| &m.requests), "HTTP requests answered."),
    ("requests_failed_total", "counter", Count(|m| &m.requests_failed),
        "Requests answered with a 4xx or 5xx other than 429/503."),
    ("requests_rejected_busy_total", "counter", Count(|m| &m.requests_rejected_busy),
        "Requests refused because the queue was full (429) or the server was stopping (503)."),
    ("prompt_tokens_total", "counter", Count(|m| &m.prompt_tokens),
        "Prompt tokens of finished sequences."),
    ("generation_tokens_total", "counter", Count(|m| &m.generated_tokens),
        "Tokens generated by finished sequences."),
    ("prefill_tokens_total", "counter", Count(|m| &m.prefill_tokens),
        "Prompt tokens read by prefill chunks."),
    ("queue_depth", "gauge", QueueDepth, "Sequences waiting for a slot."),
    ("active_sequences", "gauge", Count(|m| &m.active_sequences), "Sequences being generated."),
    ("decode_steps_total", "counter", Count(|m| &m.steps), "Batched decode steps run."),
    ("decode_step_sequences_total", "counter", Count(|m| &m.step_sequences),
        "Sequences over all decode steps (divided by the steps: the mean batch size)."),
    ("decode_batch_size", "gauge", Count(|m| &m.last_batch_size),
        "Sequences in the last decode step."),
    ("decode_step_seconds_total", "counter", Seconds(|m| &m.step_micros),
        "Time spent in decode steps."),
    ("time_to_first_token_seconds_total", "counter", Seconds(|m| &m.first_token_micros),
        "Time from queueing to the first token, summed over sequences (see ..._count)."),
    ("time_to_first_token_count", "counter", Count(|m| &m.first_tokens),
        "Sequences that produced a first token."),
    ("prefix_cache_hit_tokens_total", "counter", Count(|m| &m.cache_hit_tokens),
        "Prompt tokens taken from the prefix cache instead of read."),
    ("prefix_cache_entries", "gauge", Count(|m| &m.cache_entries),
        "States kept in the prefix cache."),
    ("prefix_cache_bytes", "gauge", Count(|m| &m.cache_bytes), "Bytes the kept states hold."),
    ("queue_wait_seconds_total", "counter", Seconds(|m| &m.queue_wait_micros),
        "Time sequences waited in the queue."),
    ("spec_decode_draft_tokens_total", "counter", Count(|m| &m.draft_tokens),
        "Tokens the drafter proposed and the model verified, over finished sequences (--draft)."),
    ("spec_decode_accepted_tokens_total", "counter", Count(|m| &m.draft_accepted_tokens),
        "Drafted tokens the model accepted, over finished sequences (--draft)."),
    ("spec_decode_verification_passes_total", "counter", Count(|m| &m.verification_passes),
        "Passes that verified drafts: each reads a sequence's last token and its drafts."),
];
