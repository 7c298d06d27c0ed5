//! The frame the x86 builds of attention's kernels share: the f32 vector
//! operations they use ([`F32Vector`], implemented by `__m256` in `avx2`
//! and `__m512` in `avx512`), the value types they load from ([`Lanes`]),
//! the kernels written once over both, and [`x86_build!`], which gives a
//! build its type and its `#[target_feature]` functions.
//!
//! The kernels take four query rows a pass, so each key or value vector
//! they load serves four rows, with 8 independent sums in registers to hide
//! the latency of the additions. They do the operations of the portable
//! kernels on the same values in the same order, so they give its bits;
//! the products are fused at f16 precision only, where every product is
//! exact in f32 (see `transformer::attention`).

use std::ops::Range;

use half::f16;

use super::{CHUNK_LEN, ChunkRows, PARTIALS, TileKernels, WeightedRows};
use crate::kernels::f16::round_to_f16_f16c;

/// An f32 vector of one x86 build and the operations the kernels use on it.
///
/// # Safety
/// Every method needs the build's instructions (`__m256`: AVX2, FMA and
/// F16C; `__m512`: AVX-512 F): it is called only inside that build's
/// `#[target_feature]` functions, into which it is inlined. Pointers are
/// the caller's to keep in bounds.
pub(super) trait F32Vector: Copy {
    /// f32 lanes in a vector.
    const WIDTH: usize;

    /// Every lane `value`.
    unsafe fn splat(value: f32) -> Self;

    /// Every lane `+0.0`.
    unsafe fn zero() -> Self;

    /// `self + other`, lane by lane.
    unsafe fn add(self, other: Self) -> Self;

    /// `self * other`, lane by lane.
    unsafe fn mul(self, other: Self) -> Self;

    /// `self * other + acc` with one rounding, lane by lane.
    unsafe fn mul_add(self, other: Self, acc: Self) -> Self;

    /// `WIDTH` f32 from `at` (unaligned).
    unsafe fn load(at: *const f32) -> Self;

    /// `WIDTH` f16 from `at` (unaligned), widened to f32.
    unsafe fn load_f16(at: *const f16) -> Self;

    /// The lanes to `at` (unaligned).
    unsafe fn store(self, at: *mut f32);
}

/// A stored value type the SIMD kernels load a vector at a time as f32
/// (and one value at a time by `Into<f32>`, exact for both).
pub(super) trait Lanes: Copy + Into<f32> {
    /// Values `at..at + V::WIDTH` of `values` as f32.
    ///
    /// # Safety
    /// `V`'s instructions ([`F32Vector`]); `at + V::WIDTH <= values.len()`.
    unsafe fn load<V: F32Vector>(values: &[Self], at: usize) -> V;
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load<V: F32Vector>(values: &[Self], at: usize) -> V {
        // SAFETY: in bounds and `V`'s instructions (the caller's contract).
        unsafe { V::load(values.as_ptr().add(at)) }
    }
}

impl Lanes for f16 {
    #[inline(always)]
    unsafe fn load<V: F32Vector>(values: &[Self], at: usize) -> V {
        // SAFETY: as for f32.
        unsafe { V::load_f16(values.as_ptr().add(at)) }
    }
}

/// One x86 build's kernels (made by [`x86_build!`]), which the frame calls
/// for one to four query rows at a time. Its values are made only by the
/// build's `run_tile`, which runs only after a `Dispatch` has checked that
/// the CPU runs the build's instructions.
///
/// # Safety
/// Each method needs the build's instructions (it is compiled with them):
/// call it only with a value of the build, which proves the CPU runs them.
pub(super) trait Build: Copy {
    /// [`key_scores`] for `R` rows in this build.
    unsafe fn key_scores<const R: usize, T: Lanes>(
        self,
        queries: &[f32],
        keys: &[T],
        scale: f32,
        products: &mut [f32],
    );

    /// [`add_weighted`] for `R` rows in this build.
    unsafe fn add_weighted<const R: usize, T: Lanes>(
        self,
        out: &mut [f32],
        out_starts: [usize; R],
        weights: [&[f32]; R],
        value_rows: &[T],
        head_dim: usize,
    );
}

impl<B: Build> TileKernels for B {
    const SIMD: bool = true;

    #[inline(always)]
    fn round_to_f16(self, values: &mut [f32], _narrowed: &mut Vec<f16>) {
        // SAFETY: `self` is a value of an x86 build, made only after a
        // `Dispatch` checked its instructions, F16C among them.
        unsafe { round_to_f16_f16c(values) };
    }

