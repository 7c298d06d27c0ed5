//! The key/value cache: the keys and values of every position a sequence
//! has read, for every layer, so a new token attends to them without
//! recomputing the prefix (lesson 001, "Recognize what an inference cache
//! changes": 7 positions computed instead of 25).
//!
//! Storage is a list of chunks of [`CHUNK_LEN`] positions, each chunk holding
//! every layer's keys and values for its positions:
//!
//! ```text
//! chunk c covers positions c*CHUNK_LEN .. (c+1)*CHUNK_LEN
//! chunk data: [n_layer][K | V][n_kv_head][32 x head_dim]   (f32, f16 or int8)
//!   K of one head: [head_dim][CHUNK_LEN]   (columns: a row per dimension)
//!   V of one head: [CHUNK_LEN][head_dim]   (rows: a row per position)
//!
//!              layer 0                                layer 1
//!           ┌──────────────────────────────────────┬──────────────────┐
//! chunk 0   │ K: head 0 dims 0..64 x positions 0..32 │ ... │ K ... │ V ... │
//!           │ V: head 0 positions 0..32 x dims 0..64 │ ... │               │
//!           └──────────────────────────────────────┴──────────────────┘
//! ```
//!
//! Keys are stored transposed within a chunk because attention's score pass
//! multiplies one query by 32 keys at a time with the positions in the
//! vector lanes, and its value pass adds value rows with the dimensions in
//! the lanes: each reads its block as it lies, with no transposition per
//! read.
//!
//! The element type follows the model's [`KvPrecision`]: with
//! [`KvPrecision::F16`] (llama.cpp's default f16 cache) keys and values are
//! rounded to f16 as they are written and stored as f16, half the bytes of
//! [`KvPrecision::F32`]. Readers get a chunk's blocks as `StoredRows` and
//! widen f16 blocks to f32 into a reused buffer with one vectorised
//! conversion (`StoredRows::to_f32`); f32 blocks are read in place.
//!
//! With [`KvPrecision::Q8_0`] (llama.cpp's q8_0 cache) the values are
//! int8s in the same layout, and each run of 32 along a head's dimensions
//! of one position has an f16 scale (`kernels::attention::q8_0`), kept
//! beside them per chunk, layer, K or V and head:
//!
//! ```text
//! K scales of one head: [n_blocks][CHUNK_LEN]   (block b of key r at b*32 + r)
//! V scales of one head: [CHUNK_LEN][n_blocks]   (a row of scales per value)
//! n_blocks = ceil(head_dim / 32)
//! ```
//!
//! A key is quantized along its dimensions, as llama.cpp rounds it, though
//! it is stored as a column; readers widen a chunk's block to f32 rows
//! into the same reused buffer as an f16 one. SmolLM2 then takes 12,240
//! bytes a position against 23,040 at f16: 53%.
//!
//! Within a chunk the keys (or values) of one key/value head are
//! contiguous, so attention reads them as one slice ([`HeadChunk`]). Chunks are `Arc`-shared: cloning a
//! cache (forking a sequence for beam search or batch rows) copies only the
//! list of pointers, and a write into a chunk another fork still holds
//! copies that one chunk first (copy on write). So forks share the prefix
//! they had in common and pay only for the chunk they diverge in.
//!
//! Layers with sliding-window attention (gemma3: five of every six) never
//! read further back than their window, so they live in a second set of
//! chunks used as a ring: [`KvCache::ring_len`] positions (twice the
//! largest window, in whole chunks), position `p` in chunk
//! `(p / CHUNK_LEN) % n_ring_chunks`. A write overwrites the row of
//! `p - ring_len`; the cache tracks the oldest row still intact, so after a
//! truncation further back than the ring reaches the decoder knows to
//! recompute the prefix (its state keeps the tokens), and a forward pass
//! reads at most `ring_len - window + 1` new tokens at a time so a query
//! never reads a row its own batch overwrote. For gemma3 270M (window 512,
//! context 32,768) the sliding layers keep 1,024 positions instead of 32,768.
//!
//! Chunks are allocated when a position first needs one (once per
//! [`CHUNK_LEN`] tokens, not per token) or up front with
//! [`KvCache::reserve`]; [`KvCache::truncate`] and [`KvCache::reset`] keep
//! them for reuse. A whole-context preallocation is avoided on purpose: for
//! SmolLM2 (30 layers, 3 key/value heads of 64, context 8192, f16) it would
//! be 189 MB per sequence (377 MB in f32).

use std::ops::Range;
use std::sync::Arc;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::config::KvPrecision;
use crate::kernels::attention::q8_0::{
    Q8_BLOCK, dequantize_keys, dequantize_values, quantize_block,
};
use crate::kernels::dispatch::Dispatch;
use crate::kernels::f16::widen_f16;

/// A cache's chunks as a state file's bytes, and back (`state_file.rs`).
mod saved;

/// Positions per chunk.
pub const CHUNK_LEN: usize = 32;

/// The dimensions of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Number of layers.
    pub n_layer: usize,
    /// Key/value heads per layer.
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// The most positions the cache holds (the model's context length).
    pub capacity: usize,
}

