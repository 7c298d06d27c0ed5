//! Attention's weights: the softmax of each score row over the positions
//! its query sees, with libm's `exp` bits and the sums in position order.

use std::ops::Range;

use crate::kernels::dispatch::Dispatch;
use crate::kernels::exp::exp_in_place;

/// Turns the scores of `rows` (`[n][span]`, the positions `seen(r)` of row
/// `r` visible) into attention weights in place: softmax after subtracting
/// the row's maximum, with libm's `exp` (or the kernels' vectorised
/// [`exp_in_place`], which gives libm's bits), the weights summed in
/// position order, as the conformance fixtures were measured with (another
/// order moves single logits of the quantized models past the fixtures'
/// tolerances). Up to [`SUM_ROWS`] rows' sums are independent chains of
/// additions, run side by side.
///
/// A row with a sink logit `s` (`sink(r)`, gpt-oss's attention sinks) has
/// one more term, as ggml's `soft_max` with sinks: the maximum is taken
/// over the scores and `s`, and `exp(s - max)` is added to the row's sum
/// after its scores.
#[inline(always)]
pub(super) fn softmax_to_weights(
    dispatch: Dispatch,
    rows: &mut [f32],
    span: usize,
    seen: impl Fn(usize) -> Range<usize>,
    sink: impl Fn(usize) -> Option<f32>,
) {
    // The sink terms `exp(s - max)` of up to SUM_ROWS rows, 0 without one.
    let mut sink_terms = [0.0f32; SUM_ROWS];
    let mut all_sink_terms = Vec::new();
    for (r, row) in rows.chunks_exact_mut(span).enumerate() {
        let row = &mut row[seen(r)];
        let mut max = row_max(row);
        if let Some(s) = sink(r) {
            max = max.max(s);
            let mut term = [s - max];
            exp_in_place(dispatch, &mut term);
            all_sink_terms.push((r, term[0]));
        }
        for score in row.iter_mut() {
            *score -= max;
        }
        exp_in_place(dispatch, row);
    }
    let mut sink_iter = all_sink_terms.iter().peekable();
    let n_rows = rows.len() / span;
    for first in (0..n_rows).step_by(SUM_ROWS) {
        let block = first..(first + SUM_ROWS).min(n_rows);
        let sums = match block.len() {
            8 => sums_in_position_order::<8>(rows, span, first, &seen),
            7 => sums_in_position_order::<7>(rows, span, first, &seen),
            6 => sums_in_position_order::<6>(rows, span, first, &seen),
            5 => sums_in_position_order::<5>(rows, span, first, &seen),
            4 => sums_in_position_order::<4>(rows, span, first, &seen),
            3 => sums_in_position_order::<3>(rows, span, first, &seen),
            2 => sums_in_position_order::<2>(rows, span, first, &seen),
            _ => sums_in_position_order::<1>(rows, span, first, &seen),
        };
        sink_terms.fill(0.0);
        while let Some(&&(r, term)) = sink_iter.peek()
            && block.contains(&r)
        {
            sink_terms[r - first] = term;
            sink_iter.next();
        }
        for ((r, sum), &term) in block.zip(sums).zip(&sink_terms) {
            let inv_sum = 1.0 / (sum + term);
            for weight in &mut rows[r * span..(r + 1) * span][seen(r)] {
                *weight *= inv_sum;
            }
        }
    }
}

/// Soft-caps the scores of `rows` (`[n][span]`, the positions `seen(r)` of
/// row `r`) in place: `cap * tanh(score / cap)`, as llama.cpp's gemma2
/// graph does before the softmax (a multiply by `1 / cap`, libm's `tanhf`,
/// a multiply by `cap`).
pub(super) fn softcap_rows(
    rows: &mut [f32],
    span: usize,
    seen: impl Fn(usize) -> Range<usize>,
    cap: f32,
) {
    let inv_cap = 1.0 / cap;
    for (r, row) in rows.chunks_exact_mut(span).enumerate() {
        for score in &mut row[seen(r)] {
            *score = (*score * inv_cap).tanh() * cap;
        }
    }
}

/// Rows whose softmax sums [`softmax_to_weights`] runs side by side: eight
/// chains of additions keep both of a core's adders busy where one chain
/// waits on each addition's latency.
const SUM_ROWS: usize = 8;

/// The sums of the `R` rows of `rows` (`[n][span]`) from row `first` on,
/// each over its positions `seen(r)` in position order (one chain of
/// additions per row, from 0.0). Over the positions every row sees the `R`
/// chains advance together; the positions before and after those, which
/// only some rows see, are added row by row, so each row's additions keep
/// their order. The result has [`SUM_ROWS`] sums, of which the first `R` are
/// the rows'.
#[inline(always)]
fn sums_in_position_order<const R: usize>(
    rows: &[f32],
    span: usize,
    first: usize,
    seen: &impl Fn(usize) -> Range<usize>,
) -> [f32; SUM_ROWS] {
    const { assert!(R >= 1 && R <= SUM_ROWS) };
    let rows: [&[f32]; R] = std::array::from_fn(|i| &rows[(first + i) * span..][..span]);
    let ranges: [Range<usize>; R] = std::array::from_fn(|i| seen(first + i));
    let mut sums = [0.0f32; SUM_ROWS];
    let shared_start = ranges.iter().map(|r| r.start).max().unwrap_or(0);
    let shared_end = ranges.iter().map(|r| r.end).min().unwrap_or(0);
    if shared_start >= shared_end {
        // No position seen by all: each row alone.
        for ((sum, row), range) in sums.iter_mut().zip(rows).zip(ranges) {
            *sum = row[range].iter().fold(0.0, |sum, &v| sum + v);
        }
        return sums;
    }
    for ((sum, row), range) in sums.iter_mut().zip(rows).zip(&ranges) {
        *sum = row[range.start..shared_start]
            .iter()
            .fold(0.0, |sum, &v| sum + v);
    }
    let shared: [&[f32]; R] = std::array::from_fn(|i| &rows[i][shared_start..shared_end]);
    for k in 0..shared_end - shared_start {
        for (sum, row) in sums.iter_mut().zip(shared) {
            *sum += row[k];
        }
    }
    for ((sum, row), range) in sums.iter_mut().zip(rows).zip(&ranges) {
        *sum = row[shared_end..range.end]
            .iter()
            .fold(*sum, |sum, &v| sum + v);
    }
    sums
}

/// The largest value of `values` (`f32::max`, so NaN is passed over;
/// negative infinity if there is none), eight lanes side by side.
#[inline(always)]
fn row_max(values: &[f32]) -> f32 {
    let (vectors, rest) = values.as_chunks::<8>();
    let mut lanes = [f32::NEG_INFINITY; 8];
    for vector in vectors {
        for (lane, &v) in lanes.iter_mut().zip(vector) {
            *lane = lane.max(v);
        }
    }
    lanes
        .iter()
        .chain(rest)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}
