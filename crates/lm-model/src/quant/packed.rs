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
//!            | m of rows 0..16 (16 x f16) |                            Q4_1 only
//!            | qh of rows 0..16 (16 x 4 bytes, bits spread, below)  |  Q5_0 only
//!            | chunk 0: q[0..4] of row 0, q[0..4] of row 1, ... of row 15 |  64 bytes
//!            | chunk 1: q[4..8] of each row                               |
//!            | ...  (a block's quant bytes / 4 chunks: 4 for the nibble types, 8 for Q8_0)
//!   block b + 1: ...
//! ```
//!
//! A panel holds the same bytes as its 16 rows did, in the same place: a
//! matrix is packed in place, and its size does not change (Q5_0's `qh`
//! words keep their bits, reordered: [`spread_high_bits`]). A product reads
//! one chunk as 16 lanes of four bytes, one row's four weights per lane,
//! and `vpdpbusd` multiplies them with four bytes of the input broadcast to
//! every lane; each lane then holds one row's integer sum over the block,
//! and one conversion, one scale product and one fused multiply-add per
//! block finish sixteen rows at once. The row-major kernels pay those per
//! row and add a horizontal sum at the end, which made prefill of a 1B
//! model compute-bound at about 0.6x llama.cpp's speed.
//!
//! Every kernel computes, for row `r` and input `x`, over the blocks `b` in
//! order, from `acc = 0`,
//!
//! ```text
//! acc = fma(d_w[r, b] * d_x[b], s[r, b] as f32, acc)
//! acc = fma(m_w[r, b], sum_x[b], acc)                 (Q4_1 only)
//! ```
//!
//! where `s = Σ_j q_w[j] q_x[j]` is the block's exact integer sum ([`weight`]
//! gives `q_w`) and `sum_x` the input block's `d_x Σ q_x` as stored
//! ([`Q8Block::sum`](super::activation::Q8Block)): the same bits on every
//! path and for any number of inputs, so a prefill and the decode steps
//! that read the same tokens agree exactly.

use rayon::prelude::*;

use super::block::QK;
use super::{GgmlType, QMatrix, QuantError, packed_k};
use crate::kernels::dispatch::Kernel;

/// Rows per panel: one 512-bit vector of i32 or f32 lanes.
pub(crate) const PANEL_ROWS: usize = 16;

/// Bytes per lane of a chunk: the four weights one `vpdpbusd` lane sums.
pub(crate) const LANE_BYTES: usize = 4;

/// Bytes of one chunk: four weights of every row of a panel.
pub(crate) const CHUNK_BYTES: usize = PANEL_ROWS * LANE_BYTES;

/// Bytes of a panel's scales for one block (16 f16 values).
pub(crate) const SCALE_BYTES: usize = PANEL_ROWS * 2;

/// Whether a matrix of `ty` with `n_rows` rows has a panel layout, in
/// whole panels: the 32-weight types Q4_0, Q4_1, Q5_0, Q8_0 and the
/// K-quants Q4_K, Q6_K ([`packed_k`](super::packed_k)), whatever the kernel.
pub(crate) fn has_panels(ty: GgmlType, n_rows: usize) -> bool {
    (fields(ty).is_some() || packed_k::packs_k(ty))
        && n_rows > 0
        && n_rows.is_multiple_of(PANEL_ROWS)
}

/// One field of a 32-weight GGUF block: `len` bytes at `at`, stored in a
/// panel's record as `len / piece` pieces of `piece` bytes, each piece for
/// the 16 rows in turn.
struct Field {
    at: usize,
    len: usize,
    piece: usize,
}

/// The f16 scale `d` (every type) or minimum `m` (Q4_1) at `at`.
const fn half_float(at: usize) -> Field {
    Field {
        at,
        len: 2,
        piece: 2,
    }
}

/// `len` quant (or `qh`) bytes at `at`, in chunks of four bytes a row.
const fn chunks(at: usize, len: usize) -> Field {
    Field {
        at,
        len,
        piece: LANE_BYTES,
    }
}

/// The fields of the 32-weight types that pack, in record order (GGUF's
/// order, `quant/block.rs`); `None` for the others.
fn fields(ty: GgmlType) -> Option<&'static [Field]> {
    const Q4_0: [Field; 2] = [half_float(0), chunks(2, 16)];
    const Q4_1: [Field; 3] = [half_float(0), half_float(2), chunks(4, 16)];
    const Q5_0: [Field; 3] = [half_float(0), chunks(2, 4), chunks(6, 16)];
    const Q8_0: [Field; 2] = [half_float(0), chunks(2, 32)];
    match ty {
        GgmlType::Q4_0 => Some(&Q4_0),
        GgmlType::Q4_1 => Some(&Q4_1),
        GgmlType::Q5_0 => Some(&Q5_0),
        GgmlType::Q8_0 => Some(&Q8_0),
        _ => None,
    }
}

