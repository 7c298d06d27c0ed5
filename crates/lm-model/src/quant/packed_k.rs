//! Q4_K and Q6_K super-blocks repacked into panels of [`PANEL_ROWS`] rows,
//! as `quant/packed.rs` does for Q4_0 and Q8_0: one SIMD lane per output
//! row, so a product's unpacking of scales and values and its f32 work are
//! shared by sixteen rows (llama.cpp's `Q4_K_8x8` repacking does the same
//! with eight).
//!
//! A panel's super-block `b` is one record holding the same bytes as the
//! sixteen rows' blocks `b` (`16 * block_bytes`, so a matrix is packed in
//! place and keeps its size). Each field of GGUF's block (`block_k.rs`
//! draws them) is stored for the 16 rows together, in pieces: piece `p` of
//! a field is the field's bytes `w p .. w p + w` of row 0, then of row 1,
//! ... of row 15 (`w` = 2 for the f16 factors, 4 for the rest), so one
//! 512-bit load of a 4-byte piece gives sixteen lanes, a row per lane:
//!
//! ```text
//! Q4_K record (2,304 bytes):
//!   d    (16 x f16)             @ 0      dmin (16 x f16)         @ 32
//!   scales: 3 pieces of 64      @ 64     (the 12 bytes of 6-bit scales and minimums)
//!   qs: 32 pieces of 64         @ 256    piece 8k + c: bytes 32k + 4c .. + 4 of qs:
//!                                        low nibbles weights 64k + 4c .. + 4 (sub-block 2k),
//!                                        high nibbles 64k + 32 + 4c .. + 4 (sub-block 2k + 1)
//! Q6_K record (3,360 bytes):
//!   d    (16 x f16)             @ 0
//!   scales: 4 pieces of 64      @ 32     (16 signed 8-bit scales, one per 16 weights)
//!   4 quarters of 768           @ 288    quarter 2h + e (h, e in 0..2), for c in 4e .. 4e + 4:
//!     4 pieces H = qh[32h + 4c ..], 4 pieces A = ql[64h + 4c ..], 4 pieces B = ql[64h + 32 + 4c ..]
//!     weights 128h + 32t + 4c .. + 4 (sub-block 4h + t) are the low (t = 0, 1) or
//!     high (t = 2, 3) nibbles of A (t even) or B (t odd), with bits 2t, 2t + 1 of H
//!     as their bits 4 and 5: a quarter holds the groups of 16 2(4h + t) + e, t = 0..4,
//!     and the kernel reads the record in order: H first, as every group of the quarter
//!     needs it (with H after A and B, each quarter's first group jumped over B's lines,
//!     and a one-input product stalled on H's: 0.62x the row-major kernel's speed)
//! ```
//!
//! Every kernel computes, for row `r` and input `x` (a
//! [`Q8KBlock`](super::activation::Q8KBlock) per super-block), over the
//! super-blocks in order, from `acc = 0`, what ggml's
//! `ggml_vec_dot_q4_K_q8_K` / `_q6_K_q8_K` compute, with the integer parts
//! exact in i32:
//!
//! ```text
//! Q4_K: sumi  = Σ_j sc[j] Σ_{l in j} q[l] x.qs[l]          (8 sub-blocks of 32)
//!       summs = Σ_j  m[j] (x.bsums[2j] + x.bsums[2j + 1])
//!       acc = fma(d * x.d, sumi as f32, acc)
//!       acc = fma(-(dmin * x.d), summs as f32, acc)
//! Q6_K: sumi  = Σ_g sc[g] Σ_{l in g} (q[l] - 32) x.qs[l]  (16 groups of 16)
//!       acc = fma(d * x.d, sumi as f32, acc)
//! ```
//!
//! (`d * x.d` and `dmin * x.d` are f32 products; [`finish`] states the f32
//! steps once.) The same bits on every path and for any number of inputs,
//! so a prefill and the decode steps that read the same tokens agree.

use super::GgmlType;
use super::packed::PANEL_ROWS;

/// One field of a GGUF super-block: `len` bytes at `at`, moved in pieces
/// of `piece` bytes.
#[derive(Clone, Copy)]
struct Field {
    at: usize,
    len: usize,
    piece: usize,
}

/// Q4_K's fields in record order: d, dmin, scales, qs.
const Q4_K_FIELDS: [Field; 4] = [
    Field {
        at: 0,
        len: 2,
        piece: 2,
    },
    Field {
        at: 2,
        len: 2,
        piece: 2,
    },
    Field {
        at: 4,
        len: 12,
        piece: 4,
    },
    Field {
        at: 16,
        len: 128,
        piece: 4,
    },
];

/// Q6_K's fields in record order: d, scales, then for each half `h` and
/// each half `e` of its runs of 32 a quarter of `ql` and `qh`: the bytes
/// of `H`, `A` and `B` (see the module docs) that values `128h + 32t + 16e
/// .. + 16` (t = 0..4) take, so that a kernel reads the record in order.
const Q6_K_FIELDS: [Field; 14] = {
    let mut fields = [Field {
        at: 208,
        len: 2,
        piece: 2,
    }; 14];
    fields[1] = Field {
        at: 192,
        len: 16,
        piece: 4,
    };
    let mut quarter = 0;
    while quarter < 4 {
        let (h, e) = (quarter / 2, quarter % 2);
        let ql = 64 * h + 16 * e;
        fields[2 + 3 * quarter] = Field {
            at: 128 + 32 * h + 16 * e,
            len: 16,
            piece: 4,
        };
        fields[3 + 3 * quarter] = Field {
            at: ql,
            len: 16,
            piece: 4,
        };
        fields[4 + 3 * quarter] = Field {
            at: ql + 32,
            len: 16,
            piece: 4,
        };
        quarter += 1;
    }
    fields
};

