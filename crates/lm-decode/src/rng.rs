//! The portable random source: ChaCha20 with a documented seeding, and the
//! uniform draw `u` in [0, 1) that selection consumes.
//!
//! ```text
//! key    = seed.to_le_bytes() followed by 24 zero bytes   (32-byte ChaCha key)
//! stream = sequence / batch-row index                     (ChaCha stream id)
//! u      = (next_u64 >> 11) * 2^-53                       (53 high bits)
//! ```
//!
//! Stream 0 is the single run, so the first of several outputs for one prompt
//! (`num_return_sequences`) and batch row 0 reproduce `generate` with the
//! same seed. Nothing here uses `StdRng`, whose algorithm may change.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// A seeded source of uniform draws for token selection.
///
/// ```
/// use lm_decode::TokenRng;
/// let mut a = TokenRng::new(7);
/// let mut b = TokenRng::with_stream(7, 0);
/// let u = a.next_uniform();
/// assert!((0.0..1.0).contains(&u));
/// assert_eq!(u, b.next_uniform(), "stream 0 is the plain seed");
/// ```
#[derive(Debug, Clone)]
pub struct TokenRng {
    chacha: ChaCha20Rng,
}

impl TokenRng {
    /// The generator for `seed` on stream 0.
    pub fn new(seed: u64) -> Self {
        Self::with_stream(seed, 0)
    }

    /// The generator for `seed` on ChaCha stream `stream` (one stream per
    /// returned sequence or batch row).
    pub fn with_stream(seed: u64, stream: u64) -> Self {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        let mut chacha = ChaCha20Rng::from_seed(key);
        chacha.set_stream(stream);
        Self { chacha }
    }

    /// A uniform draw in [0, 1): the 53 high bits of the next `u64` times 2^-53.
    pub fn next_uniform(&mut self) -> f64 {
        const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
        (self.chacha.next_u64() >> 11) as f64 * SCALE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_lie_in_the_unit_interval_and_streams_differ() {
        let mut zero = TokenRng::with_stream(1, 0);
        let mut one = TokenRng::with_stream(1, 1);
        let a: Vec<f64> = (0..100).map(|_| zero.next_uniform()).collect();
        let b: Vec<f64> = (0..100).map(|_| one.next_uniform()).collect();
        assert!(a.iter().chain(&b).all(|u| (0.0..1.0).contains(u)));
        assert_ne!(a, b);
        let mean = a.iter().sum::<f64>() / 100.0;
        assert!((mean - 0.5).abs() < 0.15, "mean {mean}");
    }

    #[test]
    fn the_draw_is_the_high_bits_of_next_u64() {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&42u64.to_le_bytes());
        let mut reference = ChaCha20Rng::from_seed(key);
        let expected = (reference.next_u64() >> 11) as f64 / 9_007_199_254_740_992.0;
        assert_eq!(TokenRng::new(42).next_uniform(), expected);
    }
}
