//! How the C allocator should treat the large blocks a model allocates.
//!
//! A model's large buffers (KV cache chunks, a prefill piece's activations,
//! each pool thread's scratch) are freed and allocated again as prompts
//! come and go, on whichever thread rayon runs the work. glibc's `malloc`
//! maps a block of 128 KiB or more on its own and returns it to the system
//! when freed, but the first time it frees one it raises that threshold to
//! the block's size: from then on such blocks come from the arena of the
//! thread that asks, and when freed they stay resident there, reused only
//! by that arena. So the memory a process holds depends on which thread
//! happened to allocate what: SmolLM2's long-context bench worker held
//! 190 MB at its end (125 MB with a fixed threshold), and one worker in
//! about ten peaked 12 to 14 MB above the others (docs/performance-log.md,
//! "Left to do").

/// The size from which glibc maps a block on its own: its default, kept
/// fixed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MAP_FROM_BYTES: libc::c_int = 128 * 1024;

/// Asks glibc's `malloc` to map every block of 128 KiB or more on its own,
/// returned to the system when freed, from now on (its default threshold,
/// fixed instead of raised as blocks are freed; see the module docs), so
/// that a process's resident memory is what it uses. A program calls it
/// once at its start, before its threads allocate; elsewhere than glibc it
/// does nothing. Returns whether the allocator took the setting.
pub fn map_large_allocations() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        set_mmap_threshold(MAP_FROM_BYTES)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// glibc's `mallopt(M_MMAP_THRESHOLD, bytes)`: whether it took the value.
/// One of the crate's two operating-system calls outside the kernels that
/// cannot be safe (the other maps the model file).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set_mmap_threshold(bytes: libc::c_int) -> bool {
    // SAFETY: `mallopt` only sets a parameter of glibc's allocator;
    // M_MMAP_THRESHOLD takes a byte count up to 32 MiB.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1 }
}
