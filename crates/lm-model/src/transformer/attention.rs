//! Causal multi-head and grouped-query attention of one query row over the
//! keys and values in the [`KvCache`].
//!
//! The causal mask is implicit: the query at position `p` reads cache rows
//! `0..=p` only, which is the lower triangle of the full mask:
//!
//! ```text
//!            key position
//!            0    1    2    3
//! query 0 [  ok  -inf -inf -inf ]
//! query 1 [  ok   ok  -inf -inf ]
//! query 2 [  ok   ok   ok  -inf ]
//! query 3 [  ok   ok   ok   ok  ]
//! ```
//!
//! With grouped-query attention, `n_head / n_kv_head` consecutive query heads
//! share one key/value head (SmolLM2: 9 query heads over 3, so heads 0-2 read
//! key/value head 0). Softmax runs in f32 after subtracting the row maximum.
//!
//! The query heads of one group are handled together: each chunk of keys
//! (and then of values) is read once for the whole group, and an f16 cache
//! widens each chunk's rows to f32 once per group into a reused buffer
//! (see `StoredRows::to_f32` in `kv_cache`), so the products below run on f32 slices
//! whatever the cache stores.

use half::f16;

use super::config::KvPrecision;
use half::slice::HalfFloatSliceExt;

use super::kv_cache::{KvCache, widen_f16};
use crate::dispatch::Dispatch;

/// Head counts and width for one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (divides `n_head`).
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Whether queries and weights are rounded to f16 (see [`KvPrecision`]).
    pub precision: KvPrecision,
    /// The factor of the query-key products (`1 / sqrt(head_dim)` for most
    /// models).
    pub scale: f32,
    /// With sliding-window attention, the positions a query sees (its own
    /// included); `None` sees every earlier position.
    pub window: Option<usize>,
}

/// Buffers [`attend`] reuses from call to call, grown (amortised) to the
/// largest need seen, so decode steps do not allocate per token.
#[derive(Debug, Clone, Default)]
pub struct AttentionScratch {
    /// Scores, then weights, of one group's query heads:
    /// `[group][n_positions]`.
    scores: Vec<f32>,
    /// One group's queries rounded to f16 (f16 precision only):
    /// `[group][head_dim]`.
    queries: Vec<f32>,
    /// One chunk's key or value rows widened to f32 (f16 cache only):
    /// `[CHUNK_LEN][head_dim]`.
    rows: Vec<f32>,
    /// Queries or weights narrowed to f16 on their way to being rounded
    /// (f16 precision only): `[max(group * head_dim, n_positions)]`.
    narrowed: Vec<f16>,
}

