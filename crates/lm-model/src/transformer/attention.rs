//! Causal multi-head and grouped-query attention of a block of query rows
//! over the keys and values in the [`KvCache`]: one query for a decode step,
//! a whole prompt for prefill.
//!
//! The causal mask is skipped by construction: the query at position `p`
//! reads cache rows `0..=p` only (the last `window` of them on a
//! sliding-window layer), which is the lower triangle of the full mask:
//!
//! ```text
//!            key position
//!            0    1    2    3
//! query 0 [  ok  -inf -inf -inf ]
//! query 1 [  ok   ok  -inf -inf ]
//! query 2 [  ok   ok   ok  -inf ]
//! query 3 [  ok   ok   ok   ok  ]
//! ```
//!
//! With grouped-query attention, `n_head / n_kv_head` consecutive query heads
//! share one key/value head (SmolLM2: 9 query heads over 3, so heads 0-2 read
//! key/value head 0). Softmax runs in f32 after subtracting the row maximum.
//!
//! The work is tiled so that a long prompt stays in cache:
//!
//! ```text
//! the cache keeps, per chunk of CHUNK_LEN (32) positions and key/value head,
//!   keys   [head_dim][CHUNK_LEN]   (a key per column: lanes = positions)
//!   values [CHUNK_LEN][head_dim]   (a value per row:  lanes = dimensions)
//! the queries are split into tiles of QUERY_TILE positions, in parallel for
//! a prompt; a tile of a few queries over a long span (a decode step at a
//! long context) is split by runs of heads on the pool instead. For each
//! key/value head a tile walks the chunks its queries see, widening each
//! chunk once to f32 (F16C for an f16 cache), so the block (8 KiB at
//! head_dim 64) is read from L1 by every query row of the tile; when at most
//! four rows read a chunk (a decode step), the SIMD builds read the f16
//! chunk in place and widen it in registers instead, and ask for the
//! block two chunks ahead (software prefetch) while they work on this one:
//!   scores  s[r][k] = q[r] . key[k] * scale     (8 partial sums per key)
//!   weights softmax of each row over its visible positions
//!   output  o[r][d] = sum_k w[r][k] * values[k][d]
//! chunks wholly after a query (or before its window) are never read for it.
//! The SIMD builds work on four query rows at a time (any rows that see the
//! chunk for scores, rows that see the same positions for outputs), so each
//! key or value vector they load serves four rows, with 8 independent sums
//! in registers to hide the latency of the additions. The AVX2 build holds
//! 8 keys or dimensions in a vector; the AVX-512 build 16, a whole chunk's
//! keys in two vectors and 64 output dimensions in four.
//! ```
//!
//! Every output value is the same sequence of f32 operations whatever the
//! tile, the number of queries in the call or the vector width, and the
//! sequence of the one-query-at-a-time attention this replaced: a score is a
//! dot product of eight partial sums, the softmax uses libm's `exp` (the
//! SIMD builds a vectorised `exp` with libm's bits, `super::exp`) and sums
//! in order, an output sums in position order. So a prompt read at once gives
//! the bits of the same prompt read token by token, the SIMD builds (the same
//! code compiled for AVX2 or AVX-512) give the bits of the portable one, and
//! the conformance fixtures see the numbers they were measured with.
//!
//! At f16 precision the SIMD builds add each product with a fused
//! multiply-add, and the bits are still those of a multiply then an add:
//! the query (rounded to f16) and the key (stored as f16), or the weight
//! (rounded to f16) and the value, have 11 significant bits each, so their
//! product has at most 22 and is exact in f32 (nor can it overflow or
//! leave the normal range), and rounding an exact product changes nothing.
//! Fusing halves the floating-point instructions of both products, which
//! bound a long prompt's attention.

use std::cell::RefCell;
use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::config::KvPrecision;
use super::exp::exp_in_place;
use super::kv_cache::{CHUNK_LEN, HeadChunk, KvCache, StoredRows, widen_f16};
use crate::dispatch::{Dispatch, Kernel};
use crate::thread_scratch::with_thread_scratch;

/// Query positions per tile. A tile's scores are `QUERY_TILE * group` rows
/// over its visible span (SmolLM2 at 4,096 positions: 48 rows of 16 KiB),
/// small enough for L2, while each chunk of keys or values it widens serves
/// that many rows.
const QUERY_TILE: usize = 16;

/// Below this many query-key products per call (`queries x span x q_dim`),
/// one tile's heads stay on the calling thread: a decode step over a few
/// hundred positions is shorter than handing its heads to rayon.
const PARALLEL_MIN_PRODUCTS: usize = 1 << 16;

/// Head counts and width for one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (divides `n_head`).
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Whether queries and weights are rounded to f16 (see [`KvPrecision`]).
    pub precision: KvPrecision,
    /// The factor of the query-key products (`1 / sqrt(head_dim)` for most
    /// models).
    pub scale: f32,
    /// With sliding-window attention, the positions a query sees (its own
    /// included); `None` sees every earlier position.
    pub window: Option<usize>,
}

impl AttentionShape {
    /// The first position the query at `pos` sees.
    fn first_visible(&self, pos: usize) -> usize {
        self.window
            .map_or(0, |window| (pos + 1).saturating_sub(window))
    }
}

/// Buffers of one query tile, reused from call to call and grown (amortised)
/// to the largest need seen, so decode steps do not allocate per token.
#[derive(Debug, Clone, Default)]
pub struct AttentionScratch {
    /// Scores, then weights, of the tile's query rows of one key/value head
    /// over the tile's visible span: `[rows][span]`, row `j * group + g`
    /// for query `j`'s head `g` of the group.
    scores: Vec<f32>,
    /// Those query rows, rounded to f16 at f16 precision: `[rows][head_dim]`.
    queries: Vec<f32>,
    /// The scaled products of those rows with one chunk's keys:
    /// `[rows][CHUNK_LEN]`.
    products: Vec<f32>,
    /// One chunk's keys widened to f32 (f16 cache): `[head_dim][CHUNK_LEN]`.
    keys: Vec<f32>,
    /// One chunk's values widened to f32 (f16 cache): `[CHUNK_LEN][head_dim]`.
    values: Vec<f32>,
    /// Queries or weights narrowed to f16 on their way to being rounded
    /// (f16 precision only).
    narrowed: Vec<f16>,
    /// The outputs of a tile split by heads, one run of heads after the
    /// other: `[run][query][run heads * head_dim]`.
    head_runs: Vec<f32>,
}

thread_local! {
    /// Each pool thread's buffers for the tiles and head runs it is handed.
    static TASK_SCRATCH: RefCell<AttentionScratch> = RefCell::new(AttentionScratch::default());
}

/// Runs `f` with this thread's task buffers (see [`with_thread_scratch`]).
fn with_task_scratch<R>(f: impl FnOnce(&mut AttentionScratch) -> R) -> R {
    with_thread_scratch(&TASK_SCRATCH, f)
}

/// Writes into `out` the attention of `queries` over `layer` of `cache`:
/// `queries` and `out` hold rows of `n_head * head_dim`, query `j` at
/// position `first_pos + j` (already rotated if the model uses RoPE), which
/// sees the cache's positions up to its own (the last `window` of them with
/// a sliding window). The keys and values of every query's position are in
/// the cache already. Several tiles of queries run in parallel on rayon's
/// pool; one tile runs on the calling thread with `scratch`, or, when it is
/// long enough to pay and the pool has several threads, in runs of heads
/// on the pool ([`attend_by_heads`]). Every output has the same bits however
/// the work is split.
pub fn attend(
    shape: AttentionShape,
    cache: &KvCache,
    layer: usize,
    first_pos: usize,
    queries: &[f32],
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    let q_dim = shape.n_head * shape.head_dim;
    // The configuration was validated when the model was built.
    debug_assert!(
        shape.head_dim > 0 && shape.n_kv_head > 0 && shape.n_head.is_multiple_of(shape.n_kv_head)
    );
    debug_assert_eq!(queries.len(), out.len(), "query and output widths");
    debug_assert!(
        !queries.is_empty() && queries.len().is_multiple_of(q_dim),
        "whole query rows"
    );
    let n_queries = queries.len() / q_dim;
    assert!(
        first_pos + n_queries <= cache.shape().capacity,
        "attention up to position {} of a cache of {}",
        first_pos + n_queries,
        cache.shape().capacity
    );
    if n_queries <= QUERY_TILE {
        let span = first_pos + n_queries - shape.first_visible(first_pos);
        let n_threads = rayon::current_num_threads();
        let run_len = head_run_len(shape, n_threads);
        if n_threads > 1
            && run_len < shape.n_head
            && n_queries * span * q_dim >= PARALLEL_MIN_PRODUCTS
        {
            attend_by_heads(
                shape, cache, layer, first_pos, queries, run_len, scratch, out,
            );
        } else {
            let heads = 0..shape.n_head;
            attend_tile(shape, cache, layer, first_pos, queries, heads, scratch, out);
        }
        return;
    }
    let tile_len = QUERY_TILE * q_dim;
    out.par_chunks_mut(tile_len)
        .zip(queries.par_chunks(tile_len))
        .enumerate()
        .for_each(|(tile_idx, (out, queries))| {
            let tile_pos = first_pos + tile_idx * QUERY_TILE;
            let heads = 0..shape.n_head;
            with_task_scratch(|scratch| {
                attend_tile(shape, cache, layer, tile_pos, queries, heads, scratch, out);
            });
        });
}

