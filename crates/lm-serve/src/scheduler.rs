//! Continuous batching: one scheduler thread owns the model's forward
//! passes; each request runs lm-decode's one generation loop on a worker
//! thread of its own, against a [`Remote`] model whose `forward` hands the
//! sequence's state to the scheduler and waits for its logits.
//!
//! ```text
//! HTTP handlers ──jobs──> JobQueue (bounded) ──> workers (--parallel threads)
//!                                                  │ lm_decode::generate_with_hook
//!                                                  │   over Remote<M>
//!                                                  v
//!                          scheduler: waits until every active sequence has
//!                          asked for its next forward, then runs ONE step:
//!                            all one-token requests  -> model.forward_batch
//!                                                       (weights read once)
//!                            multi-token passes      -> model.forward each,
//!                            (prefill chunks, draft     oldest first, up to
//!                             verifications)            prefill_chunk_len tokens
//!                          and hands each state and its logits back
//! ```
//!
//! New sequences join between steps (their prompt read in chunks of
//! `prefill_chunk_len`, so a long prompt never stalls the others for more
//! than a chunk). Sampling, stop rules and the trace stay in lm-decode's
//! loop, and the multi-sequence step gives each sequence the bits it gets
//! alone, so a request's tokens are those it gets served alone: the batch
//! changes speed, never output.
//!
//! With a drafter (`ServeConfig::draft`) the worker runs lm-decode's
//! speculative loop instead (`generate_speculative_from_state`): a round
//! whose drafter proposes nothing asks for a one-token step as the plain
//! loop does; a round with drafts asks for one pass over the last token and
//! the drafts with a logits row per token ([`Rows::All`]), which the step
//! runs like a prefill chunk. The decoder gives a row the same bits whether
//! its token is read alone, in a batch or in a longer pass, so greedy
//! tokens are the plain loop's, id for id.
//!
//! A token crosses three threads (worker, scheduler, the HTTP task), so the
//! hot path reuses what it can: each worker's token buffer and logits row
//! travel to the scheduler and back, replies go through one channel per
//! worker made at start (no `Sender` cloned per step), the scheduler keeps
//! its step's vectors between steps, and the text of each token comes
//! decoded from the loop ([`lm_decode::Step::text`]), never decoded again.

use std::cell::Cell;
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use lm_core::{LanguageModel, Rows, SequenceState, TokenId};
use lm_decode::{
    CacheLimit, Candidate, GenerationConfig, GenerationHook, PrefixCache, StopReason,
    generate_from_state, generate_speculative_from_state, tokens_reused,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::SpeculativeDrafter;
use crate::metrics::Metrics;
use crate::state_size::StateSize;
use crate::text::ServedText;
use crate::trace::StepTrace;

/// One sequence to generate: a prompt and its policy, and where its events
/// go.
pub(crate) struct Job {
    /// Which of the request's `n` choices this is.
    pub(crate) index: usize,
    pub(crate) prompt: Vec<TokenId>,
    pub(crate) config: GenerationConfig,
    pub(crate) events: UnboundedSender<(usize, Event)>,
    pub(crate) enqueued: Instant,
    /// Whether each token's event carries its [`StepTrace`] (`lm_trace`).
    pub(crate) trace: bool,
}

/// What a worker reports about its sequence.
#[derive(Debug)]
pub(crate) enum Event {
    /// A generated token (end tokens included), with the text it made final
    /// and, when the job asked for it, what the policy did at its step.
    Token {
        token: TokenId,
        logprob: f64,
        top: Vec<Candidate>,
        text: String,
        trace: Option<Box<StepTrace>>,
    },
    /// The sequence ended: the rest of its text and why it stopped.
    Done {
        text: String,
        stop_reason: StopReason,
        n_prompt: usize,
        n_generated: usize,
    },
    /// The loop failed (a bad request the checks before it missed).
    Failed(String),
}

/// The jobs waiting for a worker, bounded: a request that does not fit is
/// refused whole (429), never queued in part.
pub(crate) struct JobQueue {
    inner: Mutex<QueueInner>,
    ready: Condvar,
    capacity: usize,
}

struct QueueInner {
    jobs: VecDeque<Job>,
    closed: bool,
}

impl JobQueue {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(QueueInner {
                jobs: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            capacity,
        }
    }

    /// Queues every job or none: `Err` hands them back when they do not fit.
    pub(crate) fn push_all(&self, jobs: Vec<Job>) -> Result<(), Vec<Job>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.closed || inner.jobs.len() + jobs.len() > self.capacity {
            return Err(jobs);
        }
        inner.jobs.extend(jobs);
        self.ready.notify_all();
        Ok(())
    }

    /// The next job; `None` once the queue is closed and empty.
    fn pop(&self) -> Option<Job> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = inner.jobs.pop_front() {
                return Some(job);
            }
            if inner.closed {
                return None;
            }
            inner = self.ready.wait(inner).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Jobs waiting.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().map_or(0, |inner| inner.jobs.len())
    }

    /// Refuses new jobs and lets the workers exit once the queue is empty.
    pub(crate) fn close(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.closed = true;
        self.ready.notify_all();
    }
}