/// Where a packed 32-weight type's record holds its first chunk of quant
/// bytes: after the 16 scales, and Q4_1's 16 minimums or Q5_0's 16 `qh`.
pub(crate) const fn quants_at(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_1 => 2 * SCALE_BYTES,
        GgmlType::Q5_0 => SCALE_BYTES + CHUNK_BYTES,
        _ => SCALE_BYTES,
    }
}

/// `data`, `n_rows` rows of `n_cols` values of `ty`, packed in panels in
/// place as a model load packs them, and the matrix over it multiplying on
/// `kernel` (whether or not a load would pack on that path): for
/// `benches/quant.rs`, as packed matrices are otherwise made only by a
/// model load. `Ok(None)` when the matrix has no panel layout
/// ([`has_panels`]); the errors of [`QMatrix::new`] and
/// [`QMatrix::with_kernel`] otherwise.
#[doc(hidden)]
pub fn panels_for_bench(
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    data: &mut [u8],
    kernel: Kernel,
) -> Result<Option<QMatrix<'_>>, QuantError> {
    QMatrix::new(ty, n_rows, n_cols, data)?.with_kernel(kernel)?;
    if !has_panels(ty, n_rows) {
        return Ok(None);
    }
    let row_bytes = ty.row_bytes(n_cols)?;
    pack_in_place(ty, data, row_bytes);
    let m = QMatrix::new(ty, n_rows, n_cols, data)?.with_kernel(kernel)?;
    Ok(Some(m.in_panels()))
}

/// Repacks `data`, `n_rows` rows of `row_bytes` each stored as `ty` (which
/// [`packs`]), into panels, in place: the panels on rayon's threads, each
/// thread copying one panel at a time aside. Loading a 1B Q8_0 file spent a
/// quarter of its time here on one thread.
pub(crate) fn pack_in_place(ty: GgmlType, data: &mut [u8], row_bytes: usize) {
    debug_assert!(has_panels(ty, data.len() / row_bytes.max(1)));
    data.par_chunks_exact_mut(PANEL_ROWS * row_bytes)
        .for_each_init(Vec::new, |scratch, panel| {
            pack_panel(ty, panel, row_bytes, scratch)
        });
}

