//! The machine's read bandwidth, as STREAM measures it (McCalpin's STREAM
//! benchmark, here only its read half): the sum of a buffer several times
//! the last-level cache, read once per pass by one or more threads, the best
//! of a few passes. Decode reads every weight once per token, so this rate
//! over the model's bytes per token is the bound decode is reported against
//! (issue 35).
//!
//! ```text
//! buffer: max(1 GiB, 8 x L3) of u64 words in anonymous memory advised
//!         for 2 MB pages, as `GgufFile::open` holds the weights, written
//!         first (so every page is backed by its own memory, not the
//!         shared zero page)
//! pass:   t threads, each sums a contiguous 1/t of it with the loads of
//!         lm's kernel path (64 bytes on AVX-512, 32 on AVX2), plain or
//!         with the panel kernels' prefetches ahead, timed from a common
//!         start to the last join
//! figure: bytes / seconds of the fastest of PASSES passes of each read
//! ```
//!
//! The read is lm-model's (`lm_model::sum_words_as_kernels_read`), where
//! the kernels and their `unsafe` live, so the bound reads memory the way
//! the kernels can: on an Intel Xeon (family 6, model 207, 2026-12-07) one
//! thread read 11.5-12.3 GB/s with this file's earlier loop of 16-byte
//! loads, while 1B decode streamed 13.7 GB/s (decode at 115-123% of its
//! "bound"); a C loop read 9.2 GB/s with 16-byte loads and 15.1-15.9 with
//! 64-byte ones. The prefetched read is the faster one on some machines
//! (that Xeon: 5-15% at two threads), the plain one on others. The pages
//! matter as well: on the Zen 4 one thread read 26-31 GB/s from 4 KB pages
//! and 31-33 GB/s from 2 MB pages (a C test of both, 16- and 64-byte
//! loads; two threads read 34 GB/s from either), so a buffer in 4 KB pages
//! set a bound below what one core reads from the weights' huge pages.

use std::sync::Barrier;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Passes per thread count and read; the best is reported.
const PASSES: usize = 5;
/// The buffer's smallest size: 1 GiB.
const MIN_BUFFER_BYTES: usize = 1 << 30;
/// The buffer's largest size, whatever the cache reports: 4 GiB.
const MAX_BUFFER_BYTES: usize = 4 << 30;
/// Buffer bytes per byte of last-level cache.
const CACHE_MULTIPLE: usize = 8;
/// Words per 128 bytes: the buffer is a whole number of them.
const LANES: usize = 16;

/// Read bandwidth in bytes per second at each measured thread count.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Bandwidth {
    /// `(threads, bytes per second)`, by thread count.
    pub(super) by_threads: Vec<(usize, f64)>,
    /// The buffer's size.
    pub(super) buffer_bytes: usize,
}

impl Bandwidth {
    /// Measures at each of `thread_counts` (the best of [`PASSES`] passes
    /// of each read, plain and prefetched, over one buffer).
    pub(super) fn measure(thread_counts: &[usize]) -> Result<Self> {
        let n_bytes = buffer_bytes(last_level_cache_bytes());
        let mut buffer = huge_page_buffer(n_bytes)?;
        let words: &mut [u64] = bytemuck::cast_slice_mut(&mut buffer[..]);
        for (i, word) in words.iter_mut().enumerate() {
            *word = i as u64;
        }
        let words = &*words;
        let mut by_threads = Vec::new();
        for &n_threads in thread_counts {
            let mut best = f64::INFINITY;
            for prefetch in (0..2 * PASSES).map(|pass| pass % 2 == 1) {
                let (seconds, sum) = timed_pass(words, n_threads, prefetch)?;
                // Checked, so no pass can be optimised away.
                if sum != sum_below(words.len() as u64) {
                    bail!("the bandwidth pass summed {sum}, not the sum of its words");
                }
                best = best.min(seconds);
            }
            by_threads.push((n_threads, n_bytes as f64 / best));
        }
        Ok(Self {
            by_threads,
            buffer_bytes: n_bytes,
        })
    }

    /// Bytes per second at `n_threads`, if measured.
    pub(super) fn at(&self, n_threads: usize) -> Option<f64> {
        self.by_threads
            .iter()
            .find(|&&(n, _)| n == n_threads)
            .map(|&(_, rate)| rate)
    }

