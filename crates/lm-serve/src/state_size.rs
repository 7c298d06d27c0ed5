//! [`StateSize`]: the memory a sequence state holds, the measure of the
//! prefix cache's `--cache-mb` budget (lm-decode's `PrefixCache` counts a
//! state's bytes with the function it is given; this is that function for
//! lm-model's states and lm-core's `Prefix`).

use lm::lm_model::{DecoderState, NgramState};
use lm_core::Prefix;

/// The memory a sequence state holds, for the prefix cache's budget.
pub trait StateSize {
    /// Bytes held (an estimate; shared storage may be counted twice).
    fn size_bytes(&self) -> usize;
}

impl StateSize for DecoderState {
    fn size_bytes(&self) -> usize {
        self.cache().allocated_bytes()
    }
}

impl StateSize for NgramState {
    fn size_bytes(&self) -> usize {
        std::mem::size_of_val(self.tokens())
    }
}

impl StateSize for Prefix {
    fn size_bytes(&self) -> usize {
        std::mem::size_of_val(self.tokens.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_holds_four_bytes_a_token() {
        let state = Prefix {
            tokens: vec![1, 2, 3],
        };
        assert_eq!(state.size_bytes(), 12);
    }
}
