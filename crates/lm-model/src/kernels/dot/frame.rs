//! The frame every SIMD dot kernel runs in, whatever its instruction set:
//! the rows of a batched product ([`Batch`]), the loop over rows and
//! groups of inputs ([`each_row_and_input`]), what a kernel supplies to it
//! ([`BlockKernel`]), and the table from a type to its kernel
//! ([`with_block_type!`], [`with_super_block_type!`], [`type_of_id`]).
//!
//! Nothing here has target features of its own: it is all inlined into a
//! kernel's `#[target_feature]` entry, and compiled with that entry's
//! instruction set. A [`BlockKernel`]'s methods are `unsafe`: they are sound
//! only on a CPU with the kernel's instruction set, which only a
//! [`Dispatch`](crate::kernels::dispatch::Dispatch) has checked.

use std::cell::Cell;

use crate::quant::{GgmlType, SUPPORTED_TYPES};

/// The most inputs that share one unpacking of a weight block, on every
/// kernel: four. AVX2's sixteen registers hold four inputs' accumulators and
/// activations beside the unpacked block; on AVX-512 groups of eight were
/// slower at every n (docs/performance-log.md, "Short batches").
pub(crate) const MAX_BATCH: usize = 4;
const _: () = assert!(
    MAX_BATCH == 4,
    "`BlockKernel::dot_group` lists the widths 1 to 4"
);

/// Input `i` of consecutive inputs `len` long.
pub(crate) fn input<T>(all: &[T], i: usize, len: usize) -> &[T] {
    &all[i * len..][..len]
}

/// The weight rows of one batched product and the shape of its inputs.
#[derive(Clone, Copy)]
pub(crate) struct Batch<'a> {
    /// Whole rows, `row_bytes` each.
    pub rows: &'a [u8],
    /// The bytes of one row.
    pub row_bytes: usize,
    /// The blocks of one input (as many as a row's weight blocks).
    pub n_blocks: usize,
    /// How many inputs, one after the other.
    pub n: usize,
}

/// `out[r * n + i] = row r · input i` for the rows of `batch` and its `n`
/// inputs (input `i` is `xq[i * n_blocks..][..n_blocks]`), by `kernel`: the
/// `n` inputs split into the fewest groups of at most [`MAX_BATCH`], of
/// balanced sizes (9 inputs are groups of 3, 3 and 3), so one unpacking of
/// each weight block serves every input of a group and no input is
/// multiplied alone when `n > 1`. Groups are the outer loop
/// and rows the inner one, two at a time: a group's activations (and what
/// [`BlockKernel::prepare_group`] derives from them) stay in L1 across the
/// rows, which are few (a rayon task's).
///
/// # Safety
/// As [`BlockKernel`]'s methods: the CPU supports the kernel's instruction
/// set (and the caller, a `#[target_feature]` entry, is compiled with it).
#[inline(always)]
pub(super) unsafe fn each_row_and_input<A, K: BlockKernel<A>>(
    batch: Batch<'_>,
    xq: &[A],
    out: &mut [f32],
    kernel: K,
) {
    let Batch {
        rows,
        row_bytes,
        n_blocks,
        n,
    } = batch;
    if n == 1 {
        for (row, result) in rows.chunks_exact(row_bytes).zip(out.iter_mut()) {
            // SAFETY: the caller's contract.
            *result = unsafe { kernel.dot_one(row, xq) };
        }
        return;
    }
    let n_groups = n.div_ceil(MAX_BATCH);
    let mut group: [&[A]; MAX_BATCH] = [&[]; MAX_BATCH];
    // Taken and put back rather than borrowed inside `with`: a closure is
    // compiled without this function's target features.
    let mut shared = GROUP_SCRATCH.take();
    let mut start = 0;
    for group_idx in 0..n_groups {
        // Sizes floor((n + g) / n_groups) sum to n and differ by at most one.
        let size = (n + group_idx) / n_groups;
        for (k, x) in group[..size].iter_mut().enumerate() {
            *x = input(xq, start + k, n_blocks);
        }
        let group = &group[..size];
        // SAFETY: the caller's contract.
        unsafe { kernel.prepare_group(group, &mut shared) };
        let mut row_pairs = rows.chunks_exact(2 * row_bytes);
        let mut out_pairs = out.chunks_exact_mut(2 * n);
        for (rows, results) in (&mut row_pairs).zip(&mut out_pairs) {
            let (row0, row1) = rows.split_at(row_bytes);
            let (out0, out1) = results.split_at_mut(n);
            let out = [
                &mut out0[start..start + size],
                &mut out1[start..start + size],
            ];
            // SAFETY: as above.
            unsafe { kernel.dot_group_two_rows([row0, row1], group, &shared, out) };
        }
        let last_row = row_pairs.remainder();
        if !last_row.is_empty() {
            let results = &mut out_pairs.into_remainder()[start..start + size];
            // SAFETY: as above.
            unsafe { kernel.dot_group(last_row, group, &shared, results) };
        }
        start += size;
    }
    GROUP_SCRATCH.set(shared);
}