/// A request for one forward pass, from a worker to the scheduler. The
/// worker's buffers (`tokens`, `logits`) come back in the [`Reply`].
struct Forward<S> {
    /// The worker to answer (its index in the scheduler's reply channels).
    worker_idx: usize,
    state: S,
    tokens: Vec<TokenId>,
    rows: Rows,
    logits: Vec<f32>,
}

/// The scheduler's answer: the state and buffers back, and the result.
struct Reply<S> {
    state: S,
    tokens: Vec<TokenId>,
    logits: Vec<f32>,
    result: lm_core::Result<()>,
}

/// Sends `reply` to worker `worker_idx`; a worker that is gone (it
/// panicked) needs no answer.
fn answer<S>(replies: &[Sender<Reply<S>>], worker_idx: usize, reply: Reply<S>) {
    let _ = replies[worker_idx].send(reply);
}

enum Message<S> {
    /// A sequence became active: the scheduler waits for its requests.
    Join,
    Forward(Forward<S>),
    /// A sequence ended.
    Leave,
}

/// The prefix cache the workers share, of `cache_bytes` at most.
pub(crate) fn prefix_cache<S: StateSize + SequenceState>(
    cache_bytes: usize,
) -> Arc<Mutex<PrefixCache<S>>> {
    Arc::new(Mutex::new(PrefixCache::new(
        CacheLimit::bytes(cache_bytes),
        <S as StateSize>::size_bytes,
    )))
}

/// How the scheduler and its workers run (from `ServeConfig`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// Workers, one sequence each (`parallel`).
    pub(crate) n_workers: usize,
    /// The most tokens of multi-token passes a step runs besides its batch
    /// (`prefill_chunk_len`; one pass always runs, whatever its length).
    pub(crate) step_tokens: usize,
    /// Speculative decoding's drafter, if any.
    pub(crate) draft: Option<SpeculativeDrafter>,
}

/// Starts the scheduler and `settings.n_workers` workers serving `queue`,
/// keeping finished sequences' states in `cache`. They end once the queue
/// is closed and drained.
pub(crate) fn start<M>(
    model: Arc<M>,
    text: Arc<dyn ServedText>,
    queue: Arc<JobQueue>,
    settings: Settings,
    cancel: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    cache: Arc<Mutex<PrefixCache<M::State>>>,
) -> Vec<std::thread::JoinHandle<()>>
where
    M: LanguageModel + Send + Sync + 'static,
    M::State: StateSize + Send + 'static,
{
    let Settings {
        n_workers,
        step_tokens,
        draft,
    } = settings;
    let (to_scheduler, inbox) = std::sync::mpsc::channel();
    let (reply_to, replies): (Vec<_>, Vec<_>) =
        (0..n_workers).map(|_| std::sync::mpsc::channel()).unzip();
    let mut threads = Vec::with_capacity(n_workers + 1);
    let scheduler_model = Arc::clone(&model);
    let scheduler_metrics = Arc::clone(&metrics);
    threads.push(
        std::thread::Builder::new()
            .name("lm-serve-scheduler".into())
            .spawn(move || {
                run_scheduler(
                    &*scheduler_model,
                    &inbox,
                    &reply_to,
                    step_tokens,
                    &scheduler_metrics,
                );
            })
            .expect("spawning the scheduler thread"),
    );
    for (worker_idx, replies) in replies.into_iter().enumerate() {
        let remote = Remote {
            model: Arc::clone(&model),
            to_scheduler: to_scheduler.clone(),
            worker_idx,
            replies,
            tokens: Cell::new(Vec::new()),
        };
        let (cache, text, queue, cancel, metrics) = (
            Arc::clone(&cache),
            Arc::clone(&text),
            Arc::clone(&queue),
            Arc::clone(&cancel),
            Arc::clone(&metrics),
        );
        threads.push(
            std::thread::Builder::new()
                .name(format!("lm-serve-worker-{worker_idx}"))
                .spawn(move || {
                    while let Some(job) = queue.pop() {
                        metrics.job_started(job.enqueued);
                        run_job(&remote, &*text, job, draft, &cache, &cancel, &metrics);
                        metrics.job_ended();
                    }
                })
                .expect("spawning a worker thread"),
        );
    }
    threads
}

