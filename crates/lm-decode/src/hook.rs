//! What the loops tell their caller while they run: hooks that can fail,
//! and the chunked prefill that gives a long prompt points at which to stop.
//!
//! Hooks that can fail: the loops run with a hook that only continues or
//! breaks, and a caller's error ends the run and comes out as it went in.
//!
//! A 1,024-token prompt read in one forward call is one long wait that
//! nothing can interrupt. Read in chunks (`GenerationConfig::prefill_chunk_len`),
//! the caller's [`GenerationHook::after_prefill_chunk`] runs between chunks
//! ([`crate::generate_with_hook`]) and can stop the run there (Ctrl-C),
//! before any token is chosen.
//!
//! ```text
//! prompt: [ chunk 1 ][ chunk 2 ][ chunk 3 ] ─> logits ─> choose t1 ─> on_step ...
//!                   ^          ^          ^
//!          after_prefill_chunk(n_read, n_prompt): Continue, or Break to stop
//! ```

use std::num::NonZeroUsize;
use std::ops::ControlFlow;

use lm_core::{LanguageModel, Rows, TokenId};

use crate::error::{Error, Result};
use crate::trace::Step;

/// The caller's view of a running generation. A closure
/// `FnMut(&Step) -> Result<ControlFlow<()>, E>` is a hook that sees only the
/// steps. An error from the hook ends the run and is returned as it is; the
/// loop's own errors reach the caller as the same type.
pub trait GenerationHook {
    /// The error the hook can end the run with.
    type Error: From<Error>;

    /// Sees each step as soon as its token is chosen (with a detokenizer,
    /// [`Step::text`] is the text to print); `Break` stops the run after it.
    fn on_step(&mut self, step: &Step) -> std::result::Result<ControlFlow<()>, Self::Error>;

    /// Runs after each chunk of the prompt is read (`n_read` of `n_prompt`
    /// tokens, the last chunk included); `Break` stops the run there, with
    /// no token chosen.
    fn after_prefill_chunk(
        &mut self,
        n_read: usize,
        n_prompt: usize,
    ) -> std::result::Result<ControlFlow<()>, Self::Error> {
        let _ = (n_read, n_prompt);
        Ok(ControlFlow::Continue(()))
    }
}

impl<F, E> GenerationHook for F
where
    F: FnMut(&Step) -> std::result::Result<ControlFlow<()>, E>,
    E: From<Error>,
{
    type Error = E;

    fn on_step(&mut self, step: &Step) -> std::result::Result<ControlFlow<()>, E> {
        self(step)
    }
}

/// Runs `run` with a hook made from `on_step`: the first error `on_step`
/// returns breaks the run (as a cancel does) and is returned in place of the
/// run's result; the run's own errors become `E`.
pub(crate) fn with_fallible_hook<T: ?Sized, R, E: From<Error>>(
    mut on_step: impl FnMut(&T) -> std::result::Result<ControlFlow<()>, E>,
    run: impl FnOnce(&mut dyn FnMut(&T) -> ControlFlow<()>) -> Result<R>,
) -> std::result::Result<R, E> {
    let mut hook_error = None;
    let result = run(&mut |step| settle(on_step(step), &mut hook_error));
    finish(result, hook_error)
}

/// A hook's answer as the loop takes it: its flow, or `Break` with the
/// error kept in `hook_error` (the first one wins; the loop stops at it).
pub(crate) fn settle<E>(
    answer: std::result::Result<ControlFlow<()>, E>,
    hook_error: &mut Option<E>,
) -> ControlFlow<()> {
    answer.unwrap_or_else(|error| {
        hook_error.get_or_insert(error);
        ControlFlow::Break(())
    })
}

/// The run's result, unless a hook failed: then the hook's error.
pub(crate) fn finish<R, E: From<Error>>(
    result: Result<R>,
    hook_error: Option<E>,
) -> std::result::Result<R, E> {
    match hook_error {
        Some(error) => Err(error),
        None => Ok(result?),
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