impl KvShape {
    /// Values of one layer's keys (or values) in one chunk.
    fn half_layer_len(&self) -> usize {
        self.n_kv_head * CHUNK_LEN * self.head_dim
    }

    /// Values in one chunk.
    fn chunk_len(&self) -> usize {
        self.n_layer * 2 * self.half_layer_len()
    }

    /// q8_0 scales of one layer's keys (or values) in one chunk.
    fn half_layer_scales(&self) -> usize {
        self.n_kv_head * CHUNK_LEN * self.head_dim.div_ceil(Q8_BLOCK)
    }
}

/// One key/value head's keys or values in one chunk, as stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum StoredRows<'a> {
    /// Rows of an f32 cache.
    F32(&'a [f32]),
    /// Rows of an f16 cache.
    F16(&'a [f16]),
    /// Rows of a q8_0 cache: the int8s in the layout of the f32 rows, and
    /// their scales in the layout of the module docs, keys' (`keys`) or
    /// values'.
    Q8_0 {
        quants: &'a [i8],
        scales: &'a [f16],
        keys: bool,
    },
}

impl<'a> StoredRows<'a> {
    /// The rows as f32: an f32 cache's rows in place, an f16 cache's widened
    /// into `buf` (grown if needed, then reused) by one vectorised slice
    /// conversion (F16C when `dispatch` allows it), exact since every f16
    /// is an f32; a q8_0 cache's as each int8 times its scale, into `buf`.
    pub fn to_f32<'b>(self, dispatch: Dispatch, buf: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            Self::F32(rows) => rows,
            Self::F16(rows) => {
                if buf.len() < rows.len() {
                    buf.resize(rows.len(), 0.0);
                }
                let widened = &mut buf[..rows.len()];
                widen_f16(dispatch, rows, widened);
                widened
            }
            Self::Q8_0 {
                quants,
                scales,
                keys,
            } => {
                if buf.len() < quants.len() {
                    buf.resize(quants.len(), 0.0);
                }
                let widened = &mut buf[..quants.len()];
                if keys {
                    dequantize_keys(dispatch, quants, scales, widened);
                } else {
                    dequantize_values(dispatch, quants, scales, widened);
                }
                widened
            }
        }
    }
}

/// A value type a chunk can store: how f32 rows are written into it and how
/// stored rows are handed to readers.
trait Element: Copy + Sized {
    /// The zero value chunks start filled with.
    const ZERO: Self;

    /// Stores `source` into `dest` (same length), rounding if the type is
    /// narrower than f32.
    fn store(dest: &mut [Self], source: &[f32]);

    /// One value, rounded as [`Element::store`] rounds it.
    fn from_f32(value: f32) -> Self;

    /// `rows` as the matching [`StoredRows`] variant.
    fn stored(rows: &[Self]) -> StoredRows<'_>;
}

impl Element for f32 {
    const ZERO: Self = 0.0;

    fn store(dest: &mut [Self], source: &[f32]) {
        dest.copy_from_slice(source);
    }

    fn from_f32(value: f32) -> Self {
        value
    }

    fn stored(rows: &[Self]) -> StoredRows<'_> {
        StoredRows::F32(rows)
    }
}

impl Element for f16 {
    const ZERO: Self = f16::ZERO;

    /// Rounds to nearest, ties to even (as `f16::from_f32`), vectorised.
    fn store(dest: &mut [Self], source: &[f32]) {
        dest.convert_from_f32_slice(source);
    }

    fn from_f32(value: f32) -> Self {
        f16::from_f32(value)
    }

    fn stored(rows: &[Self]) -> StoredRows<'_> {
        StoredRows::F16(rows)
    }
}

/// The values of one chunk (layout in the module docs), in the cache's
/// precision.
#[derive(Debug, Clone)]
enum Chunk {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0 {
        /// The values, laid out as an f32 chunk's.
        quants: Vec<i8>,
        /// `[n_layer][K | V][n_kv_head][CHUNK_LEN * n_blocks]` (module docs).
        scales: Vec<f16>,
    },
}

impl Chunk {
    /// A zero-filled chunk of `shape` at `precision`.
    fn zeroed(shape: &KvShape, precision: KvPrecision) -> Self {
        match precision {
            KvPrecision::F32 => Self::F32(vec![f32::ZERO; shape.chunk_len()]),
            KvPrecision::F16 => Self::F16(vec![f16::ZERO; shape.chunk_len()]),
            KvPrecision::Q8_0 => Self::Q8_0 {
                quants: vec![0; shape.chunk_len()],
                scales: vec![f16::ZERO; shape.n_layer * 2 * shape.half_layer_scales()],
            },
        }
    }

    /// Bytes of the chunk's values.
    fn bytes(&self) -> usize {
        match self {
            Self::F32(data) => std::mem::size_of_val(data.as_slice()),
            Self::F16(data) => std::mem::size_of_val(data.as_slice()),
            Self::Q8_0 { quants, scales } => {
                std::mem::size_of_val(quants.as_slice()) + std::mem::size_of_val(scales.as_slice())
            }
        }
    }