/// How many query heads one task of [`attend_by_heads`] takes on a pool of
/// `n_threads`: whole key/value groups while there are at least as many
/// groups as threads (a group's keys and values are then read by one task
/// only), otherwise the largest part of a group that still gives every
/// thread a task. Equal runs, so the outputs split into equal chunks.
fn head_run_len(shape: AttentionShape, n_threads: usize) -> usize {
    let group = shape.n_head / shape.n_kv_head;
    let parts_per_group = n_threads.div_ceil(shape.n_kv_head).clamp(1, group);
    (1..=group / parts_per_group)
        .rev()
        .find(|len| group.is_multiple_of(*len))
        .unwrap_or(1)
}

/// [`attend`] for one tile of queries, its heads in runs of `run_len`
/// (dividing the key/value group) in parallel on rayon's pool: each run
/// writes `[query][run]` into its part of `scratch`'s head-run buffer,
/// which is then copied into `out`'s rows.
#[allow(clippy::too_many_arguments)]
fn attend_by_heads(
    shape: AttentionShape,
    cache: &KvCache,
    layer: usize,
    first_pos: usize,
    queries: &[f32],
    run_len: usize,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    let q_dim = shape.n_head * shape.head_dim;
    let n_queries = queries.len() / q_dim;
    let run_width = run_len * shape.head_dim;
    let runs = &mut scratch.head_runs;
    grow(runs, n_queries * q_dim);
    let runs = &mut runs[..n_queries * q_dim];
    runs.par_chunks_mut(n_queries * run_width)
        .enumerate()
        .for_each(|(run_idx, run_out)| {
            let heads = run_idx * run_len..(run_idx + 1) * run_len;
            with_task_scratch(|scratch| {
                attend_tile(
                    shape, cache, layer, first_pos, queries, heads, scratch, run_out,
                );
            });
        });
    for (run_idx, run_out) in runs.chunks_exact(n_queries * run_width).enumerate() {
        for (query_out, run_row) in out
            .chunks_exact_mut(q_dim)
            .zip(run_out.chunks_exact(run_width))
        {
            query_out[run_idx * run_width..][..run_width].copy_from_slice(run_row);
        }
    }
}

/// [`attend`] for one tile of queries and the query heads `heads`, with the
/// vector build the cache's dispatch allows. `queries` holds whole query
/// rows (every head); `out` holds rows of the heads in `heads` only.
#[allow(clippy::too_many_arguments)]
fn attend_tile(
    shape: AttentionShape,
    cache: &KvCache,
    layer: usize,
    first_pos: usize,
    queries: &[f32],
    heads: Range<usize>,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if cache.dispatch().has_f16c() {
        // SAFETY: a `Dispatch` holds only detected features: the AVX-512
        // kernel's include AVX-512 F and VL, every x86 SIMD kernel's include
        // AVX2 and FMA, and F16C is checked.
        match cache.dispatch().kernel() {
            Kernel::Avx512 => {
                return unsafe {
                    attend_tile_avx512(shape, cache, layer, first_pos, queries, heads, scratch, out)
                };
            }
            Kernel::Avx2 | Kernel::AvxVnni => {
                return unsafe {
                    attend_tile_avx2(shape, cache, layer, first_pos, queries, heads, scratch, out)
                };
            }
            Kernel::Portable => {}
        }
    }
    attend_tile_lanes::<1, false>(shape, cache, layer, first_pos, queries, heads, scratch, out);
}

/// [`attend_tile_lanes`] with its AVX2 kernels: the same operations on the
/// same values in 8-wide vectors, so the same bits; the products fused at
/// f16 precision, where they are exact (module docs).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn attend_tile_avx2(
    shape: AttentionShape,
    cache: &KvCache,
    layer: usize,
    first_pos: usize,
    queries: &[f32],
    heads: Range<usize>,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    if shape.precision == KvPrecision::F16 {
        attend_tile_lanes::<8, true>(shape, cache, layer, first_pos, queries, heads, scratch, out);
    } else {
        attend_tile_lanes::<8, false>(shape, cache, layer, first_pos, queries, heads, scratch, out);
    }
}

/// [`attend_tile_lanes`] with its AVX-512 kernels for the products and
/// weighted sums (16-wide vectors) and the AVX2 ones elsewhere: the same
/// operations on the same values, so the same bits; the products fused at
/// f16 precision, as in [`attend_tile_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn attend_tile_avx512(
    shape: AttentionShape,
    cache: &KvCache,
    layer: usize,
    first_pos: usize,
    queries: &[f32],
    heads: Range<usize>,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    if shape.precision == KvPrecision::F16 {
        attend_tile_lanes::<16, true>(shape, cache, layer, first_pos, queries, heads, scratch, out);
    } else {
        attend_tile_lanes::<16, false>(
            shape, cache, layer, first_pos, queries, heads, scratch, out,
        );
    }
}

/// One tile: for each key/value head (the part of its group in `heads`),
/// the scores of the tile's query rows chunk by chunk, each row's softmax,
/// then the weighted values chunk by chunk (module docs). `out` has a row
/// of `heads.len() * head_dim` values per query. Only the chunks a query
/// sees are read for it; in
/// the chunk holding a query's own position, the products with later keys
/// are computed but never stored. `LANES` is the build: 1 portable, 8 or
/// 16 the SIMD kernels (x86_64 only, called from [`attend_tile_avx2`] or
/// [`attend_tile_avx512`]) for the products, exponentials, f16 roundings
/// and weighted sums, several query rows at a time; `FUSED` (SIMD builds
/// at f16 precision only) adds the products with fused multiply-adds.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_tile_lanes<const LANES: usize, const FUSED: bool>(
    shape: AttentionShape,
    cache: &KvCache,
    layer: usize,
    first_pos: usize,
    queries: &[f32],
    heads: Range<usize>,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    let head_dim = shape.head_dim;
    let group = shape.n_head / shape.n_kv_head;
    let q_dim = shape.n_head * head_dim;
    let out_width = heads.len() * head_dim;
    let n_queries = queries.len() / q_dim;
    debug_assert_eq!(out.len(), n_queries * out_width, "output rows of the heads");
    let max_rows = n_queries * group.min(heads.len());
    let dispatch = cache.dispatch();
    let round = shape.precision == KvPrecision::F16;
    let span_start = shape.first_visible(first_pos);
    let span_end = first_pos + n_queries;
    let span = span_end - span_start;
    // A tile of a few rows (a decode step) reads each block once, straight
    // from the cache; a prompt's tile widens a block once for many rows.
    let prefetching = LANES > 1 && max_rows <= DIRECT_ROWS;
    let AttentionScratch {
        scores,
        queries: tile_queries,
        products,
        keys,
        values,
        narrowed,
        head_runs: _,
    } = scratch;
    grow(scores, max_rows * span);
    grow(tile_queries, max_rows * head_dim);
    grow(products, max_rows * CHUNK_LEN);
    // The positions query `j` sees, as offsets into the span.
    let visible =
        |j: usize| shape.first_visible(first_pos + j) - span_start..first_pos + j + 1 - span_start;
    // The queries that see some of the span offsets `rows`: a run, since
    // both ends of `visible(j)` grow with `j`.
    let seeing = |rows: std::ops::Range<usize>| {
        let first = (0..n_queries).find(|&j| !intersect(visible(j), rows.clone()).is_empty());
        first.map_or(0..0, |first| {
            let end = (first..n_queries)
                .find(|&j| intersect(visible(j), rows.clone()).is_empty())
                .unwrap_or(n_queries);
            first..end
        })
    };
    for kv_head in heads.start / group..heads.end.div_ceil(group) {
        // The heads of this group that the tile computes: `group` rows per
        // query from here on (query `j`'s head `g` is row `j * group + g`).
        let group_heads = heads.start.max(kv_head * group)..heads.end.min((kv_head + 1) * group);
        let group = group_heads.len();
        let n_rows = n_queries * group;
        let scores = &mut scores[..n_rows * span];
        let tile_queries = &mut tile_queries[..n_rows * head_dim];
        // Their columns in a query row and in an output row.
        let band = group_heads.start * head_dim..group_heads.end * head_dim;
        let out_band = band.start - heads.start * head_dim..band.end - heads.start * head_dim;
        for (rows, query) in tile_queries
            .chunks_exact_mut(group * head_dim)
            .zip(queries.chunks_exact(q_dim))
        {
            rows.copy_from_slice(&query[band.clone()]);
        }
        if round {
            round_all_to_f16::<LANES>(dispatch, tile_queries, narrowed);
        }

        // Scores: scores[r][k] = (q_r . key_k) * scale, every row that sees
        // some of a chunk multiplied by all its keys, the visible ones kept.
        let positions = span_start..span_end;
        let chunks =
            chunks_prefetching::<LANES>(cache, layer, kv_head, positions, prefetching, |c| c.keys);
        for chunk in chunks {
            let chunk_rows = chunk.start + chunk.rows.start - span_start
                ..chunk.start + chunk.rows.end - span_start;
            let chunk_offset = chunk.start as isize - span_start as isize;
            let seers = seeing(chunk_rows.clone());
            let rows = seers.start * group..seers.end * group;
            let chunk_keys = ChunkRows::new::<LANES>(chunk.keys, rows.len(), dispatch, keys);
            chunk_scores::<LANES, FUSED>(
                &tile_queries[rows.start * head_dim..rows.end * head_dim],
                chunk_keys,
                shape.scale,
                &mut products[rows.start * CHUNK_LEN..rows.end * CHUNK_LEN],
            );
            for j in seers {
                let seen = intersect(visible(j), chunk_rows.clone());
                let lanes = (seen.start as isize - chunk_offset) as usize
                    ..(seen.end as isize - chunk_offset) as usize;
                for r in j * group..(j + 1) * group {
                    scores[r * span..(r + 1) * span][seen.clone()].copy_from_slice(
                        &products[r * CHUNK_LEN..(r + 1) * CHUNK_LEN][lanes.clone()],
                    );
                }
            }
        }

        // Weights: softmax over each row's visible positions.
        let seen_by = |r: usize| visible(r / group);
        softmax_to_weights(dispatch, scores, span, seen_by);
        if round {
            for (r, row) in scores.chunks_exact_mut(span).enumerate() {
                round_all_to_f16::<LANES>(dispatch, &mut row[seen_by(r)], narrowed);
            }
        }

        // Outputs: o[r] = sum_k w[r][k] * value_k, in position order.
        for query_out in out.chunks_exact_mut(out_width) {
            query_out[out_band.clone()].fill(0.0);
        }
        let positions = span_start..span_end;
        let chunks =
            chunks_prefetching::<LANES>(cache, layer, kv_head, positions, prefetching, |c| {
                c.values
            });
        for chunk in chunks {
            let chunk_rows = chunk.start + chunk.rows.start - span_start
                ..chunk.start + chunk.rows.end - span_start;
            let chunk_offset = chunk.start as isize - span_start as isize;
            let seers = seeing(chunk_rows.clone());
            let n_readers = seers.len() * group;
            let chunk_values = ChunkRows::new::<LANES>(chunk.values, n_readers, dispatch, values);
            // Runs of queries that see the same rows of the chunk share the
            // value rows they read.
            let mut run_start = seers.start;
            while run_start < seers.end {
                let seen = intersect(visible(run_start), chunk_rows.clone());
                let run_end = (run_start + 1..seers.end)
                    .find(|&j| intersect(visible(j), chunk_rows.clone()) != seen)
                    .unwrap_or(seers.end);
                let first_row = (seen.start as isize - chunk_offset) as usize;
                let value_rows =
                    chunk_values.slice(first_row * head_dim..(first_row + seen.len()) * head_dim);
                let out_row =
                    |r: usize| r / group * out_width + out_band.start + r % group * head_dim;
                let weights_at = |r: usize| r * span + seen.start;
                add_weighted_rows::<LANES, FUSED>(
                    out,
                    run_start * group..run_end * group,
                    out_row,
                    scores,
                    weights_at,
                    value_rows,
                    head_dim,
                );
                run_start = run_end;
            }
        }
    }
}

