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
use super::super::block_k::QK_K;
use super::{GROUP_MAX_EPS, nearest_int, put_f16, signed_absmax};

/// ggml's `best_index_int8` for the 32 values `id * x`: each the index of
/// the table entry nearest it (the upper of two at equal distance; 15 for
/// NaN). ggml bisects to the entries `a < b` around `x` and takes `b` when
/// `x - a >= b - x`; that test is false for every pair of entries above
/// `x` and true for every pair below (the signs are exact in f32), so the
/// index is the count of adjacent pairs that pass it, which runs on all 32
/// values at once without branches.
#[inline(always)]
fn best_indices(x: &[f32; 32], id: f32) -> [u8; 32] {
    let ax = x.map(|v| id * v);
    let mut indices = [0u8; 32];
    for pair in IQ4_NL_VALUES.windows(2) {
        let (a, b) = (f32::from(pair[0]), f32::from(pair[1]));
        for (index, &v) in indices.iter_mut().zip(&ax) {
            // At most 15 pairs pass: no overflow (wrapping only spares
            // the check).
            *index = index.wrapping_add(u8::from(v - a >= b - v));
        }
    }
    for (index, &v) in indices.iter_mut().zip(&ax) {
        if v.is_nan() {
            *index = 15;
        }
    }
    indices
}

/// The scales of `N` groups of 32 side by side (`x[i][k]` is value `i` of
/// group `k`): ggml's search with `ntry` 7 and no importance weights, each
/// lane the f32 operations of ggml's loop for its group in ggml's order
/// (as `search.rs` runs the K-quants' searches: the groups' sums are
/// independent chains, so side by side they overlap); 0 for a group whose
/// largest magnitude is below `GROUP_MAX_EPS`.
fn group_scales<const N: usize>(x: &[[f32; N]; 32]) -> [f32; N] {
    let (amax, max) = super::search::largest_magnitudes(x);
    let first = f32::from(IQ4_NL_VALUES[0]);
    let id = max.map(|m| 1.0 / (-m / first));
    let (sumqx, sumq2) = lane_sums(x, &id);
    let (mut d, mut best) = ([0f32; N], [0f32; N]);
    for k in 0..N {
        d[k] = if sumq2[k] > 0.0 {
            sumqx[k] / sumq2[k]
        } else {
            0.0
        };
        best[k] = d[k] * sumqx[k];
    }
    for t in -7..=7 {
        let id = max.map(|m| (t as f32 + first) / m);
        let (sumqx, sumq2) = lane_sums(x, &id);
        for k in 0..N {
            if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best[k] * sumq2[k] {
                d[k] = sumqx[k] / sumq2[k];
                best[k] = d[k] * sumqx[k];
            }
        }
    }
    // A lane below GROUP_MAX_EPS computed from max = 0; ggml skips it.
    for k in 0..N {
        if amax[k] < GROUP_MAX_EPS {
            d[k] = 0.0;
        }
    }
    d
}

/// ggml's sums for one candidate scale, `N` groups side by side: lane `k`'s
/// `Σ w q x` and `Σ w q²` (w = x²) over the table values `q` of the indices
/// of `id[k] * x`, in ggml's order.
#[inline(always)]
fn lane_sums<const N: usize>(x: &[[f32; N]; 32], id: &[f32; N]) -> ([f32; N], [f32; N]) {
    let (mut sumqx, mut sumq2) = ([0f32; N], [0f32; N]);
    for xi in x {
        let mut ax = [0f32; N];
        for k in 0..N {
            ax[k] = id[k] * xi[k];
        }
        let mut indices = [0u8; N];
        for pair in IQ4_NL_VALUES.windows(2) {
            let (a, b) = (f32::from(pair[0]), f32::from(pair[1]));
            for k in 0..N {
                indices[k] = indices[k].wrapping_add(u8::from(ax[k] - a >= b - ax[k]));
            }
        }
        for k in 0..N {
            let l = if ax[k].is_nan() { 15 } else { indices[k] };
            let q = f32::from(IQ4_NL_VALUES[usize::from(l & 15)]);
            let v = xi[k];
            let w = v * v;
            sumqx[k] += w * q * v;
            sumq2[k] += w * q * q;
        }
    }
    (sumqx, sumq2)
}

/// `N` consecutive groups of 32 from `x`, side by side.
fn side_by_side<const N: usize>(x: &[f32]) -> [[f32; N]; 32] {
    let mut xt = [[0f32; N]; 32];
    for (k, group) in x.chunks_exact(32).enumerate() {
        for (i, &v) in group.iter().enumerate() {
            xt[i][k] = v;
        }
    }
    xt
}

/// Packs 32 indices: element `j` low nibble, `j + 16` high, of byte `j`.
#[inline(always)]
fn pack(levels: &[u8; 32], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = levels[j] | (levels[j + 16] << 4);
    }
}

/// IQ4_NL, a row: blocks `| d: f16 | qs: 16 |`, their scales searched
/// eight blocks at a time.
pub(super) fn quantize_row_iq4_nl(x: &[f32], dst: &mut [u8]) {
    let mut blocks = x.chunks_exact(8 * 32).zip(dst.chunks_exact_mut(8 * 18));
    for (x, dst) in &mut blocks {
        let scales = group_scales::<8>(&side_by_side(x));
        for ((x, block), &d) in x
            .chunks_exact(32)
            .zip(dst.chunks_exact_mut(18))
            .zip(&scales)
        {
            write_iq4_nl(x, block, d);
        }
    }
    let done = x.len() / (8 * 32);
    let rest = x[8 * 32 * done..].chunks_exact(32);
    for (x, block) in rest.zip(dst[8 * 18 * done..].chunks_exact_mut(18)) {
        write_iq4_nl(x, block, group_scales::<1>(&side_by_side(x))[0]);
    }
}

/// One IQ4_NL block of `x` with scale `d`: `d` as f16, and each value
/// the index nearest `x / d` (from the f32 `d`; a zero group, d = 0, takes
/// the index of 0 throughout, as in ggml).
fn write_iq4_nl(x: &[f32], block: &mut [u8], d: f32) {
    put_f16(block, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let x: &[f32; 32] = x.try_into().expect("blocks of 32");
    pack(&best_indices(x, id), &mut block[2..18]);
}

/// IQ4_XS: `| d: f16 | scales_h: u16 | scales_l: 4 | qs: 128 |`, eight
/// groups of 32; group `g`'s 6-bit scale has its low nibble in nibble
/// `g % 2` of `scales_l[g / 2]` and its top two bits at bit `2g` of
/// `scales_h`.
pub(super) fn quantize_iq4_xs(x: &[f32; QK_K], block: &mut [u8]) {
    let mut groups = [[0f32; 32]; 8];
    for (group, values) in groups.iter_mut().zip(x.chunks_exact(32)) {
        group.copy_from_slice(values);
    }
    let scales = group_scales::<8>(&side_by_side(x));
    let max_scale = signed_absmax(&scales);
    block.fill(0);
    let d = -max_scale / 32.0;
    put_f16(block, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    for (g, (&scale, group)) in scales.iter().zip(&groups).enumerate() {
        let l = nearest_int(id * scale).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        pack(
            &best_indices(group, idl),
            &mut block[8 + 16 * g..24 + 16 * g],
        );
        let l = (l + 32) as u8;
        block[4 + g / 2] |= (l & 0xF) << (4 * (g % 2));
        scales_h |= u16::from(l >> 4) << (2 * g);
    }
    block[2..4].copy_from_slice(&scales_h.to_le_bytes());
}
