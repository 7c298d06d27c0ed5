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

use half::f16;

use super::config::KvPrecision;
use super::kv_cache::KvCache;

/// Head counts and width for one attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (divides `n_head`).
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Whether queries and weights are rounded to f16 (see [`KvPrecision`]).
    pub precision: KvPrecision,
}

/// Writes into `out` (`n_head * head_dim`) the attention of `query` (same
/// width, already rotated if the model uses RoPE) over positions
/// `0..n_positions` of `layer` in `cache`. `scores` is scratch space, grown
/// to `n_positions` if needed.
pub fn attend(
    shape: AttentionShape,
    cache: &KvCache,
    layer: usize,
    n_positions: usize,
    query: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let head_dim = shape.head_dim;
    let group = (shape.n_head / shape.n_kv_head.max(1)).max(1);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let round = shape.precision == KvPrecision::F16;
    // Scores, then (for f16) the rounded query of the current head.
    if scores.len() < n_positions + head_dim {
        scores.resize(n_positions + head_dim, 0.0);
    }
    let (scores, rounded_query) = scores.split_at_mut(n_positions);
    let rounded_query = &mut rounded_query[..head_dim];
    for (head_idx, (q, o)) in query
        .chunks_exact(head_dim)
        .zip(out.chunks_exact_mut(head_dim))
        .enumerate()
    {
        let q = if round {
            for (r, &v) in rounded_query.iter_mut().zip(q) {
                *r = round_to_f16(v);
            }
            &*rounded_query
        } else {
            q
        };
        let kv_head = head_idx / group;
        let mut score_idx = 0;
        for (keys, _) in cache.rows(layer, kv_head, n_positions) {
            for key in keys.chunks_exact(head_dim) {
                if let Some(score) = scores.get_mut(score_idx) {
                    *score = dot(q, key) * scale;
                }
                score_idx += 1;
            }
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for score in scores.iter_mut() {
            *score = (*score - max).exp();
            sum += *score;
        }
        let inv_sum = 1.0 / sum;
        o.fill(0.0);
        let mut weights = scores.iter();
        for (_, values) in cache.rows(layer, kv_head, n_positions) {
            for (value, &weight) in values.chunks_exact(head_dim).zip(&mut weights) {
                let mut weight = weight * inv_sum;
                if round {
                    weight = round_to_f16(weight);
                }
                for (acc, &v) in o.iter_mut().zip(value) {
                    *acc += weight * v;
                }
            }
        }
    }
}

/// `value` rounded to the nearest f16 (ties to even), back in f32.
pub fn round_to_f16(value: f32) -> f32 {
    f16::from_f32(value).to_f32()
}

/// The dot product of two equal-length slices, with eight partial sums so
/// the compiler can vectorise it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
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
        let mut cache = KvCache::new(KvShape {
            n_layer: 1,
            n_kv_head: 1,
            head_dim: 1,
            capacity: 2,
        });
        cache.write(0, 0, &[0.0], &[0.0]);
        cache.write(0, 1, &[round_to_f16(2f32.ln())], &[3.0]);
        cache.commit(2);
        let shape = AttentionShape {
            n_head: 1,
            n_kv_head: 1,
            head_dim: 1,
            precision: KvPrecision::F16,
        };
        let mut out = [0.0];
        attend(shape, &cache, 0, 2, &[1.0], &mut Vec::new(), &mut out);
        let weight = 1.0 / (1.0 + (-round_to_f16(2f32.ln())).exp());
        assert_eq!(out[0], 3.0 * round_to_f16(weight));
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
        let mut cache = KvCache::new(KvShape {
            n_layer: 1,
            n_kv_head: 1,
            head_dim: 1,
            capacity: 4,
        });
        cache.write(0, 0, &[0.0], &[1.0]);
        cache.write(0, 1, &[3f32.ln()], &[5.0]);
        cache.commit(2);
        let shape = AttentionShape {
            n_head: 1,
            n_kv_head: 1,
            head_dim: 1,
            precision: KvPrecision::F32,
        };
        let mut out = [0.0];
        attend(shape, &cache, 0, 2, &[1.0], &mut Vec::new(), &mut out);
        assert!((out[0] - 4.0).abs() < 1e-6, "{out:?}");
        // The causal mask: position 0 reads only itself.
        attend(shape, &cache, 0, 1, &[1.0], &mut Vec::new(), &mut out);
        assert_eq!(out[0], 1.0);
    }

    #[test]
    fn grouped_query_heads_share_their_key_value_head() {
        // Two query heads over one key/value head see the same values.
        let mut cache = KvCache::new(KvShape {
            n_layer: 1,
            n_kv_head: 1,
            head_dim: 2,
            capacity: 4,
        });
        cache.write(0, 0, &[1.0, 0.0], &[2.0, 0.0]);
        cache.write(0, 1, &[0.0, 1.0], &[0.0, 2.0]);
        cache.commit(2);
        let shape = AttentionShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 2,
            precision: KvPrecision::F32,
        };
        let mut out = [0.0; 4];
        // Head 0 looks at key 0 only (large score), head 1 at key 1.
        attend(
            shape,
            &cache,
            0,
            2,
            &[50.0, 0.0, 0.0, 50.0],
            &mut Vec::new(),
            &mut out,
        );
        for (o, e) in out.iter().zip([2.0, 0.0, 0.0, 2.0]) {
            assert!((o - e).abs() < 1e-6, "{out:?}");
        }
    }
}
