//! Typed errors of the n-gram backend: each names the bad value and where it was.

/// Bad input to training, to the ARPA or compact readers, or to an estimator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NgramError {
    /// Reading the corpus or a model file failed.
    #[error("cannot read input")]
    Io(#[from] std::io::Error),
    /// The corpus is not UTF-8 (and the lossy policy was not chosen).
    #[error("invalid utf-8 at byte offset {offset} of the corpus")]
    InvalidUtf8 {
        /// Offset of the first byte that is not part of a valid UTF-8 sequence.
        offset: u64,
    },
    /// The corpus holds no word at all.
    #[error("the corpus has no words")]
    EmptyCorpus,
    /// An n-gram order outside `1..=max`.
    #[error("order must be between 1 and {max}, got {order}")]
    InvalidOrder {
        /// The rejected order.
        order: usize,
        /// The largest order supported.
        max: usize,
    },
    /// An add-k constant that is not finite and positive.
    #[error("add-k constant must be finite and > 0, got {k}")]
    InvalidAddK {
        /// The rejected constant.
        k: f64,
    },
    /// A fallback discount outside `[0, count]`.
    #[error("fallback discount for adjusted count {count} must be in [0, {count}], got {value}")]
    InvalidFallbackDiscount {
        /// The adjusted count (1, 2 or 3 for "3 and more") the discount is for.
        count: u64,
        /// The rejected discount.
        value: f64,
    },
    /// Pruning thresholds must not decrease with the order (so that every kept
    /// n-gram keeps its context).
    #[error(
        "pruning threshold for {order}-grams ({threshold}) is below the one for lower orders ({lower})"
    )]
    PruneNotMonotone {
        /// The order whose threshold is too small.
        order: usize,
        /// Its threshold.
        threshold: u64,
        /// The largest threshold of a lower order.
        lower: u64,
    },
    /// Modified Kneser-Ney needs n-grams of adjusted count 1, 2 and 3.
    #[error(
        "cannot compute kneser-ney discounts for {order}-grams: none has adjusted count {count} (small or artificial data; use a discount fallback)"
    )]
    DiscountUndefined {
        /// The order whose count-of-counts has a zero.
        order: usize,
        /// The adjusted count that never occurs.
        count: u64,
    },
    /// A modified Kneser-Ney discount fell outside `[0, count]`.
    #[error(
        "kneser-ney discount for {order}-grams of adjusted count {count} is {value}, outside [0, {count}]"
    )]
    DiscountOutOfRange {
        /// The order of the discount.
        order: usize,
        /// The adjusted count (3 means "3 and more").
        count: u64,
        /// The computed discount.
        value: f64,
    },
    /// More distinct n-grams of one order than 32-bit indices address.
    #[error("too many distinct {order}-grams for 32-bit indices")]
    TooManyNgrams {
        /// The order that overflowed.
        order: usize,
    },
    /// An ARPA file without a `\data\` line.
    #[error("arpa: no \\data\\ header")]
    ArpaMissingHeader,
    /// An ARPA line that is not UTF-8.
    #[error("arpa line {line} is not valid utf-8")]
    ArpaInvalidUtf8 {
        /// The line number (from 1).
        line: usize,
    },
    /// An ARPA file that ends before `\end\`.
    #[error("arpa: missing \\end\\ marker")]
    ArpaMissingEnd,
    /// A line that is not what the ARPA grammar expects at that point.
    #[error("arpa line {line}: expected {expected}, found {found:?}")]
    ArpaUnexpectedLine {
        /// 1-based line number.
        line: usize,
        /// What the reader expected.
        expected: &'static str,
        /// The line as read.
        found: String,
    },
    /// A probability, backoff or count that does not parse (or is NaN).
    #[error("arpa line {line}: bad number {text:?}")]
    ArpaBadNumber {
        /// 1-based line number.
        line: usize,
        /// The text that should have been a number.
        text: String,
    },
    /// A section whose number of entries differs from the `\data\` header.
    #[error("arpa: header declares {declared} {order}-grams but the body has {found}")]
    ArpaCountMismatch {
        /// The n-gram order.
        order: usize,
        /// The count in the header.
        declared: u64,
        /// The entries found in the section.
        found: u64,
    },
    /// An entry with the wrong number of fields for its section.
    #[error("arpa line {line}: a {order}-gram entry needs {order} words, found {found:?}")]
    ArpaBadEntry {
        /// 1-based line number.
        line: usize,
        /// The section's order.
        order: usize,
        /// The line as read.
        found: String,
    },
    /// A word in a higher-order entry that has no unigram.
    #[error("arpa line {line}: word {word:?} is not among the unigrams")]
    ArpaUnknownWord {
        /// 1-based line number.
        line: usize,
        /// The unknown word.
        word: String,
    },
    /// An n-gram whose context (all words but the last) is not in the model.
    #[error("arpa line {line}: the context of {ngram:?} is not in the model")]
    ArpaMissingContext {
        /// 1-based line number.
        line: usize,
        /// The n-gram as written.
        ngram: String,
    },
    /// The same n-gram twice.
    #[error("arpa line {line}: duplicate n-gram {ngram:?}")]
    ArpaDuplicate {
        /// 1-based line number of the second occurrence.
        line: usize,
        /// The n-gram as written.
        ngram: String,
    },
    /// A model without `<s>` or `</s>`.
    #[error("the model has no {word} unigram")]
    MissingSpecial {
        /// The missing marker.
        word: &'static str,
    },
    /// A compact model that does not start with the expected magic bytes.
    #[error("compact model: bad magic (not an lm n-gram file, or another version)")]
    CompactBadMagic,
    /// A compact model that ends early.
    #[error("compact model: truncated at byte {offset}")]
    CompactTruncated {
        /// Where more bytes were needed.
        offset: usize,
    },
    /// A compact model with an impossible value.
    #[error("compact model: invalid {what} at byte {offset}")]
    CompactInvalid {
        /// Where the value starts.
        offset: usize,
        /// What the value is.
        what: &'static str,
    },
}