    #[inline(always)]
    fn prefetch<T>(self, block: &[T]) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let (start, len) = (block.as_ptr().cast::<i8>(), size_of_val(block));
        for offset in (0..len).step_by(CACHE_LINE) {
            // SAFETY: the address is inside `block`; a prefetch never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(offset)) };
        }
    }

    #[inline(always)]
    fn chunk_scores(self, queries: &[f32], keys: ChunkRows<'_>, scale: f32, products: &mut [f32]) {
        match keys {
            ChunkRows::F32(keys) => chunk_scores(self, queries, keys, scale, products),
            ChunkRows::F16(keys) => chunk_scores(self, queries, keys, scale, products),
        }
    }

    #[inline(always)]
    fn add_weighted_rows<O, W>(self, out: &mut [f32], sums: WeightedRows<'_, O, W>)
    where
        O: Fn(usize) -> usize,
        W: Fn(usize) -> usize,
    {
        match sums.value_rows {
            ChunkRows::F32(values) => add_weighted_rows(self, out, &sums, values),
            ChunkRows::F16(values) => add_weighted_rows(self, out, &sums, values),
        }
    }
}

/// Bytes of a cache line on x86.
const CACHE_LINE: usize = 64;

/// [`TileKernels::chunk_scores`] in `build`, four rows a pass.
#[inline(always)]
fn chunk_scores<B: Build, T: Lanes>(
    build: B,
    queries: &[f32],
    keys: &[T],
    scale: f32,
    products: &mut [f32],
) {
    let head_dim = keys.len() / CHUNK_LEN;
    debug_assert_eq!(queries.len() / head_dim, products.len() / CHUNK_LEN);
    let (q_blocks, q_rest) = queries.split_at(queries.len() / (4 * head_dim) * 4 * head_dim);
    let (p_blocks, p_rest) = products.split_at_mut(q_blocks.len() / head_dim * CHUNK_LEN);
    // SAFETY (both blocks): `build` is a value of its build, which proves
    // the CPU runs its instructions ([`Build`]).
    for (q, p) in q_blocks
        .chunks_exact(4 * head_dim)
        .zip(p_blocks.chunks_exact_mut(4 * CHUNK_LEN))
    {
        unsafe { build.key_scores::<4, T>(q, keys, scale, p) };
    }
    unsafe {
        match q_rest.len() / head_dim {
            0 => {}
            1 => build.key_scores::<1, T>(q_rest, keys, scale, p_rest),
            2 => build.key_scores::<2, T>(q_rest, keys, scale, p_rest),
            _ => build.key_scores::<3, T>(q_rest, keys, scale, p_rest),
        }
    }
}

/// [`TileKernels::add_weighted_rows`] in `build`, four rows a pass, with
/// the value rows `value_rows` (those of `sums`).
#[inline(always)]
fn add_weighted_rows<B: Build, T: Lanes, O, W>(
    build: B,
    out: &mut [f32],
    sums: &WeightedRows<'_, O, W>,
    value_rows: &[T],
) where
    O: Fn(usize) -> usize,
    W: Fn(usize) -> usize,
{
    let WeightedRows {
        ref rows,
        ref out_row,
        weights,
        ref weights_at,
        head_dim,
        ..
    } = *sums;
    let n = value_rows.len() / head_dim;
    let mut r = rows.start;
    while r < rows.end {
        let m = (rows.end - r).min(4);
        let outs = |i: usize| out_row(r + i.min(m - 1));
        let ws = |i: usize| &weights[weights_at(r + i.min(m - 1))..][..n];
        // SAFETY: `build` is a value of its build, which proves the CPU
        // runs its instructions ([`Build`]).
        unsafe {
            match m {
                4 => build.add_weighted::<4, T>(
                    out,
                    [outs(0), outs(1), outs(2), outs(3)],
                    [ws(0), ws(1), ws(2), ws(3)],
                    value_rows,
                    head_dim,
                ),
                3 => build.add_weighted::<3, T>(
                    out,
                    [outs(0), outs(1), outs(2)],
                    [ws(0), ws(1), ws(2)],
                    value_rows,
                    head_dim,
                ),
                2 => build.add_weighted::<2, T>(
                    out,
                    [outs(0), outs(1)],
                    [ws(0), ws(1)],
                    value_rows,
                    head_dim,
                ),
                _ => build.add_weighted::<1, T>(out, [outs(0)], [ws(0)], value_rows, head_dim),
            }
        }
        r += m;
    }
}

