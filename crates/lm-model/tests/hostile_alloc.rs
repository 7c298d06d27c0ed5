//! No hostile GGUF file makes the reader allocate more than the file's size.
//!
//! A counting global allocator records the peak of live heap bytes while
//! `GgufFile::from_bytes` parses each file of `fixtures/hostile/gguf/` and
//! `fixtures/hostile/fuzz/` (the input buffer itself is allocated before the
//! measurement starts). It counts only the measuring thread's allocations
//! (parsing is single-threaded), so the other tests of this binary, running
//! at the same time, do not disturb the measurement.
//!
//! The bound: a file the reader refuses costs at most its own size plus a
//! fixed 4 KiB; a file it accepts costs at most its size times the decoded
//! form's overhead (a `MetadataValue` is 32 bytes however small the value it
//! holds, so an array of u8 costs up to 32 times its encoding), plus 4 KiB.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use lm_model::GgufFile;

use crate::common::fixture_path;

/// The system allocator, counting the live bytes of a thread that asked to
/// be measured, and their peak.
struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted.
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated minus bytes freed by this thread since its measurement
    /// began (negative when it frees what it had before).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The largest `LIVE` since the measurement began.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// Adds `delta` bytes to this thread's live count when it is measured. The
/// thread-locals hold plain `Cell`s (no destructor, no allocation), so this
/// is safe to call from inside the allocator; after the thread's locals are
/// gone it does nothing.
fn count(delta: isize) {
    let _ = MEASURING.try_with(|measuring| {
        if measuring.get() {
            let live = LIVE.get() + delta;
            LIVE.set(live);
            PEAK.set(PEAK.get().max(live));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Extra bytes allowed beyond the proportional bound (hash map buckets,
/// error values, small vectors).
const FIXED_ALLOWANCE: usize = 4096;

/// Bytes of heap per byte of file for an accepted file (see the module docs).
const DECODED_OVERHEAD: usize = 32;

/// Peak extra heap bytes of this thread while parsing `bytes`, and whether
/// it parsed.
fn peak_while_parsing(bytes: Vec<u8>) -> (usize, bool) {
    LIVE.set(0);
    PEAK.set(0);
    MEASURING.set(true);
    let parsed = GgufFile::from_bytes(bytes);
    MEASURING.set(false);
    let peak = PEAK.get();
    let ok = parsed.is_ok();
    drop(parsed);
    (peak.max(0) as usize, ok)
}

#[test]
fn parsing_any_hostile_file_allocates_at_most_about_its_size() {
    let root = fixture_path("hostile");
    let mut n_files = 0;
    let mut n_refused = 0;
    for dir in ["gguf", "fuzz"] {
        let mut paths: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "gguf"))
            .collect();
        paths.sort();
        for path in paths {
            let bytes = std::fs::read(&path).unwrap();
            let n_bytes = bytes.len();
            let (peak, parsed) = peak_while_parsing(bytes);
            // `from_bytes` takes ownership of the buffer it was given; it
            // must not copy it or size anything by a header field.
            let bound = if parsed {
                n_bytes * DECODED_OVERHEAD + FIXED_ALLOWANCE
            } else {
                n_refused += 1;
                n_bytes + FIXED_ALLOWANCE
            };
            assert!(
                peak <= bound,
                "{}: {n_bytes} bytes, parsed {parsed}, peak heap {peak} > {bound}",
                path.display()
            );
            n_files += 1;
        }
    }
    // The directory holds the whole table (a missing folder must not pass).
    assert!(
        n_files >= 40 && n_refused >= 25,
        "{n_files} files, {n_refused} refused"
    );
}
