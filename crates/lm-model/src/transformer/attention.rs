//! Causal multi-head and grouped-query attention of a block of query rows
//! over the keys and values in the [`KvCache`]: one query for a decode step,
//! a whole prompt for prefill.
//!
//! This module is the algorithm: the tiles, the positions each query sees,
//! the softmax (`softmax`); the vector kernels it runs (products, weighted
//! sums, f16 rounding), one file per instruction set, are in
//! `crate::kernels::attention`.
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
//! SIMD builds a vectorised `exp` with libm's bits, `crate::kernels::exp`) and sums
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
use rayon::prelude::*;

use super::config::KvPrecision;
use super::kv_cache::{CHUNK_LEN, HeadChunk, KvCache, StoredRows};
use crate::kernels::attention::q8_0::round_row_through_q8_0;
use crate::kernels::attention::{ChunkRows, TileJob, TileKernels, WeightedRows, run_tile};
use crate::kernels::dispatch::Dispatch;
use crate::thread_scratch::with_thread_scratch;
use softmax::{softcap_rows, softmax_to_weights};

mod softmax;

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
    /// Scores soft-capped to `(-cap, cap)` before the softmax (gemma2).
    pub softcap: Option<f32>,
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
/// the work is split. With `sinks` (`[n_head]`, gpt-oss), head `h`'s
/// softmax has one more term in its denominator, `exp(sinks[h])`, a key
/// that takes no value.
#[allow(clippy::too_many_arguments)] // the shape of one attention call
pub fn attend(
    shape: AttentionShape,
    sinks: Option<&[f32]>,
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
    let layer_kv = KvLayer {
        shape,
        sinks,
        cache,
        layer,
    };
    if n_queries <= QUERY_TILE {
        let span = first_pos + n_queries - shape.first_visible(first_pos);
        let n_threads = rayon::current_num_threads();
        let run_len = head_run_len(shape, n_threads);
        if n_threads > 1
            && run_len < shape.n_head
            && n_queries * span * q_dim >= PARALLEL_MIN_PRODUCTS
        {
            attend_by_heads(layer_kv, first_pos, queries, run_len, scratch, out);
        } else {
            attend_tile(layer_kv, first_pos, queries, 0..shape.n_head, scratch, out);
        }
        return;
    }
    let tile_len = QUERY_TILE * q_dim;
    out.par_chunks_mut(tile_len)
        .zip(queries.par_chunks(tile_len))
        .enumerate()
        .for_each(|(tile_idx, (out, queries))| {
            let tile_pos = first_pos + tile_idx * QUERY_TILE;
            with_task_scratch(|scratch| {
                attend_tile(layer_kv, tile_pos, queries, 0..shape.n_head, scratch, out);
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
fn attend_by_heads(
    layer_kv: KvLayer<'_>,
    first_pos: usize,
    queries: &[f32],
    run_len: usize,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    let shape = layer_kv.shape;
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
                attend_tile(layer_kv, first_pos, queries, heads, scratch, run_out);
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
/// kernels the cache's dispatch allows ([`Tile`]). `queries` holds whole
/// query rows (every head); `out` holds rows of the heads in `heads` only.
fn attend_tile(
    layer_kv: KvLayer<'_>,
    first_pos: usize,
    queries: &[f32],
    heads: Range<usize>,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    let tile = Tile {
        layer_kv,
        first_pos,
        queries,
        heads,
        scratch,
        out,
    };
    // At f16 precision every product is exact in f32 (module docs).
    let exact_products = layer_kv.shape.precision == KvPrecision::F16;
    run_tile(layer_kv.cache.dispatch(), exact_products, tile);
}

/// What queries attend over: one layer of the cache (its keys and values),
/// with the attention's shape and its sinks (see [`attend`]).
#[derive(Clone, Copy)]
struct KvLayer<'a> {
    shape: AttentionShape,
    sinks: Option<&'a [f32]>,
    cache: &'a KvCache,
    layer: usize,
}

/// One tile: for each key/value head (the part of its group in `heads`),
/// the scores of the tile's query rows chunk by chunk, each row's softmax,
/// then the weighted values chunk by chunk (module docs). `out` has a row
/// of `heads.len() * head_dim` values per query. Only the chunks a query
/// sees are read for it; in the chunk holding a query's own position, the
/// products with later keys are computed but never stored. The kernels
/// ([`TileKernels`]) do the products, f16 roundings and weighted sums,
/// several query rows at a time in the SIMD builds.
struct Tile<'a> {
    layer_kv: KvLayer<'a>,
    first_pos: usize,
    queries: &'a [f32],
    heads: Range<usize>,
    scratch: &'a mut AttentionScratch,
    out: &'a mut [f32],
}

impl TileJob for Tile<'_> {
    #[inline(always)]
    fn run<K: TileKernels>(self, kernels: K) {
        let (shape, queries, heads, out) =
            (self.layer_kv.shape, self.queries, self.heads, self.out);
        let first_pos = self.first_pos;
        let head_dim = shape.head_dim;
        let group = shape.n_head / shape.n_kv_head;
        let q_dim = shape.n_head * head_dim;
        let n_queries = queries.len() / q_dim;
        let span_start = shape.first_visible(first_pos);
        let span = TileSpan {
            shape,
            first_pos,
            n_queries,
            start: span_start,
            len: first_pos + n_queries - span_start,
        };
        let out_width = heads.len() * head_dim;
        debug_assert_eq!(out.len(), n_queries * out_width, "output rows of the heads");
        let max_rows = n_queries * group.min(heads.len());
        let AttentionScratch {
            scores,
            queries: tile_queries,
            products,
            keys,
            values,
            narrowed,
            head_runs: _,
        } = self.scratch;
        grow(scores, max_rows * span.len);
        grow(tile_queries, max_rows * head_dim);
        grow(products, max_rows * CHUNK_LEN);
        for kv_head in heads.start / group..heads.end.div_ceil(group) {
            // The heads of this group that the tile computes: `group` rows per
            // query from here on (query `j`'s head `g` is row `j * group + g`).
            let group_heads =
                heads.start.max(kv_head * group)..heads.end.min((kv_head + 1) * group);
            let pass = HeadPass {
                kernels,
                span,
                // This pass's heads' sinks: row `j * group + g` is head
                // `group_heads.start + g`.
                sinks: self.layer_kv.sinks.map(|sinks| &sinks[group_heads.clone()]),
                cache: self.layer_kv.cache,
                layer: self.layer_kv.layer,
                kv_head,
                group: group_heads.len(),
                // A tile of a few rows (a decode step) reads each block once,
                // straight from the cache; a prompt's tile widens a block once
                // for many rows.
                prefetching: K::SIMD && max_rows <= DIRECT_ROWS,
            };
            let n_rows = n_queries * pass.group;
            let scores = &mut scores[..n_rows * span.len];
            let tile_queries = &mut tile_queries[..n_rows * head_dim];
            // Their columns in a query row and in an output row.
            let band = group_heads.start * head_dim..group_heads.end * head_dim;
            let out_band = band.start - heads.start * head_dim..band.end - heads.start * head_dim;
            pass.gather_queries(queries, band, tile_queries, narrowed);
            pass.score_chunks(tile_queries, products, keys, scores);
            pass.weigh(scores, narrowed);
            for query_out in out.chunks_exact_mut(out_width) {
                query_out[out_band.clone()].fill(0.0);
            }
            pass.add_values(scores, values, out, out_width, out_band);
        }
    }
}

/// A tile's queries and the positions they see: query `j` is at position
/// `first_pos + j` and sees `shape.first_visible(first_pos + j)` up to its
/// own; the tile's span is the union of those, `start..` for `len`
/// positions.
#[derive(Clone, Copy)]
struct TileSpan {
    shape: AttentionShape,
    first_pos: usize,
    n_queries: usize,
    start: usize,
    len: usize,
}

impl TileSpan {
    /// The positions query `j` sees, as offsets into the span.
    #[inline(always)]
    fn visible(&self, j: usize) -> Range<usize> {
        self.shape.first_visible(self.first_pos + j) - self.start
            ..self.first_pos + j + 1 - self.start
    }

    /// The queries that see some of the span offsets `rows`: a run, since
    /// both ends of `visible(j)` grow with `j`.
    #[inline(always)]
    fn seeing(&self, rows: Range<usize>) -> Range<usize> {
        let n_queries = self.n_queries;
        let first = (0..n_queries).find(|&j| !intersect(self.visible(j), rows.clone()).is_empty());
        first.map_or(0..0, |first| {
            let end = (first..n_queries)
                .find(|&j| intersect(self.visible(j), rows.clone()).is_empty())
                .unwrap_or(n_queries);
            first..end
        })
    }

    /// The positions of `chunk` the tile reads, as offsets into the span,
    /// and the offset of the chunk's row 0 (negative when the chunk starts
    /// before the span).
    #[inline(always)]
    fn chunk_rows(&self, chunk: &HeadChunk<'_>) -> (Range<usize>, isize) {
        let rows =
            chunk.start + chunk.rows.start - self.start..chunk.start + chunk.rows.end - self.start;
        (rows, chunk.start as isize - self.start as isize)
    }
}

/// One key/value head's part of a tile: its `group` query heads' rows
/// (`group` per query) through the three steps, scores, weights, outputs.
#[derive(Clone, Copy)]
struct HeadPass<'a, K> {
    kernels: K,
    span: TileSpan,
    /// The sink logits of the pass's `group` heads, if any.
    sinks: Option<&'a [f32]>,
    cache: &'a KvCache,
    layer: usize,
    kv_head: usize,
    group: usize,
    prefetching: bool,
}

impl<'a, K: TileKernels> HeadPass<'a, K> {
    /// Copies the columns `band` of each query row of `queries` (whole
    /// rows) into `tile_queries` (`[rows][head_dim]`), rounded to f16 at
    /// f16 precision and through q8_0 at q8_0 (as llama.cpp's flash
    /// attention quantizes a query for a q8_0 key).
    #[inline(always)]
    fn gather_queries(
        &self,
        queries: &[f32],
        band: Range<usize>,
        tile_queries: &mut [f32],
        narrowed: &mut Vec<f16>,
    ) {
        let shape = self.span.shape;
        for (rows, query) in tile_queries
            .chunks_exact_mut(self.group * shape.head_dim)
            .zip(queries.chunks_exact(shape.n_head * shape.head_dim))
        {
            rows.copy_from_slice(&query[band.clone()]);
        }
        match shape.precision {
            KvPrecision::F16 => self.kernels.round_to_f16(tile_queries, narrowed),
            KvPrecision::Q8_0 => {
                for row in tile_queries.chunks_exact_mut(shape.head_dim) {
                    round_row_through_q8_0(row);
                }
            }
            KvPrecision::F32 => {}
        }
    }

    /// Scores: `scores[r][k] = (q_r . key_k) * scale`, every row that sees
    /// some of a chunk multiplied by all its keys (into `products`), the
    /// visible ones kept.
    #[inline(always)]
    fn score_chunks(
        &self,
        tile_queries: &[f32],
        products: &mut [f32],
        keys: &mut Vec<f32>,
        scores: &mut [f32],
    ) {
        let (span, group) = (self.span.len, self.group);
        let head_dim = self.span.shape.head_dim;
        let dispatch = self.cache.dispatch();
        for (stored, chunk_rows, chunk_offset, seers) in self.chunks(|c| c.keys) {
            let rows = seers.start * group..seers.end * group;
            let chunk_keys = chunk_rows_as::<K>(stored, rows.len(), dispatch, keys);
            self.kernels.chunk_scores(
                &tile_queries[rows.start * head_dim..rows.end * head_dim],
                chunk_keys,
                self.span.shape.scale,
                &mut products[rows.start * CHUNK_LEN..rows.end * CHUNK_LEN],
            );
            for j in seers {
                let seen = intersect(self.span.visible(j), chunk_rows.clone());
                let lanes = (seen.start as isize - chunk_offset) as usize
                    ..(seen.end as isize - chunk_offset) as usize;
                for r in j * group..(j + 1) * group {
                    scores[r * span..(r + 1) * span][seen.clone()].copy_from_slice(
                        &products[r * CHUNK_LEN..(r + 1) * CHUNK_LEN][lanes.clone()],
                    );
                }
            }
        }
    }

    /// Weights: softmax over each row's visible positions, rounded to f16
    /// at f16 precision.
    #[inline(always)]
    fn weigh(&self, scores: &mut [f32], narrowed: &mut Vec<f16>) {
        let span = self.span.len;
        let seen_by = |r: usize| self.span.visible(r / self.group);
        if let Some(cap) = self.span.shape.softcap {
            softcap_rows(scores, span, seen_by, cap);
        }
        let sink = |r: usize| self.sinks.map(|sinks| sinks[r % self.group]);
        softmax_to_weights(self.cache.dispatch(), scores, span, seen_by, sink);
        if self.span.shape.precision == KvPrecision::F16 {
            for (r, row) in scores.chunks_exact_mut(span).enumerate() {
                self.kernels.round_to_f16(&mut row[seen_by(r)], narrowed);
            }
        }
    }

    /// Outputs: `o[r] = sum_k w[r][k] * value_k`, in position order, added
    /// to the columns `out_band` of `out`'s rows (zeroed by the caller).
    #[inline(always)]
    fn add_values(
        &self,
        weights: &[f32],
        values: &mut Vec<f32>,
        out: &mut [f32],
        out_width: usize,
        out_band: Range<usize>,
    ) {
        let (span, group) = (self.span.len, self.group);
        let head_dim = self.span.shape.head_dim;
        let dispatch = self.cache.dispatch();
        for (stored, chunk_rows, chunk_offset, seers) in self.chunks(|c| c.values) {
            let n_readers = seers.len() * group;
            let chunk_values = chunk_rows_as::<K>(stored, n_readers, dispatch, values);
            // Runs of queries that see the same rows of the chunk share the
            // value rows they read.
            let mut run_start = seers.start;
            while run_start < seers.end {
                let seen = intersect(self.span.visible(run_start), chunk_rows.clone());
                let run_end = (run_start + 1..seers.end)
                    .find(|&j| intersect(self.span.visible(j), chunk_rows.clone()) != seen)
                    .unwrap_or(seers.end);
                let first_row = (seen.start as isize - chunk_offset) as usize;
                let value_rows =
                    chunk_values.slice(first_row * head_dim..(first_row + seen.len()) * head_dim);
                let out_band_start = out_band.start;
                let sums = WeightedRows {
                    rows: run_start * group..run_end * group,
                    out_row: |r: usize| {
                        r / group * out_width + out_band_start + r % group * head_dim
                    },
                    weights,
                    weights_at: |r: usize| r * span + seen.start,
                    value_rows,
                    head_dim,
                };
                self.kernels.add_weighted_rows(out, sums);
                run_start = run_end;
            }
        }
    }

    /// The chunks of the pass's key/value head holding the tile's span,
    /// prefetching each one's `block` (keys or values) ahead when the pass
    /// does ([`chunks_prefetching`]): for each, that block as stored, the
    /// span offsets it holds and the offset of its row 0
    /// ([`TileSpan::chunk_rows`]), and the queries that see some of it.
    #[inline(always)]
    fn chunks(
        &self,
        block: impl Fn(HeadChunk<'a>) -> StoredRows<'a> + Copy,
    ) -> impl Iterator<Item = (StoredRows<'a>, Range<usize>, isize, Range<usize>)> {
        let positions = self.span.start..self.span.start + self.span.len;
        let span = self.span;
        chunks_prefetching(
            self.kernels,
            self.cache,
            self.layer,
            self.kv_head,
            positions,
            self.prefetching,
            block,
        )
        .map(move |chunk| {
            let (chunk_rows, chunk_offset) = span.chunk_rows(&chunk);
            let seers = span.seeing(chunk_rows.clone());
            (block(chunk), chunk_rows, chunk_offset, seers)
        })
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
/// asks the kernels to prefetch the `block` (keys or values) of the chunk
/// [`PREFETCH_AHEAD`] further on.
#[inline(always)]
fn chunks_prefetching<'a, K: TileKernels>(
    kernels: K,
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
                match block(later) {
                    StoredRows::F32(rows) => kernels.prefetch(rows),
                    StoredRows::F16(rows) => kernels.prefetch(rows),
                    StoredRows::Q8_0 { quants, .. } => kernels.prefetch(quants),
                }
            }
        })
}

/// The most query rows reading a chunk for which the SIMD builds read an
/// f16 chunk in place: one pass of their four-row kernels.
const DIRECT_ROWS: usize = 4;

/// A chunk's block `stored` as the kernels read it for `n_readers` query
/// rows: for at most [`DIRECT_ROWS`] rows in the SIMD builds, an f16
/// block as stored, widened in registers as it is loaded (one pass of the
/// kernels serves four rows, so widening into memory first would only add
/// a store and a load per value: a decode step); otherwise f32 rows, an
/// f32 block in place or an f16 one widened once into `buf`.
#[inline(always)]
fn chunk_rows_as<'a, K: TileKernels>(
    stored: StoredRows<'a>,
    n_readers: usize,
    dispatch: Dispatch,
    buf: &'a mut Vec<f32>,
) -> ChunkRows<'a> {
    match stored {
        StoredRows::F16(rows) if K::SIMD && n_readers <= DIRECT_ROWS => ChunkRows::F16(rows),
        stored => ChunkRows::F32(stored.to_f32(dispatch, buf)),
    }
}

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

