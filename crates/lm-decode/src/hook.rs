//! What the generation loop tells its caller while it runs, and the chunked
//! prefill that gives a long prompt points at which to stop.
//!
//! A 1,024-token prompt read in one forward call is one long wait that
//! nothing can interrupt. Read in chunks (`GenerationConfig::prefill_chunk_len`),
//! the caller's [`GenerationHook::after_prefill_chunk`] runs between chunks
//! ([`crate::generate_with_hook`])
//! and can stop the run there (Ctrl-C), before any token is chosen.
//!
//! ```text
//! prompt: [ chunk 1 ][ chunk 2 ][ chunk 3 ] ─> logits ─> choose t1 ─> on_step ...
//!                   ^          ^          ^
//!          after_prefill_chunk(n_read, n_prompt): Continue, or Break to stop
//! ```

use std::num::NonZeroUsize;
use std::ops::ControlFlow;

use lm_core::{LanguageModel, Rows, TokenId};

use crate::{Result, Step};

/// The caller's view of a running generation. A closure
/// `FnMut(&Step) -> ControlFlow<()>` is a hook that sees only the steps.
pub trait GenerationHook {
    /// Sees each step as soon as its token is chosen; `Break` stops the run
    /// after it.
    fn on_step(&mut self, step: &Step) -> ControlFlow<()>;

    /// Runs after each chunk of the prompt is read (`n_read` of `n_prompt`
    /// tokens, the last chunk included); `Break` stops the run there, with
    /// no token chosen.
    fn after_prefill_chunk(&mut self, n_read: usize, n_prompt: usize) -> ControlFlow<()> {
        let _ = (n_read, n_prompt);
        ControlFlow::Continue(())
    }
}

impl<F: FnMut(&Step) -> ControlFlow<()>> GenerationHook for F {
    fn on_step(&mut self, step: &Step) -> ControlFlow<()> {
        self(step)
    }
}

/// Reads `tokens` into `state` in chunks of at most `chunk_len` (all at once
/// when `None`), leaving the logits row after the last token in `logits`.
/// `after_chunk(n_read, n_total)` runs after each chunk; on `Break` the rest
/// is not read and `Break` is returned.
pub(crate) fn prefill<M: LanguageModel>(
    model: &M,
    state: &mut M::State,
    tokens: &[TokenId],
    chunk_len: Option<NonZeroUsize>,
    logits: &mut Vec<f32>,
    mut after_chunk: impl FnMut(usize, usize) -> ControlFlow<()>,
) -> Result<ControlFlow<()>> {
    let chunk_len = chunk_len.map_or(tokens.len(), NonZeroUsize::get);
    let mut n_read = 0;
    // One call at least: an empty prompt is the model's to accept or refuse.
    loop {
        let chunk = &tokens[n_read..tokens.len().min(n_read + chunk_len)];
        model.forward(state, chunk, Rows::Last, logits)?;
        n_read += chunk.len();
        if after_chunk(n_read, tokens.len()).is_break() {
            return Ok(ControlFlow::Break(()));
        }
        if n_read == tokens.len() {
            return Ok(ControlFlow::Continue(()));
        }
    }
}
