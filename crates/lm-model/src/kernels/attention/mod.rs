//! Attention's kernels: the query-key products of a chunk's keys, the
//! weighted sums of its values and the f16 rounding, for many query rows
//! at a time, one file per instruction set (the algorithm that calls them,
//! tiles and softmax, is `transformer::attention`).
//!
//! - `portable`: plain Rust, the reference the SIMD builds match bit for bit.
//! - `x86`: the frame the two x86 builds share: the f32 vector operations
//!   they use ([`x86::F32Vector`]), the kernels written once over them, four
//!   query rows a pass, and the software prefetch.
//! - `avx2`, `avx512`: those kernels in 8-wide (AVX2, FMA, F16C) and
//!   16-wide (AVX-512 F) vectors.
//! - `q8_0`: llama.cpp's 8-bit blocks for a q8_0 cache: quantizing keys,
//!   values and queries, and widening a chunk to f32 rows for the kernels.
//!
//! The way in is [`run_tile`]: it takes a [`Dispatch`] and runs a
//! [`TileJob`] (the algorithm) with the fastest [`TileKernels`] it allows,
//! inside that build's `#[target_feature]` function, so the job's code is
//! compiled for the build's instruction set. A SIMD [`TileKernels`] value is
//! built there only, so holding one proves the CPU runs its instructions.

use std::ops::Range;

use half::f16;

use crate::kernels::dispatch::Dispatch;
#[cfg(target_arch = "x86_64")]
use crate::kernels::dispatch::Kernel;
use crate::transformer::CHUNK_LEN;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;
pub(crate) mod q8_0;
#[cfg(target_arch = "x86_64")]
mod x86;

use portable::Portable;

/// Lanes of a key product's partial sums, and keys a pass of the portable
/// key product handles.
const PARTIALS: usize = 8;

/// The vector kernels of one tile of attention in one build (portable, AVX2
/// or AVX-512); see the module docs for how a value is had.
pub(crate) trait TileKernels: Copy {
    /// Whether these are SIMD kernels: they read an f16 chunk in place for
    /// up to four query rows (one pass) and prefetch; the portable ones
    /// take f32 rows only and leave prefetching to the hardware.
    const SIMD: bool;

    /// Rounds every value to the nearest f16 (ties to even) in place;
    /// `narrowed` is a buffer the portable build may grow and use.
    fn round_to_f16(self, values: &mut [f32], narrowed: &mut Vec<f16>);

    /// Asks for every cache line of `block` (a chunk's key or value block)
    /// to be brought into the caches (nothing in the portable build).
    fn prefetch<T>(self, block: &[T]);

    /// The products of each query row of `queries` (`[rows][head_dim]`)
    /// with the [`CHUNK_LEN`] keys of `keys` (a chunk's key block,
    /// `[head_dim][CHUNK_LEN]`, a key per column), times `scale`, into
    /// `products` (`[rows][CHUNK_LEN]`). Each product is summed as a plain
    /// dot product of eight partial sums would be (dimension `d` into
    /// partial `d % 8`, the partials then added in order, then the products
    /// past the last whole eight), the bits of the one-query-at-a-time
    /// computation the tiles replaced. The SIMD builds take four rows at a
    /// time, so each key vector they load serves four rows.
    fn chunk_scores(self, queries: &[f32], keys: ChunkRows<'_>, scale: f32, products: &mut [f32]);

    /// Adds `sum_k w[r][k] * value_rows[k]` to the output row of each query
    /// row `r` of `sums` (see [`WeightedRows`]), each output value in
    /// position order. The SIMD builds take four rows at a time, so each
    /// value vector they load serves four rows.
    fn add_weighted_rows<O, W>(self, out: &mut [f32], sums: WeightedRows<'_, O, W>)
    where
        O: Fn(usize) -> usize,
        W: Fn(usize) -> usize;
}

/// The query rows that one run of a chunk's value rows is added to, for
/// [`TileKernels::add_weighted_rows`].
pub(crate) struct WeightedRows<'a, O, W> {
    /// The query rows.
    pub rows: Range<usize>,
    /// Where row `r`'s output starts in `out` (`head_dim` values).
    pub out_row: O,
    /// The weights of every row.
    pub weights: &'a [f32],
    /// Where row `r`'s weights start in `weights` (one per value row).
    pub weights_at: W,
    /// The value rows, `head_dim` values each.
    pub value_rows: ChunkRows<'a>,
    /// Values in a value row and in an output row.
    pub head_dim: usize,
}

/// Work written once over [`TileKernels`]: [`run_tile`] runs it with the
/// kernels a [`Dispatch`] allows, compiled inside their build's
/// `#[target_feature]` function (so `run` must be `#[inline(always)]`).
pub(crate) trait TileJob {
    /// Does the work with `kernels`.
    fn run<K: TileKernels>(self, kernels: K);
}

/// Runs `job` with the fastest kernels `dispatch` allows: AVX-512 or AVX2
/// when the CPU has F16C besides, portable otherwise (with `dispatch` for
/// its widening). `exact_products` says every product of a query and a key
/// or of a weight and a value is exact in f32 (f16 precision: 11
/// significant bits each), so the SIMD builds may add them with fused
/// multiply-adds and keep the bits of a multiply then an add.
#[inline(always)]
pub(crate) fn run_tile(dispatch: Dispatch, exact_products: bool, job: impl TileJob) {
    #[cfg(target_arch = "x86_64")]
    if dispatch.has_f16c() {
        // SAFETY: a `Dispatch` holds only detected features: the AVX-512
        // kernel's include AVX-512 F and VL, every x86 SIMD kernel's include
        // AVX2 and FMA, and F16C is checked.
        match dispatch.kernel() {
            Kernel::Avx512 => return unsafe { avx512::run_tile(exact_products, job) },
            Kernel::Avx2 | Kernel::AvxVnni => {
                return unsafe { avx2::run_tile(exact_products, job) };
            }
            Kernel::Portable => {}
        }
    }
    job.run(Portable::new(dispatch));
}

/// A chunk's keys or values as the kernels read them: f32 rows (an f32
/// cache's in place, or an f16 cache's widened once into a buffer, for many
/// query rows or the portable build), or, for a few rows in the SIMD builds
/// ([`TileKernels::SIMD`]), an f16 cache's rows as stored, widened in
/// registers as they are loaded (exact either way: every f16 is an f32).
#[derive(Clone, Copy)]
pub(crate) enum ChunkRows<'a> {
    /// f32 rows.
    F32(&'a [f32]),
    /// f16 rows, read by SIMD kernels only.
    F16(&'a [f16]),
}

impl<'a> ChunkRows<'a> {
    /// The values at `range`.
    #[inline(always)]
    pub(crate) fn slice(self, range: Range<usize>) -> Self {
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
