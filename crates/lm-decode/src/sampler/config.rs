//! The sampling settings, written once: [`SamplingConfig`] is what lm-cli's
//! flags, the `--json` report, lm-serve's requests and beam search all
//! build or embed, [`SamplingConfig::validate`] is the one check of its
//! values, and [`SamplingConfig::FIELDS`] names each setting in every front
//! end. A new stage is a field here, a line in [`SamplingConfig::chain`],
//! a row of `FIELDS`, one CLI flag and one request field.

use super::{
    BannedTokens, CandidateFilter, Dry, DynamicScale, DynamicTemperature, EpsilonCutoff, EtaCutoff,
    FrequencyPenalty, LogitBias, LogitTransform, MinP, Mirostat, NoRepeatNgram, PresencePenalty,
    RepetitionPenalty, SequenceBreakers, Temperature, TopK, TopNSigma, TopP, Typical, Xtc,
};
use crate::error::{Error, Result};
use lm_core::{Detokenize, TokenId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The sampling parameters, named as in the common APIs (HF transformers,
/// OpenAI, llama.cpp). `Default` is plain sampling at T = 1 with seed 0.
///
/// It reads from JSON by those names (a missing field is its default, an
/// unknown one an error) and writes as lm-cli's `--json` settings do: top-k,
/// top-p, min-p and the repetition penalty always (`null` when unset), the
/// other optional settings only when set, and never the seed, which a
/// report names only when the run draws.
///
/// ```
/// use lm_decode::SamplingConfig;
/// let config: SamplingConfig = serde_json::from_str(r#"{"temperature": 0.7, "top_k": 40}"#).unwrap();
/// assert_eq!(config, SamplingConfig { temperature: 0.7, top_k: Some(40), ..SamplingConfig::default() });
/// assert_eq!(
///     serde_json::to_string(&config).unwrap(),
///     r#"{"temperature":0.7,"top_k":40,"top_p":null,"min_p":null,"repetition_penalty":null}"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 means greedy (argmax, lowest id on ties).
    pub temperature: f32,
    /// Keep only the k most probable tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most probable tokens whose mass reaches p.
    pub top_p: Option<f32>,
    /// Keep tokens with at least `min_p` times the best token's probability.
    pub min_p: Option<f32>,
    /// Locally typical sampling: keep the tokens whose surprise is closest
    /// to the entropy, up to this mass (see [`Typical`]; 1 keeps all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub typical_p: Option<f32>,
    /// Top-nσ: keep logits within this many standard deviations of the
    /// best (see [`TopNSigma`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_n_sigma: Option<f32>,
    /// XTC: the chance per step of removing the top choices (see [`Xtc`];
    /// 0 or unset: no XTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xtc_probability: Option<f32>,
    /// XTC: the probability a token needs to count as a top choice
    /// (default [`SamplingConfig::XTC_THRESHOLD`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xtc_threshold: Option<f32>,
    /// The epsilon cutoff: remove tokens less probable than this (see
    /// [`EpsilonCutoff`]; 0 or unset: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon_cutoff: Option<f32>,
    /// The eta cutoff: remove tokens less probable than
    /// `min(eta, sqrt(eta) exp(-H))` (see [`EtaCutoff`]; 0 or unset: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_cutoff: Option<f32>,
    /// The fewest tokens every filter leaves (llama.cpp's `min_keep`, HF's
    /// `min_tokens_to_keep`; unset or 0: one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_keep: Option<usize>,
    /// Dynamic temperature: the temperature moves within `temperature ±
    /// range` with the candidates' entropy (see [`DynamicTemperature`]; 0 or
    /// unset: a fixed temperature).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynatemp_range: Option<f32>,
    /// Dynamic temperature's exponent on the normalised entropy (default
    /// [`SamplingConfig::DYNATEMP_EXPONENT`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynatemp_exponent: Option<f32>,
    /// Mirostat's version: 1 or 2 choose by a running bound on the surprise
    /// that steers it towards `mirostat_tau` (see [`Mirostat`]); 0 or unset:
    /// off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat: Option<u8>,
    /// Mirostat's target surprise in bits (default
    /// [`SamplingConfig::MIROSTAT_TAU`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat_tau: Option<f32>,
    /// Mirostat's learning rate (default [`SamplingConfig::MIROSTAT_ETA`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat_eta: Option<f32>,
    /// DRY's multiplier: the penalty on a token that would extend a repeated
    /// sequence (see [`Dry`]; 0 or unset: no DRY).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_multiplier: Option<f32>,
    /// DRY's base: the penalty grows as `base^(length - allowed)` (default
    /// [`SamplingConfig::DRY_BASE`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_base: Option<f32>,
    /// DRY's allowed length: repeats this long go unpenalised (default
    /// [`SamplingConfig::DRY_ALLOWED_LENGTH`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_allowed_length: Option<usize>,
    /// DRY looks for repeats in the last this many tokens (llama.cpp's
    /// `--dry-penalty-last-n`: -1 or unset is the whole history, 0 turns
    /// DRY off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_penalty_last_n: Option<i64>,
    /// The strings no repeated sequence extends across (default
    /// [`SequenceBreakers::DEFAULT`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_sequence_breakers: Option<Vec<String>>,
    /// HF's `no_repeat_ngram_size`: no n-gram of this size occurs twice
    /// (see [`NoRepeatNgram`]; 0 or unset: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_repeat_ngram_size: Option<usize>,
    /// The order of the stages after the raw logits, by llama.cpp's names
    /// (`--samplers`): exactly the stages named run, in that order (see
    /// [`SamplerOrder`]); unset: [`SamplerOrder::DEFAULT`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<SamplerOrder>,
    /// HF repetition penalty (> 0; 1 is none).
    pub repetition_penalty: Option<f32>,
    /// Subtracted once from the logit of every token in the history.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// Subtracted `count` times from the logit of every token in the history.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// The penalties count only the last this many tokens of the history
    /// (llama.cpp's `--repeat-last-n`; 0 turns them off); `None`: the whole
    /// history.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub penalty_last_n: Option<usize>,
    /// Added to the logits of the given tokens (`[id, bias]` pairs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Tokens that are never chosen.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub banned_tokens: Vec<TokenId>,
    /// Seed of the ChaCha20 generator (see [`crate::TokenRng`]); unused by greedy.
    #[serde(skip_serializing)]
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            typical_p: None,
            top_n_sigma: None,
            xtc_probability: None,
            xtc_threshold: None,
            epsilon_cutoff: None,
            eta_cutoff: None,
            min_keep: None,
            dynatemp_range: None,
            dynatemp_exponent: None,
            mirostat: None,
            mirostat_tau: None,
            mirostat_eta: None,
            dry_multiplier: None,
            dry_base: None,
            dry_allowed_length: None,
            dry_penalty_last_n: None,
            dry_sequence_breakers: None,
            no_repeat_ngram_size: None,
            order: None,
            repetition_penalty: None,
            presence_penalty: None,
            frequency_penalty: None,
            penalty_last_n: None,
            logit_bias: Vec::new(),
            banned_tokens: Vec::new(),
            seed: 0,
        }
    }
}