/// How many chunks ahead of the one being read a decode step asks for a
/// chunk's block. One layer's blocks lie a whole chunk apart (every layer's
/// keys and values for [`CHUNK_LEN`] positions: 737 KB for SmolLM2), so the
/// hardware prefetchers, which follow a stream within a page, never reach
/// the next block: without this, a step over a long context waits for
/// memory at the start of every block.
const PREFETCH_AHEAD: usize = 2;

/// The chunks of `kv_head` in `layer` holding `positions`, as
/// [`KvCache::chunks_in`] gives them; when `prefetching`, each step first
/// asks for the `block` (keys or values) of the chunk [`PREFETCH_AHEAD`]
/// further on.
#[inline(always)]
fn chunks_prefetching<'a, const LANES: usize>(
    cache: &'a KvCache,
    layer: usize,
    kv_head: usize,
    positions: Range<usize>,
    prefetching: bool,
    block: impl Fn(HeadChunk<'a>) -> StoredRows<'a>,
) -> impl Iterator<Item = HeadChunk<'a>> {
    let mut ahead = cache
        .chunks_in(layer, kv_head, positions.clone())
        .skip(PREFETCH_AHEAD);
    cache
        .chunks_in(layer, kv_head, positions)
        .inspect(move |_| {
            if prefetching && let Some(later) = ahead.next() {
                prefetch::<LANES>(block(later));
            }
        })
}

/// Asks for every cache line of `rows` (a chunk's key or value block) to be
/// brought into the caches, in the SIMD builds; the portable build leaves
/// it to the hardware.
#[inline(always)]
fn prefetch<const LANES: usize>(rows: StoredRows<'_>) {
    #[cfg(target_arch = "x86_64")]
    if LANES > 1 {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let (start, len) = match rows {
            StoredRows::F32(rows) => (rows.as_ptr().cast::<i8>(), size_of_val(rows)),
            StoredRows::F16(rows) => (rows.as_ptr().cast::<i8>(), size_of_val(rows)),
        };
        for offset in (0..len).step_by(CACHE_LINE) {
            // SAFETY: the address is inside `rows`; a prefetch never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rows;
}

/// Bytes of a cache line on x86.
const CACHE_LINE: usize = 64;

/// Grows `buf` to at least `len` values (never shrinks it).
fn grow(buf: &mut Vec<f32>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
}

/// The overlap of two ranges (empty when they do not meet).
fn intersect(a: std::ops::Range<usize>, b: std::ops::Range<usize>) -> std::ops::Range<usize> {
    a.start.max(b.start)..a.end.min(b.end).max(a.start.max(b.start))
}

/// A chunk's keys or values as the kernels read them: f32 rows (an f32
/// cache's in place, or an f16 cache's widened once into a buffer, for many
/// query rows or the portable build), or, for at most [`DIRECT_ROWS`] rows
/// in the SIMD builds, an f16 cache's rows as stored, widened in registers
/// as they are loaded (exact either way: every f16 is an f32). One pass of
/// the SIMD kernels serves four rows, so below that widening into memory
/// first would only add a store and a load per value (a decode step).
#[derive(Clone, Copy)]
enum ChunkRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

/// The most query rows reading a chunk for which the SIMD builds read an
/// f16 chunk in place: one pass of their four-row kernels.
const DIRECT_ROWS: usize = 4;

impl<'a> ChunkRows<'a> {
    /// `stored` for `n_readers` query rows, widened into `buf` if need be.
    #[inline(always)]
    fn new<const LANES: usize>(
        stored: StoredRows<'a>,
        n_readers: usize,
        dispatch: Dispatch,
        buf: &'a mut Vec<f32>,
    ) -> Self {
        match stored {
            StoredRows::F16(rows) if LANES > 1 && n_readers <= DIRECT_ROWS => Self::F16(rows),
            stored => Self::F32(stored.to_f32(dispatch, buf)),
        }
    }

    /// The values at `range`.
    #[inline(always)]
    fn slice(self, range: Range<usize>) -> Self {
        match self {
            Self::F32(rows) => Self::F32(&rows[range]),
            Self::F16(rows) => Self::F16(&rows[range]),
        }
    }

    /// The f32 rows (the portable build is only ever handed those).
    #[inline(always)]
    fn f32(self) -> &'a [f32] {
        match self {
            Self::F32(rows) => rows,
            Self::F16(_) => unreachable!("f16 rows are read in place by the SIMD builds only"),
        }
    }
}

/// A stored value type the SIMD kernels load 8 or 16 at a time as f32.
#[cfg(target_arch = "x86_64")]
trait Lanes: Copy {
    /// Values `at..at + 8` of `values` as f32.
    ///
    /// # Safety
    /// AVX2 and F16C; `at + 8 <= values.len()`.
    unsafe fn load8(values: &[Self], at: usize) -> std::arch::x86_64::__m256;

    /// Values `at..at + 16` of `values` as f32.
    ///
    /// # Safety
    /// AVX-512 F; `at + 16 <= values.len()`.
    unsafe fn load16(values: &[Self], at: usize) -> std::arch::x86_64::__m512;

    /// One value as f32.
    fn widen(self) -> f32;
}

#[cfg(target_arch = "x86_64")]
impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load8(values: &[Self], at: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: in bounds (the caller's contract); unaligned load.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(values.as_ptr().add(at)) }
    }

    #[inline(always)]
    unsafe fn load16(values: &[Self], at: usize) -> std::arch::x86_64::__m512 {
        // SAFETY: in bounds (the caller's contract); unaligned load.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(values.as_ptr().add(at)) }
    }

    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for f16 {
    #[inline(always)]
    unsafe fn load8(values: &[Self], at: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm_loadu_si128, _mm256_cvtph_ps};
        // SAFETY: in bounds (the caller's contract): 8 f16 are 16 bytes,
        // loaded unaligned; F16C is the caller's.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(values.as_ptr().add(at).cast())) }
    }

    #[inline(always)]
    unsafe fn load16(values: &[Self], at: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm256_loadu_si256, _mm512_cvtph_ps};
        // SAFETY: in bounds (the caller's contract): 16 f16 are 32 bytes,
        // loaded unaligned; AVX-512 F is the caller's.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(values.as_ptr().add(at).cast())) }
    }

    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// `acc + b * x` in eight lanes: fused (one rounding) when `FUSED`, which
/// the kernels are only when every product `b * x` is exact in f32 (module
/// docs), so both give the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn add_product8<const FUSED: bool>(
    acc: std::arch::x86_64::__m256,
    b: std::arch::x86_64::__m256,
    x: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::{_mm256_add_ps, _mm256_fmadd_ps, _mm256_mul_ps};
    if FUSED {
        _mm256_fmadd_ps(b, x, acc)
    } else {
        _mm256_add_ps(acc, _mm256_mul_ps(b, x))
    }
}

/// [`add_product8`] in sixteen lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn add_product16<const FUSED: bool>(
    acc: std::arch::x86_64::__m512,
    b: std::arch::x86_64::__m512,
    x: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::{_mm512_add_ps, _mm512_fmadd_ps, _mm512_mul_ps};
    if FUSED {
        _mm512_fmadd_ps(b, x, acc)
    } else {
        _mm512_add_ps(acc, _mm512_mul_ps(b, x))
    }
}