/// `acc + b * x` in every lane: fused (one rounding) when `FUSED`, which
/// the kernels are only when every product `b * x` is exact in f32, so
/// both give the same bits.
///
/// # Safety
/// `V`'s instructions ([`F32Vector`]).
#[inline(always)]
unsafe fn add_product<V: F32Vector, const FUSED: bool>(acc: V, b: V, x: V) -> V {
    // SAFETY: `V`'s instructions are the caller's.
    unsafe {
        if FUSED {
            b.mul_add(x, acc)
        } else {
            acc.add(b.mul(x))
        }
    }
}

/// The portable key product times `scale` for `R` query rows at once
/// (`queries`: `[R][head_dim]`, `products`: `[R][CHUNK_LEN]`), with the
/// same operations in the same order: for two vectors of keys at a time
/// (16 keys in AVX2, the whole chunk's 32 in AVX-512, so each query value
/// broadcast serves 32 keys), the partial sum of dimensions `p, p + 8, ...`
/// for each `p` in turn, added to the running sum of the earlier partials,
/// so only the sums in flight (`2 R` vectors) and the current partials
/// (`2 R`) need registers. Each product is added to its partial by
/// [`add_product`]: fused when `FUSED`.
///
/// # Safety
/// `V`'s instructions ([`F32Vector`]).
#[inline(always)]
pub(super) unsafe fn key_scores<V: F32Vector, const R: usize, const FUSED: bool, T: Lanes>(
    queries: &[f32],
    keys: &[T],
    scale: f32,
    products: &mut [f32],
) {
    let head_dim = keys.len() / CHUNK_LEN;
    assert!(queries.len() == R * head_dim && products.len() == R * CHUNK_LEN);
    const { assert!(CHUNK_LEN.is_multiple_of(2 * V::WIDTH)) };
    let whole = head_dim / PARTIALS * PARTIALS;
    let q = queries.as_ptr();
    // SAFETY (the whole body): `V`'s instructions are the caller's; for
    // d < head_dim the key row d (CHUNK_LEN values) and each query's value
    // d are in bounds, and so are row i's products (asserted above).
    unsafe {
        for pass in 0..CHUNK_LEN / (2 * V::WIDTH) {
            let columns = pass * 2 * V::WIDTH;
            let mut sums = [[V::splat(-0.0); 2]; R];
            for p in 0..PARTIALS {
                let mut partials = [[V::zero(); 2]; R];
                for d in (p..whole).step_by(PARTIALS) {
                    add_key_products::<V, R, FUSED, T>(
                        &mut partials,
                        q,
                        head_dim,
                        keys,
                        columns,
                        d,
                    );
                }
                for (sum, partial) in sums.iter_mut().zip(&partials) {
                    sum[0] = sum[0].add(partial[0]);
                    sum[1] = sum[1].add(partial[1]);
                }
            }
            let mut tails = [[V::splat(-0.0); 2]; R];
            for d in whole..head_dim {
                add_key_products::<V, R, FUSED, T>(&mut tails, q, head_dim, keys, columns, d);
            }
            let scale = V::splat(scale);
            for (i, (sum, tail)) in sums.iter().zip(&tails).enumerate() {
                let row = products.as_mut_ptr().add(i * CHUNK_LEN + columns);
                sum[0].add(tail[0]).mul(scale).store(row);
                sum[1].add(tail[1]).mul(scale).store(row.add(V::WIDTH));
            }
        }
    }
}

/// Adds to each row's two sums in `sums` (one per query row of `q`,
/// `[R][head_dim]`) the products of the row's dimension `d` with the two
/// key vectors of key row `d` from column `columns` on, by [`add_product`].
///
/// # Safety
/// `V`'s instructions ([`F32Vector`]); `d < head_dim` and
/// `columns + 2 * V::WIDTH <= CHUNK_LEN`, with `q` the start of `R` query
/// rows and `keys` a key block of `head_dim` rows (as in [`key_scores`]).
#[inline(always)]
unsafe fn add_key_products<V: F32Vector, const R: usize, const FUSED: bool, T: Lanes>(
    sums: &mut [[V; 2]; R],
    q: *const f32,
    head_dim: usize,
    keys: &[T],
    columns: usize,
    d: usize,
) {
    // SAFETY: in bounds and `V`'s instructions, by the function's contract.
    unsafe {
        let column = d * CHUNK_LEN + columns;
        let (k0, k1) = (
            T::load::<V>(keys, column),
            T::load::<V>(keys, column + V::WIDTH),
        );
        for (i, sum) in sums.iter_mut().enumerate() {
            let b = V::splat(*q.add(i * head_dim + d));
            sum[0] = add_product::<V, FUSED>(sum[0], b, k0);
            sum[1] = add_product::<V, FUSED>(sum[1], b, k1);
        }
    }
}

