//! Weights repacked into panels of [`PANEL_ROWS`] rows, so that one SIMD
//! lane holds one output row and a product's f32 work is shared by all of
//! them (llama.cpp's `Q4_0_8x8` repacking and oneDNN's blocked formats do
//! the same).
//!
//! ```text
//! row-major (GGUF):  row r: | d q[0..16] | d q[0..16] | ...      (Q4_0, 18-byte blocks)
//!
//! packed, panel p (rows 16p .. 16p + 16), then panel p + 1, ...:
//!   block b: | d of rows 0..16 (16 x f16) |
//!            | chunk 0: q[0..4] of row 0, q[0..4] of row 1, ... of row 15 |  64 bytes
//!            | chunk 1: q[4..8] of each row                               |
//!            | ...  (a block's quant bytes / 4 chunks: 4 for Q4_0, 8 for Q8_0)
//!   block b + 1: ...
//! ```
//!
//! A panel holds the same bytes as its 16 rows did, in the same place: a
//! matrix is packed in place, and its size does not change. A product reads
//! one chunk as 16 lanes of four bytes, one row's four weights per lane,
//! and `vpdpbusd` multiplies them with four bytes of the input broadcast to
//! every lane; each lane then holds one row's integer sum over the block,
//! and one conversion, one scale product and one fused multiply-add per
//! block finish sixteen rows at once. The row-major kernels pay those per
//! row and add a horizontal sum at the end, which made prefill of a 1B
//! model compute-bound at about 0.6x llama.cpp's speed.
//!
//! Every kernel computes, for row `r` and input `x`, over the blocks `b` in
//! order, `acc = fma(d_w[r, b] * d_x[b], s[r, b] as f32, acc)` from `acc =
//! 0`, where `s = Σ_j q_w[j] q_x[j]` is the block's exact integer sum: the
//! same bits on every path and for any number of inputs, so a prefill and
//! the decode steps that read the same tokens agree exactly.

use super::block::QK;
use super::{GgmlType, packed_k};
use crate::kernels::dispatch::{Dispatch, Kernel};

/// Rows per panel: one 512-bit vector of i32 or f32 lanes.
pub(crate) const PANEL_ROWS: usize = 16;

/// Bytes per lane of a chunk: the four weights one `vpdpbusd` lane sums.
pub(crate) const LANE_BYTES: usize = 4;

/// Bytes of one chunk: four weights of every row of a panel.
pub(crate) const CHUNK_BYTES: usize = PANEL_ROWS * LANE_BYTES;

/// Bytes of a panel's scales for one block (16 f16 values).
pub(crate) const SCALE_BYTES: usize = PANEL_ROWS * 2;

/// Whether a matrix of `ty` with `n_rows` rows is multiplied in panels: the
/// 32-weight types without a minimum whose blocks are an f16 scale and
/// quant bytes (Q4_0, Q8_0), and Q4_K and Q6_K where their AVX-512 kernel
/// runs ([`packed_k`](super::packed_k)), in whole panels.
pub(crate) fn packs(ty: GgmlType, n_rows: usize) -> bool {
    let k_panels = || Dispatch::detect().kernel() == Kernel::Avx512;
    (matches!(ty, GgmlType::Q4_0 | GgmlType::Q8_0) || (packed_k::packs_k(ty) && k_panels()))
        && n_rows > 0
        && n_rows.is_multiple_of(PANEL_ROWS)
}

/// The quant bytes of one block of `ty` (after its f16 scale).
pub(crate) fn quant_bytes(ty: GgmlType) -> usize {
    ty.block_bytes() - 2
}

/// Repacks `data`, `n_rows` rows of `row_bytes` each stored as `ty` (which
/// [`packs`]), into panels, in place. `scratch` holds a copy of one panel
/// at a time.
pub(crate) fn pack_in_place(
    ty: GgmlType,
    data: &mut [u8],
    row_bytes: usize,
    scratch: &mut Vec<u8>,
) {
    debug_assert!(packs(ty, data.len() / row_bytes.max(1)));
    let block_bytes = ty.block_bytes();
    let n_blocks = row_bytes / block_bytes;
    for panel in data.chunks_exact_mut(PANEL_ROWS * row_bytes) {
        scratch.clear();
        scratch.extend_from_slice(panel);
        for b in 0..n_blocks {
            let record = &mut panel[b * PANEL_ROWS * block_bytes..][..PANEL_ROWS * block_bytes];
            for r in 0..PANEL_ROWS {
                let block = &scratch[r * row_bytes + b * block_bytes..][..block_bytes];
                each_run(ty, r, |at, from, n| {
                    record[at..at + n].copy_from_slice(&block[from..from + n]);
                });
            }
        }
    }
}