/// Lanes of a key product's partial sums, and keys a pass of
/// [`key_scores`] handles.
const PARTIALS: usize = 8;

/// The products of `query` with the [`CHUNK_LEN`] keys of a chunk's key
/// block (`[head_dim][CHUNK_LEN]`, a key per column), eight keys at a time
/// in the vector lanes. Each product is summed as a plain dot product of
/// eight partial sums would be (dimension `d` into partial `d % 8`, the
/// partials then added in order, then the products past the last whole
/// eight): eight independent chains of additions per pass, and the bits of
/// the one-query-at-a-time computation this replaced.
#[inline(always)]
fn key_scores(query: &[f32], keys: &[f32]) -> [f32; CHUNK_LEN] {
    let (columns, _) = keys.as_chunks::<CHUNK_LEN>();
    debug_assert_eq!(columns.len(), query.len(), "key block width");
    let whole = query.len() / PARTIALS * PARTIALS;
    let mut out = [0.0f32; CHUNK_LEN];
    for (pass, pass_out) in out.as_chunks_mut::<PARTIALS>().0.iter_mut().enumerate() {
        let lanes = pass * PARTIALS..(pass + 1) * PARTIALS;
        let mut partial = [[0.0f32; PARTIALS]; PARTIALS];
        for (q8, columns8) in query[..whole]
            .as_chunks::<PARTIALS>()
            .0
            .iter()
            .zip(columns[..whole].as_chunks::<PARTIALS>().0)
        {
            for ((lane_partial, &q), column) in partial.iter_mut().zip(q8).zip(columns8) {
                for (p, &k) in lane_partial.iter_mut().zip(&column[lanes.clone()]) {
                    *p += q * k;
                }
            }
        }
        let mut sum = [-0.0f32; PARTIALS];
        for lane_partial in &partial {
            for (s, &p) in sum.iter_mut().zip(lane_partial) {
                *s += p;
            }
        }
        let mut tail = [-0.0f32; PARTIALS];
        for (&q, column) in query[whole..].iter().zip(&columns[whole..]) {
            for (t, &k) in tail.iter_mut().zip(&column[lanes.clone()]) {
                *t += q * k;
            }
        }
        for ((o, &s), &t) in pass_out.iter_mut().zip(&sum).zip(&tail) {
            *o = s + t;
        }
    }
    out
}

/// The products of each query row of `queries` (`[rows][head_dim]`) with
/// the [`CHUNK_LEN`] keys of `keys` (a chunk's key block), times `scale`,
/// into `products` (`[rows][CHUNK_LEN]`): each one [`key_scores`]'s sum.
/// The SIMD builds take four rows at a time, so each key vector they load
/// serves four rows.
#[inline(always)]
fn chunk_scores<const LANES: usize, const FUSED: bool>(
    queries: &[f32],
    keys: ChunkRows<'_>,
    scale: f32,
    products: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if LANES > 1 {
        match keys {
            ChunkRows::F32(keys) => {
                chunk_scores_simd::<LANES, FUSED, _>(queries, keys, scale, products);
            }
            ChunkRows::F16(keys) => {
                chunk_scores_simd::<LANES, FUSED, _>(queries, keys, scale, products);
            }
        }
        return;
    }
    let keys = keys.f32();
    let head_dim = keys.len() / CHUNK_LEN;
    debug_assert_eq!(queries.len() / head_dim, products.len() / CHUNK_LEN);
    for (query, row) in queries
        .chunks_exact(head_dim)
        .zip(products.chunks_exact_mut(CHUNK_LEN))
    {
        for (p, product) in row.iter_mut().zip(key_scores(query, keys)) {
            *p = product * scale;
        }
    }
}

/// [`chunk_scores`] in the SIMD build of `LANES` (8: AVX2, 16: AVX-512),
/// four rows a pass.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn chunk_scores_simd<const LANES: usize, const FUSED: bool, T: Lanes>(
    queries: &[f32],
    keys: &[T],
    scale: f32,
    products: &mut [f32],
) {
    let head_dim = keys.len() / CHUNK_LEN;
    debug_assert_eq!(queries.len() / head_dim, products.len() / CHUNK_LEN);
    let (q_blocks, q_rest) = queries.split_at(queries.len() / (4 * head_dim) * 4 * head_dim);
    let (p_blocks, p_rest) = products.split_at_mut(q_blocks.len() / head_dim * CHUNK_LEN);
    for (q, p) in q_blocks
        .chunks_exact(4 * head_dim)
        .zip(p_blocks.chunks_exact_mut(4 * CHUNK_LEN))
    {
        key_scores_simd::<LANES, FUSED, 4, T>(q, keys, scale, p);
    }
    match q_rest.len() / head_dim {
        0 => {}
        1 => key_scores_simd::<LANES, FUSED, 1, T>(q_rest, keys, scale, p_rest),
        2 => key_scores_simd::<LANES, FUSED, 2, T>(q_rest, keys, scale, p_rest),
        _ => key_scores_simd::<LANES, FUSED, 3, T>(q_rest, keys, scale, p_rest),
    }
}

/// [`key_scores_avx512`] or [`key_scores_avx2`], as `LANES` says.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn key_scores_simd<const LANES: usize, const FUSED: bool, const R: usize, T: Lanes>(
    queries: &[f32],
    keys: &[T],
    scale: f32,
    products: &mut [f32],
) {
    // SAFETY: called only from `attend_tile_avx512` (16 lanes) or
    // `attend_tile_avx2` (8), whose features these are.
    unsafe {
        if LANES == 16 {
            key_scores_avx512::<R, FUSED, T>(queries, keys, scale, products);
        } else {
            key_scores_avx2::<R, FUSED, T>(queries, keys, scale, products);
        }
    }
}

/// [`key_scores`] times `scale` for `R` query rows at once (`queries`:
/// `[R][head_dim]`, `products`: `[R][CHUNK_LEN]`), in AVX2 with the same
/// operations in the same order: for 16 keys (two vectors) at a time, the
/// partial sum of dimensions `p, p + 8, ...` for each `p` in turn, added to
/// the running sum of the earlier partials, so only the sums in flight
/// (`2 R` vectors) and the current partials (`2 R`) need registers. Each
/// product is added to its partial by [`add_product8`]: fused when
/// `FUSED`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn key_scores_avx2<const R: usize, const FUSED: bool, T: Lanes>(
    queries: &[f32],
    keys: &[T],
    scale: f32,
    products: &mut [f32],
) {
    use std::arch::x86_64::*;
    let head_dim = keys.len() / CHUNK_LEN;
    assert!(queries.len() == R * head_dim && products.len() == R * CHUNK_LEN);
    let whole = head_dim / PARTIALS * PARTIALS;
    let q = queries.as_ptr();
    for half in 0..CHUNK_LEN / 16 {
        let mut sums = [[_mm256_set1_ps(-0.0); 2]; R];
        for p in 0..PARTIALS {
            let mut partials = [[_mm256_setzero_ps(); 2]; R];
            for d in (p..whole).step_by(PARTIALS) {
                // SAFETY: d < head_dim, so the key row d (CHUNK_LEN values)
                // and each query's value d are in bounds (asserted above).
                unsafe {
                    let column = d * CHUNK_LEN + half * 16;
                    let (c0, c1) = (T::load8(keys, column), T::load8(keys, column + 8));
                    for (i, partial) in partials.iter_mut().enumerate() {
                        let b = _mm256_set1_ps(*q.add(i * head_dim + d));
                        partial[0] = add_product8::<FUSED>(partial[0], b, c0);
                        partial[1] = add_product8::<FUSED>(partial[1], b, c1);
                    }
                }
            }
            for (sum, partial) in sums.iter_mut().zip(&partials) {
                sum[0] = _mm256_add_ps(sum[0], partial[0]);
                sum[1] = _mm256_add_ps(sum[1], partial[1]);
            }
        }
        let mut tails = [[_mm256_set1_ps(-0.0); 2]; R];
        for d in whole..head_dim {
            // SAFETY: as above.
            unsafe {
                let column = d * CHUNK_LEN + half * 16;
                let (c0, c1) = (T::load8(keys, column), T::load8(keys, column + 8));
                for (i, tail) in tails.iter_mut().enumerate() {
                    let b = _mm256_set1_ps(*q.add(i * head_dim + d));
                    tail[0] = add_product8::<FUSED>(tail[0], b, c0);
                    tail[1] = add_product8::<FUSED>(tail[1], b, c1);
                }
            }
        }
        let scale = _mm256_set1_ps(scale);
        for (i, (sum, tail)) in sums.iter().zip(&tails).enumerate() {
            // SAFETY: row i's products are in bounds (asserted above).
            unsafe {
                let row = products.as_mut_ptr().add(i * CHUNK_LEN + half * 16);
                _mm256_storeu_ps(row, _mm256_mul_ps(_mm256_add_ps(sum[0], tail[0]), scale));
                _mm256_storeu_ps(
                    row.add(8),
                    _mm256_mul_ps(_mm256_add_ps(sum[1], tail[1]), scale),
                );
            }
        }
    }
}