/// One setting of [`SamplingConfig`] and the name each front end gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The field of [`SamplingConfig`], also its JSON name.
    pub name: &'static str,
    /// lm-cli's flag (`generate` and `chat`).
    pub flag: &'static str,
    /// lm-serve's request field (OpenAI's name where OpenAI has one).
    pub api: &'static str,
}

/// A setting [`SamplingConfig::validate`] refused: the field, and lm-decode's
/// error. Its message names the field and the allowed range.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidSetting {
    /// The field of [`SamplingConfig`] (see [`SamplingConfig::FIELDS`]).
    pub field: &'static str,
    /// What is wrong with it.
    pub error: Error,
}

impl fmt::Display for InvalidSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for InvalidSetting {}

/// The built stages of a policy, in the chain's order.
pub(crate) struct Chain {
    pub(crate) transforms: Vec<Box<dyn LogitTransform>>,
    /// The configured temperature (0: greedy, whatever the order).
    pub(crate) temperature: Temperature,
    /// The temperature the candidates start at, when the order puts a
    /// fixed temperature before every filter (else they start at T = 1 and
    /// a filter sets it, or nothing does).
    pub(crate) leading_temperature: Option<Temperature>,
    pub(crate) filters: Vec<Box<dyn CandidateFilter>>,
    pub(crate) mirostat: Option<Mirostat>,
    /// XTC's probability when it runs and its coin is not sure (0 < p < 1).
    pub(crate) coin: Option<f32>,
}

/// XTC's index in the chain's filter table (see [`OrderStage::Filter`]).
const XTC: usize = 5;

/// What DRY's sequence breakers are matched in when a chain is built.
#[derive(Clone, Copy)]
pub(crate) enum BreakerText<'a> {
    /// Check the settings only ([`SamplingConfig::validate`]).
    Unchecked,
    /// No text: breakers are an error ([`crate::Sampler::new`]).
    Missing,
    /// The tokens' text, and the vocabulary size.
    Vocabulary(&'a dyn Detokenize, usize),
}

/// The order of the stages after the raw logits (llama.cpp's `--samplers`),
/// by name: llama.cpp's names and aliases (`top_k`, `top-k`; `typ_p`,
/// `typical`; `temp`, `temperature`; ...), given as a list or as one string
/// separated by `;` or `,` (llama.cpp's syntax). Exactly the stages named
/// run, in that order, as in llama.cpp: a stage set but not named does not
/// run. The raw-logit stages (`penalties`, `dry`) come before every filter;
/// logit bias, bans and `no_repeat_ngram_size` always run, last among them;
/// mirostat, when on, always chooses after the last filter.
///
/// ```
/// use lm_decode::{Sampler, SamplerOrder, SamplingConfig};
/// let config = SamplingConfig {
///     temperature: 0.8,
///     top_k: Some(40),
///     top_p: Some(0.9),
///     order: Some("top_k;top_p;temperature".parse().unwrap()),
///     ..SamplingConfig::default()
/// };
/// let sampler = Sampler::new(&config).unwrap();
/// assert_eq!(
///     format!("{sampler:?}"),
///     "Sampler { chain: [TopK(40), TopP(0.9), Temperature(0.8)], selector: Sample }"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "OrderText", into = "Vec<String>")]
pub struct SamplerOrder(Vec<String>);

