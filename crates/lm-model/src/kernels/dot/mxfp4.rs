//! MXFP4 rows · [`Q8Block`] activations on every kernel: the portable loop
//! of `quant/mxfp4.rs` (exact integer sums per block, f32 across blocks in
//! block order, llama.cpp's generic operations), so every path gives the
//! same bits. Its blocks (17 bytes, a power-of-two scale) have no SIMD loop
//! in the 32-weight kernels, whose blocks open with an f16 scale.

use crate::quant::activation::Q8Block;
use crate::quant::mxfp4;

/// `out[r * n + i] = row r · input i` for the whole rows of `rows`
/// (`row_bytes` each) and `n` inputs of `n_blocks` blocks each.
pub(crate) fn dot_rows(
    rows: &[u8],
    row_bytes: usize,
    n_blocks: usize,
    xq: &[Q8Block],
    n: usize,
    out: &mut [f32],
) {
    for (row, results) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
        for (i, o) in results.iter_mut().enumerate() {
            *o = mxfp4::dot_blocks(row, &xq[i * n_blocks..][..n_blocks]);
        }
    }
}
