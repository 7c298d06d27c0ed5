//! Row-times-vector dot products on quantized weights, with a portable path
//! and the x86_64 paths chosen at run time ([`Kernel`]).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Dispatch::dot_rows`], the one way in: a kernel's entry per family |
//! | `frame.rs` | what every SIMD kernel shares: the loop over rows and groups of inputs, the `BlockKernel` trait, the type tables |
//! | `portable.rs`, `portable_k.rs` | plain Rust, the reference: 32-weight and float types, super-block types |
//! | `avx2.rs` | AVX2 + FMA (and AVX-VNNI's byte products): 32-weight and float types |
//! | `avx2_k.rs` | AVX2 + FMA: super-block types, and their f32 arithmetic that AVX-512 shares |
//! | `avx512.rs`, `avx512_k.rs` | AVX-512 with VNNI: 32-weight types, super-block types |
//!
//! Quantized rows are multiplied with activations quantized to 8-bit blocks
//! of their family (`Q8Block`s of 32 for the 32-weight types, `Q8KBlock`s of
//! 256 for the K-quants, whose kernels are in the `*_k` modules): the
//! per-block products are exact integer sums, scaled by `d_w * d_x` (plus
//! `m_w * sum_x` for Q4_1 and Q5_1, and the group offsets of the K-quants).
//! All paths compute the same integer sums and the same f32 operations on
//! them in the same order (eight lanes of fused multiply-adds, summed as the
//! AVX2 kernel's `horizontal_sum` sums them), so every path, the portable
//! one included, gives the same bits. Weights packed in panels
//! (`quant/packed.rs`, packed at load where the kernel has panel products:
//! AVX2, AVX-VNNI and AVX-512, unless `LM_PACK=0`) are multiplied by `kernels/panel` instead,
//! whose f32 sums run in another order: such a model's last bits differ
//! between a machine that packs and one that does not. Float rows (F32, F16, BF16) are multiplied with the f32
//! activations directly (by the AVX2 kernel on every SIMD path).

use crate::kernels::dispatch::{Dispatch, Kernel};
use crate::quant::GgmlType;
use crate::quant::activation::Activations;

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) mod frame;
mod mxfp4;
pub(crate) mod portable;
pub(crate) mod portable_k;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_k;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_k;

#[cfg(target_arch = "x86_64")]
use frame::Batch;
use frame::input;

impl Dispatch {
    /// `out[r * n + i] = row r · input i` for the rows of `rows` (each
    /// `row_bytes` long) and `n` inputs: input `i` is the `i`-th run of
    /// `n_cols` values (f32 values or their blocks) in `x`, in the form
    /// `ty.activation_kind()` names (f32 values for float types, 8-bit
    /// blocks of its family for quantized ones). The SIMD path runs the
    /// whole loop inside one target-feature function and unpacks each
    /// weight block once for a group of up to [`frame::MAX_BATCH`] inputs
    /// (the inputs split into balanced groups, none alone when `n > 1`).
    /// Every result has the same bits as the product of its row and input
    /// alone (`n = 1`).
    ///
    /// Lengths and kinds are the caller's contract, checked in debug
    /// builds: `rows` is whole rows, `out` holds `n` results per row, and
    /// `x` holds `n` inputs of the kind `ty` multiplies with
    /// ([`QMatrix`](crate::QMatrix) checks shapes at its boundary and
    /// quantizes by the type).
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
        if let (GgmlType::MXFP4, Activations::Q8(xq)) = (ty, x) {
            return mxfp4::dot_rows(self, rows, row_bytes, n_blocks, xq, n, out);
        }
        #[cfg(target_arch = "x86_64")]
        let batch = Batch {
            rows,
            row_bytes,
            n_blocks,
            n,
        };
        match (self.kernel(), x) {
            // SAFETY (each arm): a `Dispatch` holds a SIMD kernel only after
            // `lm_core::cpu` detected the features it requires (avx2, fma
            // and f16c for all of them; avxvnni, or avx512f/bw/vl/vnni, for
            // the wider ones: `Kernel::runs_on`).
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2, Activations::Q8(xq)) => unsafe { avx2::dot_rows(ty, batch, xq, out) },
            #[cfg(target_arch = "x86_64")]
            (Kernel::AvxVnni, Activations::Q8(xq)) => unsafe {
                avx2::dot_rows_vnni(ty, batch, xq, out)
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Activations::Q8(xq)) => unsafe {
                avx512::dot_rows(ty, batch, xq, out)
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2 | Kernel::AvxVnni, Activations::Q8K(xq)) => unsafe {
                avx2_k::dot_rows(ty, batch, xq, out)
            },
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Activations::Q8K(xq)) => unsafe {
                avx512_k::dot_rows(ty, batch, xq, out)
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

    /// One row (stored as `ty`) · one input `x`, for the products that have
    /// no SIMD loop of [`Dispatch::dot_rows`]: float rows with f32
    /// activations (the AVX2 kernel on every SIMD path), and every product
    /// on the portable kernel.
    #[inline]
    fn dot_row(self, ty: GgmlType, row: &[u8], x: Activations<'_>) -> f32 {
        debug_assert_eq!(row.len(), row_len(ty, x), "{ty} row length");
        match (self.kernel(), x) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `dot_rows`, every SIMD kernel's features (avx2,
            // fma and f16c among them) were detected before this `Dispatch`
            // was built.
            (Kernel::Avx2 | Kernel::AvxVnni | Kernel::Avx512, Activations::F32(x)) => unsafe {
                match ty {
                    GgmlType::F32 => avx2::dot_f32(row, x),
                    GgmlType::F16 => avx2::dot_f16(row, x),
                    GgmlType::BF16 => avx2::dot_bf16(row, x),
                    _ => unreachable!("{ty} does not multiply f32 activations"),
                }
            },
            _ => portable::dot_row(ty, row, x),
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
