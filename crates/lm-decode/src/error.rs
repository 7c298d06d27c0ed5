//! The typed errors of lm-decode: every rejected parameter or input names
//! itself and carries the bad value.

use lm_core::TokenId;

/// A bad decoding parameter, a bad input, or a model failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `top_k` is 0: it would remove every token.
    #[error("top_k must be at least 1, got {value}")]
    InvalidTopK {
        /// The rejected k.
        value: usize,
    },
    /// `top_p` outside (0, 1].
    #[error("top_p must be in (0, 1], got {value}")]
    InvalidTopP {
        /// The rejected p.
        value: f32,
    },
    /// `min_p` outside [0, 1].
    #[error("min_p must be in [0, 1], got {value}")]
    InvalidMinP {
        /// The rejected ratio.
        value: f32,
    },
    /// `typical_p` outside (0, 1].
    #[error("typical_p must be in (0, 1], got {value}")]
    InvalidTypicalP {
        /// The rejected mass.
        value: f32,
    },
    /// `top_n_sigma` that is not a positive finite number (a front end
    /// reads 0 or less as off before it gets here).
    #[error("top_n_sigma must be finite and greater than 0, got {value}")]
    InvalidTopNSigma {
        /// The rejected number of standard deviations.
        value: f32,
    },
    /// `xtc_probability` outside [0, 1].
    #[error("xtc_probability must be in [0, 1], got {value}")]
    InvalidXtcProbability {
        /// The rejected chance.
        value: f32,
    },
    /// `xtc_threshold` outside [0, 1].
    #[error("xtc_threshold must be in [0, 1], got {value}")]
    InvalidXtcThreshold {
        /// The rejected threshold.
        value: f32,
    },
    /// `epsilon_cutoff` outside (0, 1) (HF's range).
    #[error("epsilon_cutoff must be in (0, 1), got {value}")]
    InvalidEpsilonCutoff {
        /// The rejected probability.
        value: f32,
    },
    /// `eta_cutoff` outside (0, 1) (HF's range).
    #[error("eta_cutoff must be in (0, 1), got {value}")]
    InvalidEtaCutoff {
        /// The rejected probability.
        value: f32,
    },
    /// `dynatemp_range` that is negative, NaN or infinite.
    #[error("dynatemp_range must be finite and at least 0, got {value}")]
    InvalidDynatempRange {
        /// The rejected range.
        value: f32,
    },
    /// `dynatemp_exponent` that is negative, NaN or infinite.
    #[error("dynatemp_exponent must be finite and at least 0, got {value}")]
    InvalidDynatempExponent {
        /// The rejected exponent.
        value: f32,
    },
    /// `mirostat` other than 0 (off), 1 or 2.
    #[error("mirostat must be 0, 1 or 2, got {value}")]
    InvalidMirostat {
        /// The rejected version.
        value: u8,
    },
    /// `mirostat_tau` that is negative, NaN or infinite.
    #[error("mirostat_tau must be finite and at least 0, got {value}")]
    InvalidMirostatTau {
        /// The rejected target surprise.
        value: f32,
    },
    /// `mirostat_eta` that is negative, NaN or infinite.
    #[error("mirostat_eta must be finite and at least 0, got {value}")]
    InvalidMirostatEta {
        /// The rejected learning rate.
        value: f32,
    },
    /// `dry_multiplier` that is negative, NaN or infinite.
    #[error("dry_multiplier must be finite and at least 0, got {value}")]
    InvalidDryMultiplier {
        /// The rejected multiplier.
        value: f32,
    },
    /// `dry_base` below 1, NaN or infinite.
    #[error("dry_base must be finite and at least 1, got {value}")]
    InvalidDryBase {
        /// The rejected base.
        value: f32,
    },
    /// `dry_penalty_last_n` below -1 (-1 is the whole history).
    #[error("dry_penalty_last_n must be -1 (the whole history) or at least 0, got {value}")]
    InvalidDryPenaltyLastN {
        /// The rejected window.
        value: i64,
    },
    /// An empty DRY sequence breaker (it would break every sequence).
    #[error("DRY sequence breaker {index} is empty")]
    EmptyDryBreaker {
        /// Its position in the list.
        index: usize,
    },
    /// DRY's sequence breakers are text: matching them needs the tokens'
    /// text.
    #[error("{n_breakers} DRY sequence breakers need a detokenizer")]
    DryBreakersNeedDetokenizer {
        /// How many breakers were given.
        n_breakers: usize,
    },
    /// `no_repeat_ngram_size` is 0.
    #[error("no_repeat_ngram_size must be at least 1, got {value}")]
    InvalidNoRepeatNgramSize {
        /// The rejected size.
        value: usize,
    },
    /// A name in the sampler order that names no stage.
    #[error("unknown sampler {name:?} in the sampler order (known: {known})")]
    UnknownSampler {
        /// The name as given.
        name: String,
        /// The names accepted.
        known: &'static str,
    },
    /// A stage named twice in the sampler order.
    #[error("sampler {name:?} is named twice in the sampler order")]
    RepeatedSampler {
        /// The stage, as named the second time.
        name: String,
    },
    /// A raw-logit stage (penalties, DRY) named after a filter or
    /// temperature: they run on the raw logits, before every filter.
    #[error("{name:?} runs on the raw logits: name it before {after:?} in the sampler order")]
    RawStageAfterFilter {
        /// The raw-logit stage.
        name: String,
        /// The filter or temperature named before it.
        after: String,
    },
    /// A repetition penalty that is not a positive finite number.
    #[error("repetition_penalty must be positive and finite, got {value}")]
    InvalidRepetitionPenalty {
        /// The rejected penalty.
        value: f32,
    },
    /// A presence penalty that is NaN or infinite.
    #[error("presence_penalty must be finite, got {value}")]
    InvalidPresencePenalty {
        /// The rejected penalty.
        value: f32,
    },
    /// A frequency penalty that is NaN or infinite.
    #[error("frequency_penalty must be finite, got {value}")]
    InvalidFrequencyPenalty {
        /// The rejected penalty.
        value: f32,
    },
    /// A logit bias that is NaN or infinite (ban a token with `banned_tokens`).
    #[error("logit bias for token {token} must be finite, got {value}")]
    InvalidLogitBias {
        /// The biased token.
        token: TokenId,
        /// The rejected bias.
        value: f32,
    },
    /// `num_beams` is 0.
    #[error("num_beams must be at least 1, got {value}")]
    InvalidNumBeams {
        /// The rejected beam width.
        value: usize,
    },
    /// A length penalty (alpha) that is NaN or infinite.
    #[error("length_penalty must be finite, got {value}")]
    InvalidLengthPenalty {
        /// The rejected alpha.
        value: f32,
    },
    /// `num_return_sequences` is 0.
    #[error("num_return_sequences must be at least 1, got {value}")]
    InvalidNumReturnSequences {
        /// The rejected count.
        value: usize,
    },
    /// `prompt_len + max_new_tokens` does not fit in `usize`.
    #[error("max_new_tokens {max_new_tokens} overflows with a prompt of {prompt_len} tokens")]
    MaxNewTokensOverflow {
        /// The prompt length.
        prompt_len: usize,
        /// The rejected limit.
        max_new_tokens: usize,
    },
    /// A stop string that is empty (it would match before any token).
    #[error("stop string {index} is empty")]
    EmptyStopString {
        /// Position of the empty string in the list.
        index: usize,
    },
    /// Stop strings were given but no detokenizer to read the text with.
    #[error("{n_strings} stop strings need a detokenizer")]
    StopStringsNeedDetokenizer {
        /// How many stop strings were given.
        n_strings: usize,
    },
    /// The prompt has no tokens: there is nothing to predict from.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The continuation to score has no tokens.
    #[error("the continuation is empty: there is nothing to score")]
    EmptyContinuation,
    /// The prompt leaves no room for one new token in the context and the
    /// truncation policy is to refuse.
    #[error("prompt of {len} tokens leaves no room for a new token in a context of {max}")]
    PromptExceedsContext {
        /// The prompt length.
        len: usize,
        /// The model's context bound.
        max: usize,
    },
    /// The pinned head of a truncated prompt leaves no room for recent tokens
    /// and one new token.
    #[error("pinned head of {n_head} tokens leaves no room in a context of {max}")]
    PinnedHeadTooLong {
        /// The requested head length.
        n_head: usize,
        /// The model's context bound.
        max: usize,
    },
    /// A drafter's distribution `q` for a drafted token does not cover the
    /// vocabulary.
    #[error("draft distribution has {len} entries, expected the vocabulary size {vocab_size}")]
    DraftDistributionLength {
        /// The length received.
        len: usize,
        /// The target's vocabulary size.
        vocab_size: usize,
    },
    /// A drafter proposed a token its own distribution gives no positive
    /// finite probability (it cannot have been drawn from it).
    #[error("drafted token {token} has probability {prob} in its own draft distribution")]
    DraftTokenNotInDistribution {
        /// The drafted token.
        token: TokenId,
        /// Its probability under the drafter's distribution.
        prob: f32,
    },
    /// The model returned a logits row of the wrong length.
    #[error("logits row has {len} entries, expected the vocabulary size {vocab_size}")]
    LogitsLength {
        /// The row length received.
        len: usize,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// The model returned a number of logits that is not the rows asked for
    /// times the vocabulary size.
    #[error("model returned {len} logits for {n_rows} rows of {vocab_size}")]
    LogitsRows {
        /// The number of logits received.
        len: usize,
        /// The rows asked for.
        n_rows: usize,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// The penalties, bias and bans left no token to choose from.
    #[error("every token was removed by the bans and biases")]
    AllTokensFiltered,
    /// The output constraint allows no token (its language cannot go on
    /// and is not complete), or none that the bans and biases left.
    #[error("the output constraint allows no token here")]
    ConstraintAllowsNothing,
    /// The output constraint was compiled for another vocabulary.
    #[error("the output constraint covers {constraint} tokens but the model has {model}")]
    ConstraintVocabulary {
        /// The constraint's vocabulary size.
        constraint: usize,
        /// The model's.
        model: usize,
    },
    /// `vocab_size ^ n_steps` exceeds the caller's limit (or `usize`).
    #[error("{vocab_size}^{n_steps} continuations exceed the limit of {limit}")]
    TooManyContinuations {
        /// The vocabulary size.
        vocab_size: usize,
        /// The number of steps to enumerate.
        n_steps: usize,
        /// The caller's limit.
        limit: usize,
    },
    /// Keeping this many continuations does not fit in memory (ask for the
    /// best few instead).
    #[error("cannot hold {n_continuations} continuations in memory")]
    ContinuationsOutOfMemory {
        /// The continuations that were to be kept.
        n_continuations: usize,
    },
    /// A failure lm-core names, whoever meets it first: a negative or NaN
    /// temperature, a token id beyond the vocabulary (in the input, the end
    /// tokens, a bias, a ban or a history), bad logits, a context exceeded.
    /// Each failure has this one variant, whether the sampler, the loop or
    /// the model reports it.
    #[error(transparent)]
    Core(#[from] lm_core::Error),
}

impl Error {
    /// `value` when `is_valid`, else the error `invalid` makes of it: the one
    /// shape of every parameter check.
    pub(crate) fn check<T>(value: T, is_valid: bool, invalid: impl FnOnce(T) -> Self) -> Result<T> {
        if is_valid {
            Ok(value)
        } else {
            Err(invalid(value))
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
