//! Row-times-vector dot products on quantized weights, with a portable path
//! and an x86_64 AVX2 + FMA path chosen at run time.
//!
//! Quantized rows are multiplied with activations quantized to [`Q8Block`]s:
//! the per-block products are exact integer sums, scaled by `d_w * d_x` (plus
//! `m_w * sum_x` for Q4_1). The two paths compute the same integer sums and
//! differ only in the order of the f32 accumulation. Float rows (F32, F16,
//! BF16) are multiplied with the f32 activations directly.

use super::GgmlType;
use super::activation::Q8Block;

pub(crate) mod portable;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

/// Which implementation of the dot products to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    /// Plain Rust, for every target; the reference for the SIMD path.
    Portable,
    /// x86_64 AVX2 + FMA + F16C intrinsics (Haswell and later).
    Avx2,
}

impl Kernel {
    /// The fastest kernel this CPU supports.
    pub fn detect() -> Kernel {
        if Kernel::Avx2.is_available() {
            Kernel::Avx2
        } else {
            Kernel::Portable
        }
    }

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Portable => true,
            Kernel::Avx2 => avx2_available(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}

/// A kernel whose availability on this CPU has been checked: the only way to
/// reach the `unsafe` SIMD functions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dispatch {
    kernel: Kernel,
}

impl Dispatch {
    /// The portable kernel, available everywhere.
    pub const PORTABLE: Dispatch = Dispatch {
        kernel: Kernel::Portable,
    };

    /// `Some` if the CPU supports `kernel`.
    pub fn new(kernel: Kernel) -> Option<Dispatch> {
        kernel.is_available().then_some(Dispatch { kernel })
    }

    /// Dot product of one weight row (`row`, stored as `ty`) with the activations:
    /// `x` for float types, `xq` (the same activations quantized) for quantized types.
    ///
    /// Lengths are the caller's contract: `row` holds `x.len()` weights and
    /// `xq.len() * 32 == x.len()` for quantized types. Shorter inputs are
    /// truncated to the shortest, never read out of bounds.
    #[inline]
    pub fn dot_row(self, ty: GgmlType, row: &[u8], x: &[f32], xq: &[Q8Block]) -> f32 {
        match self.kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                // SAFETY: a `Dispatch` holding `Kernel::Avx2` is only built after
                // `is_available` confirmed avx2, fma and f16c on this CPU.
                unsafe {
                    match ty {
                        GgmlType::Q4_0 => avx2::dot_q4_0(row, [xq])[0],
                        GgmlType::Q4_1 => avx2::dot_q4_1(row, [xq])[0],
                        GgmlType::Q8_0 => avx2::dot_q8_0(row, [xq])[0],
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
    /// `row_bytes` long, `out.len() / n` of them) and `n` inputs: input `i`
    /// is `xs[i * n_cols..][..n_cols]` for float types and
    /// `xq[i * n_blocks..][..n_blocks]` (`n_blocks = n_cols / 32`) for
    /// quantized ones. The SIMD path runs the whole loop inside one
    /// target-feature function and unpacks each weight block once for up to
    /// [`BATCH`] inputs. Every result has the same bits as
    /// [`Dispatch::dot_row`] on its row and input alone; inputs missing from
    /// `xs` or `xq` count as empty.
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
        let n_blocks = n_cols / super::QK;
        #[cfg(target_arch = "x86_64")]
        if self.kernel == Kernel::Avx2 && ty.is_quantized() {
            // SAFETY: a `Dispatch` holding `Kernel::Avx2` is only built after
            // `is_available` confirmed avx2, fma and f16c.
            unsafe { avx2::dot_rows(ty, rows, row_bytes, xq, n_blocks, n, out) };
            return;
        }
        for (row, results) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
            for (i, o) in results.iter_mut().enumerate() {
                *o = self.dot_row(ty, row, input(xs, i, n_cols), input(xq, i, n_blocks));
            }
        }
    }
}

/// Input `i` of consecutive inputs `len` long, empty if `all` is too short.
pub(crate) fn input<T>(all: &[T], i: usize, len: usize) -> &[T] {
    all.get(i * len..)
        .and_then(|rest| rest.get(..len))
        .unwrap_or(&[])
}

/// Inputs that share one unpacking of a weight block in [`Dispatch::dot_rows`].
pub(crate) const BATCH: usize = 4;