/// Writes into `out` (`n_head * head_dim`) the attention of `query` (same
/// width, already rotated if the model uses RoPE) over positions
/// `0..n_positions` of `layer` in `cache`, or over the last `window` of
/// them with a sliding window.
pub fn attend(
    shape: AttentionShape,
    cache: &KvCache,
    layer: usize,
    n_positions: usize,
    query: &[f32],
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    let head_dim = shape.head_dim;
    // The configuration was validated when the model was built.
    debug_assert!(
        head_dim > 0 && shape.n_kv_head > 0 && shape.n_head.is_multiple_of(shape.n_kv_head)
    );
    debug_assert_eq!(query.len(), shape.n_head * head_dim, "query width");
    debug_assert_eq!(out.len(), shape.n_head * head_dim, "output width");
    assert!(
        (1..=cache.shape().capacity).contains(&n_positions),
        "attention over {n_positions} positions of a cache of {}",
        cache.shape().capacity
    );
    let dispatch = cache.dispatch();
    let group = shape.n_head / shape.n_kv_head;
    let group_width = group * head_dim;
    let scale = shape.scale;
    let first_visible = shape
        .window
        .map_or(0, |window| n_positions.saturating_sub(window));
    let n_visible = n_positions - first_visible;
    let round = shape.precision == KvPrecision::F16;
    let AttentionScratch {
        scores,
        queries,
        rows,
        narrowed,
    } = scratch;
    if scores.len() < group * n_visible {
        scores.resize(group * n_visible, 0.0);
    }
    if queries.len() < group_width {
        queries.resize(group_width, 0.0);
    }
    let scores = &mut scores[..group * n_visible];
    let visible = first_visible..n_positions;
    let rounded_queries = &mut queries[..group_width];
    // Consecutive query heads share a key/value head, so one group's
    // queries and outputs are contiguous.
    for (kv_head, (group_queries, group_out)) in query
        .chunks_exact(group_width)
        .zip(out.chunks_exact_mut(group_width))
        .enumerate()
    {
        let group_queries = if round {
            rounded_queries.copy_from_slice(group_queries);
            round_all_to_f16(dispatch, rounded_queries, narrowed);
            &*rounded_queries
        } else {
            group_queries
        };
        // scores[g * n_visible + p - first_visible] = q_g . k_p * scale
        let mut first_pos = 0;
        for (keys, _) in cache.rows_in(layer, kv_head, visible.clone()) {
            let keys = keys.to_f32(dispatch, rows);
            for (row_idx, key) in keys.chunks_exact(head_dim).enumerate() {
                let pos = first_pos + row_idx;
                for (head_scores, q) in scores
                    .chunks_exact_mut(n_visible)
                    .zip(group_queries.chunks_exact(head_dim))
                {
                    head_scores[pos] = dot(q, key) * scale;
                }
            }
            first_pos += keys.len() / head_dim;
        }
        for head_scores in scores.chunks_exact_mut(n_visible) {
            softmax_to_weights(head_scores);
            if round {
                round_all_to_f16(dispatch, head_scores, narrowed);
            }
        }
        group_out.fill(0.0);
        let mut first_pos = 0;
        for (_, values) in cache.rows_in(layer, kv_head, visible.clone()) {
            let n_rows = values.len() / head_dim;
            let values = values.to_f32(dispatch, rows);
            for (head_weights, o) in scores
                .chunks_exact(n_visible)
                .zip(group_out.chunks_exact_mut(head_dim))
            {
                let weights = &head_weights[first_pos..];
                for (value, &weight) in values.chunks_exact(head_dim).zip(weights) {
                    for (acc, &v) in o.iter_mut().zip(value) {
                        *acc += weight * v;
                    }
                }
            }
            first_pos += n_rows;
        }
    }
}

/// Turns one head's scores into its attention weights in place: softmax
/// after subtracting the maximum.
fn softmax_to_weights(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        sum += *score;
    }
    let inv_sum = 1.0 / sum;
    for score in scores.iter_mut() {
        *score *= inv_sum;
    }
}

/// Rounds every value to the nearest f16 (ties to even) in place, as
/// [`round_to_f16`] does one value at a time, through `narrowed` (grown if
/// needed) with vectorised conversions both ways.
fn round_all_to_f16(dispatch: Dispatch, values: &mut [f32], narrowed: &mut Vec<f16>) {
    if narrowed.len() < values.len() {
        narrowed.resize(values.len(), f16::ZERO);
    }
    let narrowed = &mut narrowed[..values.len()];
    narrowed.convert_from_f32_slice(values);
    widen_f16(dispatch, narrowed, values);
}

/// `value` rounded to the nearest f16 (ties to even), back in f32: the
/// one-value definition the tests check the slice rounding against.
#[cfg(test)]
fn round_to_f16(value: f32) -> f32 {
    f16::from_f32(value).to_f32()
}

