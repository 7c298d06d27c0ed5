//! Products of weights packed in panels of 16 rows
//! ([`crate::quant::packed`]) with activations quantized to 32-value
//! blocks: the portable reference, the AVX2 kernel (with AVX-VNNI's
//! `vpdpbusd` where the CPU has it) and the AVX-512 VNNI kernel, with the
//! same bits (the arithmetic is stated in `quant/packed.rs`).
//!
//! A product tiles its inputs by up to [`MAX_TILE`] (four on AVX2): each block of a panel
//! is unpacked once per tile, into vectors whose lanes are the panel's rows,
//! and every input of the tile multiplies the same vectors, so unpacking
//! costs a fraction of the products and the f32 work is one conversion and
//! one fused multiply-add per block for sixteen rows.

use crate::kernels::dispatch::{Dispatch, Kernel};
use crate::quant::GgmlType;
use crate::quant::activation::{Q8Block, Q8KBlock};
use crate::quant::packed::PANEL_ROWS;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_k;
mod portable;
mod portable_k;

/// One panel product's operands: the panels (each `n_blocks` blocks of a
/// packed type) and `n` inputs, input `i` being `xq[i * n_blocks..][..n_blocks]`.
#[derive(Clone, Copy)]
pub(crate) struct PanelProduct<'a, A> {
    /// Whole panels.
    pub panels: &'a [u8],
    /// Blocks per row (and per input).
    pub n_blocks: usize,
    /// The inputs' activation blocks.
    pub xq: &'a [A],
    /// Each input block's `Σ qs` (32-weight types; empty for Q8_K blocks,
    /// which hold their sums).
    pub sums: &'a [i32],
    /// How many inputs.
    pub n: usize,
}

impl<'a, A> PanelProduct<'a, A> {
    /// Calls `tile(panel, part, out)` for each panel (`panel_bytes` long)
    /// and each of the fewest balanced tiles of at most `max_tile` inputs
    /// (sizes `floor((n + k) / n_tiles)`, which sum to `n` and differ by at
    /// most one, so no input is multiplied alone when `n > 1`): `part` is
    /// the tile's inputs (its `n` the tile's size) and `out` its results,
    /// `part.n * 16` values. The loop every panel kernel runs.
    #[inline(always)]
    pub(crate) fn each_tile(
        self,
        panel_bytes: usize,
        max_tile: usize,
        out: &mut [f32],
        mut tile: impl FnMut(&'a [u8], PanelProduct<'a, A>, &mut [f32]),
    ) {
        let PanelProduct {
            panels,
            n_blocks,
            xq,
            sums,
            n,
        } = self;
        let n_tiles = n.div_ceil(max_tile);
        for (panel, out) in panels
            .chunks_exact(panel_bytes)
            .zip(out.chunks_exact_mut(n * PANEL_ROWS))
        {
            let mut start = 0;
            for k in 0..n_tiles {
                let size = (n + k) / n_tiles;
                let inputs = start * n_blocks..(start + size) * n_blocks;
                let part = PanelProduct {
                    panels: panel,
                    n_blocks,
                    xq: &xq[inputs.clone()],
                    sums: sums.get(inputs).unwrap_or(&[]),
                    n: size,
                };
                tile(
                    panel,
                    part,
                    &mut out[start * PANEL_ROWS..][..size * PANEL_ROWS],
                );
                start += size;
            }
        }
    }
}

/// The most inputs that share one unpacking of a panel's block: eight
/// inputs' accumulators and the block's eight vectors of weights fit
/// AVX-512's 32 registers with room for the scales.
pub(crate) const MAX_TILE: usize = 8;

impl Dispatch {
    /// `out[(p * n + i) * 16 + l] = row (16 p + l) · input i` for the panels
    /// of `panels` (each `n_blocks` blocks of `ty`) and `n` inputs, input
    /// `i` being `xq[i * n_blocks..][..n_blocks]` and `sums` its blocks'
    /// sums of quantized values (`Σ qs`, same indexing).
    ///
    /// Lengths are the caller's contract, checked in debug builds.
    pub(crate) fn dot_panels(
        self,
        ty: GgmlType,
        product: PanelProduct<'_, Q8Block>,
        out: &mut [f32],
    ) {
        let PanelProduct {
            panels,
            n_blocks,
            xq,
            sums,
            n,
        } = product;
        let panel_bytes = PANEL_ROWS * n_blocks * ty.block_bytes();
        debug_assert!(panel_bytes > 0 && panels.len().is_multiple_of(panel_bytes));
        debug_assert_eq!(out.len(), panels.len() / panel_bytes * n * PANEL_ROWS);
        debug_assert_eq!((xq.len(), sums.len()), (n * n_blocks, n * n_blocks));
        match self.kernel() {
            // SAFETY: a `Dispatch` holds the AVX-512 kernel only on a CPU
            // with avx512f/bw/vl/vnni (and avx2, fma, f16c): `Kernel::runs_on`.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { avx512::dot_panels(ty, product, out) },
            // SAFETY: a `Dispatch` holds these kernels only on a CPU with
            // avx2, fma and f16c (and avxvnni for AvxVnni): `Kernel::runs_on`.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::dot_panels(ty, product, out) },
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => unsafe { avx2::dot_panels_vnni(ty, product, out) },
            _ => portable::dot_panels(ty, product, out),
        }
    }

    /// [`Dispatch::dot_panels`] for Q4_K and Q6_K panels
    /// ([`crate::quant::packed_k`]) with Q8_K inputs (`xq[i * n_blocks..]`
    /// is input `i`; their sums are in the blocks).
    pub(crate) fn dot_panels_k(
        self,
        ty: GgmlType,
        product: PanelProduct<'_, Q8KBlock>,
        out: &mut [f32],
    ) {
        let PanelProduct {
            panels,
            n_blocks,
            xq,
            n,
            ..
        } = product;
        let panel_bytes = PANEL_ROWS * n_blocks * ty.block_bytes();
        debug_assert!(panel_bytes > 0 && panels.len().is_multiple_of(panel_bytes));
        debug_assert_eq!(out.len(), panels.len() / panel_bytes * n * PANEL_ROWS);
        debug_assert_eq!(xq.len(), n * n_blocks);
        match self.kernel() {
            // SAFETY: as for `dot_panels`.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { avx512_k::dot_panels_k(ty, product, out) },
            _ => portable_k::dot_panels_k(ty, product, out),
        }
    }
}
