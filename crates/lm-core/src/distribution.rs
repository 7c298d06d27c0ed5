//! Choosing one token from logits or probabilities: argmax with a defined tie
//! rule, and inverse-CDF selection with a uniform draw.

use crate::{Error, Result, TokenId};

/// The index of the largest value; the lowest index wins ties (greedy decoding).
///
/// Values may be -inf (masked); NaN and +inf are errors, as is a slice that is
/// empty or entirely -inf.
///
/// ```
/// assert_eq!(lm_core::argmax(&[1.0, 3.0, 3.0]).unwrap(), 1);
/// ```
pub fn argmax(values: &[f32]) -> Result<TokenId> {
    if values.is_empty() {
        return Err(Error::EmptyLogits);
    }
    // Branch-free lanes (the compiler vectorises them): the largest value,
    // and whether any value is NaN or +inf. Only then are indices looked at.
    let (max, all_valid) = max_and_validity(values);
    if !all_valid {
        let (index, &value) = values
            .iter()
            .enumerate()
            .find(|(_, v)| v.is_nan() || **v == f32::INFINITY)
            .expect("the scan saw a NaN or +inf");
        return Err(Error::InvalidLogit { index, value });
    }
    if max == f32::NEG_INFINITY {
        return Err(Error::AllMasked);
    }
    Ok(first_index_of(values, max) as TokenId)
}

/// Lanes of the vectorised scans over a vocabulary.
const LANES: usize = 16;

/// The largest value and whether every value is below +inf (NaN is not).
fn max_and_validity(values: &[f32]) -> (f32, bool) {
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut valid = [true; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for lane in 0..LANES {
            let v = chunk[lane];
            max[lane] = if v > max[lane] { v } else { max[lane] };
            valid[lane] &= v < f32::INFINITY;
        }
    }
    let mut best = f32::NEG_INFINITY;
    let mut all_valid = valid.iter().all(|&v| v);
    for &v in max.iter().chain(chunks.remainder()) {
        best = if v > best { v } else { best };
        all_valid &= v < f32::INFINITY;
    }
    (best, all_valid)
}

/// The first index holding `target`, which must occur in `values`.
fn first_index_of(values: &[f32], target: f32) -> usize {
    let mut start = 0;
    for chunk in values.chunks(LANES) {
        // `fold`, not `any`: no early exit inside a chunk, so it vectorises.
        if chunk.iter().fold(false, |hit, &v| hit | (v == target)) {
            break;
        }
        start += chunk.len();
    }
    start
        + values[start..]
            .iter()
            .position(|&v| v == target)
            .expect("target occurs in values")
}

/// Inverse-CDF selection (lesson 000, "The mathematics"): walk the tokens in id
/// order, add up their probabilities, and take the first token at which the
/// running total exceeds `u`. The total is kept in f64 and advances a block of
/// 16 tokens at a time until the block that crosses `u`, which is walked token
/// by token (so a row of 49,152 costs about 3,000 additions, not 49,152).
///
/// `u` must lie in [0, 1). The probabilities must be non-negative and finite
/// with a positive sum; they are used as given, so a sum a little off 1 from
/// rounding is harmless. The selection never falls off the end: when `u` is at
/// least the running total after the last token (u close to 1 and a sum that
/// rounded low), the last token with a positive probability is taken. A token
/// of probability 0 is never selected.
///
/// ```
/// // p = (0.665, 0.245, 0.090): u = 0.7 passes "red" and lands on "green".
/// assert_eq!(lm_core::sample_inverse_cdf(&[0.665, 0.245, 0.090], 0.7).unwrap(), 1);
/// ```
pub fn sample_inverse_cdf(probs: &[f32], u: f64) -> Result<TokenId> {
    if !(0.0..1.0).contains(&u) {
        return Err(Error::UniformOutOfRange { value: u });
    }
    if probs.is_empty() {
        return Err(Error::EmptyLogits);
    }
    if !all_valid_probabilities(probs) {
        let (index, &p) = probs
            .iter()
            .enumerate()
            .find(|(_, p)| !is_valid_probability(**p))
            .expect("the scan saw an invalid probability");
        return Err(Error::InvalidProbability {
            index,
            value: f64::from(p),
        });
    }
    let last_positive = probs
        .iter()
        .rposition(|&p| p > 0.0)
        .ok_or(Error::AllMasked)?;
    // The running total advances a block of LANES entries at a time while it
    // stays at most u; the block that crosses u is walked entry by entry.
    // Blocks of zeros (most of a filtered row) cost one vector sum.
    let mut running = 0.0f64;
    let mut start = 0;
    for block in probs[..last_positive].chunks(LANES) {
        let block_sum = sum_in_lanes(block);
        if running + block_sum <= u {
            running += block_sum;
        } else {
            for (offset, &p) in block.iter().enumerate() {
                running += f64::from(p);
                if p > 0.0 && running > u {
                    return Ok((start + offset) as TokenId);
                }
            }
        }
        start += block.len();
    }
    Ok(last_positive as TokenId)
}