/// The scheduler's loop: gather requests until every active sequence has
/// one, run a step, repeat; ends when every worker is gone. Worker `i` gets
/// its answers through `replies[i]`; a step runs at most `step_tokens`
/// tokens of multi-token passes besides its batch.
fn run_scheduler<M: LanguageModel>(
    model: &M,
    inbox: &Receiver<Message<M::State>>,
    replies: &[Sender<Reply<M::State>>],
    step_tokens: usize,
    metrics: &Metrics,
) {
    let mut n_active = 0usize;
    let mut waiting: Vec<Forward<M::State>> = Vec::new();
    let mut scratch = StepScratch::default();
    loop {
        let ready = n_active > 0 && waiting.len() == n_active;
        let message = if ready {
            // Nothing more (or every worker gone): run the step.
            inbox.try_recv().ok()
        } else {
            match inbox.recv() {
                Ok(message) => Some(message),
                Err(_) => return,
            }
        };
        match message {
            Some(Message::Join) => n_active += 1,
            Some(Message::Leave) => n_active -= 1,
            Some(Message::Forward(forward)) => waiting.push(forward),
            None => step(
                model,
                &mut waiting,
                &mut scratch,
                replies,
                step_tokens,
                metrics,
            ),
        }
    }
}

/// The vectors a step fills and empties, kept between steps so a step
/// allocates only its list of token slices.
struct StepScratch<S> {
    /// The one-token requests run together, by field.
    workers: Vec<usize>,
    states: Vec<S>,
    tokens: Vec<Vec<TokenId>>,
    logits: Vec<Vec<f32>>,
    /// The multi-token passes this step runs, oldest first.
    passes: Vec<Forward<S>>,
    /// The requests left for a later step.
    deferred: Vec<Forward<S>>,
}

impl<S> Default for StepScratch<S> {
    fn default() -> Self {
        Self {
            workers: Vec::new(),
            states: Vec::new(),
            tokens: Vec::new(),
            logits: Vec::new(),
            passes: Vec::new(),
            deferred: Vec::new(),
        }
    }
}

/// One step: every waiting one-token request in one `forward_batch`, then
/// the waiting multi-token passes (prefill chunks, speculative
/// verifications), oldest first, while their tokens total at most
/// `step_tokens` (the oldest always runs); the others wait for the next
/// step.
fn step<M: LanguageModel>(
    model: &M,
    waiting: &mut Vec<Forward<M::State>>,
    scratch: &mut StepScratch<M::State>,
    replies: &[Sender<Reply<M::State>>],
    step_tokens: usize,
    metrics: &Metrics,
) {
    let mut n_pass_tokens = 0;
    for f in waiting.drain(..) {
        if f.tokens.len() == 1 && f.rows == Rows::Last {
            scratch.workers.push(f.worker_idx);
            scratch.states.push(f.state);
            scratch.tokens.push(f.tokens);
            scratch.logits.push(f.logits);
        } else if scratch.deferred.is_empty()
            && (scratch.passes.is_empty() || n_pass_tokens + f.tokens.len() <= step_tokens)
        {
            n_pass_tokens += f.tokens.len();
            scratch.passes.push(f);
        } else {
            scratch.deferred.push(f);
        }
    }
    std::mem::swap(waiting, &mut scratch.deferred);
    if !scratch.workers.is_empty() {
        decode_together(model, scratch, replies, metrics);
    }
    for mut f in scratch.passes.drain(..) {
        let result = model.forward(&mut f.state, &f.tokens, f.rows, &mut f.logits);
        match f.rows {
            Rows::Last => metrics.record_prefill(f.tokens.len()),
            Rows::All => metrics.record_verification(),
        }
        let reply = Reply {
            state: f.state,
            tokens: f.tokens,
            logits: f.logits,
            result,
        };
        answer(replies, f.worker_idx, reply);
    }
}