/// [`key_scores_avx2`] in AVX-512: the whole chunk's keys (two vectors of
/// 16) at once, so each query value broadcast serves 32 keys; the same
/// operations on every key, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
fn key_scores_avx512<const R: usize, const FUSED: bool, T: Lanes>(
    queries: &[f32],
    keys: &[T],
    scale: f32,
    products: &mut [f32],
) {
    use std::arch::x86_64::*;
    const VECTORS: usize = CHUNK_LEN / 16;
    const { assert!(CHUNK_LEN.is_multiple_of(16)) };
    let head_dim = keys.len() / CHUNK_LEN;
    assert!(queries.len() == R * head_dim && products.len() == R * CHUNK_LEN);
    let whole = head_dim / PARTIALS * PARTIALS;
    let q = queries.as_ptr();
    // SAFETY (both blocks below): d < head_dim, so the key row d (CHUNK_LEN
    // values) and each query's value d are in bounds (asserted above).
    let key_row = |d: usize| -> [__m512; VECTORS] {
        std::array::from_fn(|v| unsafe { T::load16(keys, d * CHUNK_LEN + v * 16) })
    };
    let mut sums = [[_mm512_set1_ps(-0.0); VECTORS]; R];
    for p in 0..PARTIALS {
        let mut partials = [[_mm512_setzero_ps(); VECTORS]; R];
        for d in (p..whole).step_by(PARTIALS) {
            let k = key_row(d);
            for (i, partial) in partials.iter_mut().enumerate() {
                let b = _mm512_set1_ps(unsafe { *q.add(i * head_dim + d) });
                for (partial, &k) in partial.iter_mut().zip(&k) {
                    *partial = add_product16::<FUSED>(*partial, b, k);
                }
            }
        }
        for (sum, partial) in sums.iter_mut().zip(&partials) {
            for (sum, &partial) in sum.iter_mut().zip(partial) {
                *sum = _mm512_add_ps(*sum, partial);
            }
        }
    }
    let mut tails = [[_mm512_set1_ps(-0.0); VECTORS]; R];
    for d in whole..head_dim {
        let k = key_row(d);
        for (i, tail) in tails.iter_mut().enumerate() {
            let b = _mm512_set1_ps(unsafe { *q.add(i * head_dim + d) });
            for (tail, &k) in tail.iter_mut().zip(&k) {
                *tail = add_product16::<FUSED>(*tail, b, k);
            }
        }
    }
    let scale = _mm512_set1_ps(scale);
    for (i, (sum, tail)) in sums.iter().zip(&tails).enumerate() {
        for (v, (&sum, &tail)) in sum.iter().zip(tail).enumerate() {
            // SAFETY: row i's products are in bounds (asserted above).
            unsafe {
                let at = products.as_mut_ptr().add(i * CHUNK_LEN + v * 16);
                _mm512_storeu_ps(at, _mm512_mul_ps(_mm512_add_ps(sum, tail), scale));
            }
        }
    }
}

/// Adds `sum_k w[r][k] * value_rows[k]` to the output row of each query
/// row `r` in `rows`, each output value in position order: row `r`'s output
/// starts at `out[out_row(r)]` (`head_dim` values) and its weights at
/// `weights[weights_at(r)]` (one per value row). The SIMD builds take four
/// rows at a time, so each value vector they load serves four rows.
#[inline(always)]
fn add_weighted_rows<const LANES: usize, const FUSED: bool>(
    out: &mut [f32],
    rows: std::ops::Range<usize>,
    out_row: impl Fn(usize) -> usize,
    weights: &[f32],
    weights_at: impl Fn(usize) -> usize,
    value_rows: ChunkRows<'_>,
    head_dim: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if LANES > 1 {
        match value_rows {
            ChunkRows::F32(values) => add_weighted_rows_simd::<LANES, FUSED, _>(
                out, rows, out_row, weights, weights_at, values, head_dim,
            ),
            ChunkRows::F16(values) => add_weighted_rows_simd::<LANES, FUSED, _>(
                out, rows, out_row, weights, weights_at, values, head_dim,
            ),
        }
        return;
    }
    let value_rows = value_rows.f32();
    let n = value_rows.len() / head_dim;
    for r in rows {
        add_weighted_row(
            &mut out[out_row(r)..][..head_dim],
            &weights[weights_at(r)..][..n],
            value_rows,
        );
    }
}

/// [`add_weighted_rows`] in the SIMD build of `LANES` (8: AVX2, 16:
/// AVX-512), four rows a pass.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn add_weighted_rows_simd<const LANES: usize, const FUSED: bool, T: Lanes>(
    out: &mut [f32],
    rows: std::ops::Range<usize>,
    out_row: impl Fn(usize) -> usize,
    weights: &[f32],
    weights_at: impl Fn(usize) -> usize,
    value_rows: &[T],
    head_dim: usize,
) {
    let n = value_rows.len() / head_dim;
    let mut r = rows.start;
    while r < rows.end {
        let m = (rows.end - r).min(4);
        let outs = |i: usize| out_row(r + i.min(m - 1));
        let ws = |i: usize| &weights[weights_at(r + i.min(m - 1))..][..n];
        match m {
            4 => add_weighted_simd::<LANES, FUSED, 4, T>(
                out,
                [outs(0), outs(1), outs(2), outs(3)],
                [ws(0), ws(1), ws(2), ws(3)],
                value_rows,
                head_dim,
            ),
            3 => add_weighted_simd::<LANES, FUSED, 3, T>(
                out,
                [outs(0), outs(1), outs(2)],
                [ws(0), ws(1), ws(2)],
                value_rows,
                head_dim,
            ),
            2 => add_weighted_simd::<LANES, FUSED, 2, T>(
                out,
                [outs(0), outs(1)],
                [ws(0), ws(1)],
                value_rows,
                head_dim,
            ),
            _ => add_weighted_simd::<LANES, FUSED, 1, T>(
                out,
                [outs(0)],
                [ws(0)],
                value_rows,
                head_dim,
            ),
        }
        r += m;
    }
}

/// [`add_weighted_avx512`] or [`add_weighted_avx2`], as `LANES` says.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn add_weighted_simd<const LANES: usize, const FUSED: bool, const R: usize, T: Lanes>(
    out: &mut [f32],
    out_starts: [usize; R],
    weights: [&[f32]; R],
    value_rows: &[T],
    head_dim: usize,
) {
    // SAFETY: called only from `attend_tile_avx512` (16 lanes) or
    // `attend_tile_avx2` (8), whose features these are.
    unsafe {
        if LANES == 16 {
            add_weighted_avx512::<R, FUSED, T>(out, out_starts, weights, value_rows, head_dim);
        } else {
            add_weighted_avx2::<R, FUSED, T>(out, out_starts, weights, value_rows, head_dim);
        }
    }
}

/// [`add_weighted_row`] for `R` output rows at once (starting at
/// `out_starts`, distinct rows of `head_dim` values), in AVX2: 16 output
/// values of every row stay in registers across the value rows, and each
/// value vector is loaded once for the `R` rows; fused products when
/// `FUSED`, as in [`key_scores_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn add_weighted_avx2<const R: usize, const FUSED: bool, T: Lanes>(
    out: &mut [f32],
    out_starts: [usize; R],
    weights: [&[f32]; R],
    value_rows: &[T],
    head_dim: usize,
) {
    use std::arch::x86_64::*;
    let n = weighted_rows_checked(out.len(), &out_starts, &weights, value_rows.len(), head_dim);
    let base = out.as_mut_ptr();
    let mut d = 0;
    // SAFETY (every block below): output values `start + d..start + d + 16`
    // (or 8) lie in row `start..start + head_dim`, value `k * head_dim + d`
    // and the 15 (or 7) after it in value row k < n, weight k < n: all in
    // bounds (asserted above).
    while d + 16 <= head_dim {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for (a, &start) in acc.iter_mut().zip(&out_starts) {
                a[0] = _mm256_loadu_ps(base.add(start + d));
                a[1] = _mm256_loadu_ps(base.add(start + d + 8));
            }
            for k in 0..n {
                let row = k * head_dim + d;
                let (v0, v1) = (T::load8(value_rows, row), T::load8(value_rows, row + 8));
                for (a, w) in acc.iter_mut().zip(&weights) {
                    let b = _mm256_set1_ps(*w.get_unchecked(k));
                    a[0] = add_product8::<FUSED>(a[0], b, v0);
                    a[1] = add_product8::<FUSED>(a[1], b, v1);
                }
            }
            for (a, &start) in acc.iter().zip(&out_starts) {
                _mm256_storeu_ps(base.add(start + d), a[0]);
                _mm256_storeu_ps(base.add(start + d + 8), a[1]);
            }
        }
        d += 16;
    }
    if d + 8 <= head_dim {
        unsafe {
            let mut acc = [_mm256_setzero_ps(); R];
            for (a, &start) in acc.iter_mut().zip(&out_starts) {
                *a = _mm256_loadu_ps(base.add(start + d));
            }
            for k in 0..n {
                let v0 = T::load8(value_rows, k * head_dim + d);
                for (a, w) in acc.iter_mut().zip(&weights) {
                    let b = _mm256_set1_ps(*w.get_unchecked(k));
                    *a = add_product8::<FUSED>(*a, b, v0);
                }
            }
            for (a, &start) in acc.iter().zip(&out_starts) {
                _mm256_storeu_ps(base.add(start + d), *a);
            }
        }
        d += 8;
    }
    add_weighted_dims(
        out,
        &out_starts,
        &weights,
        value_rows,
        head_dim,
        d..head_dim,
    );
}

/// Asserts what the SIMD weighted-sum kernels rely on: whole value rows of
/// `head_dim`, every output row within `out_len`, one weight per value
/// row. Returns the number of value rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn weighted_rows_checked<const R: usize>(
    out_len: usize,
    out_starts: &[usize; R],
    weights: &[&[f32]; R],
    n_values: usize,
    head_dim: usize,
) -> usize {
    let n = n_values / head_dim;
    assert!(n_values == n * head_dim);
    for (&start, w) in out_starts.iter().zip(weights) {
        assert!(start + head_dim <= out_len && w.len() == n);
    }
    n
}

