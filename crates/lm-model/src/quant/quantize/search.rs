//! ggml's K-quant scale searches (`make_qkx2_quants` for Q2_K, Q4_K and
//! Q5_K, `make_qx_quants` for Q6_K, `make_q3_quants` for Q3_K) run on all the groups of a super-block at
//! once: lane `k` of every array is group `k`, and each lane goes through
//! exactly the f32 operations of ggml's loop for its group, in ggml's
//! order, so the results are ggml's bit for bit.
//!
//! Why: each candidate scale of ggml's search sums 32 (or 16) products in
//! sequence, a chain of dependent additions that keeps one core waiting on
//! its adder; run one group at a time, the search costs about 60 ns a
//! weight. Across groups the chains are independent, so with the groups
//! side by side the sums become vector operations (`[f32; N]` loops that
//! the compiler vectorises) and no value is reassociated. The branches
//! of ggml's loop become per-lane selections, and instead of copying a
//! candidate's levels when it wins, a lane keeps the `iscale` and offset
//! that made them and computes them once at the end, with the same
//! operations.

/// ggml's `nearest_int` (see `quantize.rs`), as written there.
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007F_FFFF) - 0x0040_0000
}

/// `nearest_int(v)` bounded to `lo..=hi`, as an f32: the bound is taken
/// on the integer converted to f32 (exact, every value is below 2^23 in
/// magnitude), which equals ggml's integer bound and, unlike an `i32`
/// clamp, vectorises without SSE4.1.
#[inline(always)]
fn bounded_level(v: f32, lo: f32, hi: f32) -> f32 {
    let l = nearest_int(v) as f32;
    let l = if l < lo { lo } else { l };
    if l > hi { hi } else { l }
}

/// The parameters of ggml's `make_qkx2_quants` search: levels `0..=nmax`,
/// `nstep + 1` candidate scales `(rmin + rdelta * is + nmax) / (max - min)`,
/// and the error each candidate is judged by (`mad`: the weighted sum of
/// absolute errors, else of squared errors).
#[derive(Debug, Clone, Copy)]
pub(super) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub mad: bool,
}

impl Qkx2 {
    /// Q2_K's search (groups of 16, 2-bit levels, absolute error).
    pub const Q2_K: Qkx2 = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        mad: true,
    };
    /// Q4_K's search (groups of 32, 4-bit levels).
    pub const Q4_K: Qkx2 = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        mad: false,
    };
    /// Q5_K's search (groups of 32, 5-bit levels).
    pub const Q5_K: Qkx2 = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        mad: false,
    };
}

/// ggml's `make_qkx2_quants` for `N` groups of `G` values at once:
/// `x[i][k]` and `weights[i][k]` are value `i` of group `k`. Writes the
/// levels (`0..=nmax`) into `levels[i][k]` and returns each group's scale
/// and minus its minimum, as the one-group version in `quantize.rs`
/// documents.
pub(super) fn make_qkx2_quants<const N: usize, const G: usize>(
    x: &[[f32; N]; G],
    weights: &[[f32; N]; G],
    levels: &mut [[u8; N]; G],
    search: Qkx2,
) -> ([f32; N], [f32; N]) {
    let Qkx2 {
        nmax,
        rmin,
        rdelta,
        nstep,
        mad,
    } = search;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = [0f32; N];
    for k in 0..N {
        sum_x[k] = sum_w[k] * x[0][k];
    }
    for (xi, wi) in x.iter().zip(weights).skip(1) {
        for k in 0..N {
            let v = xi[k];
            min[k] = if v < min[k] { v } else { min[k] };
            max[k] = if v > max[k] { v } else { max[k] };
            sum_w[k] += wi[k];
            sum_x[k] += wi[k] * v;
        }
    }
    for m in &mut min {
        *m = if *m > 0.0 { 0.0 } else { *m };
    }
    let flat_min = min;
    let mut flat = [false; N];
    for k in 0..N {
        flat[k] = max[k] == min[k];
    }
    let nmax_f = nmax as f32;
    // The first guess: the range split evenly.
    let mut iscale = [0f32; N];
    let mut scale = [0f32; N];
    for k in 0..N {
        iscale[k] = nmax_f / (max[k] - min[k]);
        scale[k] = 1.0 / iscale[k];
    }
    let mut candidate = [[0f32; N]; G];
    set_levels(x, &iscale, &min, nmax_f, &mut candidate);
    let mut best_error = error(x, weights, &scale, &min, &candidate, mad);
    // What made the best levels so far.
    let (mut best_iscale, mut best_offset) = (iscale, min);
    for is in 0..=nstep {
        let step = rmin + rdelta * is as f32 + nmax_f;
        for k in 0..N {
            iscale[k] = step / (max[k] - min[k]);
        }
        set_levels(x, &iscale, &min, nmax_f, &mut candidate);
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; N], [0f32; N], [0f32; N]);
        for ((xi, wi), li) in x.iter().zip(weights).zip(&candidate) {
            for k in 0..N {
                let (w, l) = (wi[k], li[k]);
                sum_l[k] += w * l;
                sum_l2[k] += w * l * l;
                sum_xl[k] += w * l * xi[k];
            }
        }
        let (mut this_scale, mut this_min, mut fitted) = ([0f32; N], [0f32; N], [false; N]);
        for k in 0..N {
            let det = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
            let s = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / det;
            let m = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / det;
            (this_scale[k], this_min[k]) = if m > 0.0 {
                (sum_xl[k] / sum_l2[k], 0.0)
            } else {
                (s, m)
            };
            fitted[k] = det > 0.0;
        }
        let this_error = error(x, weights, &this_scale, &this_min, &candidate, mad);
        for k in 0..N {
            if fitted[k] && this_error[k] < best_error[k] {
                best_error[k] = this_error[k];
                best_iscale[k] = iscale[k];
                best_offset[k] = min[k];
                scale[k] = this_scale[k];
                min[k] = this_min[k];
            }
        }
    }
    set_levels(x, &best_iscale, &best_offset, nmax_f, &mut candidate);
    let mut neg_min = [0f32; N];
    for k in 0..N {
        // A constant group: levels 0, scale 0 (ggml returns before searching).
        if flat[k] {
            scale[k] = 0.0;
            min[k] = flat_min[k];
        }
        neg_min[k] = -min[k];
    }
    for (out, li) in levels.iter_mut().zip(&candidate) {
        for k in 0..N {
            out[k] = if flat[k] { 0 } else { li[k] as u8 };
        }
    }
    (scale, neg_min)
}