#[cfg(test)]
mod tests {
    use super::super::kv_cache::KvShape;
    use super::*;
    use crate::kernels::f16::round_to_f16;

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
            softcap: None,
        };
        let mut out = [0.0];
        let mut scratch = AttentionScratch::default();
        attend(
            shape,
            None,
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
            softcap: None,
        };
        let mut out = [0.0; 4];
        // Head 0 looks at key 0 only (large score), head 1 at key 1.
        attend(
            shape,
            None,
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
            KvPrecision::F32 | KvPrecision::Q8_0 => v,
        };
        let seen = shape.first_visible(pos)..pos + 1;
        let mut out = Vec::new();
        for (head_idx, q) in query.chunks_exact(head_dim).enumerate() {
            let mut q: Vec<f32> = q.iter().map(|&v| round(v)).collect();
            if shape.precision == KvPrecision::Q8_0 {
                round_row_through_q8_0(&mut q);
            }
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
        /// Each query head's sink logit, if any.
        sinks: Option<Vec<f32>>,
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
                    softcap: None,
                },
                keys: rows(7),
                values: rows(8),
                queries: pseudo_random(9, n * 4 * head_dim),
                sinks: None,
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

        /// The rows the cache holds: f16-rounded in an f16 cache, each
        /// head's read back through q8_0 in a q8_0 cache.
        fn stored(&self, rows: &[Vec<f32>]) -> Vec<Vec<f32>> {
            rows.iter()
                .map(|r| match self.shape.precision {
                    KvPrecision::F16 => r.iter().map(|&v| round_to_f16(v)).collect(),
                    KvPrecision::F32 => r.clone(),
                    KvPrecision::Q8_0 => {
                        let mut r = r.clone();
                        for head in r.chunks_exact_mut(self.shape.head_dim) {
                            round_row_through_q8_0(head);
                        }
                        r
                    }
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
                self.sinks.as_deref(),
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

    /// Every precision; at q8_0 the plain attention reads the keys and
    /// values as the q8_0 round trip gives them, and queries through it.
    const PRECISIONS: [KvPrecision; 3] = [KvPrecision::F32, KvPrecision::F16, KvPrecision::Q8_0];

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
        for precision in PRECISIONS {
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
        for precision in PRECISIONS {
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
            softcap: None,
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
    fn q8_0_attention_stays_near_exact_attention_over_the_unquantized_rows() {
        // The independent check of the q8_0 path as a whole: the same f64
        // attention over the keys, values and queries as written, before
        // any quantization. Values in [-2, 2) have q8_0 steps of 2/127 at
        // most, so each key, value and query is off by up to 0.009, which
        // moves an output by about twice that: 0.0153 measured (head_dim
        // 40, 70 positions), against 2e-6 for the f32 cache.
        let n = 70;
        let head_dim = 40;
        let case = Case::new(head_dim, None, KvPrecision::Q8_0, n);
        let out = case.attend_block(&case.cache(Dispatch::detect()), 0..n);
        let mut exact_case = Case::new(head_dim, None, KvPrecision::F32, n);
        exact_case.shape.precision = KvPrecision::F32;
        let exact = case_in_f64(&exact_case, n);
        let worst = out
            .iter()
            .zip(&exact)
            .map(|(&ours, &exact)| (f64::from(ours) - exact).abs())
            .fold(0.0, f64::max);
        assert!(worst < 0.02, "max |q8_0 - exact| = {worst}");
        assert!(worst > 1e-4, "the cache did quantize: {worst}");
    }

    /// Every output of `case`'s attention over positions `0..n` (query
    /// rows one after the other), computed in f64 with libm's exp from the
    /// rows as written.
    fn case_in_f64(case: &Case, n: usize) -> Vec<f64> {
        let head_dim = case.shape.head_dim;
        let mut out = Vec::new();
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
                            * f64::from(case.shape.scale)
                    })
                    .collect();
                // A sink is one more score, whose exponential joins the sum
                // and weighs no value.
                let sink = case.sinks.as_ref().map(|s| f64::from(s[head_idx]));
                let max = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum = exps.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
                for d in 0..head_dim {
                    out.push(
                        exps.iter()
                            .zip(&case.values[seen.clone()])
                            .map(|(e, v)| e / sum * f64::from(v[kv.start + d]))
                            .sum(),
                    );
                }
            }
        }
        out
    }

    /// Attention sinks (gpt-oss): each head's sink logit joins its
    /// softmax's denominator, on every kernel, with and without a window,
    /// within float rounding of the f64 sum; sinks of these sizes (one far
    /// above every score) move the outputs far beyond that.
    #[test]
    fn sinks_join_each_heads_denominator_as_the_f64_sum_says() {
        let n = 40;
        for dispatch in Dispatch::every_available() {
            for window in [None, Some(17)] {
                let mut case = Case::new(40, window, KvPrecision::F32, n);
                let plain = case.attend_block(&case.cache(dispatch), 0..n);
                case.sinks = Some(vec![-3.0, 0.5, 2.0, 8.0]);
                let out = case.attend_block(&case.cache(dispatch), 0..n);
                for (idx, (&ours, &exact)) in out.iter().zip(&case_in_f64(&case, n)).enumerate() {
                    assert!(
                        (f64::from(ours) - exact).abs() < 2e-6,
                        "{dispatch:?}, window {window:?}, output {idx}: {ours} vs {exact}"
                    );
                }
                let moved = plain
                    .iter()
                    .zip(&out)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(moved > 0.1, "the sinks move the outputs: {moved}");
            }
        }
    }

    #[test]
    fn tiled_attention_is_within_float_rounding_of_exact_attention() {
        // The independent check: softmax attention in f64 with libm's exp.
        let n = 70;
        for window in [None, Some(17)] {
            let case = Case::new(40, window, KvPrecision::F32, n);
            let out = case.attend_block(&case.cache(Dispatch::detect()), 0..n);
            for (idx, (&ours, &exact)) in out.iter().zip(&case_in_f64(&case, n)).enumerate() {
                assert!(
                    (f64::from(ours) - exact).abs() < 2e-6,
                    "window {window:?}, output {idx}: {ours} vs {exact}"
                );
            }
        }
    }
}
