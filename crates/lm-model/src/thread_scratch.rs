//! Per-thread scratch buffers reused from call to call, so steady-state
//! products and attention do not allocate.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Runs `f` with this thread's value of `key`, or with a fresh default one
/// while that is in use (a call nested inside another on the same thread,
/// as rayon's work stealing can make one).
pub(crate) fn with_thread_scratch<T: Default + 'static, R>(
    key: &'static LocalKey<RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut T::default()),
    })
}
