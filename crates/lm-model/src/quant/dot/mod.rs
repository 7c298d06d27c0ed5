//! Row-times-vector dot products on quantized weights, with a portable path
//! and an x86_64 AVX2 + FMA path chosen at run time.
//!
//! Quantized rows are multiplied with activations quantized to [`Q8Block`]s:
//! the per-block products are exact integer sums, scaled by `d_w * d_x` (plus
//! `m_w * sum_x` for Q4_1 and Q5_1). The two paths compute the same integer sums and
//! differ only in the order of the f32 accumulation. Float rows (F32, F16,
//! BF16) are multiplied with the f32 activations directly.

use super::GgmlType;
use super::activation::Q8Block;

pub(crate) mod portable;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use crate::dispatch::{Dispatch, Kernel};

impl Dispatch {
    /// Dot product of one weight row (`row`, stored as `ty`) with the activations:
    /// `x` for float types, `xq` (the same activations quantized) for quantized types.
    ///
    /// Lengths are the caller's contract, checked in debug builds: `row`
    /// holds `x.len()` weights of a float type or `xq.len()` blocks of a
    /// quantized one ([`QMatrix`](super::QMatrix) checks shapes at its boundary).
    #[inline]
    pub fn dot_row(self, ty: GgmlType, row: &[u8], x: &[f32], xq: &[Q8Block]) -> f32 {
        debug_assert_eq!(row.len(), row_len(ty, x, xq), "{ty} row length");
        match self.kernel() {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                // SAFETY: a `Dispatch` holding `Kernel::Avx2` is only built after
                // `lm_core::cpu` detected avx2, fma and f16c on this CPU.
                unsafe {
                    match ty {
                        GgmlType::Q4_0 => avx2::dot_q4_0(row, [xq])[0],
                        GgmlType::Q4_1 => avx2::dot_q4_1(row, [xq])[0],
                        GgmlType::Q5_0 => avx2::dot_q5_0(row, [xq])[0],
                        GgmlType::Q5_1 => avx2::dot_q5_1(row, [xq])[0],
                        GgmlType::Q8_0 => avx2::dot_q8_0(row, [xq])[0],
                        GgmlType::IQ4_NL => avx2::dot_iq4_nl(row, [xq])[0],
                        GgmlType::F32 => avx2::dot_f32(row, x),
                        GgmlType::F16 => avx2::dot_f16(row, x),
                        GgmlType::BF16 => avx2::dot_bf16(row, x),
                    }
                }
            }
            _ => portable::dot_row(ty, row, x, xq),
        }
    }

    /// `out[r * n + i] = row r · input i` for the rows of `rows` (each
    /// `row_bytes` long) and `n` inputs: input `i` is
    /// `xs[i * n_cols..][..n_cols]` for float types and
    /// `xq[i * n_blocks..][..n_blocks]` (`n_blocks = n_cols / 32`) for
    /// quantized ones. The SIMD path runs the whole loop inside one
    /// target-feature function and unpacks each weight block once for up to
    /// [`BATCH`] inputs. Every result has the same bits as
    /// [`Dispatch::dot_row`] on its row and input alone.
    ///
    /// Lengths are the caller's contract, checked in debug builds: `rows`
    /// is whole rows, `out` holds `n` results per row, and `xs` (float
    /// types) or `xq` (quantized types) holds `n` inputs.
    #[allow(clippy::too_many_arguments)] // the shape of a block product
    pub fn dot_rows(
        self,
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        n_cols: usize,
        xs: &[f32],
        xq: &[Q8Block],
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
        if !ty.is_quantized() {
            debug_assert_eq!(xs.len(), n * n_cols, "float inputs");
            for (row, results) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
                for (o, x) in results.iter_mut().zip(xs.chunks_exact(n_cols)) {
                    *o = self.dot_row(ty, row, x, &[]);
                }
            }
            return;
        }
        let n_blocks = n_cols / super::QK;
        debug_assert_eq!(xq.len(), n * n_blocks, "quantized inputs");
        #[cfg(target_arch = "x86_64")]
        if self.kernel() == Kernel::Avx2 {
            // SAFETY: a `Dispatch` holding `Kernel::Avx2` is only built after
            // `lm_core::cpu` detected avx2, fma and f16c.
            unsafe { avx2::dot_rows(ty, rows, row_bytes, xq, n_blocks, n, out) };
            return;
        }
        for (row, results) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
            for (o, xq) in results.iter_mut().zip(xq.chunks_exact(n_blocks)) {
                *o = self.dot_row(ty, row, &[], xq);
            }
        }
    }
}

/// The bytes of a row that multiplies `x` (float types) or `xq` (quantized types).
fn row_len(ty: GgmlType, x: &[f32], xq: &[Q8Block]) -> usize {
    let n_blocks = if ty.is_quantized() { xq.len() } else { x.len() };
    n_blocks * ty.block_bytes()
}

/// Input `i` of consecutive inputs `len` long.
pub(crate) fn input<T>(all: &[T], i: usize, len: usize) -> &[T] {
    &all[i * len..][..len]
}

/// Inputs that share one unpacking of a weight block in [`Dispatch::dot_rows`].
pub(crate) const BATCH: usize = 4;
