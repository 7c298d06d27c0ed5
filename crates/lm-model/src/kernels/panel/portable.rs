//! The panel products in plain Rust: the reference for the SIMD kernel,
//! row by row in the order `quant/packed.rs` states. Each row's block is put
//! back in GGUF's layout, so this kernel shares nothing with the SIMD ones
//! but the arithmetic.

use super::PanelProduct;
use crate::quant::GgmlType;
use crate::quant::activation::Q8Block;
use crate::quant::block::{QK, min_offset, read_f16};
use crate::quant::packed::weight;

/// See [`Dispatch::dot_panels`](crate::kernels::dispatch::Dispatch::dot_panels).
pub(super) fn dot_panels(ty: GgmlType, product: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    let min_at = min_offset(ty);
    product.fold_blocks(ty, out, |acc, block, x| {
        let s: i32 = (0..QK)
            .map(|j| weight(ty, block, j) * i32::from(x.qs[j]))
            .sum();
        let acc = (read_f16(block) * x.d).mul_add(s as f32, acc);
        match min_at {
            Some(at) => read_f16(&block[at..]).mul_add(x.sum, acc),
            None => acc,
        }
    });
}