    /// Stores the key and value rows of `layer` at row `row` of the chunk.
    fn write(&mut self, shape: &KvShape, layer: usize, row: usize, key: &[f32], value: &[f32]) {
        match self {
            Self::F32(data) => write_rows(data, shape, layer, row, key, value),
            Self::F16(data) => write_rows(data, shape, layer, row, key, value),
            Self::Q8_0 { quants, scales } => {
                write_q8_0_rows(quants, scales, shape, layer, row, key, value);
            }
        }
    }

    /// The keys (`[head_dim][CHUNK_LEN]`) and values (`[CHUNK_LEN][head_dim]`)
    /// of `kv_head` in `layer`.
    fn head(
        &self,
        shape: &KvShape,
        layer: usize,
        kv_head: usize,
    ) -> (StoredRows<'_>, StoredRows<'_>) {
        match self {
            Self::F32(data) => head_blocks(data, shape, layer, kv_head),
            Self::F16(data) => head_blocks(data, shape, layer, kv_head),
            Self::Q8_0 { quants, scales } => {
                let half = shape.half_layer_len();
                let block = CHUNK_LEN * shape.head_dim;
                let key_start = layer * 2 * half + kv_head * block;
                let half_scales = shape.half_layer_scales();
                let scale_block = half_scales / shape.n_kv_head;
                let key_scales = layer * 2 * half_scales + kv_head * scale_block;
                let rows = |start: usize, scale_start: usize, keys| StoredRows::Q8_0 {
                    quants: &quants[start..start + block],
                    scales: &scales[scale_start..scale_start + scale_block],
                    keys,
                };
                (
                    rows(key_start, key_scales, true),
                    rows(key_start + half, key_scales + half_scales, false),
                )
            }
        }
    }
}

/// [`Chunk::write`] for one element type: the value row as it comes, the
/// key row into column `row` of the key block.
fn write_rows<E: Element>(
    data: &mut [E],
    shape: &KvShape,
    layer: usize,
    row: usize,
    key: &[f32],
    value: &[f32],
) {
    let half = shape.half_layer_len();
    let block = CHUNK_LEN * shape.head_dim;
    let key_base = layer * 2 * half;
    let value_base = key_base + half;
    for (head_idx, (key, value)) in key
        .chunks_exact(shape.head_dim)
        .zip(value.chunks_exact(shape.head_dim))
        .enumerate()
    {
        let keys = &mut data[key_base + head_idx * block..][..block];
        for (column, &k) in keys.chunks_exact_mut(CHUNK_LEN).zip(key) {
            column[row] = E::from_f32(k);
        }
        let start = value_base + head_idx * block + row * shape.head_dim;
        E::store(&mut data[start..start + shape.head_dim], value);
    }
}

/// [`Chunk::write`] for a q8_0 chunk: each head's key quantized block by
/// block along its dimensions into column `row` of the key block (its
/// scales into column `row` of the key scales), its value into row `row`.
fn write_q8_0_rows(
    quants: &mut [i8],
    scales: &mut [f16],
    shape: &KvShape,
    layer: usize,
    row: usize,
    key: &[f32],
    value: &[f32],
) {
    let (half, half_scales) = (shape.half_layer_len(), shape.half_layer_scales());
    let block = CHUNK_LEN * shape.head_dim;
    let n_blocks = shape.head_dim.div_ceil(Q8_BLOCK);
    let scale_block = CHUNK_LEN * n_blocks;
    let (key_base, key_scale_base) = (layer * 2 * half, layer * 2 * half_scales);
    let mut key_quants = [0i8; Q8_BLOCK];
    for (head_idx, (key, value)) in key
        .chunks_exact(shape.head_dim)
        .zip(value.chunks_exact(shape.head_dim))
        .enumerate()
    {
        let keys = &mut quants[key_base + head_idx * block..][..block];
        let key_scales = &mut scales[key_scale_base + head_idx * scale_block..][..scale_block];
        for (b, key_run) in key.chunks(Q8_BLOCK).enumerate() {
            let run_quants = &mut key_quants[..key_run.len()];
            key_scales[b * CHUNK_LEN + row] = quantize_block(key_run, run_quants);
            let columns = keys[b * Q8_BLOCK * CHUNK_LEN..].chunks_exact_mut(CHUNK_LEN);
            for (column, &q) in columns.zip(run_quants.iter()) {
                column[row] = q;
            }
        }
        let start = key_base + half + head_idx * block + row * shape.head_dim;
        let scale_start = key_scale_base + half_scales + head_idx * scale_block + row * n_blocks;
        let value_quants = quants[start..start + shape.head_dim].chunks_mut(Q8_BLOCK);
        for ((run_quants, run), scale) in value_quants
            .zip(value.chunks(Q8_BLOCK))
            .zip(&mut scales[scale_start..scale_start + n_blocks])
        {
            *scale = quantize_block(run, run_quants);
        }
    }
}

