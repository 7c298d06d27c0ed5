//! A detokenizer of numbered words with a newline every so often: text for
//! the stages that read it (DRY's sequence breakers), shared by the property
//! tests and the sampling bench (which includes this file by path).

use lm_core::{Detokenize, TokenId};

/// Token `id` decodes to `" w{id}"`, except every `.0`-th (id 0 included),
/// which is a newline (a DRY sequence breaker).
pub struct Words(pub TokenId);

impl Detokenize for Words {
    fn decode(&self, ids: &[TokenId]) -> String {
        ids.iter()
            .map(|&id| {
                if id % self.0 == 0 {
                    "\n".to_owned()
                } else {
                    format!(" w{id}")
                }
            })
            .collect()
    }
}
