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

    /// The Prometheus text exposition of every metric of [`REQUESTS`] and
    /// [`EXPOSED`], with `queue_depth` read by the caller.
    pub(crate) fn render(&self, queue_depth: usize) -> String {
        render_models(
            None,
            &[ModelMetrics {
                id: None,
                metrics: self,
                queue_depth,
                loaded: None,
            }],
        )
    }

    /// A metric's value as shown.
    fn value(&self, source: Source, queue_depth: usize) -> String {
        match source {
            Count(field) => field(self).load(Ordering::Relaxed).to_string(),
            Seconds(field) => {
                format!("{:.6}", field(self).load(Ordering::Relaxed) as f64 / 1e6)
            }
            QueueDepth => queue_depth.to_string(),
        }
    }
}

/// One model's part of `/metrics`.
pub(crate) struct ModelMetrics<'a> {
    /// The `model="ID"` label (a several-model server's); `None`: no label.
    pub(crate) id: Option<&'a str>,
    pub(crate) metrics: &'a Metrics,
    pub(crate) queue_depth: usize,
    /// A several-model server's `lm_model_*` metrics ([`LOAD_EXPOSED`]):
    /// whether it is loaded, its loads, its unloads and its requests in
    /// flight, in that order.
    pub(crate) loaded: Option<[u64; 4]>,
}

/// The Prometheus text of several models' metrics: each of [`REQUESTS`]
/// and [`EXPOSED`] once, with one sample per model (labelled with its id
/// when it has one) and, for [`REQUESTS`], first an unlabelled one of the
/// `front`'s when given (a several-model server's own answers); then the
/// models' load state ([`LOAD_EXPOSED`]) for those that have one.
pub(crate) fn render_models(front: Option<&Metrics>, models: &[ModelMetrics<'_>]) -> String {
    let mut out = String::new();
    let label = |model: &ModelMetrics<'_>| {
        model.id.map_or_else(String::new, |id| {
            format!("{{model=\"{}\"}}", escape_label(id))
        })
    };
    let rows =
        (REQUESTS.iter().map(|row| (row, front))).chain(EXPOSED.iter().map(|row| (row, None)));
    for (&(name, kind, source, help), front) in rows {
        let _ = writeln!(out, "# HELP lm_{name} {help}");
        let _ = writeln!(out, "# TYPE lm_{name} {kind}");
        if let Some(front) = front {
            let _ = writeln!(out, "lm_{name} {}", front.value(source, 0));
        }
        for model in models {
            let value = model.metrics.value(source, model.queue_depth);
            let _ = writeln!(out, "lm_{name}{} {value}", label(model));
        }
    }
    for (index, (name, kind, help)) in LOAD_EXPOSED.into_iter().enumerate() {
        let mut header = Some(());
        for model in models {
            let Some(values) = model.loaded else {
                continue;
            };
            if header.take().is_some() {
                let _ = writeln!(out, "# HELP lm_{name} {help}");
                let _ = writeln!(out, "# TYPE lm_{name} {kind}");
            }
            let value = values[index];
            let _ = writeln!(out, "lm_{name}{} {value}", label(model));
        }
    }
    out
}

/// A label value with Prometheus's escapes (backslash, quote, newline).
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A several-model server's metrics of each model's load state: its name
/// after `lm_`, its Prometheus type and its help text (values in this
/// order in [`ModelMetrics::loaded`]).
const LOAD_EXPOSED: [(&str, &str, &str); 4] = [
    (
        "model_loaded",
        "gauge",
        "Whether the model is loaded (1) or unloaded (0).",
    ),
    (
        "model_loads_total",
        "counter",
        "Times the model was loaded, the first load included.",
    ),
    (
        "model_unloads_total",
        "counter",
        "Times the model was unloaded after idling (--idle-unload).",
    ),
    (
        "model_requests_in_flight",
        "gauge",
        "Requests for the model waiting for its load or running, until their answer ends.",
    ),
];

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

/// A metric of `GET /metrics`: its name after `lm_`, its Prometheus type,
/// its source and its help text.
type Exposed = (&'static str, &'static str, Source, &'static str);

/// The metrics of answers, shown first: the only ones a several-model
/// server's front has of its own.
#[rustfmt::skip]
const REQUESTS: [Exposed; 3] = [
    ("requests_total", "counter", Count(|m| &m.requests), "HTTP requests answered."),
    ("requests_failed_total", "counter", Count(|m| &m.requests_failed),
        "Requests answered with a 4xx or 5xx other than 429/503."),
    ("requests_rejected_busy_total", "counter", Count(|m| &m.requests_rejected_busy),
        "Requests refused because the queue was full (429) or the server was stopping (503)."),
];

/// The rest of `GET /metrics`, in the order shown after [`REQUESTS`].
#[rustfmt::skip]
const EXPOSED: [Exposed; 18] = [
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