/// [`Chunk::head`] for one element type.
fn head_blocks<'a, E: Element>(
    data: &'a [E],
    shape: &KvShape,
    layer: usize,
    kv_head: usize,
) -> (StoredRows<'a>, StoredRows<'a>) {
    let half = shape.half_layer_len();
    let block = CHUNK_LEN * shape.head_dim;
    let key_start = layer * 2 * half + kv_head * block;
    let keys = &data[key_start..key_start + block];
    let values = &data[key_start + half..key_start + half + block];
    (E::stored(keys), E::stored(values))
}

/// One chunk of one key/value head, as [`KvCache::chunks_in`] hands it to
/// attention: the whole chunk's blocks, and which of its rows were asked for.
#[derive(Debug, Clone)]
pub(crate) struct HeadChunk<'a> {
    /// The position of the chunk's row 0.
    pub start: usize,
    /// The rows asked for, within the chunk (`0..CHUNK_LEN` at most).
    pub rows: Range<usize>,
    /// Keys, `[head_dim][CHUNK_LEN]`: the key of row `r` is column `r`.
    pub keys: StoredRows<'a>,
    /// Values, `[CHUNK_LEN][head_dim]`.
    pub values: StoredRows<'a>,
}

/// The keys and values of one sequence; see the module docs for the layout.
#[derive(Debug, Clone)]
pub struct KvCache {
    shape: KvShape,
    precision: KvPrecision,
    /// Positions holding valid keys and values: the sequence position `pos`.
    pos: usize,
    /// Where each layer's keys and values live: `(store, layer in store)`
    /// with store 0 the full store and 1 the ring.
    layer_slots: Arc<[(usize, usize)]>,
    /// Every global layer's keys and values, a chunk per [`CHUNK_LEN`]
    /// positions.
    full: Store,
    /// The sliding-window layers' keys and values, in a ring of chunks.
    ring: Option<Store>,
    /// The SIMD paths of the model that made the cache (f16 widening).
    dispatch: Dispatch,
}

/// The chunks of one group of layers (module docs' layout, with the
/// group's layer count).
#[derive(Debug, Clone)]
struct Store {
    /// The layout of one chunk (`n_layer` is the group's).
    shape: KvShape,
    chunks: Vec<Arc<Chunk>>,
    /// In a ring, the number of chunks: position `p` lives in chunk
    /// `(p / CHUNK_LEN) % n_ring_chunks`, overwriting `p - ring length`.
    n_ring_chunks: Option<usize>,
    /// In a ring, the lowest position whose row has not been overwritten
    /// since it was written (0 for a full store).
    floor: usize,
}

impl Store {
    fn new(shape: KvShape, n_ring_chunks: Option<usize>) -> Self {
        Self {
            shape,
            chunks: Vec::new(),
            n_ring_chunks,
            floor: 0,
        }
    }

    /// The chunk holding position `pos`.
    fn chunk_idx(&self, pos: usize) -> usize {
        let logical = pos / CHUNK_LEN;
        self.n_ring_chunks.map_or(logical, |n| logical % n)
    }

    /// Positions the store holds at most.
    fn len(&self) -> usize {
        self.n_ring_chunks
            .map_or(self.shape.capacity, |n| n * CHUNK_LEN)
    }

    fn reserve(&mut self, n_positions: usize, precision: KvPrecision) {
        let n_chunks = n_positions
            .min(self.shape.capacity)
            .min(self.len())
            .div_ceil(CHUNK_LEN);
        while self.chunks.len() < n_chunks {
            self.chunks
                .push(Arc::new(Chunk::zeroed(&self.shape, precision)));
        }
    }

    fn write(
        &mut self,
        precision: KvPrecision,
        layer: usize,
        pos: usize,
        key: &[f32],
        value: &[f32],
    ) {
        let idx = self.chunk_idx(pos);
        self.reserve((idx + 1) * CHUNK_LEN, precision);
        let shape = self.shape;
        Arc::make_mut(&mut self.chunks[idx]).write(&shape, layer, pos % CHUNK_LEN, key, value);
        if self.n_ring_chunks.is_some() {
            self.floor = self.floor.max((pos + 1).saturating_sub(self.len()));
        }
    }

    fn chunks_in(
        &self,
        layer: usize,
        kv_head: usize,
        positions: Range<usize>,
    ) -> impl Iterator<Item = HeadChunk<'_>> {
        debug_assert!(
            positions.is_empty() || positions.start >= self.floor,
            "positions {positions:?} overwritten in the ring (floor {})",
            self.floor
        );
        let first_chunk = positions.start / CHUNK_LEN;
        let end_chunk = positions.end.div_ceil(CHUNK_LEN);
        (first_chunk..end_chunk).map(move |logical| {
            let start = logical * CHUNK_LEN;
            let rows = positions.start.max(start) - start..(positions.end - start).min(CHUNK_LEN);
            let (keys, values) =
                self.chunks[self.chunk_idx(start)].head(&self.shape, layer, kv_head);
            HeadChunk {
                start,
                rows,
                keys,
                values,
            }
        })
    }
}