/// How a request may spell an order: a list of names or one string.
#[derive(Deserialize)]
#[serde(untagged)]
enum OrderText {
    List(Vec<String>),
    Text(String),
}

impl From<OrderText> for SamplerOrder {
    fn from(text: OrderText) -> Self {
        match text {
            OrderText::List(names) => Self(names),
            OrderText::Text(text) => Self::split(&text),
        }
    }
}

impl From<SamplerOrder> for Vec<String> {
    fn from(order: SamplerOrder) -> Self {
        order.0
    }
}

impl std::str::FromStr for SamplerOrder {
    type Err = std::convert::Infallible;

    /// Splits at `;` or `,` (names are checked when the chain is built).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self::split(text))
    }
}

/// A stage an order can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OrderStage {
    Penalties,
    Dry,
    Temperature,
    /// The filter at this index of the chain's filter table (top-nσ, top-k,
    /// typical, top-p, min-p, XTC, epsilon, eta).
    Filter(usize),
}

impl SamplerOrder {
    /// The order when none is given: the raw-logit stages, temperature, then
    /// llama.cpp's default filter order, then the cutoffs.
    pub const DEFAULT: [&'static str; 11] = [
        "penalties",
        "dry",
        "temperature",
        "top_n_sigma",
        "top_k",
        "typ_p",
        "top_p",
        "min_p",
        "xtc",
        "epsilon_cutoff",
        "eta_cutoff",
    ];

    /// Every accepted name and its stage.
    const NAMES: [(&'static str, OrderStage); 20] = [
        ("penalties", OrderStage::Penalties),
        ("dry", OrderStage::Dry),
        ("temperature", OrderStage::Temperature),
        ("temp", OrderStage::Temperature),
        ("top_n_sigma", OrderStage::Filter(0)),
        ("top-n-sigma", OrderStage::Filter(0)),
        ("top_k", OrderStage::Filter(1)),
        ("top-k", OrderStage::Filter(1)),
        ("typ_p", OrderStage::Filter(2)),
        ("typ-p", OrderStage::Filter(2)),
        ("typical_p", OrderStage::Filter(2)),
        ("typical", OrderStage::Filter(2)),
        ("top_p", OrderStage::Filter(3)),
        ("top-p", OrderStage::Filter(3)),
        ("min_p", OrderStage::Filter(4)),
        ("min-p", OrderStage::Filter(4)),
        ("xtc", OrderStage::Filter(XTC)),
        ("epsilon_cutoff", OrderStage::Filter(6)),
        ("eta_cutoff", OrderStage::Filter(7)),
        ("nucleus", OrderStage::Filter(3)),
    ];

    /// What an unknown name's error lists.
    const KNOWN: &'static str = "penalties, dry, temperature, top_n_sigma, top_k, typ_p, \
        top_p, min_p, xtc, epsilon_cutoff, eta_cutoff";

    /// An order of these names.
    pub fn new(names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self(names.into_iter().map(Into::into).collect())
    }

    /// The names, as given.
    pub fn names(&self) -> &[String] {
        &self.0
    }

    fn split(text: &str) -> Self {
        Self::new(
            text.split([';', ','])
                .map(str::trim)
                .filter(|name| !name.is_empty()),
        )
    }

    /// The stages named, checked: each name known, none twice, no
    /// raw-logit stage after a filter.
    pub(crate) fn stages(&self) -> Result<Vec<OrderStage>> {
        let mut stages: Vec<OrderStage> = Vec::with_capacity(self.0.len());
        let mut first_filter: Option<&str> = None;
        for name in &self.0 {
            let stage = Self::NAMES
                .iter()
                .find(|(known, _)| known == name)
                .map(|&(_, stage)| stage)
                .ok_or_else(|| Error::UnknownSampler {
                    name: name.clone(),
                    known: Self::KNOWN,
                })?;
            if stages.contains(&stage) {
                return Err(Error::RepeatedSampler { name: name.clone() });
            }
            match (stage, first_filter) {
                (OrderStage::Penalties | OrderStage::Dry, Some(after)) => {
                    return Err(Error::RawStageAfterFilter {
                        name: name.clone(),
                        after: after.to_owned(),
                    });
                }
                (OrderStage::Penalties | OrderStage::Dry, None) => {}
                (_, None) => first_filter = Some(name),
                _ => {}
            }
            stages.push(stage);
        }
        Ok(stages)
    }
}

impl SamplingConfig {
    /// Every setting, in the chain's order, with its CLI flag and request
    /// field: the table a test walks to check that each is reachable from
    /// both front ends. A ban is a bias of -inf on the command line
    /// (`--logit-bias TOKEN=-inf`); JSON has no infinity, so a request bans
    /// with OpenAI's -100.
    pub const FIELDS: &'static [Field] = &[
        Field::new(
            "repetition_penalty",
            "--repetition-penalty",
            "repetition_penalty",
        ),
        Field::new("presence_penalty", "--presence-penalty", "presence_penalty"),
        Field::new(
            "frequency_penalty",
            "--frequency-penalty",
            "frequency_penalty",
        ),
        Field::new("penalty_last_n", "--repeat-last-n", "repeat_last_n"),
        Field::new("dry_multiplier", "--dry-multiplier", "dry_multiplier"),
        Field::new("dry_base", "--dry-base", "dry_base"),
        Field::new(
            "dry_allowed_length",
            "--dry-allowed-length",
            "dry_allowed_length",
        ),
        Field::new(
            "dry_penalty_last_n",
            "--dry-penalty-last-n",
            "dry_penalty_last_n",
        ),
        Field::new(
            "dry_sequence_breakers",
            "--dry-sequence-breaker",
            "dry_sequence_breakers",
        ),
        Field::new(
            "no_repeat_ngram_size",
            "--no-repeat-ngram-size",
            "no_repeat_ngram_size",
        ),
        Field::new("logit_bias", "--logit-bias", "logit_bias"),
        Field::new("banned_tokens", "--logit-bias", "logit_bias"),
        Field::new("temperature", "--temperature", "temperature"),
        Field::new("dynatemp_range", "--dynatemp-range", "dynatemp_range"),
        Field::new("dynatemp_exponent", "--dynatemp-exp", "dynatemp_exponent"),
        Field::new("top_n_sigma", "--top-nsigma", "top_n_sigma"),
        Field::new("top_k", "--top-k", "top_k"),
        Field::new("typical_p", "--typical", "typical_p"),
        Field::new("top_p", "--top-p", "top_p"),
        Field::new("min_p", "--min-p", "min_p"),
        Field::new("xtc_probability", "--xtc-probability", "xtc_probability"),
        Field::new("xtc_threshold", "--xtc-threshold", "xtc_threshold"),
        Field::new("epsilon_cutoff", "--epsilon-cutoff", "epsilon_cutoff"),
        Field::new("eta_cutoff", "--eta-cutoff", "eta_cutoff"),
        Field::new("min_keep", "--min-keep", "min_keep"),
        Field::new("mirostat", "--mirostat", "mirostat"),
        Field::new("mirostat_tau", "--mirostat-ent", "mirostat_tau"),
        Field::new("mirostat_eta", "--mirostat-lr", "mirostat_eta"),
        Field::new("order", "--samplers", "samplers"),
        Field::new("seed", "--seed", "seed"),
    ];