/// Runs the one-token requests gathered in `scratch` in one
/// `forward_batch` and answers each worker, leaving `scratch` empty.
fn decode_together<M: LanguageModel>(
    model: &M,
    scratch: &mut StepScratch<M::State>,
    replies: &[Sender<Reply<M::State>>],
    metrics: &Metrics,
) {
    let started = Instant::now();
    let StepScratch {
        workers,
        states,
        tokens,
        logits,
        ..
    } = scratch;
    let slices: Vec<&[TokenId]> = tokens.iter().map(Vec::as_slice).collect();
    // A failed batch changed no state: each sequence alone, so only the bad
    // one fails.
    let failures: Option<Vec<lm_core::Result<()>>> = match model
        .forward_batch(states, &slices, logits)
    {
        Ok(()) => None,
        Err(_) => Some(
            states
                .iter_mut()
                .zip(&slices)
                .zip(logits.iter_mut())
                .map(|((state, tokens), logits)| model.forward(state, tokens, Rows::Last, logits))
                .collect(),
        ),
    };
    metrics.record_step(workers.len(), started.elapsed());
    let mut failures = failures.map(Vec::into_iter);
    let answers = workers
        .drain(..)
        .zip(states.drain(..))
        .zip(tokens.drain(..))
        .zip(logits.drain(..));
    for (((worker_idx, state), tokens), logits) in answers {
        let result = match &mut failures {
            Some(results) => results.next().unwrap_or(Ok(())),
            None => Ok(()),
        };
        let reply = Reply {
            state,
            tokens,
            logits,
            result,
        };
        answer(replies, worker_idx, reply);
    }
}

/// The model as a worker sees it: every forward pass goes through the
/// scheduler.
struct Remote<M: LanguageModel> {
    model: Arc<M>,
    to_scheduler: Sender<Message<M::State>>,
    /// This worker's index in the scheduler's reply channels.
    worker_idx: usize,
    replies: Receiver<Reply<M::State>>,
    /// The token buffer between forward calls (it travels with each
    /// request and comes back with the reply).
    tokens: Cell<Vec<TokenId>>,
}

/// A sequence's state while its worker holds it (`None` only while the
/// scheduler has it, inside a forward call).
#[derive(Debug, Clone)]
struct RemoteState<S>(Option<S>);

impl<S: SequenceState> SequenceState for RemoteState<S> {
    fn pos(&self) -> usize {
        self.0.as_ref().map_or(0, SequenceState::pos)
    }

    fn truncate(&mut self, pos: usize) {
        if let Some(state) = &mut self.0 {
            state.truncate(pos);
        }
    }
}

impl<M: LanguageModel> LanguageModel for Remote<M> {
    type State = RemoteState<M::State>;

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn context_length(&self) -> Option<usize> {
        self.model.context_length()
    }

    fn new_state(&self) -> Self::State {
        RemoteState(Some(self.model.new_state()))
    }

    fn forward(
        &self,
        state: &mut Self::State,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        self.model.check_input(state.pos(), tokens)?;
        let inner = state
            .0
            .take()
            .expect("a state is home between forward calls");
        let mut buffer = self.tokens.take();
        buffer.clear();
        buffer.extend_from_slice(tokens);
        let forward = Forward {
            worker_idx: self.worker_idx,
            state: inner,
            tokens: buffer,
            rows,
            logits: std::mem::take(logits),
        };
        self.to_scheduler
            .send(Message::Forward(forward))
            .expect("the scheduler outlives its workers");
        let reply = self
            .replies
            .recv()
            .expect("the scheduler answers every request");
        state.0 = Some(reply.state);
        *logits = reply.logits;
        self.tokens.set(reply.tokens);
        reply.result
    }
}

/// A sequence's seat in the batch: joins when made, leaves when dropped
/// (also when the loop panics), so the scheduler never waits for it.
struct Seat<'a, S>(&'a Sender<Message<S>>);

impl<'a, S> Seat<'a, S> {
    fn join(to_scheduler: &'a Sender<Message<S>>) -> Self {
        let _ = to_scheduler.send(Message::Join);
        Self(to_scheduler)
    }
}