/// The inputs of one product of a row with a group (see
/// [`BlockKernel::dot`]), and what [`BlockKernel::prepare_group`] derived
/// from them.
#[derive(Clone, Copy)]
pub(super) struct Group<'a, A, const N: usize> {
    /// Each input's activation blocks, as many as the row's.
    pub inputs: [&'a [A]; N],
    /// Per block, what `prepare_group` derived for this group (the AVX2
    /// 32-weight types with a minimum: the inputs' `sum_x` side by side);
    /// empty otherwise, and for one input alone.
    pub shared: &'a [Shared],
}

/// Per weight block, a value for each input of a group that
/// [`BlockKernel::prepare_group`] derives once for every row.
pub(super) type Shared = [f32; MAX_BATCH];

thread_local! {
    /// The buffer [`BlockKernel::prepare_group`] fills, reused across calls
    /// so that steady-state products do not allocate.
    static GROUP_SCRATCH: Cell<Vec<Shared>> = const { Cell::new(Vec::new()) };
}

/// The body of a [`BlockKernel::dot_group`]: runs `$body` with `$x` the
/// group as an array of `N` inputs, for `N` the group's size among the
/// widths listed (1 to [`MAX_BATCH`]), so that `$body` can call a
/// kernel generic over `N`.
macro_rules! dot_group_of_widths {
    ($xq:ident, |$x:ident: N| $body:expr; $($n:literal)+) => {
        match $xq.len() {
            $($n => {
                let $x: [_; $n] = std::array::from_fn(|k| $xq[k]);
                $body
            })+
            size => unreachable!("a group of {size} inputs"),
        }
    };
}
pub(super) use dot_group_of_widths;

