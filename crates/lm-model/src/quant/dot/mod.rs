//! Row-times-vector dot products on quantized weights, with a portable path
//! and the x86_64 paths chosen at run time ([`Kernel`]): AVX2 + FMA (`avx2`,
//! `avx2_k`), the same with AVX-VNNI's byte products (`avx2`'s `_vnni`
//! entries), and AVX-512 with VNNI (`avx512`, `avx512_k`).
//!
//! Quantized rows are multiplied with activations quantized to 8-bit blocks
//! of their family (`Q8Block`s of 32 for the 32-weight types, `Q8KBlock`s of
//! 256 for the K-quants, whose kernels are in the `*_k` modules): the
//! per-block products are exact integer sums, scaled by `d_w * d_x` (plus
//! `m_w * sum_x` for Q4_1 and Q5_1, and the group offsets of the K-quants).
//! All paths compute the same integer sums and the same f32 operations on
//! them in the same order (eight lanes of fused multiply-adds, summed as the
//! AVX2 kernel's `horizontal_sum` sums them), so every path, the portable
//! one included, gives the same bits, and a model's numbers do not depend
//! on the machine. Float rows (F32, F16, BF16) are multiplied with the f32
//! activations directly (by the AVX2 kernel on every SIMD path).

use super::GgmlType;
use super::activation::Activations;

pub(crate) mod portable;
pub(crate) mod portable_k;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_k;

use crate::dispatch::{Dispatch, Kernel};