impl KvCache {
    /// An empty cache of the given shape storing values at `precision`
    /// (f32, f16 or q8_0), widening f16 with `dispatch`; nothing is
    /// allocated yet. Every layer keeps every position.
    #[cfg(test)]
    pub(crate) fn new(shape: KvShape, precision: KvPrecision, dispatch: Dispatch) -> Self {
        Self::with_windows(shape, precision, dispatch, &vec![None; shape.n_layer])
    }

    /// `KvCache::new` where each layer whose `windows` entry is
    /// `Some(window)` keeps only a ring of [`KvCache::ring_len`] positions
    /// (at least twice the largest window, whole chunks): a sliding-window
    /// layer never reads further back than its window.
    pub(crate) fn with_windows(
        shape: KvShape,
        precision: KvPrecision,
        dispatch: Dispatch,
        windows: &[Option<usize>],
    ) -> Self {
        debug_assert_eq!(windows.len(), shape.n_layer);
        let mut counts = [0, 0];
        let layer_slots: Arc<[(usize, usize)]> = windows
            .iter()
            .map(|window| {
                let store = usize::from(window.is_some());
                counts[store] += 1;
                (store, counts[store] - 1)
            })
            .collect();
        let largest_window = windows.iter().flatten().copied().max().unwrap_or(0);
        let group = |n_layer| KvShape { n_layer, ..shape };
        let ring = (counts[1] > 0).then(|| {
            let n_ring_chunks = (2 * largest_window).max(1).div_ceil(CHUNK_LEN);
            Store::new(group(counts[1]), Some(n_ring_chunks))
        });
        Self {
            shape,
            precision,
            pos: 0,
            layer_slots,
            full: Store::new(group(counts[0]), None),
            ring,
            dispatch,
        }
    }

    /// The SIMD paths readers widen f16 rows with.
    pub(crate) fn dispatch(&self) -> Dispatch {
        self.dispatch
    }

    /// The cache's dimensions.
    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// The type keys and values are stored as.
    pub fn precision(&self) -> KvPrecision {
        self.precision
    }

    /// How many positions hold valid keys and values.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The positions the sliding-window layers keep (`None` without such
    /// layers).
    pub fn ring_len(&self) -> Option<usize> {
        self.ring.as_ref().map(Store::len)
    }

    /// Whether the sliding-window layers still hold every row a token at
    /// position [`KvCache::pos`] reads with a window of `window`: false
    /// after a truncation further back than the ring reaches (the model
    /// then recomputes the prefix).
    pub(crate) fn holds_window(&self, window: usize) -> bool {
        self.ring
            .as_ref()
            .is_none_or(|ring| ring.floor <= (self.pos + 1).saturating_sub(window))
    }

    /// Bytes of key and value storage this cache holds (whole chunks,
    /// including those kept for reuse after a truncate; a chunk shared
    /// with a fork counts in both).
    pub fn allocated_bytes(&self) -> usize {
        self.stores()
            .flat_map(|store| &store.chunks)
            .map(|chunk| chunk.bytes())
            .sum()
    }

    fn stores(&self) -> impl Iterator<Item = &Store> {
        std::iter::once(&self.full).chain(&self.ring)
    }

    /// Allocates the chunks for the first `n_positions` positions (capped
    /// at the capacity, and at the ring for sliding-window layers) now, so
    /// later tokens allocate nothing.
    pub fn reserve(&mut self, n_positions: usize) {
        let precision = self.precision;
        self.full.reserve(n_positions, precision);
        if let Some(ring) = &mut self.ring {
            ring.reserve(n_positions, precision);
        }
    }

