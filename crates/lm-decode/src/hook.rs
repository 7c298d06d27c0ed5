//! Step hooks that can fail: the loops run with a hook that only continues
//! or breaks, and a caller's error ends the run and comes out as it went in.

use crate::{Error, Result};
use std::ops::ControlFlow;

/// Runs `run` with a hook made from `on_step`: the first error `on_step`
/// returns breaks the run (as a cancel does) and is returned in place of the
/// run's result; the run's own errors become `E`.
pub(crate) fn with_fallible_hook<T: ?Sized, R, E: From<Error>>(
    mut on_step: impl FnMut(&T) -> std::result::Result<ControlFlow<()>, E>,
    run: impl FnOnce(&mut dyn FnMut(&T) -> ControlFlow<()>) -> Result<R>,
) -> std::result::Result<R, E> {
    let mut hook_error = None;
    let result = run(&mut |step| {
        on_step(step).unwrap_or_else(|error| {
            hook_error = Some(error);
            ControlFlow::Break(())
        })
    });
    match hook_error {
        Some(error) => Err(error),
        None => Ok(result?),
    }
}