impl Dispatch {
    /// Dot product of one weight row (`row`, stored as `ty`) with the
    /// activations `x`, in the form `ty.activation_kind()` names (f32 values
    /// for float types, 8-bit blocks of its family for quantized ones).
    ///
    /// Lengths and kinds are the caller's contract, checked in debug builds:
    /// `row` holds as many weights as `x` holds values, and `x` is of the
    /// kind `ty` multiplies with ([`QMatrix`](super::QMatrix) checks shapes
    /// at its boundary and quantizes by the type).
    #[inline]
    pub fn dot_row(self, ty: GgmlType, row: &[u8], x: Activations<'_>) -> f32 {
        debug_assert_eq!(row.len(), row_len(ty, x), "{ty} row length");
        match (self.kernel(), x) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY (each arm): a `Dispatch` holds a SIMD kernel only after
            // `lm_core::cpu` detected the features it requires (avx2, fma
            // and f16c for all of them; avxvnni, or avx512f/bw/vl/vnni, for
            // the wider ones: `Kernel::runs_on`).
            (Kernel::Avx2 | Kernel::AvxVnni | Kernel::Avx512, Activations::F32(x)) => unsafe {
                match ty {
                    GgmlType::F32 => avx2::dot_f32(row, x),
                    GgmlType::F16 => avx2::dot_f16(row, x),
                    GgmlType::BF16 => avx2::dot_bf16(row, x),
                    _ => unreachable!("{ty} does not multiply f32 activations"),
                }
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2, Activations::Q8(xq)) => unsafe { avx2::dot_row(ty, row, xq) },
            #[cfg(target_arch = "x86_64")]
            (Kernel::AvxVnni, Activations::Q8(xq)) => unsafe { avx2::dot_row_vnni(ty, row, xq) },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Activations::Q8(xq)) => unsafe { avx512::dot_row(ty, row, xq) },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2 | Kernel::AvxVnni, Activations::Q8K(xq)) => unsafe {
                avx2_k::dot_row(ty, row, xq)
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Activations::Q8K(xq)) => unsafe { avx512_k::dot_row(ty, row, xq) },
            _ => portable::dot_row(ty, row, x),
        }
    }

    /// `out[r * n + i] = row r · input i` for the rows of `rows` (each
    /// `row_bytes` long) and `n` inputs: input `i` is the `i`-th run of
    /// `n_cols` values (f32 values or their blocks) in `x`. The SIMD path runs
    /// the whole loop inside one target-feature function and unpacks each
    /// weight block once for a group of up to [`MAX_BATCH`] inputs (the
    /// inputs split into balanced groups, none alone when `n > 1`). Every
    /// result has the same bits as [`Dispatch::dot_row`] on its row and
    /// input alone.
    ///
    /// Lengths are the caller's contract, checked in debug builds: `rows`
    /// is whole rows, `out` holds `n` results per row, and `x` holds `n`
    /// inputs of the kind `ty` multiplies with.
    #[allow(clippy::too_many_arguments)] // the shape of a block product
    pub fn dot_rows(
        self,
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        n_cols: usize,
        x: Activations<'_>,
        n: usize,
        out: &mut [f32],
    ) {
        if row_bytes == 0 || n == 0 {
            out.fill(0.0);
            return;
        }
        let n_rows = rows.len() / row_bytes;
        debug_assert_eq!(rows.len(), n_rows * row_bytes, "whole rows");
        debug_assert_eq!(out.len(), n_rows * n, "one result per row and input");
        let n_blocks = n_cols / ty.block_size();
        match x {
            Activations::Q8(xq) => debug_assert_eq!(xq.len(), n * n_blocks, "quantized inputs"),
            Activations::Q8K(xq) => debug_assert_eq!(xq.len(), n * n_blocks, "quantized inputs"),
            Activations::F32(_) => {}
        }
        match (self.kernel(), x) {
            // SAFETY (each arm): as in `dot_row`, the kernel's features were
            // detected before this `Dispatch` was built.
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2, Activations::Q8(xq)) => unsafe {
                avx2::dot_rows(ty, rows, row_bytes, xq, n_blocks, n, out)
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::AvxVnni, Activations::Q8(xq)) => unsafe {
                avx2::dot_rows_vnni(ty, rows, row_bytes, xq, n_blocks, n, out)
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Activations::Q8(xq)) => unsafe {
                avx512::dot_rows(ty, rows, row_bytes, xq, n_blocks, n, out)
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2 | Kernel::AvxVnni, Activations::Q8K(xq)) => unsafe {
                avx2_k::dot_rows(ty, rows, row_bytes, xq, n_blocks, n, out)
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Activations::Q8K(xq)) => unsafe {
                avx512_k::dot_rows(ty, rows, row_bytes, xq, n_blocks, n, out)
            },
            _ => {
                for (row, results) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
                    for (i, o) in results.iter_mut().enumerate() {
                        *o = self.dot_row(ty, row, x.input(i, n_blocks));
                    }
                }
            }
        }
    }
}

/// The bytes of a row that multiplies `x`.
fn row_len(ty: GgmlType, x: Activations<'_>) -> usize {
    let n_blocks = match x {
        Activations::F32(x) => x.len(),
        Activations::Q8(xq) => xq.len(),
        Activations::Q8K(xq) => xq.len(),
    };
    n_blocks * ty.block_bytes()
}

impl<'a> Activations<'a> {
    /// Input `i` of consecutive inputs `n_blocks` blocks (or values) long.
    fn input(self, i: usize, n_blocks: usize) -> Activations<'a> {
        match self {
            Activations::F32(x) => Activations::F32(input(x, i, n_blocks)),
            Activations::Q8(xq) => Activations::Q8(input(xq, i, n_blocks)),
            Activations::Q8K(xq) => Activations::Q8K(input(xq, i, n_blocks)),
        }
    }
}

/// Input `i` of consecutive inputs `len` long.
pub(crate) fn input<T>(all: &[T], i: usize, len: usize) -> &[T] {
    &all[i * len..][..len]
}

/// The most inputs that share one unpacking of a weight block in
/// [`Dispatch::dot_rows`] on any kernel (each kernel's `BlockKernel::WIDTH`
/// is at most this; four on every path: eight on AVX-512 did not pay).
pub(crate) const MAX_BATCH: usize = 4;