    /// XTC's threshold when only its probability is given (llama.cpp's
    /// default).
    pub const XTC_THRESHOLD: f32 = 0.1;
    /// Dynamic temperature's exponent when only its range is given
    /// (llama.cpp's default).
    pub const DYNATEMP_EXPONENT: f32 = 1.0;
    /// Mirostat's target surprise in bits when none is given (llama.cpp's
    /// default).
    pub const MIROSTAT_TAU: f32 = 5.0;
    /// Mirostat's learning rate when none is given (llama.cpp's default).
    pub const MIROSTAT_ETA: f32 = 0.1;
    /// DRY's base when none is given (llama.cpp's default).
    pub const DRY_BASE: f32 = 1.75;
    /// DRY's allowed length when none is given (llama.cpp's default).
    pub const DRY_ALLOWED_LENGTH: usize = 2;

    /// Greedy decoding: temperature 0, nothing else.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every setting with the rule of the stage that uses it, so a
    /// front end refuses exactly what [`crate::Sampler::new`] would.
    ///
    /// ```
    /// use lm_decode::{Error, SamplingConfig};
    /// let bad = SamplingConfig { min_p: Some(1.5), ..SamplingConfig::default() };
    /// let refused = bad.validate().unwrap_err();
    /// assert_eq!((refused.field, refused.error), ("min_p", Error::InvalidMinP { value: 1.5 }));
    /// assert_eq!(bad.validate().unwrap_err().to_string(), "min_p must be in [0, 1], got 1.5");
    /// ```
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        self.chain(BreakerText::Unchecked).map(drop)
    }

    /// The stages this config sets, built and checked, in the chain's order:
    /// the order's raw-logit stages, then `no_repeat_ngram_size`, the bias
    /// and the bans; temperature leading the filters when the order puts it
    /// first, else as a filter in its place. `text` is what DRY's sequence
    /// breakers are matched in.
    pub(crate) fn chain(&self, text: BreakerText<'_>) -> Result<Chain, InvalidSetting> {
        let temperature = checked("temperature", Temperature::new(self.temperature))?;
        let order = match &self.order {
            Some(order) => order.stages(),
            None => SamplerOrder::new(SamplerOrder::DEFAULT).stages(),
        };
        let order = checked("order", order)?;
        let mut penalties = [
            transform(stage(
                "repetition_penalty",
                self.repetition_penalty,
                RepetitionPenalty::new,
            )?),
            transform(stage(
                "presence_penalty",
                self.presence_penalty,
                PresencePenalty::new,
            )?),
            transform(stage(
                "frequency_penalty",
                self.frequency_penalty,
                FrequencyPenalty::new,
            )?),
        ];
        let mut dry = transform(self.dry(text)?);
        let last = [
            transform(stage(
                "no_repeat_ngram_size",
                self.no_repeat_ngram_size.filter(|&n| n != 0),
                NoRepeatNgram::new,
            )?),
            transform(stage(
                "logit_bias",
                non_empty(&self.logit_bias),
                LogitBias::new,
            )?),
            transform(stage(
                "banned_tokens",
                non_empty(&self.banned_tokens),
                |tokens| Ok(BannedTokens::new(tokens)),
            )?),
        ];
        let dynamic = match (self.dynatemp_range, self.dynatemp_exponent) {
            (None, None) => None,
            (range, exponent) => {
                let range = range.unwrap_or(0.0);
                let exponent = exponent.unwrap_or(Self::DYNATEMP_EXPONENT);
                let built =
                    checked_one_of("dynatemp_range", DynamicTemperature::new(range, exponent))?;
                (range > 0.0).then_some(built)
            }
        };
        let xtc_threshold = stage("xtc_threshold", self.xtc_threshold, Xtc::check_threshold)?;
        let xtc = stage("xtc_probability", self.xtc_probability, |p| {
            Xtc::new(p, xtc_threshold.unwrap_or(Self::XTC_THRESHOLD))
        })?;
        let coin = xtc.map(Xtc::probability).filter(|&p| p > 0.0 && p < 1.0);
        let mut filters = [
            filter(stage("top_n_sigma", self.top_n_sigma, TopNSigma::new)?),
            filter(stage("top_k", self.top_k, TopK::new)?),
            filter(stage("typical_p", self.typical_p, Typical::new)?),
            filter(stage("top_p", self.top_p, TopP::new)?),
            filter(stage("min_p", self.min_p, MinP::new)?),
            filter(xtc.filter(|xtc| xtc.probability() > 0.0)),
            filter(stage(
                "epsilon_cutoff",
                self.epsilon_cutoff.filter(|&e| e != 0.0),
                EpsilonCutoff::new,
            )?),
            filter(stage(
                "eta_cutoff",
                self.eta_cutoff.filter(|&e| e != 0.0),
                EtaCutoff::new,
            )?),
        ];
        let mirostat = self.mirostat()?;
        let mut chain = Chain {
            transforms: Vec::new(),
            temperature,
            leading_temperature: None,
            filters: Vec::new(),
            mirostat,
            coin: None,
        };
        for stage in order {
            let built = match stage {
                OrderStage::Penalties => {
                    chain
                        .transforms
                        .extend(penalties.iter_mut().filter_map(Option::take));
                    continue;
                }
                OrderStage::Dry => {
                    chain.transforms.extend(dry.take());
                    continue;
                }
                OrderStage::Temperature => match dynamic {
                    None if chain.filters.is_empty() => {
                        chain.leading_temperature = Some(temperature);
                        continue;
                    }
                    None => Some(Box::new(temperature) as Box<dyn CandidateFilter>),
                    Some(dynamic) => Some(Box::new(DynamicScale::new(temperature, dynamic)) as _),
                },
                OrderStage::Filter(index) => filters[index].take(),
            };
            chain.filters.extend(built);
        }
        chain.transforms.extend(last.into_iter().flatten());
        // XTC ran when the order took it from the table.
        chain.coin = coin.filter(|_| filters[XTC].is_none());
        Ok(chain)
    }

    /// The DRY stage, when `dry_multiplier` is above 0 and its window is
    /// not 0; its other settings are checked whenever one is given.
    fn dry(&self, text: BreakerText<'_>) -> Result<Option<Dry>, InvalidSetting> {
        let is_set = self.dry_multiplier.is_some()
            || self.dry_base.is_some()
            || self.dry_allowed_length.is_some()
            || self.dry_penalty_last_n.is_some()
            || self.dry_sequence_breakers.is_some();
        if !is_set {
            return Ok(None);
        }
        let window = match self.dry_penalty_last_n {
            None | Some(-1) => None,
            Some(n) => Some(checked(
                "dry_penalty_last_n",
                usize::try_from(n).map_err(|_| Error::InvalidDryPenaltyLastN { value: n }),
            )?),
        };
        let default_breakers = SequenceBreakers::DEFAULT.map(str::to_owned);
        let breakers = self
            .dry_sequence_breakers
            .as_deref()
            .unwrap_or(&default_breakers);
        if let Some(index) = breakers.iter().position(String::is_empty) {
            return Err(InvalidSetting {
                field: "dry_sequence_breakers",
                error: Error::EmptyDryBreaker { index },
            });
        }
        let multiplier = self.dry_multiplier.unwrap_or(0.0);
        let is_on = multiplier > 0.0 && window != Some(0);
        let compiled = match text {
            _ if breakers.is_empty() || !is_on => SequenceBreakers::none(),
            BreakerText::Unchecked => SequenceBreakers::none(),
            BreakerText::Missing => {
                return Err(InvalidSetting {
                    field: "dry_sequence_breakers",
                    error: Error::DryBreakersNeedDetokenizer {
                        n_breakers: breakers.len(),
                    },
                });
            }
            BreakerText::Vocabulary(detokenizer, vocab_size) => checked(
                "dry_sequence_breakers",
                SequenceBreakers::new(breakers, vocab_size, detokenizer),
            )?,
        };
        let dry = checked_one_of(
            "dry_multiplier",
            Dry::new(
                multiplier,
                self.dry_base.unwrap_or(Self::DRY_BASE),
                self.dry_allowed_length.unwrap_or(Self::DRY_ALLOWED_LENGTH),
                window,
                Arc::new(compiled),
            ),
        )?;
        Ok(is_on.then_some(dry))
    }

    /// Mirostat, when `mirostat` is 1 or 2 (its tau and eta are checked
    /// whenever given).
    fn mirostat(&self) -> Result<Option<Mirostat>, InvalidSetting> {
        let tau = self.mirostat_tau.unwrap_or(Self::MIROSTAT_TAU);
        let eta = self.mirostat_eta.unwrap_or(Self::MIROSTAT_ETA);
        let version = self.mirostat.unwrap_or(0);
        if version == 0 && (self.mirostat_tau.is_some() || self.mirostat_eta.is_some()) {
            checked_one_of("mirostat", Mirostat::new(2, tau, eta))?;
            return Ok(None);
        }
        checked_one_of("mirostat", Mirostat::new(version, tau, eta))
    }

    /// A seed for a run that was given none: the clock's nanoseconds hashed
    /// with the process's random hash keys (seeded by the OS), so runs
    /// started in the same instant still differ. lm-cli's `--seed random`
    /// and a request without `seed` both take it.
    pub fn fresh_seed() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        hasher.write_u128(now.as_nanos());
        hasher.finish()
    }
}