/// The portable weighted sum for `R` output rows at once (starting at
/// `out_starts`, distinct rows of `head_dim` values): `WIDE` vectors of
/// output values of every row (32 values in AVX2, 64 in AVX-512) stay in
/// registers across the value rows, then one vector at a time, then the
/// rest one value at a time, each value vector loaded once for the `R`
/// rows; fused products when `FUSED`, as in [`key_scores`].
///
/// # Safety
/// `V`'s instructions ([`F32Vector`]).
#[inline(always)]
pub(super) unsafe fn add_weighted<
    V: F32Vector,
    const R: usize,
    const WIDE: usize,
    const FUSED: bool,
    T: Lanes,
>(
    out: &mut [f32],
    out_starts: [usize; R],
    weights: [&[f32]; R],
    value_rows: &[T],
    head_dim: usize,
) {
    weighted_rows_checked(out.len(), &out_starts, &weights, value_rows.len(), head_dim);
    let mut d = 0;
    // SAFETY (both loops): `V`'s instructions are the caller's; each block's
    // dimensions lie in `d..head_dim`, and the output rows, weights and
    // value rows are as asserted above.
    while d + WIDE * V::WIDTH <= head_dim {
        unsafe {
            add_weighted_block::<V, R, WIDE, FUSED, T>(
                out,
                &out_starts,
                &weights,
                value_rows,
                head_dim,
                d,
            )
        };
        d += WIDE * V::WIDTH;
    }
    while d + V::WIDTH <= head_dim {
        unsafe {
            add_weighted_block::<V, R, 1, FUSED, T>(
                out,
                &out_starts,
                &weights,
                value_rows,
                head_dim,
                d,
            )
        };
        d += V::WIDTH;
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

/// Output values `d..d + N * V::WIDTH` of the `R` rows of
/// [`add_weighted`], in `N` vectors per row held in registers across the
/// value rows.
///
/// # Safety
/// `V`'s instructions ([`F32Vector`]); `d + N * V::WIDTH <= head_dim`,
/// every output row `start..start + head_dim` in `out`, every weight slice
/// one weight per value row.
#[inline(always)]
unsafe fn add_weighted_block<
    V: F32Vector,
    const R: usize,
    const N: usize,
    const FUSED: bool,
    T: Lanes,
>(
    out: &mut [f32],
    out_starts: &[usize; R],
    weights: &[&[f32]; R],
    value_rows: &[T],
    head_dim: usize,
    d: usize,
) {
    let n = value_rows.len() / head_dim;
    let base = out.as_mut_ptr();
    // SAFETY: in bounds and `V`'s instructions, by the function's contract.
    // (Plain loops, not `array::from_fn`: a closure here would not have the
    // caller's target features, and its loads would not be inlined.)
    unsafe {
        let mut acc = [[V::zero(); N]; R];
        for (acc, &start) in acc.iter_mut().zip(out_starts) {
            for (v, a) in acc.iter_mut().enumerate() {
                *a = V::load(base.add(start + d + V::WIDTH * v));
            }
        }
        for k in 0..n {
            let row = k * head_dim + d;
            let mut values = [V::zero(); N];
            for (v, value) in values.iter_mut().enumerate() {
                *value = T::load::<V>(value_rows, row + V::WIDTH * v);
            }
            for (acc, w) in acc.iter_mut().zip(weights) {
                let b = V::splat(*w.get_unchecked(k));
                for (a, &value) in acc.iter_mut().zip(&values) {
                    *a = add_product::<V, FUSED>(*a, b, value);
                }
            }
        }
        for (acc, &start) in acc.iter().zip(out_starts) {
            for (v, &a) in acc.iter().enumerate() {
                a.store(base.add(start + d + V::WIDTH * v));
            }
        }
    }
}

/// The output dimensions `dims` of the SIMD weighted-sum kernels' rows one
/// value at a time (those past the last whole vector), in the same order.
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
                let value: f32 = value_rows[k * head_dim + dim].into();
                a += weight * value;
            }
            out[start + dim] = a;
        }
    }
}