/// The dot product of two equal-length slices, with eight partial sums so
/// the compiler can vectorise it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len(), "dot of unequal lengths");
    let mut partial = [0.0f32; 8];
    let a_chunks = a.chunks_exact(8);
    let b_chunks = b.chunks_exact(8);
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for i in 0..8 {
            partial[i] += x[i] * y[i];
        }
    }
    partial.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::super::kv_cache::KvShape;
    use super::*;

    /// The attention output of one head of width 1 (`query`) over the
    /// first `n_positions` positions of layer 0 of `cache`.
    fn attend_width_one(
        cache: &KvCache,
        precision: KvPrecision,
        n_positions: usize,
        query: f32,
    ) -> f32 {
        let shape = AttentionShape {
            n_head: 1,
            n_kv_head: 1,
            head_dim: 1,
            precision,
            scale: 1.0,
            window: None,
        };
        let mut out = [0.0];
        let mut scratch = AttentionScratch::default();
        attend(
            shape,
            cache,
            0,
            n_positions,
            &[query],
            &mut scratch,
            &mut out,
        );
        out[0]
    }

    /// A one-layer cache of one key/value head holding `rows` (key, value)
    /// at positions 0, 1, ...
    fn one_head_cache(
        head_dim: usize,
        capacity: usize,
        precision: KvPrecision,
        rows: &[(&[f32], &[f32])],
    ) -> KvCache {
        let shape = KvShape {
            n_layer: 1,
            n_kv_head: 1,
            head_dim,
            capacity,
        };
        let mut cache = KvCache::new(shape, precision, Dispatch::detect());
        for (pos, (key, value)) in rows.iter().enumerate() {
            cache.write(0, pos, key, value);
        }
        cache.commit(rows.len());
        cache
    }

    #[test]
    fn f16_rounding_keeps_eleven_significant_bits() {
        // f16 has a 10-bit fraction: 1 + 2^-10 survives, 1 + 2^-12 rounds to 1.
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-10)), 1.0 + 2f32.powi(-10));
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-12)), 1.0);
        assert_eq!(round_to_f16(0.1), 0.099_975_586);
    }

    #[test]
    fn f16_attention_rounds_the_weights() {
        // Keys 0 and ln 2 give weights 1/3 and 2/3; in f16 they are
        // 0.33325195 and 0.6665039, so the output over values 0 and 3 is
        // 3 * 0.6665039 instead of 2.
        let cache = one_head_cache(
            1,
            2,
            KvPrecision::F16,
            &[(&[0.0], &[0.0]), (&[round_to_f16(2f32.ln())], &[3.0])],
        );
        let weight = 1.0 / (1.0 + (-round_to_f16(2f32.ln())).exp());
        assert_eq!(
            attend_width_one(&cache, KvPrecision::F16, 2, 1.0),
            3.0 * round_to_f16(weight)
        );
    }

    #[test]
    fn rounding_a_slice_matches_rounding_each_value() {
        // Ties (1 + 2^-11 and 1 + 3 * 2^-11 go to the even neighbour),
        // subnormals, overflow, and a spread of ordinary values; 45 values so
        // the eight-wide loop leaves a remainder.
        let mut values = vec![
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            3.0 * 2f32.powi(-25),
            2f32.powi(-26),
            65519.0,
            65520.0,
            -0.1,
        ];
        values.extend((0..38).map(|i| (i as f32 * 0.731 - 9.0).powi(3) / 7.0));
        let expected: Vec<u32> = values.iter().map(|&v| round_to_f16(v).to_bits()).collect();
        assert_eq!(
            expected[..6],
            [
                1f32.to_bits(),
                (1.0 + 2f32.powi(-9)).to_bits(),
                2f32.powi(-23).to_bits(),
                0f32.to_bits(),
                65504f32.to_bits(),
                f32::INFINITY.to_bits()
            ]
        );
        round_all_to_f16(Dispatch::detect(), &mut values, &mut Vec::new());
        let rounded: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        assert_eq!(rounded, expected);
    }

    #[test]
    fn dot_matches_a_plain_sum() {
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..19).map(|i| (i % 3) as f32).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(dot(&a, &b), plain);
    }

    #[test]
    fn one_query_over_two_positions_by_hand() {
        // One head of width 1: keys 0 and ln(3) * 1, query 1, values 1 and 5.
        // Weights softmax([0, ln 3]) = [1/4, 3/4], output 1/4 + 15/4 = 4.
        let cache = one_head_cache(
            1,
            4,
            KvPrecision::F32,
            &[(&[0.0], &[1.0]), (&[3f32.ln()], &[5.0])],
        );
        let out = attend_width_one(&cache, KvPrecision::F32, 2, 1.0);
        assert!((out - 4.0).abs() < 1e-6, "{out:?}");
        // The causal mask: position 0 reads only itself.
        assert_eq!(attend_width_one(&cache, KvPrecision::F32, 1, 1.0), 1.0);
    }

    #[test]
    fn grouped_query_heads_share_their_key_value_head() {
        // Two query heads over one key/value head see the same values.
        let cache = one_head_cache(
            2,
            4,
            KvPrecision::F32,
            &[(&[1.0, 0.0], &[2.0, 0.0]), (&[0.0, 1.0], &[0.0, 2.0])],
        );
        let shape = AttentionShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 2,
            precision: KvPrecision::F32,
            scale: 1.0 / 2f32.sqrt(),
            window: None,
        };
        let mut out = [0.0; 4];
        // Head 0 looks at key 0 only (large score), head 1 at key 1.
        attend(
            shape,
            &cache,
            0,
            2,
            &[50.0, 0.0, 0.0, 50.0],
            &mut AttentionScratch::default(),
            &mut out,
        );
        for (o, e) in out.iter().zip([2.0, 0.0, 0.0, 2.0]) {
            assert!((o - e).abs() < 1e-6, "{out:?}");
        }
    }

    /// The attention of one query head written out plainly, head by head
    /// and position by position (the computation before query heads were
    /// grouped), over keys and values given as f32 rows.
    fn attend_head_by_head(
        shape: AttentionShape,
        keys: &[Vec<f32>],
        values: &[Vec<f32>],
        query: &[f32],
    ) -> Vec<f32> {
        let head_dim = shape.head_dim;
        let group = shape.n_head / shape.n_kv_head;
        let round = |v: f32| match shape.precision {
            KvPrecision::F16 => f16::from_f32(v).to_f32(),
            KvPrecision::F32 => v,
        };
        let mut out = Vec::new();
        for (head_idx, q) in query.chunks_exact(head_dim).enumerate() {
            let q: Vec<f32> = q.iter().map(|&v| round(v)).collect();
            let kv = head_idx / group * head_dim..(head_idx / group + 1) * head_dim;
            let scores: Vec<f32> = keys
                .iter()
                .map(|k| dot(&q, &k[kv.clone()]) * (1.0 / (head_dim as f32).sqrt()))
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f32 = exps.iter().sum();
            let mut o = vec![0.0; head_dim];
            for (e, v) in exps.iter().zip(values) {
                let weight = round(e * (1.0 / sum));
                for (acc, &x) in o.iter_mut().zip(&v[kv.clone()]) {
                    *acc += weight * x;
                }
            }
            out.extend(o);
        }
        out
    }

    #[test]
    fn grouped_attention_equals_head_by_head_attention_bit_for_bit_at_both_precisions() {
        // 4 query heads over 2 key/value heads of width 8, 70 positions (three
        // chunks), pseudo-random values; every prefix length is checked.
        let kv_shape = KvShape {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 8,
            capacity: 80,
        };
        let mut state = 7u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
        };
        let n = 70;
        let row = |next: &mut dyn FnMut() -> f32| (0..16).map(|_| next()).collect::<Vec<f32>>();
        let keys: Vec<Vec<f32>> = (0..n).map(|_| row(&mut next)).collect();
        let values: Vec<Vec<f32>> = (0..n).map(|_| row(&mut next)).collect();
        let query: Vec<f32> = (0..32).map(|_| next()).collect();
        for precision in [KvPrecision::F32, KvPrecision::F16] {
            let mut cache = KvCache::new(kv_shape, precision, Dispatch::detect());
            for (pos, (k, v)) in keys.iter().zip(&values).enumerate() {
                cache.write(1, pos, k, v);
            }
            cache.commit(n);
            // The cache holds what the plain version reads: f16-rounded rows
            // for an f16 cache.
            let stored = |rows: &[Vec<f32>]| -> Vec<Vec<f32>> {
                rows.iter()
                    .map(|r| match precision {
                        KvPrecision::F16 => r.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
                        KvPrecision::F32 => r.clone(),
                    })
                    .collect()
            };
            let (stored_keys, stored_values) = (stored(&keys), stored(&values));
            let shape = AttentionShape {
                n_head: 4,
                n_kv_head: 2,
                head_dim: 8,
                precision,
                scale: 1.0 / 8f32.sqrt(),
                window: None,
            };
            let mut scratch = AttentionScratch::default();
            let mut out = vec![0.0; 32];
            for n_positions in 1..=n {
                attend(
                    shape,
                    &cache,
                    1,
                    n_positions,
                    &query,
                    &mut scratch,
                    &mut out,
                );
                let expected = attend_head_by_head(
                    shape,
                    &stored_keys[..n_positions],
                    &stored_values[..n_positions],
                    &query,
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&out),
                    bits(&expected),
                    "{precision:?}, {n_positions} positions"
                );
            }
        }
    }
}