/// Bytes of one piece of every row: a 512-bit vector of 4-byte lanes.
pub(crate) const PIECE_BYTES: usize = PANEL_ROWS * 4;

/// Record offsets of Q4_K's fields.
pub(crate) mod q4_k {
    /// The rows' `d` (16 f16).
    pub(crate) const D: usize = 0;
    /// The rows' `dmin` (16 f16).
    pub(crate) const DMIN: usize = 32;
    /// The 3 pieces of 6-bit scales and minimums.
    pub(crate) const SCALES: usize = 64;
    /// The 32 pieces of nibbles.
    pub(crate) const QS: usize = 256;
}

/// Record offsets of Q6_K's fields.
pub(crate) mod q6_k {
    use super::PIECE_BYTES;

    /// The rows' `d` (16 f16).
    pub(crate) const D: usize = 0;
    /// The 4 pieces of signed 8-bit scales.
    pub(crate) const SCALES: usize = 32;
    /// The first quarter; quarter `2h + e` is `QUARTER_BYTES` further per
    /// step, its four pieces of `H` first, then `A`'s, then `B`'s.
    pub(crate) const QUARTERS: usize = 288;
    /// Bytes of a quarter: 12 pieces.
    pub(crate) const QUARTER_BYTES: usize = 12 * PIECE_BYTES;
    /// Where a quarter's pieces of `qh` (`H`) start in it.
    pub(crate) const QH: usize = 0;
    /// Where a quarter's pieces of `ql` start in it: `A`'s, then `B`'s.
    pub(crate) const QL: usize = 4 * PIECE_BYTES;
}

/// Whether `ty` is one of the super-block types packed here.
pub(crate) fn packs_k(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
}

/// The fields of `ty` ([`packs_k`]) in record order.
fn fields(ty: GgmlType) -> &'static [Field] {
    match ty {
        GgmlType::Q4_K => &Q4_K_FIELDS,
        GgmlType::Q6_K => &Q6_K_FIELDS,
        _ => unreachable!("{ty} is not a packed K-quant"),
    }
}

/// Calls `f(record_at, block_at, n)` for every run of `n` bytes that moves
/// between row `r`'s GGUF block (from `block_at`) and its record (from
/// `record_at`).
#[inline]
pub(crate) fn each_piece(ty: GgmlType, r: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut field_at = 0;
    for field in fields(ty) {
        for p in 0..field.len / field.piece {
            let record_at = field_at + (p * PANEL_ROWS + r) * field.piece;
            f(record_at, field.at + p * field.piece, field.piece);
        }
        field_at += PANEL_ROWS * field.len;
    }
}

/// The f32 steps of one super-block (see the module docs): `d` and `dmin`
/// are the row's factors, `d_x` the input's, `sumi` and `summs` the exact
/// integer sums (`summs` is 0 for Q6_K, whose offset is inside `sumi`, and
/// then the second step is skipped).
#[inline(always)]
pub(crate) fn finish(
    ty: GgmlType,
    acc: f32,
    d: f32,
    dmin: f32,
    d_x: f32,
    sumi: i32,
    summs: i32,
) -> f32 {
    let acc = (d * d_x).mul_add(sumi as f32, acc);
    match ty {
        GgmlType::Q4_K => (-(dmin * d_x)).mul_add(summs as f32, acc),
        _ => acc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing and unpacking are tested with the 32-weight types' in
    /// `packed.rs`, through which they are reached; here, that a record
    /// holds exactly its sixteen blocks' bytes.
    #[test]
    fn records_hold_the_blocks_bytes() {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let record_len: usize = fields(ty).iter().map(|f| PANEL_ROWS * f.len).sum();
            assert_eq!(record_len, PANEL_ROWS * ty.block_bytes());
        }
    }

    #[test]
    fn the_kernels_offsets_are_the_fields() {
        let offsets = |ty| {
            let mut at = 0;
            fields(ty)
                .iter()
                .map(|f| {
                    let start = at;
                    at += PANEL_ROWS * f.len;
                    start
                })
                .collect::<Vec<_>>()
        };
        use q4_k::{D, DMIN, QS, SCALES};
        assert_eq!(offsets(GgmlType::Q4_K), [D, DMIN, SCALES, QS]);
        let q6 = offsets(GgmlType::Q6_K);
        assert_eq!(q6[..3], [q6_k::D, q6_k::SCALES, q6_k::QUARTERS]);
        for (quarter, at) in q6[2..].chunks_exact(3).enumerate() {
            let start = q6_k::QUARTERS + quarter * q6_k::QUARTER_BYTES;
            assert_eq!(
                at,
                [
                    start + q6_k::QH,
                    start + q6_k::QL,
                    start + q6_k::QL + 4 * PIECE_BYTES
                ]
            );
        }
    }
}