/// An x86 build of the kernels, from its name, its `#[target_feature]`
/// string, its vector type with the lanes it holds, how many vectors of each
/// output row [`add_weighted`] keeps in registers, and the intrinsics of
/// the [`F32Vector`] operations (the f16 load as widen(load)). It defines
/// `$build<FUSED>`, the [`Build`] whose methods are compiled with those
/// features; `run_tile`, the build's way in (`super::run_tile` calls it);
/// and the vector type's [`F32Vector`] implementation.
macro_rules! x86_build {
    (
        $(#[$doc:meta])*
        $build:ident: $features:literal, $vector:ident of $width:literal lanes, $wide:literal wide;
        splat $splat:ident, zero $zero:ident, add $add:ident, mul $mul:ident,
        mul_add $mul_add:ident, load $load:ident, store $store:ident,
        load_f16 $widen:ident($load_halves:ident)
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub(in crate::kernels::attention) struct $build<const FUSED: bool>(());

        /// Runs `job` with this build's kernels, its code compiled with this
        /// build's instructions; with fused products when `exact_products`.
        #[target_feature(enable = $features)]
        pub(in crate::kernels::attention) fn run_tile(
            exact_products: bool,
            job: impl $crate::kernels::attention::TileJob,
        ) {
            if exact_products {
                job.run($build::<true>(()));
            } else {
                job.run($build::<false>(()));
            }
        }

        impl<const FUSED: bool> $crate::kernels::attention::x86::Build for $build<FUSED> {
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn key_scores<const R: usize, T: $crate::kernels::attention::x86::Lanes>(
                self,
                queries: &[f32],
                keys: &[T],
                scale: f32,
                products: &mut [f32],
            ) {
                // SAFETY: this function has the vector type's instructions.
                unsafe {
                    $crate::kernels::attention::x86::key_scores::<$vector, R, FUSED, T>(
                        queries, keys, scale, products,
                    )
                }
            }

            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn add_weighted<const R: usize, T: $crate::kernels::attention::x86::Lanes>(
                self,
                out: &mut [f32],
                out_starts: [usize; R],
                weights: [&[f32]; R],
                value_rows: &[T],
                head_dim: usize,
            ) {
                // SAFETY: as in `key_scores`.
                unsafe {
                    $crate::kernels::attention::x86::add_weighted::<$vector, R, $wide, FUSED, T>(
                        out, out_starts, weights, value_rows, head_dim,
                    )
                }
            }
        }

        $crate::kernels::attention::x86::f32_vector! {
            $vector of $width lanes;
            splat $splat, zero $zero, add $add, mul $mul,
            mul_add $mul_add, load $load, store $store,
            load_f16 $widen($load_halves)
        }
    };
}
pub(super) use x86_build;

/// The [`F32Vector`] implementation of `$vector` (`$width` lanes) from
/// the intrinsics of its operations, for [`x86_build!`].
macro_rules! f32_vector {
    (
        $vector:ident of $width:literal lanes;
        splat $splat:ident, zero $zero:ident, add $add:ident, mul $mul:ident,
        mul_add $mul_add:ident, load $load:ident, store $store:ident,
        load_f16 $widen:ident($load_halves:ident)
    ) => {
        impl $crate::kernels::attention::x86::F32Vector for $vector {
            const WIDTH: usize = $width;

            #[inline(always)]
            unsafe fn splat(value: f32) -> Self {
                // SAFETY (every method): the build's instructions, the
                // caller's (the trait's contract); pointers in bounds for
                // `WIDTH` values (the caller's contract), unaligned access.
                unsafe { $splat(value) }
            }

            #[inline(always)]
            unsafe fn zero() -> Self {
                // SAFETY: as in `splat`.
                unsafe { $zero() }
            }

            #[inline(always)]
            unsafe fn add(self, other: Self) -> Self {
                // SAFETY: as in `splat`.
                unsafe { $add(self, other) }
            }

            #[inline(always)]
            unsafe fn mul(self, other: Self) -> Self {
                // SAFETY: as in `splat`.
                unsafe { $mul(self, other) }
            }

            #[inline(always)]
            unsafe fn mul_add(self, other: Self, acc: Self) -> Self {
                // SAFETY: as in `splat`.
                unsafe { $mul_add(self, other, acc) }
            }

            #[inline(always)]
            unsafe fn load(at: *const f32) -> Self {
                // SAFETY: as in `splat`.
                unsafe { $load(at) }
            }

            #[inline(always)]
            unsafe fn load_f16(at: *const half::f16) -> Self {
                // SAFETY: as in `splat` (`WIDTH` f16, half the bytes).
                unsafe { $widen($load_halves(at.cast())) }
            }

            #[inline(always)]
            unsafe fn store(self, at: *mut f32) {
                // SAFETY: as in `splat`.
                unsafe { $store(at, self) }
            }
        }
    };
}
pub(super) use f32_vector;