/// The f64 sum of up to [`LANES`] values, in a fixed order that vectorises.
fn sum_in_lanes(block: &[f32]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    for (lane, &p) in lanes.iter_mut().zip(block) {
        *lane = f64::from(p);
    }
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
        width /= 2;
    }
    lanes[0]
}

/// Non-negative and finite (NaN is not).
fn is_valid_probability(p: f32) -> bool {
    (0.0..f32::INFINITY).contains(&p)
}

/// [`is_valid_probability`] for every entry, in lanes of integer min and max
/// that vectorise: `p + 0.0` turns -0.0 into +0.0, and then the bits of a
/// non-negative finite f32, read as i32, lie in [0, bits of +inf); a negative
/// number (or NaN) is below 0, +inf and a positive NaN at or above.
fn all_valid_probabilities(probs: &[f32]) -> bool {
    const INFINITY_BITS: i32 = 0x7f80_0000;
    let bits = |p: f32| (p + 0.0).to_bits() as i32;
    let mut low = [0i32; LANES];
    let mut high = [0i32; LANES];
    let mut chunks = probs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for lane in 0..LANES {
            low[lane] = low[lane].min(bits(chunk[lane]));
            high[lane] = high[lane].max(bits(chunk[lane]));
        }
    }
    let low = low
        .into_iter()
        .chain(chunks.remainder().iter().map(|&p| bits(p)))
        .min();
    let high = high
        .into_iter()
        .chain(chunks.remainder().iter().map(|&p| bits(p)))
        .max();
    low >= Some(0) && high < Some(INFINITY_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_lowest_index_on_ties() {
        assert_eq!(argmax(&[0.5, 0.5]).unwrap(), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -7.0, -7.0]).unwrap(), 1);
    }

    /// The definition, one index at a time.
    fn argmax_reference(values: &[f32]) -> Result<TokenId> {
        if values.is_empty() {
            return Err(Error::EmptyLogits);
        }
        let mut best: Option<(usize, f32)> = None;
        for (index, &value) in values.iter().enumerate() {
            if value.is_nan() || value == f32::INFINITY {
                return Err(Error::InvalidLogit { index, value });
            }
            if value > f32::NEG_INFINITY && best.is_none_or(|(_, b)| value > b) {
                best = Some((index, value));
            }
        }
        let (index, _) = best.ok_or(Error::AllMasked)?;
        Ok(index as TokenId)
    }

    /// A value drawn mostly from a few levels (so ties are common), sometimes
    /// -inf, rarely NaN or +inf.
    fn logit() -> impl proptest::strategy::Strategy<Value = f32> {
        use proptest::prelude::*;
        prop_oneof![
            20 => (-3i8..=3).prop_map(f32::from),
            20 => -10.0f32..10.0,
            4 => Just(f32::NEG_INFINITY),
            1 => Just(f32::NAN),
            1 => Just(f32::INFINITY),
        ]
    }

    proptest::proptest! {
        #[test]
        fn argmax_matches_the_definition(values in proptest::collection::vec(logit(), 0..80)) {
            let got = argmax(&values);
            let want = argmax_reference(&values);
            // NaN != NaN: compare the error's index and the value's bits.
            match (&got, &want) {
                (
                    Err(Error::InvalidLogit { index: a, value: x }),
                    Err(Error::InvalidLogit { index: b, value: y }),
                ) => proptest::prop_assert!(a == b && x.to_bits() == y.to_bits()),
                _ => proptest::prop_assert_eq!(got, want),
            }
        }
    }

    #[test]
    fn argmax_finds_the_first_maximum_in_a_vocabulary_sized_row() {
        let mut values: Vec<f32> = (0..49_152).map(|i| ((i * 7919) % 1000) as f32).collect();
        values[30_001] = 5000.0;
        values[40_000] = 5000.0;
        assert_eq!(argmax(&values).unwrap(), 30_001);
        values[49_151] = f32::NAN;
        assert!(matches!(
            argmax(&values),
            Err(Error::InvalidLogit { index: 49_151, .. })
        ));
    }

    #[test]
    fn argmax_rejects_bad_input() {
        crate::softmax::tests::assert_refuses_bad_logits(argmax);
    }

    /// Brute-force reference: the first index whose cumulative sum exceeds u.
    fn reference(probs: &[f32], u: f64) -> usize {
        let mut cdf = 0.0;
        for (i, &p) in probs.iter().enumerate() {
            cdf += f64::from(p);
            if cdf > u {
                return i;
            }
        }
        unreachable!("u below the total")
    }

    #[test]
    fn inverse_cdf_matches_the_cumulative_sum() {
        let probs = [0.1f32, 0.0, 0.3, 0.6];
        for k in 0..1000 {
            let u = f64::from(k) / 1000.0;
            assert_eq!(
                sample_inverse_cdf(&probs, u).unwrap() as usize,
                reference(&probs, u),
                "u = {u}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn inverse_cdf_matches_the_definition_on_sparse_rows(
            cells in proptest::collection::vec((0u8..4, 0.0f32..1.0), 1..200),
            u in 0.0f64..1.0,
        ) {
            // Three in four entries are 0, as after top-k or top-p.
            let probs: Vec<f32> = cells.iter().map(|&(keep, p)| if keep == 0 { p } else { 0.0 }).collect();
            let total: f64 = probs.iter().map(|&p| f64::from(p)).sum();
            proptest::prop_assume!(total > 0.0);
            let probs: Vec<f32> = probs.iter().map(|&p| (f64::from(p) / total) as f32).collect();
            // The definition: the first positive entry at which the running
            // total exceeds u, else the last positive entry.
            let mut running = 0.0f64;
            let mut want = None;
            for (i, &p) in probs.iter().enumerate() {
                running += f64::from(p);
                if p > 0.0 && running > u {
                    want = Some(i);
                    break;
                }
            }
            let want = want.unwrap_or_else(|| probs.iter().rposition(|&p| p > 0.0).unwrap());
            proptest::prop_assert_eq!(sample_inverse_cdf(&probs, u).unwrap() as usize, want);
        }
    }

    #[test]
    fn inverse_cdf_lesson_000_boundaries() {
        let p = [0.665f32, 0.245, 0.090];
        assert_eq!(sample_inverse_cdf(&p, 0.0).unwrap(), 0);
        assert_eq!(sample_inverse_cdf(&p, 0.664).unwrap(), 0);
        assert_eq!(sample_inverse_cdf(&p, 0.666).unwrap(), 1);
        assert_eq!(sample_inverse_cdf(&p, 0.95).unwrap(), 2);
    }

    #[test]
    fn inverse_cdf_never_falls_off_the_end() {
        // The sum rounds below u: the last positive token is taken, never a
        // zero-probability one after it.
        let probs = [0.3f32, 0.3, 0.3, 0.0];
        assert_eq!(sample_inverse_cdf(&probs, 0.95).unwrap(), 2);
        let next_below_one = 1.0 - f64::EPSILON / 2.0;
        assert_eq!(sample_inverse_cdf(&[0.5, 0.5], next_below_one).unwrap(), 1);
    }

    #[test]
    fn inverse_cdf_skips_zero_probability_tokens() {
        assert_eq!(sample_inverse_cdf(&[0.0, 1.0], 0.0).unwrap(), 1);
        assert_eq!(sample_inverse_cdf(&[0.0, 0.0, 1.0, 0.0], 0.999).unwrap(), 2);
    }

    #[test]
    fn inverse_cdf_checks_every_kind_of_float() {
        // -0.0 is a zero probability; NaN of either sign, -inf, +inf and the
        // smallest negative number are errors, anywhere in a long row.
        let mut probs = vec![0.0f32; 100];
        probs[3] = -0.0;
        probs[60] = 1.0;
        assert_eq!(sample_inverse_cdf(&probs, 0.5).unwrap(), 60);
        for bad in [
            f32::NAN,
            f32::from_bits(0xffc0_0000),
            f32::NEG_INFINITY,
            f32::INFINITY,
            -f32::from_bits(1),
        ] {
            for index in [0, 37, 99] {
                let mut row = probs.clone();
                row[index] = bad;
                assert!(
                    matches!(
                        sample_inverse_cdf(&row, 0.5),
                        Err(Error::InvalidProbability { index: i, .. }) if i == index
                    ),
                    "{bad} at {index}"
                );
            }
        }
    }

    #[test]
    fn inverse_cdf_rejects_bad_input() {
        assert_eq!(
            sample_inverse_cdf(&[1.0], 1.0),
            Err(Error::UniformOutOfRange { value: 1.0 })
        );
        assert!(matches!(
            sample_inverse_cdf(&[1.0], -0.1),
            Err(Error::UniformOutOfRange { .. })
        ));
        assert!(matches!(
            sample_inverse_cdf(&[1.0], f64::NAN),
            Err(Error::UniformOutOfRange { .. })
        ));
        assert_eq!(sample_inverse_cdf(&[], 0.5), Err(Error::EmptyLogits));
        assert_eq!(sample_inverse_cdf(&[0.0, 0.0], 0.5), Err(Error::AllMasked));
        assert!(matches!(
            sample_inverse_cdf(&[0.5, -0.1], 0.5),
            Err(Error::InvalidProbability { index: 1, .. })
        ));
        assert!(matches!(
            sample_inverse_cdf(&[f32::NAN], 0.5),
            Err(Error::InvalidProbability { index: 0, .. })
        ));
    }
}
