//! The panel products in plain Rust: the reference for the SIMD kernel,
//! lane by lane in the order `quant/packed.rs` states.

use super::PanelProduct;
use crate::quant::GgmlType;
use crate::quant::activation::Q8Block;
use crate::quant::block::{QK, read_f16};
use crate::quant::packed::{CHUNK_BYTES, LANE_BYTES, PANEL_ROWS, SCALE_BYTES, quant_bytes, weight};

/// See [`Dispatch::dot_panels`](crate::kernels::dispatch::Dispatch::dot_panels).
pub(super) fn dot_panels(ty: GgmlType, product: PanelProduct<'_, Q8Block>, out: &mut [f32]) {
    let PanelProduct {
        panels,
        n_blocks,
        xq,
        n,
        ..
    } = product;
    let record_bytes = PANEL_ROWS * ty.block_bytes();
    let q_bytes = quant_bytes(ty);
    let mut q = [0u8; QK];
    for (panel, out) in panels
        .chunks_exact(n_blocks * record_bytes)
        .zip(out.chunks_exact_mut(n * PANEL_ROWS))
    {
        for (i, out) in out.chunks_exact_mut(PANEL_ROWS).enumerate() {
            let x = &xq[i * n_blocks..][..n_blocks];
            for (r, o) in out.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for (record, x) in panel.chunks_exact(record_bytes).zip(x) {
                    for c in 0..q_bytes / LANE_BYTES {
                        let lane = SCALE_BYTES + c * CHUNK_BYTES + r * LANE_BYTES;
                        q[c * LANE_BYTES..][..LANE_BYTES]
                            .copy_from_slice(&record[lane..lane + LANE_BYTES]);
                    }
                    let s: i32 = (0..QK)
                        .map(|j| weight(ty, &q[..q_bytes], j) * i32::from(x.qs[j]))
                        .sum();
                    let scale = read_f16(&record[2 * r..]) * x.d;
                    acc = scale.mul_add(s as f32, acc);
                }
                *o = acc;
            }
        }
    }
}
