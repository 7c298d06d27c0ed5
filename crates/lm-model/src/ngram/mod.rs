//! Count-based next-token models (lesson 000's lab: "build a count-based
//! next-token model"), in the backoff form KenLM and SRILM share.
//!
//! - Train from any UTF-8 text ([`train`]: each line a sentence, split into
//!   words and punctuation by [`split_words`]) or from the caller's own
//!   tokens ([`NgramCounts::add_sentence`]); lm-model does not depend on
//!   lm-tokenize.
//! - Estimate with maximum likelihood, add-k, or interpolated modified
//!   Kneser-Ney as KenLM's `lmplz` does ([`Smoothing`]); every context, seen
//!   or not, gets a distribution by backoff.
//! - Read and write ARPA files ([`NgramModel::read_arpa`],
//!   [`NgramModel::write_arpa`]); score text as KenLM's `query` does
//!   ([`NgramModel::score`]).
//! - Generate through lm-decode: [`NgramModel`] implements
//!   [`lm_core::LanguageModel`] (logits are natural-log probabilities, `<s>`
//!   is masked, `</s>` is the end token) and [`lm_core::Detokenize`].
//!
//! ```
//! use lm_model::ngram::{NgramCounts, NgramModel, Smoothing};
//! // Lesson 000's lab: probabilities from counts.
//! let mut counts = NgramCounts::new(2).unwrap();
//! counts.add_sentence(["the", "cat", "sat"]).unwrap();
//! counts.add_sentence(["the", "dog", "sat"]).unwrap();
//! let model = NgramModel::estimate(&counts, &Smoothing::MaximumLikelihood, &[]).unwrap();
//! let the = model.vocab().id("the").unwrap();
//! let cat = model.vocab().id("cat").unwrap();
//! // count(the cat) / count(the ·) = 1/2
//! let p = model.log10_prob(&[the], cat);
//! assert!((p.probability() - 0.5).abs() < 1e-6);
//! assert_eq!(p.ngram_length, 2); // the bigram "the cat" is stored
//! ```

mod arpa;
mod compact;
mod counts;
mod embedded;
mod error;
mod key;
mod model;
mod score;
mod smoothing;
mod split;
mod vocab;

use std::io::BufRead;

pub use arpa::MISSING_UNK_LOG10_PROB;
pub use compact::COMPACT_MAGIC;
pub use counts::{MAX_ORDER, NgramCounts};
pub use embedded::{EMBEDDED_COMPACT, embedded_default, embedded_options};
pub use error::NgramError;
pub use model::{LN_10, NgramEntry, NgramModel, NgramProb, NgramState};
pub use score::{CorpusScore, SentenceScore, WordScore};
pub use smoothing::{Discount, DiscountFallback, Smoothing, kneser_ney_discounts};
pub use split::{PROGRESS_INTERVAL, Utf8Policy, WordSplit, for_each_line, split_words};
pub use vocab::{BOS, EOS, UNK, Vocab};

/// How to train a model from text.
///
/// The default is a trigram model with interpolated modified Kneser-Ney
/// that falls back to `lmplz`'s documented fallback discounts
/// ([`Discount::LMPLZ_FALLBACK`]: D1 = 0.5, D2 = 1, D3+ = 1.5, what
/// `lmplz --discount_fallback` uses) for an order whose counts cannot give
/// them. Kneser-Ney estimates its discounts from how many n-grams were seen
/// once, twice and three times, and a small corpus often lacks one of those,
/// so without a fallback (`lmplz`'s own default) any small corpus fails with
/// [`NgramError::DiscountUndefined`]. The fallback changes nothing where the
/// discounts are defined (the model is exactly `lmplz`'s), and the model
/// records each order that took it ([`NgramModel::discount_fallbacks`]), so a
/// caller can report it. For `lmplz`'s refusal, set
/// `smoothing: Smoothing::ModifiedKneserNey { fallback: None }`.
///
/// ```
/// use lm_model::ngram::{Discount, TrainOptions, train};
/// let model = train("the cat sat\nthe dog sat\n".as_bytes(), &TrainOptions::default(), |_| {})
///     .unwrap();
/// // Two sentences have no bigram seen twice: the bigrams fell back.
/// let fallback = model.discount_fallbacks()[1];
/// assert_eq!(fallback.order, 2);
/// assert_eq!(fallback.discount, Discount::LMPLZ_FALLBACK);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    /// The n-gram order (2 bigram, 3 trigram, ...), 1..=[`MAX_ORDER`].
    pub order: usize,
    /// The estimator.
    pub smoothing: Smoothing,
    /// What to do with bytes that are not UTF-8.
    pub utf8: Utf8Policy,
    /// `prune[m - 1]`: drop m-grams (m ≥ 2) seen at most this often; missing
    /// entries keep everything. Must not decrease with the order.
    pub prune: Vec<u64>,
}

impl Default for TrainOptions {
    /// A trigram model with modified Kneser-Ney and `lmplz`'s fallback
    /// discounts, strict UTF-8, no pruning.
    fn default() -> Self {
        Self {
            order: 3,
            smoothing: Smoothing::ModifiedKneserNey {
                fallback: Some(Discount::LMPLZ_FALLBACK),
            },
            utf8: Utf8Policy::Strict,
            prune: Vec::new(),
        }
    }
}

/// Trains a model from a corpus: each line is a sentence, split into words
/// and punctuation. `on_progress` gets the bytes read so far about every MiB
/// (lm-model never prints). Memory grows with the distinct n-grams, not with
/// the corpus.
pub fn train<R: BufRead>(
    reader: R,
    options: &TrainOptions,
    on_progress: impl FnMut(u64),
) -> Result<NgramModel, NgramError> {
    let mut counts = NgramCounts::new(options.order)?;
    counts.add_text(reader, options.utf8, on_progress)?;
    NgramModel::estimate(&counts, &options.smoothing, &options.prune)
}