impl<S> Drop for Seat<'_, S> {
    fn drop(&mut self) {
        let _ = self.0.send(Message::Leave);
    }
}

/// Streams each step to the job's events; stops the run when the client
/// went away or the server is shutting down.
struct StreamHook<'a> {
    index: usize,
    events: &'a UnboundedSender<(usize, Event)>,
    cancel: &'a AtomicBool,
    metrics: &'a Metrics,
    started: Instant,
    first_token: bool,
    /// Whether to send each step's [`StepTrace`].
    trace: bool,
}

impl StreamHook<'_> {
    fn flow(&self) -> ControlFlow<()> {
        if self.events.is_closed() || self.cancel.load(Ordering::Relaxed) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

/// On `&mut`, so the caller keeps the hook after the run.
impl GenerationHook for &mut StreamHook<'_> {
    type Error = lm_decode::Error;

    fn on_step(&mut self, step: &lm_decode::Step) -> Result<ControlFlow<()>, Self::Error> {
        if self.first_token {
            self.first_token = false;
            self.metrics.record_first_token(self.started.elapsed());
        }
        let _ = self.events.send((
            self.index,
            Event::Token {
                token: step.token,
                logprob: step.logprob,
                top: step.model_top.clone(),
                text: step.text.clone(),
                trace: self.trace.then(|| Box::new(StepTrace::of(step))),
            },
        ));
        Ok(self.flow())
    }

    fn after_prefill_chunk(
        &mut self,
        _n_read: usize,
        _n_prompt: usize,
    ) -> Result<ControlFlow<()>, Self::Error> {
        Ok(self.flow())
    }
}

/// Runs one job through lm-decode's loop (the speculative one with
/// `draft`), from the longest kept prefix of its prompt, reports its end
/// and keeps its state.
fn run_job<M: LanguageModel>(
    remote: &Remote<M>,
    text: &dyn ServedText,
    job: Job,
    draft: Option<SpeculativeDrafter>,
    cache: &Mutex<PrefixCache<M::State>>,
    cancel: &AtomicBool,
    metrics: &Metrics,
) where
    M::State: StateSize,
{
    let _seat = Seat::join(&remote.to_scheduler);
    let detokenizer = text.detokenizer();
    let mut hook = StreamHook {
        index: job.index,
        events: &job.events,
        cancel,
        metrics,
        started: job.enqueued,
        first_token: true,
        trace: job.trace,
    };
    let (state, n_shared) = match lock(cache).longest_prefix(&job.prompt) {
        Some((state, n_shared)) => (RemoteState(Some(state)), n_shared),
        None => (remote.new_state(), 0),
    };
    let (prompt, config) = (&job.prompt, &job.config);
    let result = match draft {
        None => generate_from_state(remote, state, prompt, config, Some(detokenizer), &mut hook),
        Some(draft) => {
            let drafter = draft.start();
            let detokenizer = Some(detokenizer);
            generate_speculative_from_state(
                remote,
                state,
                prompt,
                config,
                detokenizer,
                drafter,
                &mut hook,
            )
            .map(|(generation, stats, state)| {
                metrics.record_drafts(stats.drafted_tokens, stats.accepted_tokens);
                (generation, state)
            })
        }
    };
    let event = match result {
        Ok((generation, state)) => {
            metrics.record_cache_hit(tokens_reused(&generation, n_shared));
            metrics.record_generated(generation.prompt.len(), generation.tokens.len());
            if let Some(state) = state.0 {
                let mut cache = lock(cache);
                cache.insert_run(&generation, state);
                metrics.record_cache_usage(cache.len(), cache.used_bytes());
            }
            Event::Done {
                text: generation.held_back_text,
                stop_reason: generation.stop_reason,
                n_prompt: generation.prompt.len(),
                n_generated: generation.tokens.len(),
            }
        }
        Err(error) => Event::Failed(error.to_string()),
    };
    let _ = job.events.send((job.index, event));
}

/// The cache, also after a worker panicked holding it (it stays consistent:
/// every change is made whole under the lock).
fn lock<S>(cache: &Mutex<PrefixCache<S>>) -> std::sync::MutexGuard<'_, PrefixCache<S>> {
    cache.lock().unwrap_or_else(|e| e.into_inner())
}
