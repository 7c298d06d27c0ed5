//! What a one-call generation is asked: the [`Prompt`] (text, ids or a
//! chat) and the [`Options`] (limits, sampling, stop strings, output
//! format), which become lm-decode's
//! [`GenerationConfig`](lm_decode::GenerationConfig) for the loaded model
//! ([`GgufModel::generation_config`](crate::GgufModel::generation_config)):
//! the facade adds no setting of its own and runs no loop of its own.
//! [`Drafting`] picks lm-decode's speculative loop instead of the plain one.

use std::sync::Arc;

use lm_core::TokenId;
use lm_decode::SamplingConfig;
use lm_tokenize::Message;

use crate::gguf::GgufModel;
use crate::structured::OutputFormat;

/// Who drafts the tokens of speculative decoding
/// ([`lm_decode::generate_speculative`]): the model verifies up to 8
/// drafted tokens in one forward pass. Greedy output is the plain loop's,
/// id for id; sampled output has the plain loop's distribution.
#[derive(Debug, Clone)]
pub enum Drafting {
    /// Prompt lookup: the continuation of the latest earlier match of the
    /// last tokens ([`lm_decode::PromptLookup`]); no second model.
    PromptLookup,
    /// A smaller model with the same vocabulary
    /// ([`lm_decode::ModelDrafter`]).
    Model(Arc<GgufModel>),
}

impl PartialEq for Drafting {
    /// Prompt lookup equals itself; draft models are equal when they are
    /// the same loaded model.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::PromptLookup, Self::PromptLookup) => true,
            (Self::Model(a), Self::Model(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// What the model continues: plain text (tokenized as `lm-cli generate`
/// does, special-token text included), token ids as they are, or a chat
/// rendered with the model's template and ending with the opening of the
/// assistant's turn (message contents kept literal).
///
/// `&str`, `&String`, `&[TokenId]`, `&Vec<TokenId>`, `&[Message]` and
/// `&Vec<Message>` convert into it, so
/// [`GgufModel::generate`](crate::GgufModel::generate) takes any of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Prompt<'a> {
    /// Text, tokenized with the model's tokenizer.
    Text(&'a str),
    /// Token ids, read as they are.
    Ids(&'a [TokenId]),
    /// A conversation, rendered with the model's chat template.
    Chat(&'a [Message]),
}

/// `From` a reference to each form a prompt is held in, into its variant.
macro_rules! prompt_from {
    ($($variant:ident($held:ty)),+) => {$(
        impl<'a> From<&'a $held> for Prompt<'a> {
            fn from(prompt: &'a $held) -> Self {
                Self::$variant(prompt)
            }
        }
    )+};
}

prompt_from!(
    Text(str),
    Text(String),
    Ids([TokenId]),
    Ids(Vec<TokenId>),
    Chat([Message]),
    Chat(Vec<Message>)
);

/// How a one-call generation runs. The default is greedy (temperature 0),
/// at most 256 new tokens, ending on the model's end tokens, no stop
/// strings, no output format, no top candidates recorded, no drafting.
///
/// Set the fields, or chain the setters for the common settings:
///
/// ```
/// use lm::Options;
/// let options = Options::default().temperature(0.7).top_p(0.9).seed(42).stop("\n\n");
/// assert_eq!(options.sampling.temperature, 0.7);
/// assert_eq!(options.stop, ["\n\n"]);
/// let greedy = Options { max_new_tokens: 8, ..Options::default() };
/// assert_eq!(greedy.sampling.temperature, 0.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The most tokens to generate.
    pub max_new_tokens: usize,
    /// Every sampling setting (temperature, top-k, top-p, min-p,
    /// penalties, seed, ...), as `lm-cli` and `lm-serve` spell them;
    /// greedy by default.
    pub sampling: SamplingConfig,
    /// Strings that end the response when the generated text contains
    /// them (the text is cut before the string).
    pub stop: Vec<String>,
    /// Structured output: the response must be of this format. Compiled for
    /// the model's vocabulary by the facade, at each call.
    pub format: Option<OutputFormat>,
    /// How many top candidates each step of the trace records (0: none),
    /// for the top log-probabilities.
    pub n_top_candidates: usize,
    /// Speculative decoding: who drafts (`None`: the plain loop).
    pub draft: Option<Drafting>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_new_tokens: 256,
            sampling: SamplingConfig::greedy(),
            stop: Vec::new(),
            format: None,
            n_top_candidates: 0,
            draft: None,
        }
    }
}

/// Chained setters of [`Options`], each written `name(arg: Type) => field
/// = value;` under its doc: sets the field and returns the options.
macro_rules! setters {
    ($(
        $(#[$doc:meta])*
        $name:ident($arg:ident: $ty:ty) => $($field:ident).+ = $value:expr;
    )+) => {$(
        $(#[$doc])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.$($field).+ = $value;
            self
        }
    )+};
}

impl Options {
    setters! {
        /// Sets the most tokens to generate.
        max_new_tokens(max_new_tokens: usize) => max_new_tokens = max_new_tokens;
        /// Sets the temperature (0: greedy; above 0: sampled).
        temperature(temperature: f32) => sampling.temperature = temperature;
        /// Keeps the `top_k` most probable tokens.
        top_k(top_k: usize) => sampling.top_k = Some(top_k);
        /// Keeps the most probable tokens up to probability mass `top_p`.
        top_p(top_p: f32) => sampling.top_p = Some(top_p);
        /// Keeps the tokens at least `min_p` times as probable as the best.
        min_p(min_p: f32) => sampling.min_p = Some(min_p);
        /// Sets the repetition penalty (1: none).
        repetition_penalty(penalty: f32) => sampling.repetition_penalty = Some(penalty);
        /// Sets the seed of the sampler's random stream (unused when greedy).
        seed(seed: u64) => sampling.seed = seed;
        /// Asks for structured output of `format`.
        format(format: OutputFormat) => format = Some(format);
        /// Records the `n` most probable candidates at each step.
        n_top_candidates(n: usize) => n_top_candidates = n;
        /// Decodes speculatively with drafts from `drafting`.
        draft(drafting: Drafting) => draft = Some(drafting);
    }

    /// Adds a stop string.
    pub fn stop(mut self, stop: impl Into<String>) -> Self {
        self.stop.push(stop.into());
        self
    }
}