/// The output dimensions `dims` of the SIMD weighted-sum kernels' rows one
/// value at a time (those past the last whole vector), in the same order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn add_weighted_dims<const R: usize, T: Lanes>(
    out: &mut [f32],
    out_starts: &[usize; R],
    weights: &[&[f32]; R],
    value_rows: &[T],
    head_dim: usize,
    dims: Range<usize>,
) {
    for (&start, w) in out_starts.iter().zip(weights) {
        for dim in dims.clone() {
            let mut a = out[start + dim];
            for (k, &weight) in w.iter().enumerate() {
                a += weight * value_rows[k * head_dim + dim].widen();
            }
            out[start + dim] = a;
        }
    }
}

/// [`add_weighted_avx2`] in AVX-512: 64 output values of every row (four
/// vectors) stay in registers across the value rows, then 16 at a time;
/// the same operations on every value, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
fn add_weighted_avx512<const R: usize, const FUSED: bool, T: Lanes>(
    out: &mut [f32],
    out_starts: [usize; R],
    weights: [&[f32]; R],
    value_rows: &[T],
    head_dim: usize,
) {
    weighted_rows_checked(out.len(), &out_starts, &weights, value_rows.len(), head_dim);
    let mut d = 0;
    // SAFETY (both loops): each block's dimensions lie in `d..head_dim`,
    // and the output rows, weights and value rows are as asserted above.
    while d + 64 <= head_dim {
        unsafe {
            add_weighted_block_avx512::<R, 4, FUSED, T>(
                out,
                &out_starts,
                &weights,
                value_rows,
                head_dim,
                d,
            )
        };
        d += 64;
    }
    while d + 16 <= head_dim {
        unsafe {
            add_weighted_block_avx512::<R, 1, FUSED, T>(
                out,
                &out_starts,
                &weights,
                value_rows,
                head_dim,
                d,
            )
        };
        d += 16;
    }
    add_weighted_dims(
        out,
        &out_starts,
        &weights,
        value_rows,
        head_dim,
        d..head_dim,
    );
}

/// Output values `d..d + 16 V` of the `R` rows of [`add_weighted_avx512`],
/// in `V` vectors per row held in registers across the value rows.
///
/// # Safety
/// AVX-512 F; `d + 16 V <= head_dim`, every output row `start..start +
/// head_dim` in `out`, every weight slice one weight per value row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn add_weighted_block_avx512<const R: usize, const V: usize, const FUSED: bool, T: Lanes>(
    out: &mut [f32],
    out_starts: &[usize; R],
    weights: &[&[f32]; R],
    value_rows: &[T],
    head_dim: usize,
    d: usize,
) {
    use std::arch::x86_64::*;
    let n = value_rows.len() / head_dim;
    let base = out.as_mut_ptr();
    // SAFETY: in bounds by the function's contract.
    unsafe {
        let mut acc: [[__m512; V]; R] = std::array::from_fn(|i| {
            std::array::from_fn(|v| _mm512_loadu_ps(base.add(out_starts[i] + d + 16 * v)))
        });
        for k in 0..n {
            let row = k * head_dim + d;
            let values: [__m512; V] = std::array::from_fn(|v| T::load16(value_rows, row + 16 * v));
            for (acc, w) in acc.iter_mut().zip(weights) {
                let b = _mm512_set1_ps(*w.get_unchecked(k));
                for (a, &value) in acc.iter_mut().zip(&values) {
                    *a = add_product16::<FUSED>(*a, b, value);
                }
            }
        }
        for (acc, &start) in acc.iter().zip(out_starts) {
            for (v, &a) in acc.iter().enumerate() {
                _mm512_storeu_ps(base.add(start + d + 16 * v), a);
            }
        }
    }
}

/// Adds `sum_k weights[k] * rows[k]` to `out` (rows of `out.len()` values),
/// each output value in row order; 32 outputs at a time stay in registers
/// across the rows.
#[inline(always)]
fn add_weighted_row(out: &mut [f32], weights: &[f32], rows: &[f32]) {
    const BLOCK: usize = 32;
    let width = out.len();
    debug_assert_eq!(rows.len(), weights.len() * width, "one row per weight");
    let (blocks, tail) = out.as_chunks_mut::<BLOCK>();
    for (block_idx, block) in blocks.iter_mut().enumerate() {
        let mut acc = *block;
        for (&w, row) in weights.iter().zip(rows.chunks_exact(width)) {
            let (part, _) = row[block_idx * BLOCK..].as_chunks::<BLOCK>();
            for (a, &v) in acc.iter_mut().zip(&part[0]) {
                *a += w * v;
            }
        }
        *block = acc;
    }
    let tail_start = width - tail.len();
    for (&w, row) in weights.iter().zip(rows.chunks_exact(width)) {
        for (a, &v) in tail.iter_mut().zip(&row[tail_start..]) {
            *a += w * v;
        }
    }
}

/// Turns the scores of `rows` (`[n][span]`, the positions `seen(r)` of row
/// `r` visible) into attention weights in place: softmax after subtracting
/// the row's maximum, with libm's `exp` (or [`exp`](super::exp)'s
/// vectorised `exp`, which gives libm's bits), the weights summed in
/// position order, as the conformance fixtures were measured with (another
/// order moves single logits of the quantized models past the fixtures'
/// tolerances). Up to [`SUM_ROWS`] rows' sums are independent chains of
/// additions, run side by side.
#[inline(always)]
fn softmax_to_weights(
    dispatch: Dispatch,
    rows: &mut [f32],
    span: usize,
    seen: impl Fn(usize) -> Range<usize>,
) {
    for (r, row) in rows.chunks_exact_mut(span).enumerate() {
        let row = &mut row[seen(r)];
        let max = row_max(row);
        for score in row.iter_mut() {
            *score -= max;
        }
        exp_in_place(dispatch, row);
    }
    let n_rows = rows.len() / span;
    for first in (0..n_rows).step_by(SUM_ROWS) {
        let block = first..(first + SUM_ROWS).min(n_rows);
        let sums = match block.len() {
            8 => sums_in_position_order::<8>(rows, span, first, &seen),
            7 => sums_in_position_order::<7>(rows, span, first, &seen),
            6 => sums_in_position_order::<6>(rows, span, first, &seen),
            5 => sums_in_position_order::<5>(rows, span, first, &seen),
            4 => sums_in_position_order::<4>(rows, span, first, &seen),
            3 => sums_in_position_order::<3>(rows, span, first, &seen),
            2 => sums_in_position_order::<2>(rows, span, first, &seen),
            _ => sums_in_position_order::<1>(rows, span, first, &seen),
        };
        for (r, sum) in block.zip(sums) {
            let inv_sum = 1.0 / sum;
            for weight in &mut rows[r * span..(r + 1) * span][seen(r)] {
                *weight *= inv_sum;
            }
        }
    }
}

/// Rows whose softmax sums [`softmax_to_weights`] runs side by side: eight
/// chains of additions keep both of a core's adders busy where one chain
/// waits on each addition's latency.
const SUM_ROWS: usize = 8;

/// The sums of the `R` rows of `rows` (`[n][span]`) from row `first` on,
/// each over its positions `seen(r)` in position order (one chain of
/// additions per row, from 0.0). Over the positions every row sees the `R`
/// chains advance together; the positions before and after those, which
/// only some rows see, are added row by row, so each row's additions keep
/// their order. The result has [`SUM_ROWS`] sums, of which the first `R` are
/// the rows'.
#[inline(always)]
fn sums_in_position_order<const R: usize>(
    rows: &[f32],
    span: usize,
    first: usize,
    seen: &impl Fn(usize) -> Range<usize>,
) -> [f32; SUM_ROWS] {
    const { assert!(R >= 1 && R <= SUM_ROWS) };
    let rows: [&[f32]; R] = std::array::from_fn(|i| &rows[(first + i) * span..][..span]);
    let ranges: [Range<usize>; R] = std::array::from_fn(|i| seen(first + i));
    let mut sums = [0.0f32; SUM_ROWS];
    let shared_start = ranges.iter().map(|r| r.start).max().unwrap_or(0);
    let shared_end = ranges.iter().map(|r| r.end).min().unwrap_or(0);
    if shared_start >= shared_end {
        // No position seen by all: each row alone.
        for ((sum, row), range) in sums.iter_mut().zip(rows).zip(ranges) {
            *sum = row[range].iter().fold(0.0, |sum, &v| sum + v);
        }
        return sums;
    }
    for ((sum, row), range) in sums.iter_mut().zip(rows).zip(&ranges) {
        *sum = row[range.start..shared_start]
            .iter()
            .fold(0.0, |sum, &v| sum + v);
    }
    let shared: [&[f32]; R] = rows.map(|row| &row[shared_start..shared_end]);
    for k in 0..shared_end - shared_start {
        for (sum, row) in sums.iter_mut().zip(shared) {
            *sum += row[k];
        }
    }
    for ((sum, row), range) in sums.iter_mut().zip(rows).zip(&ranges) {
        *sum = row[shared_end..range.end]
            .iter()
            .fold(*sum, |sum, &v| sum + v);
    }
    sums
}

