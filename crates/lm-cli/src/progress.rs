//! Progress bars on stderr for slow work, drawn only when stderr is a
//! terminal (a pipe or a file gets nothing): counting a training corpus
//! (`train`), and reading a long prompt (`generate`), which shows a bar only
//! once reading it has taken longer than [`PREFILL_QUIET`].

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How long a prompt is read before a bar appears: a short prompt never
/// flickers one.
pub const PREFILL_QUIET: Duration = Duration::from_secs(1);

/// A bar of `len` units with `template` (indicatif's syntax), or `None`
/// when stderr is not a terminal.
pub fn terminal_bar(len: u64, template: &str) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    Some(bar)
}

/// The progress of reading one prompt, fed after each prefill chunk
/// (lm-decode's `GenerationHook::after_prefill_chunk`) and cleared when the
/// first token is chosen (or the run ends).
#[derive(Debug)]
pub struct PrefillProgress {
    start: Instant,
    /// Whether stderr is a terminal (checked once).
    on_terminal: bool,
    bar: Option<ProgressBar>,
}

impl PrefillProgress {
    /// Starts the clock: call when the prompt starts being read.
    pub fn start() -> Self {
        Self {
            start: Instant::now(),
            on_terminal: std::io::stderr().is_terminal(),
            bar: None,
        }
    }

    /// `n_read` of `n_prompt` tokens have been read.
    pub fn chunk_read(&mut self, n_read: usize, n_prompt: usize) {
        if !self.on_terminal {
            return;
        }
        if self.bar.is_none() && shows_bar(self.start.elapsed(), n_read, n_prompt) {
            self.bar = terminal_bar(
                n_prompt as u64,
                "reading the prompt {bar:40} {pos}/{len} tokens ({eta})",
            );
        }
        if let Some(bar) = &self.bar {
            bar.set_position(n_read as u64);
        }
    }

    /// Clears the bar, if one was drawn.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for PrefillProgress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Whether a prompt read for `elapsed`, `n_read` of `n_prompt` tokens so
/// far, deserves a bar: it is slow (past [`PREFILL_QUIET`]) and not done.
fn shows_bar(elapsed: Duration, n_read: usize, n_prompt: usize) -> bool {
    elapsed >= PREFILL_QUIET && n_read < n_prompt
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_only_for_a_slow_unfinished_prompt() {
        let second = Duration::from_secs(1);
        assert!(!shows_bar(Duration::from_millis(999), 512, 4096));
        assert!(shows_bar(second, 512, 4096));
        assert!(shows_bar(10 * second, 3584, 4096));
        // The last chunk is read: the first token comes next, no bar.
        assert!(!shows_bar(10 * second, 4096, 4096));
    }
}