/// `candidate[i][k]` = ggml's level of `x[i][k]` for `iscale[k]` and
/// offset `min[k]`: `nearest_int(iscale * (x - min))` bounded to `0..=nmax`.
#[inline(always)]
fn set_levels<const N: usize, const G: usize>(
    x: &[[f32; N]; G],
    iscale: &[f32; N],
    min: &[f32; N],
    nmax: f32,
    candidate: &mut [[f32; N]; G],
) {
    for (li, xi) in candidate.iter_mut().zip(x) {
        for k in 0..N {
            li[k] = bounded_level(iscale[k] * (xi[k] - min[k]), 0.0, nmax);
        }
    }
}

/// Each group's `Σ w (scale l + min - x)²` (`Σ w |scale l + min - x|`
/// when `mad`), summed in ggml's order.
#[inline(always)]
fn error<const N: usize, const G: usize>(
    x: &[[f32; N]; G],
    weights: &[[f32; N]; G],
    scale: &[f32; N],
    min: &[f32; N],
    levels: &[[f32; N]; G],
    mad: bool,
) -> [f32; N] {
    let mut error = [0f32; N];
    for ((xi, wi), li) in x.iter().zip(weights).zip(levels) {
        for k in 0..N {
            let diff = scale[k] * li[k] + min[k] - xi[k];
            let diff = if mad { diff.abs() } else { diff * diff };
            error[k] += wi[k] * diff;
        }
    }
    error
}