/// [`pack_in_place`] of one panel's 16 rows, through `scratch`.
fn pack_panel(ty: GgmlType, panel: &mut [u8], row_bytes: usize, scratch: &mut Vec<u8>) {
    let block_bytes = ty.block_bytes();
    let n_blocks = row_bytes / block_bytes;
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
        if ty == GgmlType::Q5_0 {
            for qh in record[SCALE_BYTES..][..CHUNK_BYTES].chunks_exact_mut(LANE_BYTES) {
                let word = u32::from_le_bytes(qh.try_into().expect("four bytes"));
                qh.copy_from_slice(&spread_high_bits(word).to_le_bytes());
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
    if ty == GgmlType::Q5_0 {
        let qh = &mut block[2..2 + LANE_BYTES];
        let word = u32::from_le_bytes((&*qh).try_into().expect("four bytes"));
        qh.copy_from_slice(&gather_high_bits(word).to_le_bytes());
    }
}

/// Calls `f(record_at, block_at, n)` for every run of `n` bytes that moves
/// between row `r`'s GGUF block of `ty` (from `block_at`) and its panel's
/// record (from `record_at`): packing and unpacking are this one map, read
/// one way or the other. The 32-weight types' fields ([`fields`]); the
/// K-quants' pieces ([`packed_k`]).
#[inline]
fn each_run(ty: GgmlType, r: usize, mut f: impl FnMut(usize, usize, usize)) {
    let Some(fields) = fields(ty) else {
        return packed_k::each_piece(ty, r, f);
    };
    let mut field_at = 0;
    for field in fields {
        for p in 0..field.len / field.piece {
            let record_at = field_at + (p * PANEL_ROWS + r) * field.piece;
            f(record_at, field.at + p * field.piece, field.piece);
        }
        field_at += PANEL_ROWS * field.len;
    }
}

/// Q5_0's `qh` word (bit `j` the fifth bit of weight `j`) as a panel
/// stores it: bit `4k + i` moved to bit `k` of byte `i` (`k` in 0..8, `i`
/// in 0..4). A kernel's vector `k` holds weights `4k .. 4k + 4` in a lane's
/// four bytes, so one shift of the stored word puts their fifth bits at
/// bit 4 of those bytes (`stored << (4 - k)` or `>> (k - 4)`, then `& 0x10`),
/// where `u = q + 16` needs them.
pub(crate) fn spread_high_bits(qh: u32) -> u32 {
    (0..32).fold(0, |acc, j| acc | ((qh >> j) & 1) << (8 * (j % 4) + j / 4))
}

/// The inverse of [`spread_high_bits`]: GGUF's `qh` word again.
pub(crate) fn gather_high_bits(stored: u32) -> u32 {
    (0..32).fold(0, |acc, j| {
        acc | ((stored >> (8 * (j % 4) + j / 4)) & 1) << j
    })
}

/// The integer weight `j` (0..32) of a GGUF block of `ty` (a packed
/// 32-weight type), whose scale multiplies it: Q4_0 stores `nibble - 8`,
/// Q4_1 the nibble, Q5_0 `nibble + 16 · (bit j of qh) - 16` (weights 0..16
/// in the low nibbles, 16..32 in the high ones), Q8_0 the signed byte.
#[inline(always)]
pub(crate) fn weight(ty: GgmlType, block: &[u8], j: usize) -> i32 {
    let nibble = |qs: &[u8]| i32::from((qs[j % (QK / 2)] >> (4 * (j / (QK / 2)))) & 0x0F);
    match ty {
        GgmlType::Q4_0 => nibble(&block[2..]) - 8,
        GgmlType::Q4_1 => nibble(&block[4..]),
        GgmlType::Q5_0 => {
            let qh = u32::from_le_bytes(block[2..6].try_into().expect("four bytes"));
            nibble(&block[6..]) + 16 * ((qh >> j) & 1) as i32 - 16
        }
        GgmlType::Q8_0 => i32::from(block[2 + j] as i8),
        _ => unreachable!("{ty} is not packed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::block::block_values;

    #[test]
    fn packing_moves_every_byte_and_unpacking_restores_each_block() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
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
            pack_in_place(ty, &mut packed, row_bytes);
            assert_ne!(packed, original);
            let ones = |v: &[u8]| v.iter().map(|b| b.count_ones()).sum::<u32>();
            assert_eq!(ones(&packed), ones(&original), "{ty}: the same bits");
            if ty != GgmlType::Q5_0 {
                let (mut sorted_a, mut sorted_b) = (original.clone(), packed.clone());
                sorted_a.sort_unstable();
                sorted_b.sort_unstable();
                assert_eq!(sorted_a, sorted_b, "{ty}: a permutation of the bytes");
            }
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
    fn spread_high_bits_puts_each_vectors_bits_in_place() {
        for qh in [0x8000_0001u32, 0xDEAD_BEEF, 0x1234_5678, u32::MAX, 0] {
            let stored = spread_high_bits(qh);
            assert_eq!(gather_high_bits(stored), qh);
            assert_eq!(stored.count_ones(), qh.count_ones());
            for k in 0..8 {
                let shifted = if k < 4 {
                    stored << (4 - k)
                } else {
                    stored >> (k - 4)
                };
                for i in 0..4 {
                    let bit = (shifted >> (8 * i + 4)) & 1;
                    assert_eq!(bit, (qh >> (4 * k + i)) & 1, "qh {qh:#x}, k {k}, i {i}");
                }
            }
        }
        assert_eq!(spread_high_bits(1 << 5), 1 << (8 + 1), "bit 4 * 1 + 1");
    }

    #[test]
    fn weights_read_as_ggml_defines_them() {
        let mut block = [0u8; 34];
        block[2] = 0xA3; // Q4_0: weight 0 = 3 - 8, weight 16 = 10 - 8
        assert_eq!(weight(GgmlType::Q4_0, &block, 0), -5);
        assert_eq!(weight(GgmlType::Q4_0, &block, 16), 2);
        assert_eq!(weight(GgmlType::Q8_0, &[0xFF; 34], 5), -1);
        // Every packed type's weights are the integers `block_values` reads.
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
        ] {
            let block: Vec<u8> = (0..ty.block_bytes())
                .map(|i| (i * 89 % 256) as u8)
                .collect();
            let values = block_values(ty, &block);
            for (j, &v) in values.iter().enumerate() {
                assert_eq!(weight(ty, &block, j), i32::from(v), "{ty} weight {j}");
            }
        }
    }

    #[test]
    fn only_whole_panels_of_the_panel_types_pack() {
        assert!(has_panels(GgmlType::Q4_0, 2048));
        assert!(has_panels(GgmlType::Q8_0, 16));
        assert!(has_panels(GgmlType::Q4_1, 2048));
        assert!(has_panels(GgmlType::Q5_0, 576));
        assert!(has_panels(GgmlType::Q6_K, 2048));
        assert!(!has_panels(GgmlType::Q4_0, 8));
        assert!(!has_panels(GgmlType::Q5_1, 2048));
        assert!(!has_panels(GgmlType::Q2_K, 2048));
    }
}