/// The largest value of `values` (`f32::max`, so NaN is passed over;
/// negative infinity if there is none), eight lanes side by side.
#[inline(always)]
fn row_max(values: &[f32]) -> f32 {
    let (vectors, rest) = values.as_chunks::<8>();
    let mut lanes = [f32::NEG_INFINITY; 8];
    for vector in vectors {
        for (lane, &v) in lanes.iter_mut().zip(vector) {
            *lane = lane.max(v);
        }
    }
    lanes
        .iter()
        .chain(rest)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Rounds every value to the nearest f16 (ties to even) in place, as
/// [`round_to_f16`] does one value at a time: in a SIMD build (`LANES` 8
/// or 16), F16C there and back eight values at a time; otherwise through
/// `narrowed` (grown if needed) with `half`'s slice conversions.
#[inline(always)]
fn round_all_to_f16<const LANES: usize>(
    dispatch: Dispatch,
    values: &mut [f32],
    narrowed: &mut Vec<f16>,
) {
    #[cfg(target_arch = "x86_64")]
    if LANES > 1 {
        // SAFETY: called only from `attend_tile_avx2` or
        // `attend_tile_avx512`, whose features include this function's.
        unsafe { round_to_f16_f16c(values) };
        return;
    }
    if narrowed.len() < values.len() {
        narrowed.resize(values.len(), f16::ZERO);
    }
    let narrowed = &mut narrowed[..values.len()];
    narrowed.convert_from_f32_slice(values);
    widen_f16(dispatch, narrowed, values);
}

/// [`round_all_to_f16`] with F16C: `vcvtps2ph` rounding to nearest even
/// (as `half` does, subnormals and overflow included), then back.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn round_to_f16_f16c(values: &mut [f32]) {
    use std::arch::x86_64::*;
    let (vectors, rest) = values.as_chunks_mut::<8>();
    for vector in vectors {
        // SAFETY: eight f32 in bounds; unaligned access is allowed.
        unsafe {
            let x = _mm256_loadu_ps(vector.as_ptr());
            let halves = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm256_storeu_ps(vector.as_mut_ptr(), _mm256_cvtph_ps(halves));
        }
    }
    for value in rest {
        *value = f16::from_f32(*value).to_f32();
    }
}

/// `value` rounded to the nearest f16 (ties to even), back in f32: the
/// one-value definition the tests check the slice rounding against.
#[cfg(test)]
fn round_to_f16(value: f32) -> f32 {
    f16::from_f32(value).to_f32()
}

#[cfg(test)]
mod tests {
    use super::super::kv_cache::KvShape;
    use super::*;

    /// The attention output of one head of width 1 (`query`) over the
    /// first `n_positions` positions of layer 0 of `cache`.
    fn attend_width_one(
        cache: &KvCache,
        precision: KvPrecision,
        n_positions: usize,
        query: f32,
    ) -> f32 {
        let shape = AttentionShape {
            n_head: 1,
            n_kv_head: 1,
            head_dim: 1,
            precision,
            scale: 1.0,
            window: None,
        };
        let mut out = [0.0];
        let mut scratch = AttentionScratch::default();
        attend(
            shape,
            cache,
            0,
            n_positions - 1,
            &[query],
            &mut scratch,
            &mut out,
        );
        out[0]
    }

    /// A one-layer cache of one key/value head holding `rows` (key, value)
    /// at positions 0, 1, ...
    fn one_head_cache(
        head_dim: usize,
        capacity: usize,
        precision: KvPrecision,
        rows: &[(&[f32], &[f32])],
    ) -> KvCache {
        let shape = KvShape {
            n_layer: 1,
            n_kv_head: 1,
            head_dim,
            capacity,
        };
        let mut cache = KvCache::new(shape, precision, Dispatch::detect());
        for (pos, (key, value)) in rows.iter().enumerate() {
            cache.write(0, pos, key, value);
        }
        cache.commit(rows.len());
        cache
    }