    /// The worker's JSON: `{"read_bytes_per_s": {"1": 3.1e10, ...}}`.
    pub(super) fn to_json(&self) -> Value {
        let rates: serde_json::Map<String, Value> = self
            .by_threads
            .iter()
            .map(|&(n, rate)| (n.to_string(), Value::from(rate)))
            .collect();
        serde_json::json!({ "read_bytes_per_s": rates, "buffer_bytes": self.buffer_bytes })
    }

    /// Reads [`Bandwidth::to_json`]'s output.
    pub(super) fn from_json(json: &Value) -> Result<Self> {
        let rates = json["read_bytes_per_s"]
            .as_object()
            .with_context(|| format!("bandwidth output lacks `read_bytes_per_s`: {json}"))?;
        let mut by_threads = rates
            .iter()
            .map(|(n, rate)| {
                let n: usize = n
                    .parse()
                    .with_context(|| format!("bad thread count `{n}`"))?;
                let rate = rate
                    .as_f64()
                    .filter(|rate| rate.is_finite() && *rate > 0.0)
                    .with_context(|| format!("bad rate {rate} at {n} threads"))?;
                Ok((n, rate))
            })
            .collect::<Result<Vec<_>>>()?;
        by_threads.sort_by_key(|&(n, _)| n);
        let buffer_bytes = json["buffer_bytes"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .with_context(|| format!("bandwidth output lacks `buffer_bytes`: {json}"))?;
        Ok(Self {
            by_threads,
            buffer_bytes,
        })
    }
}

/// The report's line for the readings of a run (`(threads, bytes per
/// second of each reading)`, each of a `buffer_bytes` buffer): the median
/// at each thread count, and the range when there were several readings.
/// `read bandwidth: X GB/s (1 thread), Y GB/s (2 threads; 3 readings,
/// A-B)`.
pub(super) fn readings_line(readings: &[(usize, Vec<f64>)], buffer_bytes: usize) -> String {
    let figures: Vec<String> = readings
        .iter()
        .filter_map(|(n, rates)| {
            let median = super::median(rates)?;
            let unit = if *n == 1 { "thread" } else { "threads" };
            let gb = |rate: f64| rate / 1e9;
            Some(if rates.len() > 1 {
                let (low, high) = rates
                    .iter()
                    .fold((f64::INFINITY, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
                format!(
                    "{:.1} GB/s ({n} {unit}; median of {} readings, {:.1}-{:.1})",
                    gb(median),
                    rates.len(),
                    gb(low),
                    gb(high)
                )
            } else {
                format!("{:.1} GB/s ({n} {unit})", gb(median))
            })
        })
        .collect();
    format!(
        "read bandwidth: {} (sum of a {:.0} MiB buffer with the kernels' loads, best of {PASSES} passes plain and {PASSES} prefetched, measured just before each of lm's runs)",
        figures.join(", "),
        buffer_bytes as f64 / f64::from(1 << 20)
    )
}

/// One pass: `n_threads` threads (fewer for a buffer of fewer words) each
/// sum a contiguous share of `words` after a common start, with the
/// kernels' prefetches if `prefetch`; the seconds from that start to the
/// last join, and the wrapping sum of all the words.
fn timed_pass(words: &[u64], n_threads: usize, prefetch: bool) -> Result<(f64, u64)> {
    let share = words.len().div_ceil(n_threads.max(1)).max(1);
    let start_line = Barrier::new(words.len().div_ceil(share) + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = words
            .chunks(share)
            .map(|part| {
                let start_line = &start_line;
                scope.spawn(move || {
                    start_line.wait();
                    lm_model::sum_words_as_kernels_read(part, prefetch)
                })
            })
            .collect();
        start_line.wait();
        let start = Instant::now();
        let mut total = 0u64;
        for handle in handles {
            let sum = handle
                .join()
                .map_err(|_| anyhow::anyhow!("a bandwidth thread panicked"))?;
            total = total.wrapping_add(sum);
        }
        Ok((start.elapsed().as_secs_f64(), total))
    })
}

/// `0 + 1 + ... + (n - 1)`, wrapping as the read's sum does.
fn sum_below(n: u64) -> u64 {
    if n.is_multiple_of(2) {
        (n / 2).wrapping_mul(n.wrapping_sub(1))
    } else {
        n.wrapping_mul((n - 1) / 2)
    }
}

/// `n_bytes` of fresh anonymous memory (page-aligned, so u64 words),
/// advised for 2 MB pages: a hint, refused harmlessly where transparent
/// huge pages are off, as it is for the weights.
fn huge_page_buffer(n_bytes: usize) -> Result<memmap2::MmapMut> {
    let buffer = memmap2::MmapOptions::new()
        .len(n_bytes)
        .map_anon()
        .context("mapping the bandwidth buffer")?;
    #[cfg(target_os = "linux")]
    let _ = buffer.advise(memmap2::Advice::HugePage);
    Ok(buffer)
}

/// The buffer's size for a last-level cache of `cache_bytes`:
/// [`CACHE_MULTIPLE`] times it, at least [`MIN_BUFFER_BYTES`], at most
/// [`MAX_BUFFER_BYTES`], a whole number of lane groups.
fn buffer_bytes(cache_bytes: Option<usize>) -> usize {
    let bytes = cache_bytes
        .map_or(0, |c| c.saturating_mul(CACHE_MULTIPLE))
        .clamp(MIN_BUFFER_BYTES, MAX_BUFFER_BYTES);
    bytes / (8 * LANES) * (8 * LANES)
}

/// The size of CPU 0's highest-level cache, from
/// `/sys/devices/system/cpu/cpu0/cache/index*/` (Linux; `None` elsewhere).
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|entry| {
        let path = entry.ok()?.path();
        let level: u32 = std::fs::read_to_string(path.join("level"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let size = parse_cache_size(&std::fs::read_to_string(path.join("size")).ok()?)?;
        Some((level, size))
    })
    .max()
    .map(|(_, size)| size)
}

/// A sysfs cache size (`32768K`, `1M`, `512`) in bytes.
fn parse_cache_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, multiplier) = match text.chars().last()? {
        'K' => (&text[..text.len() - 1], 1 << 10),
        'M' => (&text[..text.len() - 1], 1 << 20),
        'G' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_splits_the_buffer_among_threads_and_sums_all_of_it() {
        let words: Vec<u64> = (0..1001).collect();
        for n_threads in [1, 2, 3, 7] {
            for prefetch in [false, true] {
                let (seconds, sum) = timed_pass(&words, n_threads, prefetch).unwrap();
                assert_eq!(sum, 1000 * 1001 / 2);
                assert!(seconds >= 0.0);
            }
        }
        assert_eq!(timed_pass(&words[..2], 3, false).unwrap().1, 1);
        assert_eq!(sum_below(1001), 1000 * 1001 / 2);
        assert_eq!(sum_below(1 << 40), (1u64 << 39).wrapping_mul((1 << 40) - 1));
    }

    #[test]
    fn buffer_is_eight_caches_within_its_bounds() {
        assert_eq!(buffer_bytes(None), 1 << 30);
        assert_eq!(buffer_bytes(Some(32 << 20)), 1 << 30);
        assert_eq!(buffer_bytes(Some(256 << 20)), 2 << 30);
        assert_eq!(buffer_bytes(Some(usize::MAX)), 4 << 30);
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("lots"), None);
    }

    #[test]
    fn json_round_trips_and_names_thread_counts_in_order() {
        let bandwidth = Bandwidth {
            by_threads: vec![(1, 3.5e10), (2, 5.25e10)],
            buffer_bytes: 1 << 30,
        };
        let back = Bandwidth::from_json(&bandwidth.to_json()).unwrap();
        assert_eq!(back, bandwidth);
        assert_eq!(back.at(2), Some(5.25e10));
        assert_eq!(back.at(4), None);
        assert_eq!(
            readings_line(
                &[(1, vec![3.5e10]), (2, vec![5.25e10, 3.0e10, 6.0e10])],
                1 << 30
            ),
            "read bandwidth: 35.0 GB/s (1 thread), 52.5 GB/s (2 threads; median of 3 readings, 30.0-60.0) (sum of a 1024 MiB buffer with the kernels' loads, best of 5 passes plain and 5 prefetched, measured just before each of lm's runs)"
        );
        let bad = serde_json::json!({ "read_bytes_per_s": { "1": -1.0 }, "buffer_bytes": 8 });
        assert!(Bandwidth::from_json(&bad).is_err());
    }
}
