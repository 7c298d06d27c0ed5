//! Ctrl-C while generating: stop after the current step, print what was
//! generated so far, exit with code 130 (128 + SIGINT, as shells report a
//! process ended by Ctrl-C).
//!
//! ```text
//! Ctrl-C ──> handler sets REQUESTED ──> generate's step hook returns
//!            (a second Ctrl-C exits      ControlFlow::Break: lm-decode's loop
//!             at once with 130)          stops with StopReason::Cancelled
//!                                              │
//!   generate: finishes the printer (the text so far), notes the
//!   interruption on stderr, returns `Interrupted` ──> main: exit 130
//! ```
//!
//! Only `generate` installs the handler; every other
//! command keeps the default (Ctrl-C ends it at once; `train --out` never
//! leaves a half-written file, it writes a temporary file and renames it).

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

/// The exit code of an interrupted run.
pub const EXIT_CODE: u8 = 130;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// A run stopped by Ctrl-C after printing what it had generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted after {n_tokens} generated tokens")]
pub struct Interrupted {
    /// Tokens generated before the interruption.
    pub n_tokens: usize,
}

/// Installs the Ctrl-C handler: the first Ctrl-C asks the run to stop after
/// its current step, a second one exits at once.
pub fn install() -> Result<()> {
    ctrlc::set_handler(|| {
        if REQUESTED.swap(true, Ordering::SeqCst) {
            std::process::exit(i32::from(EXIT_CODE));
        }
    })
    .context("installing the Ctrl-C handler")
}

/// Whether Ctrl-C was pressed.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