impl Field {
    const fn new(name: &'static str, flag: &'static str, api: &'static str) -> Self {
        Self { name, flag, api }
    }
}

/// The stage of a setting that is set, built by `build`; its field named
/// when `build` refuses the value.
fn stage<T, S>(
    field: &'static str,
    value: Option<T>,
    build: impl FnOnce(T) -> Result<S>,
) -> Result<Option<S>, InvalidSetting> {
    value.map(|value| checked(field, build(value))).transpose()
}

/// A stage as built, with its field named when it was refused.
fn checked<S>(field: &'static str, built: Result<S>) -> Result<S, InvalidSetting> {
    built.map_err(|error| InvalidSetting { field, error })
}

/// A stage of several settings as built, with the setting its error is
/// about named (`field` when the error names none of the others).
fn checked_one_of<S>(field: &'static str, built: Result<S>) -> Result<S, InvalidSetting> {
    built.map_err(|error| {
        let field = match error {
            Error::InvalidDryBase { .. } => "dry_base",
            Error::InvalidDynatempExponent { .. } => "dynatemp_exponent",
            Error::InvalidMirostatTau { .. } => "mirostat_tau",
            Error::InvalidMirostatEta { .. } => "mirostat_eta",
            _ => field,
        };
        InvalidSetting { field, error }
    })
}

