//! The embedded default model: a pruned trigram Kneser-Ney model of the King
//! James Version of the Bible (public domain), shipped in the compact form
//! so `lm-cli generate` writes English-like text with no download.
//!
//! The corpus is the text of Debian's `bible-kjv-text` package, one verse per
//! line with the verse references stripped (`scripts/ngram/kjv_corpus.sh`);
//! `fixtures/README.md` has the source, the licence and the recipe, which
//! [`embedded_options`] encodes and a test checks byte for byte when the
//! corpus is at hand.

use super::error::NgramError;
use super::model::NgramModel;
use super::{Smoothing, TrainOptions, Utf8Policy};

/// The compact model file, built into the library.
pub const EMBEDDED_COMPACT: &[u8] = include_bytes!("../../../../fixtures/ngram/kjv-3gram.lmng");

/// The training options of the embedded model: order 3, modified Kneser-Ney,
/// bigrams and trigrams seen once pruned.
pub fn embedded_options() -> TrainOptions {
    TrainOptions {
        order: 3,
        smoothing: Smoothing::ModifiedKneserNey { fallback: None },
        utf8: Utf8Policy::Strict,
        prune: vec![0, 1, 1],
    }
}

/// Loads the embedded default model (a few milliseconds).
///
/// ```
/// let model = lm_model::ngram::embedded_default().unwrap();
/// assert_eq!(model.order(), 3);
/// assert!(model.vocab().id("LORD").is_some());
/// ```
pub fn embedded_default() -> Result<NgramModel, NgramError> {
    NgramModel::from_compact(EMBEDDED_COMPACT)
}
