//! The K-quant panel products in plain Rust: the reference for the SIMD
//! kernel, row by row in the order `quant/packed_k.rs` states. Each row's
//! super-block is put back in GGUF's layout and read by `block_k`'s
//! unpacking, so this kernel shares nothing with the SIMD one but the
//! arithmetic.

use super::PanelProduct;
use crate::quant::GgmlType;
use crate::quant::activation::Q8KBlock;
use crate::quant::block_k::{self, QK_K};
use crate::quant::packed_k::finish;

/// See [`Dispatch::dot_panels`](crate::kernels::dispatch::Dispatch::dot_panels).
pub(super) fn dot_panels_k(ty: GgmlType, product: PanelProduct<'_, Q8KBlock>, out: &mut [f32]) {
    product.fold_blocks(ty, out, |acc, block, x| {
        let w = block_k::unpack(ty, block);
        let (sumi, summs) = integer_sums(ty, &w, x);
        finish(ty, acc, w.d, w.dmin, x.d, sumi, summs)
    });
}

/// The exact `sumi` and `summs` of one super-block and one input block
/// (`quant/packed_k.rs`): Q4_K's minimums apart, Q6_K's offset of 32 in
/// its values.
fn integer_sums(ty: GgmlType, w: &block_k::SuperBlock, x: &Q8KBlock) -> (i32, i32) {
    let offset = if ty == GgmlType::Q6_K { 32 } else { 0 };
    let mut sumi = 0i32;
    for (g, (q, qx)) in w.q.chunks_exact(16).zip(x.qs.chunks_exact(16)).enumerate() {
        let dot: i32 = q
            .iter()
            .zip(qx)
            .map(|(&q, &qx)| (i32::from(q) - offset) * i32::from(qx))
            .sum();
        sumi += i32::from(w.scales[g]) * dot;
    }
    let summs = if ty == GgmlType::Q4_K {
        (0..QK_K / 16)
            .map(|g| i32::from(w.mins[g]) * i32::from(x.bsums[g]))
            .sum()
    } else {
        0
    };
    (sumi, summs)
}
