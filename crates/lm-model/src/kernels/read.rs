//! A read of memory as fast as the weight kernels stream it: the wrapping
//! sum of `u64` words with the widest loads of the kernel path, and, on
//! request, the panel kernels' prefetches ahead of them. `cargo xtask bench`
//! sets decode against the faster of the two reads (its read bound, issue
//! 35).
//!
//! The loads' width matters on some machines: on an Intel Xeon (family 6,
//! model 207, 2026-12-07) one thread summed 9.2 GB/s with 16-byte loads
//! and 15.1-15.3 with 64-byte ones (a C loop over 2 GB in 2 MB pages), so a
//! bound read with baseline SSE2 loads sat below what decode streamed.

use super::dispatch::{Dispatch, Kernel};

/// Words a step of the SIMD reads sums: 128 bytes, two cache lines.
const STEP_WORDS: usize = 16;

/// The wrapping sum of `words`, read with `dispatch`'s widest loads (64
/// bytes on AVX-512, 32 on AVX2 and AVX-VNNI, the compiler's choice on the
/// portable path); with `prefetch`, each line also asks for those ahead of
/// it as the panel kernels do (`panel::prefetch_ahead`).
pub(crate) fn sum_words(dispatch: Dispatch, words: &[u64], prefetch: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    match dispatch.kernel() {
        // SAFETY: the dispatch checked that the CPU runs AVX-512 F.
        Kernel::Avx512 => return unsafe { sum_words_avx512(words, prefetch) },
        // SAFETY: the dispatch checked that the CPU runs AVX2.
        Kernel::Avx2 | Kernel::AvxVnni => return unsafe { sum_words_avx2(words, prefetch) },
        Kernel::Portable => {}
    }
    let _ = (dispatch, prefetch);
    sum_words_portable(words)
}

/// [`sum_words`] in plain Rust: sixteen independent lanes, which the
/// compiler makes packed adds.
fn sum_words_portable(words: &[u64]) -> u64 {
    let (steps, rest) = words.as_chunks::<STEP_WORDS>();
    let mut lanes = [0u64; STEP_WORDS];
    for step in steps {
        for (lane, &word) in lanes.iter_mut().zip(step) {
            *lane = lane.wrapping_add(word);
        }
    }
    wrapping_sum(lanes.iter().chain(rest))
}

fn wrapping_sum<'a>(words: impl Iterator<Item = &'a u64>) -> u64 {
    words.fold(0, |sum, &word| sum.wrapping_add(word))
}

/// Calls `add` with the start of each step, first asking for the lines
/// ahead of its two as the panel kernels do when `prefetch`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn for_each_step(steps: &[[u64; STEP_WORDS]], prefetch: bool, mut add: impl FnMut(*const u64)) {
    for step in steps {
        let at = step.as_ptr();
        if prefetch {
            super::panel::prefetch_ahead(at.cast());
            super::panel::prefetch_ahead(at.wrapping_add(8).cast());
        }
        add(at);
    }
}

/// [`sum_words`] with 64-byte loads, two lines a step into two
/// accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_words_avx512(words: &[u64], prefetch: bool) -> u64 {
    use std::arch::x86_64::{__m512i, _mm512_setzero_si512};
    use std::arch::x86_64::{_mm512_add_epi64, _mm512_loadu_si512, _mm512_reduce_add_epi64};

    let (steps, rest) = words.as_chunks::<STEP_WORDS>();
    let (mut low, mut high) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    for_each_step(steps, prefetch, |at| {
        // SAFETY: `at` starts 16 words, 128 readable bytes; the loads take
        // any alignment.
        let (a, b) = unsafe {
            (
                _mm512_loadu_si512(at.cast::<__m512i>()),
                _mm512_loadu_si512(at.add(8).cast::<__m512i>()),
            )
        };
        (low, high) = (_mm512_add_epi64(low, a), _mm512_add_epi64(high, b));
    });
    let lanes = _mm512_reduce_add_epi64(_mm512_add_epi64(low, high)) as u64;
    lanes.wrapping_add(wrapping_sum(rest.iter()))
}

/// [`sum_words`] with 32-byte loads, four a step into two accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_words_avx2(words: &[u64], prefetch: bool) -> u64 {
    use std::arch::x86_64::{__m256i, _mm256_add_epi64, _mm256_loadu_si256};
    use std::arch::x86_64::{_mm256_setzero_si256, _mm256_storeu_si256};

    let (steps, rest) = words.as_chunks::<STEP_WORDS>();
    let (mut low, mut high) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for_each_step(steps, prefetch, |at| {
        // SAFETY: `at` starts 16 words, 128 readable bytes; the loads take
        // any alignment.
        let load = |words: usize| unsafe { _mm256_loadu_si256(at.add(words).cast::<__m256i>()) };
        let [a, b, c, d] = [load(0), load(4), load(8), load(12)];
        low = _mm256_add_epi64(_mm256_add_epi64(low, a), c);
        high = _mm256_add_epi64(_mm256_add_epi64(high, b), d);
    });
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` is 32 writable bytes; the store takes any alignment.
    unsafe {
        _mm256_storeu_si256(
            lanes.as_mut_ptr().cast::<__m256i>(),
            _mm256_add_epi64(low, high),
        )
    };
    wrapping_sum(lanes.iter().chain(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_sums_every_remainder_as_a_plain_fold() {
        for len in [0, 1, 7, 15, 16, 17, 31, 32, 33, 100, 1000, 4099] {
            let words: Vec<u64> = (0..len).map(|i| u64::MAX - 3 * i as u64).collect();
            let plain = words.iter().fold(0u64, |s, &w| s.wrapping_add(w));
            for dispatch in Dispatch::every_available() {
                for prefetch in [false, true] {
                    let sum = sum_words(dispatch, &words, prefetch);
                    assert_eq!(sum, plain, "{:?}, {len} words", dispatch.kernel());
                }
            }
        }
    }
}