/// A quantized dot kernel on activation blocks `A`, for
/// [`each_row_and_input`]: its products of one row (or two) with a group of
/// inputs, all of them inlined into the kernel's `#[target_feature]` entry
/// (a method compiled on its own lacks the entry's target features, and its
/// intrinsics become calls, twenty times slower).
///
/// # Safety
/// Every method requires a CPU with the kernel's instruction set: the
/// features its entry enables, which a [`Dispatch`] checked before it chose
/// the entry.
///
/// [`Dispatch`]: crate::kernels::dispatch::Dispatch
pub(super) trait BlockKernel<A> {
    /// `row · group.inputs[i]` for each of `N` inputs (1 to
    /// [`MAX_BATCH`]), each with the bits of its product alone.
    ///
    /// # Safety
    /// See [`BlockKernel`].
    unsafe fn dot<const N: usize>(&self, row: &[u8], group: Group<'_, A, N>) -> [f32; N];

    /// Fills `shared` with per-block values of a group's inputs that every
    /// row's [`BlockKernel::dot`] reads (for the AVX2 32-weight types with a
    /// minimum, each block's activation sums side by side, one load for the
    /// whole group). Nothing by default.
    ///
    /// # Safety
    /// See [`BlockKernel`].
    #[inline(always)]
    unsafe fn prepare_group(&self, _xq: &[&[A]], _shared: &mut Vec<Shared>) {}

    /// `out[i] = row · xq[i]` for 1 to [`MAX_BATCH`] inputs: the
    /// group's size made a constant for [`BlockKernel::dot`].
    ///
    /// # Safety
    /// See [`BlockKernel`].
    #[inline(always)]
    unsafe fn dot_group(&self, row: &[u8], xq: &[&[A]], shared: &[Shared], out: &mut [f32]) {
        // SAFETY: the caller's contract.
        dot_group_of_widths!(xq, |x: N| out.copy_from_slice(&unsafe { self.dot(row, Group { inputs: x, shared }) }); 1 2 3 4)
    }

    /// [`BlockKernel::dot_group`] of two rows, `out[r]` for `rows[r]`, with
    /// the same bits. By default one row after the other; a kernel with the
    /// registers for both rows' accumulators loads each input's blocks once
    /// for the two.
    ///
    /// # Safety
    /// See [`BlockKernel`].
    #[inline(always)]
    unsafe fn dot_group_two_rows(
        &self,
        [row0, row1]: [&[u8]; 2],
        xq: &[&[A]],
        shared: &[Shared],
        [out0, out1]: [&mut [f32]; 2],
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            self.dot_group(row0, xq, shared, out0);
            self.dot_group(row1, xq, shared, out1);
        }
    }

    /// `row · xq` for one input (a decode step's product). The AVX-512 and
    /// K-quant kernels call an out-of-line function here: inlined into the
    /// loop beside every batch width, the one-input product ran at half
    /// speed (`benches/alpha`).
    ///
    /// # Safety
    /// See [`BlockKernel`].
    #[inline(always)]
    unsafe fn dot_one(&self, row: &[u8], xq: &[A]) -> f32 {
        // SAFETY: the caller's contract.
        let alone = Group {
            inputs: [xq],
            shared: &[],
        };
        let [result] = unsafe { self.dot(row, alone) };
        result
    }
}

/// The supported type whose GGML id is `id`: a kernel's constant parameter
/// (a type cannot be one) turned back into its type in a `const` block, so
/// that the per-type branches fold away.
pub(super) const fn type_of_id(id: u32) -> GgmlType {
    let mut k = 0;
    while k < SUPPORTED_TYPES.len() {
        if SUPPORTED_TYPES[k] as u32 == id {
            return SUPPORTED_TYPES[k];
        }
        k += 1;
    }
    panic!("not a supported type id")
}

/// `$body` with the constant `$id` the GGML id of `$ty`, one of the listed
/// types (a kernel generic over the id is one kernel per type).
macro_rules! with_type_id {
    ($ty:expr, [$($name:ident)+], |$id:ident| $body:expr) => {
        match $ty {
            $($crate::quant::GgmlType::$name => {
                const $id: u32 = $crate::quant::GgmlType::$name as u32;
                $body
            })+
            ty => unreachable!("{ty} has no kernel of this family"),
        }
    };
}

/// `$body` with `$id` the GGML id of `$ty`, a 32-weight block type (the
/// types multiplied with `Q8Block`s): the one list of them for every
/// instruction set.
macro_rules! with_block_type {
    ($ty:expr, |$id:ident| $body:expr) => {
        $crate::kernels::dot::frame::with_type_id!($ty, [Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL], |$id| $body)
    };
}

/// `$body` with `$id` the GGML id of `$ty`, a super-block type (the
/// K-quants and IQ4_XS, multiplied with `Q8KBlock`s): the one list of them
/// for every instruction set.
macro_rules! with_super_block_type {
    ($ty:expr, |$id:ident| $body:expr) => {
        $crate::kernels::dot::frame::with_type_id!($ty, [Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS], |$id| $body)
    };
}
#[allow(unused_imports)] // used only on x86_64
pub(super) use {with_block_type, with_super_block_type, with_type_id};