    /// Forgets every position from `pos` on (editing a token invalidates the
    /// cache from that position). A `pos` at or beyond the current one
    /// changes nothing. Storage is kept for reuse.
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }

    /// Forgets every position; storage is kept for reuse.
    pub fn reset(&mut self) {
        self.pos = 0;
        if let Some(ring) = &mut self.ring {
            ring.floor = 0;
        }
    }

    /// How many of the valid positions of `self` use the same storage as
    /// `other` (both forks of one sequence): the prefix forking did not copy.
    /// Counted in the full store (the global layers).
    pub fn shared_positions(&self, other: &KvCache) -> usize {
        let valid = self.pos.min(other.pos);
        let shared_chunks = self
            .full
            .chunks
            .iter()
            .zip(&other.full.chunks)
            .take_while(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        valid.min(shared_chunks * CHUNK_LEN)
    }

    /// Stores the key and value rows (`n_kv_head * head_dim` each, heads end
    /// to end) of `layer` at position `pos`, rounded to f16 in an f16 cache
    /// and quantized in a q8_0 one. Does not advance the cache:
    /// [`KvCache::commit`] does, once every layer is written. The position
    /// is below the capacity, the layer exists and the rows have the
    /// shape's width: the model checked the context bound and built the
    /// rows from its configuration.
    pub(crate) fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        let shape = self.shape;
        assert!(
            pos < shape.capacity && layer < shape.n_layer,
            "kv write at layer {layer}, position {pos} outside {shape:?}"
        );
        let row_len = shape.n_kv_head * shape.head_dim;
        debug_assert_eq!((key.len(), value.len()), (row_len, row_len), "kv row width");
        let (store, layer_in_store) = self.layer_slots[layer];
        let precision = self.precision;
        self.store_mut(store)
            .write(precision, layer_in_store, pos, key, value);
    }

    fn store_mut(&mut self, store: usize) -> &mut Store {
        match (store, &mut self.ring) {
            (1, Some(ring)) => ring,
            _ => &mut self.full,
        }
    }

    /// Marks `n` more positions as valid after they were written for every
    /// layer.
    pub(crate) fn commit(&mut self, n: usize) {
        debug_assert!(
            self.pos + n <= self.shape.capacity,
            "commit past the capacity"
        );
        self.pos += n;
    }

    /// The chunks of `kv_head` in `layer` that hold the positions
    /// `positions`, in position order, each with the rows of it that are
    /// asked for. On a sliding-window layer the positions are within the
    /// ring's reach (the model reads only its window, and recomputes after a
    /// deeper truncation).
    pub(crate) fn chunks_in(
        &self,
        layer: usize,
        kv_head: usize,
        positions: Range<usize>,
    ) -> impl Iterator<Item = HeadChunk<'_>> {
        let (store, layer_in_store) = self.layer_slots[layer];
        let store = match (store, &self.ring) {
            (1, Some(ring)) => ring,
            _ => &self.full,
        };
        store.chunks_in(layer_in_store, kv_head, positions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRECISIONS: [KvPrecision; 2] = [KvPrecision::F32, KvPrecision::F16];

    fn shape() -> KvShape {
        KvShape {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 3,
            capacity: 100,
        }
    }

    /// The key row of (layer, pos, head) is filled with `layer*1000 + pos*10 + head`;
    /// the value row is its negation. Integers below 2048 are exact in f16.
    fn fill(cache: &mut KvCache, range: std::ops::Range<usize>) {
        for pos in range.clone() {
            for layer in 0..2 {
                let key: Vec<f32> = (0..2)
                    .flat_map(|head| [(layer * 1000 + pos * 10 + head) as f32; 3])
                    .collect();
                let value: Vec<f32> = key.iter().map(|k| -k).collect();
                cache.write(layer, pos, &key, &value);
            }
        }
        cache.commit(range.len());
    }

    fn read(cache: &KvCache, layer: usize, head: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        read_range(cache, layer, head, 0..n)
    }

    #[test]
    fn rows_come_back_in_position_order_across_chunks() {
        for precision in PRECISIONS {
            let mut cache = KvCache::new(shape(), precision, Dispatch::detect());
            fill(&mut cache, 0..70);
            assert_eq!(cache.pos(), 70);
            let (keys, values) = read(&cache, 1, 1, 70);
            let expected: Vec<f32> = (0..70)
                .flat_map(|pos| [(1000 + pos * 10 + 1) as f32; 3])
                .collect();
            assert_eq!(keys, expected, "{precision:?}");
            assert_eq!(
                values,
                expected.iter().map(|k| -k).collect::<Vec<_>>(),
                "{precision:?}"
            );
        }
    }

    #[test]
    fn an_f16_cache_returns_exactly_the_f16_rounded_values_written() {
        let shape = KvShape {
            n_layer: 1,
            n_kv_head: 2,
            head_dim: 4,
            capacity: 40,
        };
        // f16 keeps 11 significant bits, rounding ties to even: 1 + 2^-11 is
        // halfway and rounds down to 1, 1 + 3 * 2^-11 rounds up to 1 + 2^-9; 0.1 becomes 0.099975586; 65519 rounds
        // down to the largest f16, 65504, and 65520 overflows to infinity;
        // 2^-24 is the smallest subnormal, 2^-26 underflows to 0.
        let key = [
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            0.1,
            -0.1,
            65519.0,
            65520.0,
            2f32.powi(-24),
            2f32.powi(-26),
        ];
        let expected_key = [
            1.0,
            1.0 + 2f32.powi(-9),
            0.099_975_586,
            -0.099_975_586,
            65504.0,
            f32::INFINITY,
            2f32.powi(-24),
            0.0,
        ];
        // Values: a spread of magnitudes, checked against the scalar rounding.
        let value: Vec<f32> = (0..8).map(|i| (i as f32 * 0.37 - 1.3).powi(3)).collect();
        let mut f16_cache = KvCache::new(shape, KvPrecision::F16, Dispatch::detect());
        let mut f32_cache = KvCache::new(shape, KvPrecision::F32, Dispatch::detect());
        // Position 33 is in the second chunk.
        for cache in [&mut f16_cache, &mut f32_cache] {
            for pos in 0..34 {
                cache.write(0, pos, &key, &value);
            }
            cache.commit(34);
        }
        let to_bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for head in 0..2 {
            let (keys, values) = read(&f16_cache, 0, head, 34);
            let row = head * 4..head * 4 + 4;
            let last = 33 * 4..34 * 4;
            assert_eq!(
                to_bits(&keys[last.clone()]),
                to_bits(&expected_key[row.clone()])
            );
            let rounded: Vec<f32> = value[row.clone()]
                .iter()
                .map(|&v| f16::from_f32(v).to_f32())
                .collect();
            assert_ne!(rounded, value[row.clone()], "the values need rounding");
            assert_eq!(to_bits(&values[last.clone()]), to_bits(&rounded));
            // The f32 cache keeps what was written.
            let (keys, values) = read(&f32_cache, 0, head, 34);
            assert_eq!(to_bits(&keys[last.clone()]), to_bits(&key[row.clone()]));
            assert_eq!(to_bits(&values[last]), to_bits(&value[row]));
        }
    }

    #[test]
    fn an_f16_cache_takes_half_the_bytes_of_an_f32_cache() {
        // One chunk of shape(): 2 layers x (K, V) x 2 heads x 32 rows x 3 = 768 values.
        for (precision, value_bytes) in [(KvPrecision::F32, 4), (KvPrecision::F16, 2)] {
            let mut cache = KvCache::new(shape(), precision, Dispatch::detect());
            assert_eq!(cache.allocated_bytes(), 0, "nothing before the first write");
            fill(&mut cache, 0..33);
            assert_eq!(
                cache.allocated_bytes(),
                2 * 768 * value_bytes,
                "{precision:?}"
            );
        }
        // SmolLM2 at its 8192-token context: 30 layers, 3 key/value heads of
        // 64, 30 * 2 * 3 * 64 values per position, so 188.7 MB in f16 and
        // 377.5 MB in f32 (the module docs); two chunks measured here.
        let smollm2 = KvShape {
            n_layer: 30,
            n_kv_head: 3,
            head_dim: 64,
            capacity: 8192,
        };
        let per_position_bytes = |precision| {
            let mut cache = KvCache::new(smollm2, precision, Dispatch::detect());
            cache.reserve(2 * CHUNK_LEN);
            cache.allocated_bytes() / (2 * CHUNK_LEN)
        };
        assert_eq!(per_position_bytes(KvPrecision::F16) * 8192, 188_743_680);
        assert_eq!(per_position_bytes(KvPrecision::F32) * 8192, 377_487_360);
    }

    /// llama.cpp's q8_0 reading of `row`, written out for one block of 32
    /// at a time: scale `f16(amax / 127)`, each value
    /// `round_half_even(x * 127 / amax)` times the scale.
    fn q8_0_reading(row: &[f32]) -> Vec<f32> {
        row.chunks(32)
            .flat_map(|block| {
                let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale = f16::from_f32(amax / 127.0).to_f32();
                block
                    .iter()
                    .map(move |&x| (x * (127.0 / amax)).round_ties_even() * scale)
            })
            .collect()
    }

    #[test]
    fn a_q8_0_cache_returns_each_key_and_value_as_llama_cpp_quantizes_it() {
        // head_dim 40: per head a block of 32 and one of 8; 70 positions over
        // three chunks; and a ring layer (window 20: a ring of 64, wrapped).
        let shape = KvShape {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 40,
            capacity: 100,
        };
        let row = |seed: usize| -> Vec<f32> {
            (0..80)
                .map(|i| ((seed * 131 + i * 37) % 201) as f32 / 50.0 - 2.0)
                .collect()
        };
        for windows in [[None, None], [None, Some(20)]] {
            let mut cache =
                KvCache::with_windows(shape, KvPrecision::Q8_0, Dispatch::detect(), &windows);
            for pos in 0..70 {
                for layer in 0..2 {
                    let key = row(pos * 4 + layer * 2);
                    let value = row(pos * 4 + layer * 2 + 1);
                    cache.write(layer, pos, &key, &value);
                }
            }
            cache.commit(70);
            for (layer, head) in [(0, 0), (0, 1), (1, 1)] {
                let range = if windows[layer].is_some() {
                    30..70
                } else {
                    0..70
                };
                let (keys, values) = read_range(&cache, layer, head, range.clone());
                let columns = head * 40..(head + 1) * 40;
                let expected = |offset| -> Vec<f32> {
                    range
                        .clone()
                        .flat_map(|pos| {
                            q8_0_reading(&row(pos * 4 + layer * 2 + offset)[columns.clone()])
                        })
                        .collect()
                };
                assert_eq!(keys, expected(0), "keys of layer {layer}, head {head}");
                assert_eq!(values, expected(1), "values of layer {layer}, head {head}");
                assert_ne!(
                    keys[..40],
                    row(range.start * 4 + layer * 2)[columns.clone()]
                );
            }
        }
    }

    #[test]
    fn a_q8_0_cache_takes_53_percent_of_the_bytes_of_an_f16_cache() {
        // SmolLM2: a position is 30 layers x (K, V) x 3 heads x (64 int8s +
        // two f16 scales) = 12,240 bytes, against 23,040 at f16.
        let smollm2 = KvShape {
            n_layer: 30,
            n_kv_head: 3,
            head_dim: 64,
            capacity: 8192,
        };
        let mut cache = KvCache::new(smollm2, KvPrecision::Q8_0, Dispatch::detect());
        cache.reserve(2 * CHUNK_LEN);
        assert_eq!(cache.allocated_bytes() / (2 * CHUNK_LEN), 12_240);
        assert_eq!(
            30 * 2 * 3 * KvPrecision::Q8_0.row_bytes(64),
            12_240,
            "row_bytes agrees"
        );
    }

    #[test]
    fn a_fork_shares_its_prefix_and_copies_on_write() {
        for precision in PRECISIONS {
            let mut cache = KvCache::new(shape(), precision, Dispatch::detect());
            fill(&mut cache, 0..40);
            let mut fork = cache.clone();
            assert_eq!(fork.shared_positions(&cache), 40);
            // Overwrite position 35 in the fork: only the second chunk is copied.
            fork.truncate(35);
            fork.write(0, 35, &[9.0; 6], &[9.0; 6]);
            fork.commit(1);
            assert_eq!(fork.shared_positions(&cache), CHUNK_LEN);
            assert_eq!(
                read(&cache, 0, 0, 40).0[35 * 3],
                350.0,
                "the original is untouched"
            );
            assert_eq!(read(&fork, 0, 0, 36).0[35 * 3], 9.0);
            assert_eq!(
                read(&fork, 0, 0, 36).0[34 * 3],
                340.0,
                "the fork kept its prefix"
            );
            fork.truncate(0);
            fork.write(1, 0, &[7.0; 6], &[7.0; 6]);
            fork.commit(1);
            assert_eq!(read(&cache, 1, 0, 1).0, vec![1000.0; 3]);
            assert_eq!(read(&fork, 1, 0, 1).0, vec![7.0; 3]);
            assert_eq!(fork.shared_positions(&cache), 0);
            assert_eq!(fork.precision(), precision, "the copies keep the precision");
            assert_eq!(fork.allocated_bytes(), cache.allocated_bytes());
        }
    }

    #[test]
    fn a_sliding_layer_keeps_a_ring_and_reads_any_window_within_it() {
        // Layer 0 global, layer 1 sliding with a window of 12: a ring of 32.
        for precision in PRECISIONS {
            let mut cache =
                KvCache::with_windows(shape(), precision, Dispatch::detect(), &[None, Some(12)]);
            assert_eq!(cache.ring_len(), Some(32));
            fill(&mut cache, 0..100);
            // The global layer keeps all 100 positions.
            let (keys, _) = read_range(&cache, 0, 1, 0..100);
            let expected: Vec<f32> = (0..100)
                .flat_map(|pos| [(pos * 10 + 1) as f32; 3])
                .collect();
            assert_eq!(keys, expected, "{precision:?}");
            // The sliding layer reads any range of the last 32 positions,
            // across the ring's wrap (68..100 are rows 4..32, then 0..4, of
            // its one chunk).
            for range in [88..100, 68..100, 70..95] {
                let (keys, values) = read_range(&cache, 1, 0, range.clone());
                let expected: Vec<f32> = range
                    .clone()
                    .flat_map(|pos| [(1000 + pos * 10) as f32; 3])
                    .collect();
                assert_eq!(keys, expected, "{precision:?} {range:?}");
                assert_eq!(values, expected.iter().map(|k| -k).collect::<Vec<_>>());
            }
            // One global chunk per 32 positions, one ring of 32 for the other.
            let per_layer_chunk =
                2 * 2 * CHUNK_LEN * 3 * if precision == KvPrecision::F16 { 2 } else { 4 };
            assert_eq!(cache.allocated_bytes(), (4 + 1) * per_layer_chunk);
            // A truncation within reach keeps the window; a deeper one does not.
            assert!(cache.holds_window(12));
            cache.truncate(80);
            assert!(cache.holds_window(12), "80 - 11 = 69 >= 68");
            cache.truncate(70);
            assert!(!cache.holds_window(12), "70 - 11 = 59 < 68");
            cache.reset();
            assert!(cache.holds_window(12));
        }
    }

    fn read_range(
        cache: &KvCache,
        layer: usize,
        head: usize,
        range: Range<usize>,
    ) -> (Vec<f32>, Vec<f32>) {
        // Row by row: a key is a column of its chunk's key block.
        let head_dim = cache.shape().head_dim;
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut buf = Vec::new();
        for chunk in cache.chunks_in(layer, head, range) {
            let key_block = chunk.keys.to_f32(cache.dispatch(), &mut buf).to_vec();
            let value_block = chunk.values.to_f32(cache.dispatch(), &mut buf);
            for row in chunk.rows {
                keys.extend((0..head_dim).map(|d| key_block[d * CHUNK_LEN + row]));
                values.extend_from_slice(&value_block[row * head_dim..(row + 1) * head_dim]);
            }
        }
        (keys, values)
    }

    #[test]
    fn truncate_and_reset_only_move_the_position() {
        let mut cache = KvCache::new(shape(), KvPrecision::F16, Dispatch::detect());
        fill(&mut cache, 0..10);
        cache.truncate(20);
        assert_eq!(cache.pos(), 10);
        cache.truncate(4);
        assert_eq!(cache.pos(), 4);
        cache.reset();
        assert_eq!(cache.pos(), 0);
        assert_eq!(cache.allocated_bytes(), 768 * 2, "storage is kept");
    }
}
