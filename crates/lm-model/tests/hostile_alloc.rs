//! No hostile GGUF file makes the reader allocate more than the file's size.
//!
//! A counting global allocator records the peak of live heap bytes while
//! `GgufFile::from_bytes` parses each file of `fixtures/hostile/gguf/` and
//! `fixtures/hostile/fuzz/` (the input buffer itself is allocated before the
//! measurement starts). This binary holds a single test, so nothing else
//! allocates while it measures.
//!
//! The bound: a file the reader refuses costs at most its own size plus a
//! fixed 4 KiB; a file it accepts costs at most its size times the decoded
//! form's overhead (a `MetadataValue` is 32 bytes however small the value it
//! holds, so an array of u8 costs up to 32 times its encoding), plus 4 KiB.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use lm_model::GgufFile;

/// The system allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            let live = LIVE.fetch_add(new_size - layout.size(), Ordering::SeqCst) + new_size
                - layout.size();
            PEAK.fetch_max(live, Ordering::SeqCst);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
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

/// Peak extra heap bytes while parsing `bytes`, and whether it parsed.
fn peak_while_parsing(bytes: Vec<u8>) -> (usize, bool) {
    let baseline = LIVE.load(Ordering::SeqCst);
    PEAK.store(baseline, Ordering::SeqCst);
    let parsed = GgufFile::from_bytes(bytes);
    let peak = PEAK.load(Ordering::SeqCst);
    let ok = parsed.is_ok();
    drop(parsed);
    (peak.saturating_sub(baseline), ok)
}

#[test]
fn parsing_any_hostile_file_allocates_at_most_about_its_size() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hostile");
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