/// A list setting as a stage's value: `None` when empty (no stage).
fn non_empty<T: Clone>(items: &[T]) -> Option<Vec<T>> {
    (!items.is_empty()).then(|| items.to_vec())
}

fn transform<T: LogitTransform + 'static>(stage: Option<T>) -> Option<Box<dyn LogitTransform>> {
    stage.map(|stage| Box::new(stage) as Box<dyn LogitTransform>)
}

fn filter<T: CandidateFilter + 'static>(stage: Option<T>) -> Option<Box<dyn CandidateFilter>> {
    stage.map(|stage| Box::new(stage) as Box<dyn CandidateFilter>)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_table_names_every_field_once_and_in_the_json_form() {
        let mut config = serde_json::to_value(SamplingConfig {
            presence_penalty: Some(0.0),
            frequency_penalty: Some(0.0),
            penalty_last_n: Some(0),
            logit_bias: vec![(0, 0.0)],
            banned_tokens: vec![0],
            typical_p: Some(1.0),
            top_n_sigma: Some(1.0),
            xtc_probability: Some(0.0),
            xtc_threshold: Some(0.1),
            min_keep: Some(1),
            epsilon_cutoff: Some(0.0),
            eta_cutoff: Some(0.0),
            dynatemp_range: Some(0.0),
            dynatemp_exponent: Some(1.0),
            mirostat: Some(0),
            mirostat_tau: Some(5.0),
            mirostat_eta: Some(0.1),
            dry_multiplier: Some(0.0),
            dry_base: Some(1.75),
            dry_allowed_length: Some(2),
            dry_penalty_last_n: Some(-1),
            dry_sequence_breakers: Some(vec![]),
            no_repeat_ngram_size: Some(0),
            order: Some(SamplerOrder::new(["top_k"])),
            ..SamplingConfig::default()
        })
        .unwrap();
        let object = config.as_object_mut().unwrap();
        // The seed is read, never written.
        object.insert("seed".into(), 0.into());
        let mut written: Vec<&str> = object.keys().map(String::as_str).collect();
        let mut named: Vec<&str> = SamplingConfig::FIELDS.iter().map(|f| f.name).collect();
        written.sort_unstable();
        named.sort_unstable();
        assert_eq!(written, named);
    }

    #[test]
    fn json_reads_every_field_and_refuses_unknown_ones() {
        let config: SamplingConfig = serde_json::from_str(
            r#"{"temperature": 0.5, "top_k": 3, "top_p": 0.9, "min_p": 0.1,
                "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.25,
                "penalty_last_n": 8, "logit_bias": [[2, -1.0]], "banned_tokens": [4], "seed": 9,
                "typical_p": 0.95, "top_n_sigma": 1.5, "xtc_probability": 0.5, "xtc_threshold": 0.2,
                "min_keep": 3, "epsilon_cutoff": 3e-4, "eta_cutoff": 2e-3, "dynatemp_range": 0.5,
                "dynatemp_exponent": 1.5, "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
                "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3,
                "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", "\n\n"],
                "no_repeat_ngram_size": 3, "order": "top_k;typ_p;temperature"}"#,
        )
        .unwrap();
        assert_eq!(
            config,
            SamplingConfig {
                temperature: 0.5,
                top_k: Some(3),
                top_p: Some(0.9),
                min_p: Some(0.1),
                repetition_penalty: Some(1.1),
                presence_penalty: Some(0.5),
                frequency_penalty: Some(0.25),
                penalty_last_n: Some(8),
                logit_bias: vec![(2, -1.0)],
                banned_tokens: vec![4],
                typical_p: Some(0.95),
                top_n_sigma: Some(1.5),
                xtc_probability: Some(0.5),
                xtc_threshold: Some(0.2),
                min_keep: Some(3),
                epsilon_cutoff: Some(3e-4),
                eta_cutoff: Some(2e-3),
                dynatemp_range: Some(0.5),
                dynatemp_exponent: Some(1.5),
                mirostat: Some(2),
                mirostat_tau: Some(4.0),
                mirostat_eta: Some(0.2),
                dry_multiplier: Some(0.8),
                dry_base: Some(2.0),
                dry_allowed_length: Some(3),
                dry_penalty_last_n: Some(-1),
                dry_sequence_breakers: Some(vec!["\n".into(), "\n\n".into()]),
                no_repeat_ngram_size: Some(3),
                order: Some(SamplerOrder::new(["top_k", "typ_p", "temperature"])),
                seed: 9,
            }
        );
        // An order is a list too, and writes as one.
        let listed: SamplingConfig =
            serde_json::from_str(r#"{"order": ["top_k", "temperature"]}"#).unwrap();
        assert_eq!(
            serde_json::to_value(&listed).unwrap()["order"],
            serde_json::json!(["top_k", "temperature"])
        );
        assert!(serde_json::from_str::<SamplingConfig>(r#"{"top_q": 1}"#).is_err());
    }

    /// One setting changed from the default.
    type Setting = fn(&mut SamplingConfig);

    #[test]
    fn validate_names_the_field_of_each_refused_stage() {
        let base = SamplingConfig::default;
        let with = |set: Setting| {
            let mut config = base();
            set(&mut config);
            config
        };
        let named: [(Setting, &str); 8] = [
            (|c| c.temperature = -1.0, "temperature"),
            (|c| c.top_k = Some(0), "top_k"),
            (|c| c.top_p = Some(0.0), "top_p"),
            (|c| c.min_p = Some(-0.5), "min_p"),
            (|c| c.repetition_penalty = Some(0.0), "repetition_penalty"),
            (|c| c.presence_penalty = Some(f32::NAN), "presence_penalty"),
            (
                |c| c.frequency_penalty = Some(f32::INFINITY),
                "frequency_penalty",
            ),
            (|c| c.logit_bias = vec![(1, f32::NAN)], "logit_bias"),
        ];
        for (set, field) in named {
            let config = with(set);
            assert_eq!(config.validate().unwrap_err().field, field, "{config:?}");
        }
        let described: [(Setting, &str, Error, &str); 5] = [
            (
                |c| c.typical_p = Some(0.0),
                "typical_p",
                Error::InvalidTypicalP { value: 0.0 },
                "typical_p must be in (0, 1], got 0",
            ),
            (
                |c| c.top_n_sigma = Some(-1.0),
                "top_n_sigma",
                Error::InvalidTopNSigma { value: -1.0 },
                "top_n_sigma must be finite and greater than 0, got -1",
            ),
            (
                |c| c.top_n_sigma = Some(f32::INFINITY),
                "top_n_sigma",
                Error::InvalidTopNSigma {
                    value: f32::INFINITY,
                },
                "top_n_sigma must be finite and greater than 0, got inf",
            ),
            (
                |c| c.xtc_probability = Some(1.5),
                "xtc_probability",
                Error::InvalidXtcProbability { value: 1.5 },
                "xtc_probability must be in [0, 1], got 1.5",
            ),
            // The threshold is checked even when XTC is off.
            (
                |c| c.xtc_threshold = Some(-0.5),
                "xtc_threshold",
                Error::InvalidXtcThreshold { value: -0.5 },
                "xtc_threshold must be in [0, 1], got -0.5",
            ),
        ];
        for (set, field, error, message) in described {
            let config = with(set);
            let refused = config.validate().unwrap_err();
            assert_eq!(
                (refused.field, &refused.error, refused.to_string().as_str()),
                (field, &error, message)
            );
            // The sampler refuses with the same typed error.
            assert_eq!(crate::Sampler::new(&config).err(), Some(error));
        }
        // NaN is refused too (and is no value to compare with `==`).
        let nan = with(|c| c.xtc_threshold = Some(f32::NAN));
        let refused = nan.validate().unwrap_err();
        assert!(
            matches!(refused.error, Error::InvalidXtcThreshold { value } if value.is_nan()),
            "{refused:?}"
        );
        assert_eq!(
            refused.to_string(),
            "xtc_threshold must be in [0, 1], got NaN"
        );
        assert_eq!(base().validate(), Ok(()));
    }

    #[test]
    fn the_chain_runs_the_filters_in_llama_cpps_order() {
        let config = SamplingConfig {
            top_k: Some(40),
            top_p: Some(0.9),
            min_p: Some(0.05),
            typical_p: Some(0.95),
            top_n_sigma: Some(1.5),
            xtc_probability: Some(0.5),
            ..SamplingConfig::default()
        };
        let sampler = crate::Sampler::new(&config).unwrap();
        assert_eq!(
            format!("{sampler:?}"),
            "Sampler { chain: [Temperature(1.0), TopNSigma(1.5), TopK(40), Typical(0.95), TopP(0.9), \
             MinP(0.05), Xtc { probability: 0.5, threshold: 0.1 }], selector: Sample }"
        );
        // XTC at probability 0 is no stage.
        let off = SamplingConfig {
            xtc_probability: Some(0.0),
            xtc_threshold: Some(0.3),
            ..SamplingConfig::default()
        };
        assert!(
            off.chain(BreakerText::Unchecked)
                .unwrap()
                .filters
                .is_empty()
        );
    }

    #[test]
    fn an_order_runs_exactly_the_named_stages_where_it_names_them() {
        // p = (0.4, 0.35, 0.25). At T = 1, top-p 0.45 keeps two tokens; at
        // T = 0.5 first, q = (0.464, 0.355, 0.181) and it keeps one.
        let logits = [0.4f32.ln(), 0.35f32.ln(), 0.25f32.ln()];
        let policy = |samplers: Option<&str>| {
            let config = SamplingConfig {
                temperature: 0.5,
                top_p: Some(0.45),
                order: samplers.map(|s| s.parse().unwrap()),
                ..SamplingConfig::default()
            };
            let mut sampler = crate::Sampler::new(&config).unwrap();
            sampler.policy(&logits, &[]).unwrap().to_vec()
        };
        let close = |got: Vec<f32>, want: [f64; 3]| {
            for (g, w) in got.iter().zip(want) {
                assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want:?}");
            }
        };
        close(policy(None), [1.0, 0.0, 0.0]);
        close(policy(Some("temperature;top_p")), [1.0, 0.0, 0.0]);
        // llama.cpp's default puts temperature last: top-p sees T = 1, then
        // the two survivors are sharpened: 0.16 / (0.16 + 0.1225).
        let sharpened = 0.16 / 0.2825;
        close(
            policy(Some("top_p;temperature")),
            [sharpened, 1.0 - sharpened, 0.0],
        );
        // Without temperature in the order, none is applied (as llama.cpp).
        close(policy(Some("top_p")), [0.4 / 0.75, 0.35 / 0.75, 0.0]);
        // Nor is a stage that is set but not named.
        close(
            policy(Some("temperature")),
            [0.16 / 0.345, 0.1225 / 0.345, 0.0625 / 0.345],
        );
    }

    #[test]
    fn an_order_refuses_unknown_repeated_and_misplaced_names() {
        let refused = |samplers: &str| {
            let config = SamplingConfig {
                order: Some(samplers.parse().unwrap()),
                ..SamplingConfig::default()
            };
            let refused = config.validate().unwrap_err();
            assert_eq!(refused.field, "order");
            refused.error.to_string()
        };
        assert_eq!(
            refused("top_k;top_q"),
            "unknown sampler \"top_q\" in the sampler order (known: penalties, dry, temperature, \
             top_n_sigma, top_k, typ_p, top_p, min_p, xtc, epsilon_cutoff, eta_cutoff)"
        );
        // An alias names the same stage.
        assert_eq!(
            refused("top_k, temp, top-k"),
            "sampler \"top-k\" is named twice in the sampler order"
        );
        assert_eq!(
            refused("dry;top_k;penalties"),
            "\"penalties\" runs on the raw logits: name it before \"top_k\" in the sampler order"
        );
        // llama.cpp's syntax, its comma form, and its aliases are read.
        for text in [
            "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature",
            " top-k , typical , nucleus , min-p , temp ",
        ] {
            let config = SamplingConfig {
                order: Some(text.parse().unwrap()),
                ..SamplingConfig::default()
            };
            assert_eq!(config.validate(), Ok(()), "{text}");
        }
    }
}
