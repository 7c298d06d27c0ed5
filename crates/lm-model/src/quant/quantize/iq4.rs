//! IQ4_NL and IQ4_XS as ggml writes them without an importance matrix
//! (`quantize_row_iq4_nl_impl` through `quantize_iq4_nl` and
//! `quantize_iq4_xs`, what `llama-quantize` runs): 4-bit indices into the
//! non-linear table `IQ4_NL_VALUES` (-127..113) with one scale per group of
//! 32.
//!
//! Per group, with weights `x²`: the first scale maps the value of largest
//! magnitude to the table's end (`d = max / 127`), each value takes the
//! nearest table entry, and the scale is refitted by weighted least
//! squares; then 15 more scales `max / (-127 + t)`, `t` in `-7..=7`, are
//! tried the same way, keeping the one of largest `(Σ w q x)² / Σ w q²`.
//! IQ4_NL stores that scale as its f16 `d` and requantizes with it; IQ4_XS
//! stores a super-block scale `d = max_scale / -32` and each group's scale
//! as a 6-bit multiple of it (plus 32), then requantizes every group with
//! `d * l`, computed from the unrounded f32 `d` as ggml does.

use super::super::block::IQ4_NL_VALUES;
use super::{GROUP_MAX_EPS, nearest_int, put_f16};

/// ggml's `best_index_int8`: the index of the table entry nearest `x`
/// (the upper of two at equal distance), by bisection.
#[inline(always)]
fn best_index(x: f32) -> usize {
    let value = |i: usize| f32::from(IQ4_NL_VALUES[i]);
    if x <= value(0) {
        return 0;
    }
    if x >= value(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < value(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - value(hi - 1) < value(hi) - x {
        hi - 1
    } else {
        hi
    }
}

/// `Σ w q x` and `Σ w q²` (w = x²) for the indices of `x * id`, in ggml's
/// order, writing the indices to `levels` when given.
#[inline(always)]
fn sums(x: &[f32; 32], id: f32, mut levels: Option<&mut [u8; 32]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (j, &v) in x.iter().enumerate() {
        let l = best_index(id * v);
        if let Some(levels) = levels.as_deref_mut() {
            levels[j] = l as u8;
        }
        let q = f32::from(IQ4_NL_VALUES[l]);
        let w = v * v;
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// One group's scale (ggml's search with `ntry` 7, no importance
/// weights; 0 for a group whose largest magnitude is below
/// `GROUP_MAX_EPS`).
fn group_scale(x: &[f32; 32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let first = f32::from(IQ4_NL_VALUES[0]);
    let (sumqx, sumq2) = sums(x, 1.0 / (-max / first), None);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for t in -7..=7 {
        let id = (t as f32 + first) / max;
        let (sumqx, sumq2) = sums(x, id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 indices: element `j` low nibble, `j + 16` high, of byte `j`.
#[inline(always)]
fn pack(levels: &[u8; 32], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = levels[j] | (levels[j + 16] << 4);
    }
}

/// IQ4_NL: `| d: f16 | qs: 16 |`.
pub(super) fn quantize_iq4_nl(x: &[f32; 32], block: &mut [u8]) {
    let d = group_scale(x);
    put_f16(block, d);
    // A zero group (d = 0) takes the index of 0 throughout, as in ggml.
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut levels = [0u8; 32];
    sums(x, id, Some(&mut levels));
    pack(&levels, &mut block[2..18]);
}

/// IQ4_XS: `| d: f16 | scales_h: u16 | scales_l: 4 | qs: 128 |`, eight
/// groups of 32; group `g`'s 6-bit scale has its low nibble in nibble
/// `g % 2` of `scales_l[g / 2]` and its top two bits at bit `2g` of
/// `scales_h`.
pub(super) fn quantize_iq4_xs(x: &[f32], block: &mut [u8]) {
    let mut groups = [[0f32; 32]; 8];
    for (group, values) in groups.iter_mut().zip(x.chunks_exact(32)) {
        group.copy_from_slice(values);
    }
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for (scale, group) in scales.iter_mut().zip(&groups) {
        *scale = group_scale(group);
        if scale.abs() > amax_scale {
            amax_scale = scale.abs();
            max_scale = *scale;
        }
    }
    block.fill(0);
    let d = -max_scale / 32.0;
    put_f16(block, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    for (g, (&scale, group)) in scales.iter().zip(&groups).enumerate() {
        let l = nearest_int(id * scale).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        let mut levels = [0u8; 32];
        sums(group, idl, Some(&mut levels));
        pack(&levels, &mut block[8 + 16 * g..24 + 16 * g]);
        let l = (l + 32) as u8;
        block[4 + g / 2] |= (l & 0xF) << (4 * (g % 2));
        scales_h |= u16::from(l >> 4) << (2 * g);
    }
    block[2..4].copy_from_slice(&scales_h.to_le_bytes());
}