    #[test]
    fn f16_rounding_keeps_eleven_significant_bits() {
        // f16 has a 10-bit fraction: 1 + 2^-10 survives, 1 + 2^-12 rounds to 1.
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-10)), 1.0 + 2f32.powi(-10));
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-12)), 1.0);
        assert_eq!(round_to_f16(0.1), 0.099_975_586);
    }

    #[test]
    fn f16_attention_rounds_the_weights() {
        // Keys 0 and ln 2 give weights 1/3 and 2/3; in f16 they are
        // 0.33325195 and 0.6665039, so the output over values 0 and 3 is
        // 3 * 0.6665039 instead of 2.
        let cache = one_head_cache(
            1,
            2,
            KvPrecision::F16,
            &[(&[0.0], &[0.0]), (&[round_to_f16(2f32.ln())], &[3.0])],
        );
        let weight = 1.0 / (1.0 + (-round_to_f16(2f32.ln())).exp());
        assert_eq!(
            attend_width_one(&cache, KvPrecision::F16, 2, 1.0),
            3.0 * round_to_f16(weight)
        );
    }

    #[test]
    fn rounding_a_slice_matches_rounding_each_value() {
        // Ties (1 + 2^-11 and 1 + 3 * 2^-11 go to the even neighbour),
        // subnormals, overflow, and a spread of ordinary values; 45 values so
        // the eight-wide loop leaves a remainder.
        let mut values = vec![
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            3.0 * 2f32.powi(-25),
            2f32.powi(-26),
            65519.0,
            65520.0,
            -0.1,
        ];
        values.extend((0..38).map(|i| (i as f32 * 0.731 - 9.0).powi(3) / 7.0));
        let expected: Vec<u32> = values.iter().map(|&v| round_to_f16(v).to_bits()).collect();
        assert_eq!(
            expected[..6],
            [
                1f32.to_bits(),
                (1.0 + 2f32.powi(-9)).to_bits(),
                2f32.powi(-23).to_bits(),
                0f32.to_bits(),
                65504f32.to_bits(),
                f32::INFINITY.to_bits()
            ]
        );
        let dispatch = Dispatch::detect();
        let mut portable = values.clone();
        round_all_to_f16::<1>(dispatch, &mut portable, &mut Vec::new());
        assert_eq!(bits(&portable), expected);
        #[cfg(target_arch = "x86_64")]
        if dispatch.kernel() != Kernel::Portable && dispatch.has_f16c() {
            // SAFETY: the CPU has AVX2 and F16C, the F16C path's features.
            unsafe { round_to_f16_f16c(&mut values) };
            assert_eq!(bits(&values), expected, "F16C");
        }
    }

    #[test]
    fn one_query_over_two_positions_by_hand() {
        // One head of width 1: keys 0 and ln(3) * 1, query 1, values 1 and 5.
        // Weights softmax([0, ln 3]) = [1/4, 3/4], output 1/4 + 15/4 = 4.
        let cache = one_head_cache(
            1,
            4,
            KvPrecision::F32,
            &[(&[0.0], &[1.0]), (&[3f32.ln()], &[5.0])],
        );
        let out = attend_width_one(&cache, KvPrecision::F32, 2, 1.0);
        assert!((out - 4.0).abs() < 1e-6, "{out:?}");
        // The causal mask: position 0 reads only itself.
        assert_eq!(attend_width_one(&cache, KvPrecision::F32, 1, 1.0), 1.0);
    }

    #[test]
    fn grouped_query_heads_share_their_key_value_head() {
        // Two query heads over one key/value head see the same values.
        let cache = one_head_cache(
            2,
            4,
            KvPrecision::F32,
            &[(&[1.0, 0.0], &[2.0, 0.0]), (&[0.0, 1.0], &[0.0, 2.0])],
        );
        let shape = AttentionShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 2,
            precision: KvPrecision::F32,
            scale: 1.0 / 2f32.sqrt(),
            window: None,
        };
        let mut out = [0.0; 4];
        // Head 0 looks at key 0 only (large score), head 1 at key 1.
        attend(
            shape,
            &cache,
            0,
            1,
            &[50.0, 0.0, 0.0, 50.0],
            &mut AttentionScratch::default(),
            &mut out,
        );
        for (o, e) in out.iter().zip([2.0, 0.0, 0.0, 2.0]) {
            assert!((o - e).abs() < 1e-6, "{out:?}");
        }
    }

    /// Pseudo-random values in [-2, 2) from a fixed seed (an LCG).
    fn pseudo_random(seed: u32, n: usize) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    /// The dot product of two equal-length slices with eight partial sums
    /// (the one-query-at-a-time attention's, before the tiles).
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut partial = [0.0f32; 8];
        let a_chunks = a.chunks_exact(8);
        let b_chunks = b.chunks_exact(8);
        let tail: f32 = a_chunks
            .remainder()
            .iter()
            .zip(b_chunks.remainder())
            .map(|(x, y)| x * y)
            .sum();
        for (x, y) in a_chunks.zip(b_chunks) {
            for i in 0..8 {
                partial[i] += x[i] * y[i];
            }
        }
        partial.iter().sum::<f32>() + tail
    }

    /// The attention of the query at `pos` written out plainly, head by
    /// head and position by position, as it was computed before the tiles:
    /// scores by [`dot`], softmax with `exp` summed in order, outputs summed
    /// in position order; keys and values as f32 rows as the cache stores
    /// them.
    fn attend_plainly(
        shape: AttentionShape,
        keys: &[Vec<f32>],
        values: &[Vec<f32>],
        pos: usize,
        query: &[f32],
    ) -> Vec<f32> {
        let head_dim = shape.head_dim;
        let group = shape.n_head / shape.n_kv_head;
        let round = |v: f32| match shape.precision {
            KvPrecision::F16 => round_to_f16(v),
            KvPrecision::F32 => v,
        };
        let seen = shape.first_visible(pos)..pos + 1;
        let mut out = Vec::new();
        for (head_idx, q) in query.chunks_exact(head_dim).enumerate() {
            let q: Vec<f32> = q.iter().map(|&v| round(v)).collect();
            let kv = head_idx / group * head_dim..(head_idx / group + 1) * head_dim;
            let scores: Vec<f32> = keys[seen.clone()]
                .iter()
                .map(|k| dot(&q, &k[kv.clone()]) * shape.scale)
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = scores.iter().map(|&s| (s - max).exp()).collect();
            let sum: f32 = exps.iter().fold(0.0, |acc, &e| acc + e);
            let inv_sum = 1.0 / sum;
            let mut o = vec![0.0; head_dim];
            for (e, v) in exps.iter().zip(&values[seen.clone()]) {
                let weight = round(e * inv_sum);
                for (acc, &x) in o.iter_mut().zip(&v[kv.clone()]) {
                    *acc += weight * x;
                }
            }
            out.extend(o);
        }
        out
    }

    /// 4 query heads over 2 key/value heads, `n` positions of keys and
    /// values and a query row per position, pseudo-random.
    struct Case {
        shape: AttentionShape,
        keys: Vec<Vec<f32>>,
        values: Vec<Vec<f32>>,
        queries: Vec<f32>,
    }

    impl Case {
        fn new(head_dim: usize, window: Option<usize>, precision: KvPrecision, n: usize) -> Case {
            let kv_dim = 2 * head_dim;
            let rows = |seed| {
                pseudo_random(seed, n * kv_dim)
                    .chunks_exact(kv_dim)
                    .map(<[f32]>::to_vec)
                    .collect::<Vec<_>>()
            };
            Case {
                shape: AttentionShape {
                    n_head: 4,
                    n_kv_head: 2,
                    head_dim,
                    precision,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    window,
                },
                keys: rows(7),
                values: rows(8),
                queries: pseudo_random(9, n * 4 * head_dim),
            }
        }

        /// The keys and values in layer 1 of a cache built with `dispatch`.
        fn cache(&self, dispatch: Dispatch) -> KvCache {
            let kv_shape = KvShape {
                n_layer: 2,
                n_kv_head: 2,
                head_dim: self.shape.head_dim,
                capacity: self.keys.len().max(100),
            };
            let mut cache = KvCache::new(kv_shape, self.shape.precision, dispatch);
            for (pos, (k, v)) in self.keys.iter().zip(&self.values).enumerate() {
                cache.write(1, pos, k, v);
            }
            cache.commit(self.keys.len());
            cache
        }

        /// The rows the cache holds: f16-rounded in an f16 cache.
        fn stored(&self, rows: &[Vec<f32>]) -> Vec<Vec<f32>> {
            rows.iter()
                .map(|r| match self.shape.precision {
                    KvPrecision::F16 => r.iter().map(|&v| round_to_f16(v)).collect(),
                    KvPrecision::F32 => r.clone(),
                })
                .collect()
        }

        /// `attend` over the queries of positions `positions` in one call.
        fn attend_block(&self, cache: &KvCache, positions: std::ops::Range<usize>) -> Vec<f32> {
            let q_dim = 4 * self.shape.head_dim;
            let queries = &self.queries[positions.start * q_dim..positions.end * q_dim];
            let mut out = vec![f32::NAN; queries.len()];
            let mut scratch = AttentionScratch::default();
            attend(
                self.shape,
                cache,
                1,
                positions.start,
                queries,
                &mut scratch,
                &mut out,
            );
            out
        }
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn tiled_attention_equals_plain_attention_bit_for_bit_in_one_call_or_one_query_at_a_time() {
        // 70 positions: three chunks and five tiles of queries (so the
        // parallel path runs); head widths with and without a 32-value
        // block, and 84 (64 + 16 + 4: every block width of the SIMD
        // kernels, and dimensions past the last eight); causal and
        // sliding-window layers at both precisions (a window of 2 leaves
        // the four queries of a softmax block no position they all see, one
        // of 5 a few).
        let n = 70;
        for precision in [KvPrecision::F32, KvPrecision::F16] {
            for head_dim in [8, 40, 84] {
                for window in [None, Some(2), Some(5), Some(40)] {
                    let case = Case::new(head_dim, window, precision, n);
                    let what = format!("{precision:?}, head_dim {head_dim}, window {window:?}");
                    let (keys, values) = (case.stored(&case.keys), case.stored(&case.values));
                    let q_dim = 4 * head_dim;
                    let expected: Vec<f32> = (0..n)
                        .flat_map(|pos| {
                            let query = &case.queries[pos * q_dim..(pos + 1) * q_dim];
                            attend_plainly(case.shape, &keys, &values, pos, query)
                        })
                        .collect();
                    // Every build (portable, AVX2, AVX-512) computes the
                    // same bits.
                    for dispatch in Dispatch::every_available() {
                        let what = format!("{what}, {:?}", dispatch.kernel());
                        let cache = case.cache(dispatch);
                        assert_eq!(
                            bits(&case.attend_block(&cache, 0..n)),
                            bits(&expected),
                            "{what}: all at once"
                        );
                        let one_by_one: Vec<f32> = (0..n)
                            .flat_map(|pos| case.attend_block(&cache, pos..pos + 1))
                            .collect();
                        assert_eq!(bits(&one_by_one), bits(&expected), "{what}: one at a time");
                        // A block that starts inside a chunk, as a second
                        // prompt piece does.
                        assert_eq!(
                            bits(&case.attend_block(&cache, 33..61)),
                            bits(&expected[33 * q_dim..61 * q_dim]),
                            "{what}: positions 33..61"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_long_span_split_by_heads_across_threads_keeps_every_bit() {
        // 500 positions: one query (a decode step) or three (a short
        // verification pass) over them is long enough to be split by heads.
        // Two threads take one key/value group each; three and four split
        // each group into single heads.
        let n = 500;
        let head_dim = 40;
        let q_dim = 4 * head_dim;
        for precision in [KvPrecision::F32, KvPrecision::F16] {
            for window in [None, Some(450)] {
                let case = Case::new(head_dim, window, precision, n);
                let (keys, values) = (case.stored(&case.keys), case.stored(&case.values));
                for (dispatch, positions) in Dispatch::every_available()
                    .into_iter()
                    .flat_map(|dispatch| [(dispatch, n - 1..n), (dispatch, n - 3..n)])
                {
                    let cache = case.cache(dispatch);
                    let span = positions.end - case.shape.first_visible(positions.start);
                    assert!(positions.len() * span * q_dim >= PARALLEL_MIN_PRODUCTS);
                    let expected: Vec<f32> = positions
                        .clone()
                        .flat_map(|pos| {
                            let query = &case.queries[pos * q_dim..(pos + 1) * q_dim];
                            attend_plainly(case.shape, &keys, &values, pos, query)
                        })
                        .collect();
                    for n_threads in [1, 2, 3, 4] {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(n_threads)
                            .build()
                            .unwrap();
                        let out = pool.install(|| case.attend_block(&cache, positions.clone()));
                        assert_eq!(
                            bits(&out),
                            bits(&expected),
                            "{:?}: {precision:?}, window {window:?}, positions {positions:?}, \
                             {n_threads} threads",
                            dispatch.kernel()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn head_runs_are_whole_groups_while_there_are_enough_and_divide_them() {
        let shape = |n_head, n_kv_head| AttentionShape {
            n_head,
            n_kv_head,
            head_dim: 64,
            precision: KvPrecision::F16,
            scale: 0.125,
            window: None,
        };
        // SmolLM2: 9 heads over 3.
        assert_eq!(head_run_len(shape(9, 3), 2), 3);
        assert_eq!(head_run_len(shape(9, 3), 3), 3);
        assert_eq!(head_run_len(shape(9, 3), 4), 1);
        // Gemma 3 270M: 4 heads over 1.
        assert_eq!(head_run_len(shape(4, 1), 2), 2);
        assert_eq!(head_run_len(shape(4, 1), 3), 1);
        assert_eq!(head_run_len(shape(4, 1), 8), 1);
        // Multi-head attention: one head per group.
        assert_eq!(head_run_len(shape(12, 12), 2), 1);
    }

    #[test]
    fn tiled_attention_is_within_float_rounding_of_exact_attention() {
        // The independent check: softmax attention in f64 with libm's exp.
        let n = 70;
        for window in [None, Some(17)] {
            let case = Case::new(40, window, KvPrecision::F32, n);
            let out = case.attend_block(&case.cache(Dispatch::detect()), 0..n);
            let head_dim = 40;
            for pos in 0..n {
                let seen = case.shape.first_visible(pos)..pos + 1;
                for head_idx in 0..4 {
                    let kv = head_idx / 2 * head_dim..(head_idx / 2 + 1) * head_dim;
                    let q = &case.queries[(pos * 4 + head_idx) * head_dim..][..head_dim];
                    let scores: Vec<f64> = case.keys[seen.clone()]
                        .iter()
                        .map(|k| {
                            q.iter()
                                .zip(&k[kv.clone()])
                                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                                .sum::<f64>()
                                / (head_dim as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = exps.iter().sum();
                    for d in 0..head_dim {
                        let exact: f64 = exps
                            .iter()
                            .zip(&case.values[seen.clone()])
                            .map(|(e, v)| e / sum * f64::from(v[kv.start + d]))
                            .sum();
                        let ours = f64::from(out[(pos * 4 + head_idx) * head_dim + d]);
                        assert!(
                            (ours - exact).abs() < 2e-6,
                            "window {window:?}, position {pos}, head {head_idx}, dim {d}: {ours} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}
