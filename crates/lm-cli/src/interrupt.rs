//! Ctrl-C while generating: stop after the current step, print what was
//! generated so far in the output mode asked for (text, `--trace` table or
//! `--json`), exit with code 130 (128 + SIGINT, as shells report a process
//! ended by Ctrl-C).
//!
//! ```text
//! Ctrl-C ──> handler: press() sets REQUESTED ──> the step hook of generate
//!            (a second Ctrl-C gives the run      or beam search (after_step)
//!             GRACE to print, then exits 130;    returns ControlFlow::Break:
//!             a third exits at once)             lm-decode stops, StopReason::Cancelled
//!                                                     │
//!   generate: the Cancelled generation goes through the same output code
//!   as a finished one, then `Interrupted` ──> main: `note: interrupted ...`, exit 130
//! ```
//!
//! Ctrl-C during a long prefill is honoured between prompt chunks
//! ([`after_prefill_chunk`], lm-decode's `GenerationHook`): the run stops
//! there, with no token generated.
//!
//! Tests press Ctrl-C deterministically with the environment variable
//! [`TEST_HOOK_VAR`]` = N`: the N-th generated token of the run (counted over
//! every sequence; a beam-search step counts as one) presses it, through the
//! same [`press`] as the real handler; `prefill:N` presses it after the N-th
//! chunk of the prompt is read. Nothing but tests should set it.
//!
//! Two presses close together are common (`timeout -s INT` signals the
//! child and then its process group; an impatient double Ctrl-C), so the
//! second press does not exit at once: the run still stops at its next step
//! and prints what it has, and only if it has not ended within [`GRACE`]
//! (a step stuck in a slow forward pass) does the process exit 130 without
//! it. A third press exits at once.
//!
//! `chat` installs it too: Ctrl-C stops the current reply, [`reset`]
//! re-arms it, and the chat goes back to the prompt (a second Ctrl-C during
//! the same reply exits with 130 after [`GRACE`]). Only `generate` and `chat` install
//! the handler; every other
//! command keeps the default (Ctrl-C ends it at once; `train --out` never
//! leaves a half-written file, it writes a temporary file and renames it).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};

/// The exit code of an interrupted run.
pub const EXIT_CODE: u8 = 130;

/// The test hook: `N` (at least 1) acts as a Ctrl-C right after the N-th
/// generated token, `prefill:N` right after the N-th prompt chunk is read.
pub const TEST_HOOK_VAR: &str = "LM_CLI_TEST_INTERRUPT_AFTER";

/// How long a second Ctrl-C lets the run print what it has before the
/// process exits without it.
pub const GRACE: Duration = Duration::from_secs(2);

/// Ctrl-C was pressed.
static REQUESTED: AtomicBool = AtomicBool::new(false);
/// Ctrl-C presses since the last [`reset`].
static N_PRESSES: AtomicUsize = AtomicUsize::new(0);
/// Steps taken so far in this run, all sequences together.
static N_GENERATED: AtomicUsize = AtomicUsize::new(0);
/// Prompt chunks read so far in this run, all sequences together.
static N_PREFILL_CHUNKS: AtomicUsize = AtomicUsize::new(0);
/// The test hook's press, read once by [`install`].
static PRESS_AFTER: OnceLock<Option<TestPress>> = OnceLock::new();

/// When the test hook presses Ctrl-C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TestPress {
    /// After this many generated tokens.
    Steps(usize),
    /// After this many prompt chunks.
    PrefillChunks(usize),
}

/// A run stopped by Ctrl-C after printing what it had generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted after {n_tokens} generated tokens")]
pub struct Interrupted {
    /// Tokens generated before the interruption.
    pub n_tokens: usize,
}

/// A test hook value that is not a token count of at least 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{TEST_HOOK_VAR} must be a token count of at least 1, got {value:?}")]
pub struct TestHookError {
    /// The value as set.
    pub value: String,
}

/// Installs the Ctrl-C handler: the first Ctrl-C asks the run to stop after
/// its current step, a second one exits after [`GRACE`] unless the run has
/// ended, a third exits at once. Reads the test hook.
pub fn install() -> Result<()> {
    let press_after = match std::env::var_os(TEST_HOOK_VAR) {
        None => None,
        Some(value) => {
            let value = value.to_string_lossy().into_owned();
            let (press, count) = match value.strip_prefix("prefill:") {
                Some(count) => (TestPress::PrefillChunks as fn(usize) -> TestPress, count),
                None => (TestPress::Steps as fn(usize) -> TestPress, value.as_str()),
            };
            match count.parse::<usize>() {
                Ok(n) if n >= 1 => Some(press(n)),
                _ => return Err(TestHookError { value }.into()),
            }
        }
    };
    let _ = PRESS_AFTER.set(press_after);
    ctrlc::set_handler(press).context("installing the Ctrl-C handler")
}

/// Whether Ctrl-C was pressed.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// The step hook's check: counts one step (pressing Ctrl-C for the test
/// hook when its count is reached) and tells whether the run should stop
/// after this step.
pub fn after_step() -> bool {
    let n_generated = N_GENERATED.fetch_add(1, Ordering::SeqCst) + 1;
    if test_hook() == Some(TestPress::Steps(n_generated)) {
        press();
    }
    requested()
}

/// The prefill hook's check: counts one prompt chunk read (pressing Ctrl-C
/// for the test hook when its count is reached) and tells whether the run
/// should stop before reading more.
pub fn after_prefill_chunk() -> bool {
    let n_chunks = N_PREFILL_CHUNKS.fetch_add(1, Ordering::SeqCst) + 1;
    if test_hook() == Some(TestPress::PrefillChunks(n_chunks)) {
        press();
    }
    requested()
}

/// Forgets a Ctrl-C that has been handled (a chat's stopped reply), so the
/// next one stops the next reply instead of exiting.
pub fn reset() {
    REQUESTED.store(false, Ordering::SeqCst);
    N_PRESSES.store(0, Ordering::SeqCst);
}

/// What Ctrl-C does (the handler, and the test hook): the first press asks
/// the run to stop, the second starts the [`GRACE`] clock, the third exits.
fn press() {
    REQUESTED.store(true, Ordering::SeqCst);
    match N_PRESSES.fetch_add(1, Ordering::SeqCst) {
        0 => {}
        1 => {
            // On its own thread, so a third press is handled meanwhile.
            let clock = std::thread::Builder::new()
                .name("ctrl-c-grace".to_owned())
                .spawn(|| {
                    std::thread::sleep(GRACE);
                    exit_interrupted();
                });
            if clock.is_err() {
                exit_interrupted();
            }
        }
        _ => exit_interrupted(),
    }
}

/// Ends the process as interrupted, without waiting for the run.
fn exit_interrupted() -> ! {
    std::process::exit(i32::from(EXIT_CODE))
}

fn test_hook() -> Option<TestPress> {
    PRESS_AFTER.get().copied().flatten()
}