/// Each of `N` groups' largest magnitude and the value that has it (the
/// first, on a tie), over the `M` values `x[i][k]` of group `k`: where
/// every search of ggml's starts.
pub(super) fn largest_magnitudes<const N: usize, const M: usize>(
    x: &[[f32; N]; M],
) -> ([f32; N], [f32; N]) {
    let (mut amax, mut max) = ([0f32; N], [0f32; N]);
    for xi in x {
        for k in 0..N {
            let a = xi[k].abs();
            if a > amax[k] {
                (amax[k], max[k]) = (a, xi[k]);
            }
        }
    }
    (amax, max)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights
/// (Q6_K's groups of 16, `nmax` 32) for `N` groups at once: `x[i][k]` is
/// value `i` of group `k`. Writes the levels (`0..64`, the signed level
/// plus 32) into `levels[i][k]` and returns each group's scale; a group
/// whose largest magnitude is below `eps` gets levels 0 and scale 0, as
/// ggml's. The one-group version in `quantize.rs` documents
/// the search.
pub(super) fn make_qx_quants<const N: usize>(
    x: &[[f32; N]; 16],
    levels: &mut [[u8; N]; 16],
    eps: f32,
) -> [f32; N] {
    const NMAX: i32 = 32;
    let (amax, max) = largest_magnitudes(x);
    let level = |iscale: f32, v: f32| bounded_level(iscale * v, -NMAX as f32, (NMAX - 1) as f32);
    // Σ w x l and Σ w l² with w = x², in ggml's order of operations.
    let sums = |iscale: &[f32; N]| {
        let (mut sumlx, mut suml2) = ([0f32; N], [0f32; N]);
        for xi in x {
            for k in 0..N {
                let v = xi[k];
                let l = level(iscale[k], v);
                let w = v * v;
                sumlx[k] += w * v * l;
                suml2[k] += w * l * l;
            }
        }
        (sumlx, suml2)
    };
    let mut iscale = [0f32; N];
    for k in 0..N {
        iscale[k] = -(NMAX as f32) / max[k];
    }
    let (sumlx, suml2) = sums(&iscale);
    let (mut scale, mut best) = ([0f32; N], [0f32; N]);
    for k in 0..N {
        scale[k] = if suml2[k] != 0.0 {
            sumlx[k] / suml2[k]
        } else {
            0.0
        };
        best[k] = scale[k] * sumlx[k];
    }
    let mut best_iscale = iscale;
    for is in (-9..=9).filter(|&is| is != 0) {
        let step = -(NMAX as f32 + 0.1 * is as f32);
        for k in 0..N {
            iscale[k] = step / max[k];
        }
        let (sumlx, suml2) = sums(&iscale);
        for k in 0..N {
            if suml2[k] > 0.0 && sumlx[k] * sumlx[k] > best[k] * suml2[k] {
                best_iscale[k] = iscale[k];
                scale[k] = sumlx[k] / suml2[k];
                best[k] = scale[k] * sumlx[k];
            }
        }
    }
    for (out, xi) in levels.iter_mut().zip(x) {
        for k in 0..N {
            out[k] = if amax[k] < eps {
                0
            } else {
                (NMAX as f32 + level(best_iscale[k], xi[k])) as u8
            };
        }
    }
    for k in 0..N {
        if amax[k] < eps {
            scale[k] = 0.0;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse` (Q3_K's groups of 16, `nmax` 4)
/// for `N` groups at once: `x[i][k]` is value `i` of group `k`. Each group
/// starts from the levels of `-4 / max` (`max` its value of largest
/// magnitude), bounded to `-4..=3`, and then, up to five times, revisits
/// each value in turn: with that value left out of the weighted (`x²`)
/// sums `Σ w x l` and `Σ w l²`, it tries the level `x Σ w l² / Σ w x l`
/// and keeps it when it raises `(Σ w x l)² / Σ w l²`, the fit's gain
/// (the error of the best scale for the levels falls by as much). Writes
/// the levels plus 4 (`0..8`) into `levels[i][k]` and returns each group's
/// scale `Σ w x l / Σ w l²`; a group whose largest magnitude is below
/// `eps` gets levels 0 and scale 0, as ggml's.
///
/// ggml stops a group after a pass that changes nothing; here every lane
/// runs until no lane changes, which is the same: a pass that changes
/// nothing leaves the state as it found it, so the next one does too.
pub(super) fn make_q3_quants<const N: usize>(
    x: &[[f32; N]; 16],
    levels: &mut [[u8; N]; 16],
    eps: f32,
) -> [f32; N] {
    const NMAX: f32 = 4.0;
    let (amax, max) = largest_magnitudes(x);
    // The signed levels as f32, and Σ w x l and Σ w l² with w = x², in
    // ggml's order of operations. (A lane below `eps` may compute NaNs
    // here; its results are replaced at the end.)
    let mut l = [[0f32; N]; 16];
    let (mut sumlx, mut suml2) = ([0f32; N], [0f32; N]);
    let mut iscale = [0f32; N];
    for k in 0..N {
        iscale[k] = -NMAX / max[k];
    }
    for (li, xi) in l.iter_mut().zip(x) {
        for k in 0..N {
            let v = xi[k];
            let q = bounded_level(iscale[k] * v, -NMAX, NMAX - 1.0);
            li[k] = q;
            let w = v * v;
            sumlx[k] += w * v * q;
            suml2[k] += w * q * q;
        }
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, xi) in l.iter_mut().zip(x) {
            for k in 0..N {
                let (v, old) = (xi[k], li[k]);
                let w = v * v;
                let slx = sumlx[k] - w * v * old;
                let sl2 = suml2[k] - w * old * old;
                let new = bounded_level(v * sl2 / slx, -NMAX, NMAX - 1.0);
                let new_slx = slx + w * v * new;
                let new_sl2 = sl2 + w * new * new;
                let better = slx > 0.0
                    && new != old
                    && new_sl2 > 0.0
                    && new_slx * new_slx * suml2[k] > sumlx[k] * sumlx[k] * new_sl2;
                if better {
                    li[k] = new;
                    sumlx[k] = new_slx;
                    suml2[k] = new_sl2;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (out, li) in levels.iter_mut().zip(&l) {
        for k in 0..N {
            out[k] = if amax[k] < eps {
                0
            } else {
                (li[k] + NMAX) as u8
            };
        }
    }
    let mut scale = [0f32; N];
    for k in 0..N {
        scale[k] = if amax[k] < eps || suml2[k] <= 0.0 {
            0.0
        } else {
            sumlx[k] / suml2[k]
        };
    }
    scale
}