/// Block `b` of row `row_idx` of a packed matrix (`row_bytes` per row in
/// the row-major layout) back in GGUF's layout, into `block`
/// (`ty.block_bytes()` long).
pub(crate) fn unpack_block(
    ty: GgmlType,
    data: &[u8],
    row_bytes: usize,
    row_idx: usize,
    b: usize,
    block: &mut [u8],
) {
    let block_bytes = ty.block_bytes();
    let panel = &data[row_idx / PANEL_ROWS * PANEL_ROWS * row_bytes..];
    let record = &panel[b * PANEL_ROWS * block_bytes..][..PANEL_ROWS * block_bytes];
    each_run(ty, row_idx % PANEL_ROWS, |at, to, n| {
        block[to..to + n].copy_from_slice(&record[at..at + n]);
    });
}

/// Calls `f(record_at, block_at, n)` for every run of `n` bytes that moves
/// between row `r`'s GGUF block of `ty` (from `block_at`) and its panel's
/// record (from `record_at`): packing and unpacking are this one map, read
/// one way or the other. The 32-weight types' scale, then their lanes of
/// four quant bytes; the K-quants' pieces ([`packed_k`]).
#[inline]
fn each_run(ty: GgmlType, r: usize, mut f: impl FnMut(usize, usize, usize)) {
    if packed_k::packs_k(ty) {
        return packed_k::each_piece(ty, r, f);
    }
    f(2 * r, 0, 2);
    for c in 0..quant_bytes(ty) / LANE_BYTES {
        f(
            SCALE_BYTES + c * CHUNK_BYTES + r * LANE_BYTES,
            2 + c * LANE_BYTES,
            LANE_BYTES,
        );
    }
}

/// The integer weight `j` (0..32) of a block's quant bytes `q` of `ty`, and
/// the offset subtracted from its unsigned form: Q4_0 stores `nibble - 8`
/// (weights 0..16 in the low nibbles, 16..32 in the high ones), Q8_0 the
/// signed byte.
#[inline(always)]
pub(crate) fn weight(ty: GgmlType, q: &[u8], j: usize) -> i32 {
    match ty {
        GgmlType::Q4_0 => i32::from((q[j % (QK / 2)] >> (4 * (j / (QK / 2)))) & 0x0F) - 8,
        GgmlType::Q8_0 => i32::from(q[j] as i8),
        _ => unreachable!("{ty} is not packed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_moves_every_byte_and_unpacking_restores_each_block() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let (n_rows, n_blocks) = (32, 3);
            let row_bytes = n_blocks * ty.block_bytes();
            let original: Vec<u8> = (0..n_rows * row_bytes)
                .map(|i| (i * 7 % 251) as u8)
                .collect();
            let mut packed = original.clone();
            pack_in_place(ty, &mut packed, row_bytes, &mut Vec::new());
            assert_ne!(packed, original);
            let (mut sorted_a, mut sorted_b) = (original.clone(), packed.clone());
            sorted_a.sort_unstable();
            sorted_b.sort_unstable();
            assert_eq!(sorted_a, sorted_b, "a permutation of the bytes");
            let mut block = vec![0; ty.block_bytes()];
            for row in 0..n_rows {
                for b in 0..n_blocks {
                    unpack_block(ty, &packed, row_bytes, row, b, &mut block);
                    let start = row * row_bytes + b * ty.block_bytes();
                    assert_eq!(block, original[start..start + ty.block_bytes()]);
                }
            }
        }
    }

    #[test]
    fn weights_read_as_ggml_defines_them() {
        let mut q = [0u8; 16];
        q[0] = 0xA3; // weight 0 = 3 - 8, weight 16 = 10 - 8
        assert_eq!(weight(GgmlType::Q4_0, &q, 0), -5);
        assert_eq!(weight(GgmlType::Q4_0, &q, 16), 2);
        assert_eq!(weight(GgmlType::Q8_0, &[0xFF; 32], 5), -1);
    }

    #[test]
    fn only_whole_panels_of_the_scale_only_types_pack() {
        assert!(packs(GgmlType::Q4_0, 2048));
        assert!(packs(GgmlType::Q8_0, 16));
        assert!(!packs(GgmlType::Q4_0, 8));
        assert!(!packs(GgmlType::Q4_1, 2048));
        assert!(!packs(GgmlType::Q2_K, 2048));
    }
}
