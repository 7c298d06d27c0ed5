//! The sampling settings, written once: [`SamplingConfig`] is what lm-cli's
//! flags, the `--json` report, lm-serve's requests and beam search all
//! build or embed, [`SamplingConfig::validate`] is the one check of its
//! values, and [`SamplingConfig::FIELDS`] names each setting in every front
//! end. A new stage is a field here, a line in [`SamplingConfig::chain`],
//! a row of `FIELDS`, one CLI flag and one request field.

use super::{
    BannedTokens, CandidateFilter, FrequencyPenalty, LogitBias, LogitTransform, MinP,
    PresencePenalty, RepetitionPenalty, Temperature, TopK, TopNSigma, TopP, Typical, Xtc,
};
use crate::error::{Error, Result};
use lm_core::TokenId;
use serde::{Deserialize, Serialize};
use std::fmt;

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
    /// The fewest tokens every filter leaves (llama.cpp's `min_keep`, HF's
    /// `min_tokens_to_keep`; unset or 0: one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_keep: Option<usize>,
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
            min_keep: None,
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
    pub(crate) temperature: Temperature,
    pub(crate) filters: Vec<Box<dyn CandidateFilter>>,
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
        Field::new("logit_bias", "--logit-bias", "logit_bias"),
        Field::new("banned_tokens", "--logit-bias", "logit_bias"),
        Field::new("temperature", "--temperature", "temperature"),
        Field::new("top_n_sigma", "--top-nsigma", "top_n_sigma"),
        Field::new("top_k", "--top-k", "top_k"),
        Field::new("typical_p", "--typical", "typical_p"),
        Field::new("top_p", "--top-p", "top_p"),
        Field::new("min_p", "--min-p", "min_p"),
        Field::new("xtc_probability", "--xtc-probability", "xtc_probability"),
        Field::new("xtc_threshold", "--xtc-threshold", "xtc_threshold"),
        Field::new("min_keep", "--min-keep", "min_keep"),
        Field::new("seed", "--seed", "seed"),
    ];

    /// XTC's threshold when only its probability is given (llama.cpp's
    /// default).
    pub const XTC_THRESHOLD: f32 = 0.1;

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
        self.chain().map(drop)
    }

    /// The stages this config sets, built and checked, in the chain's order.
    pub(crate) fn chain(&self) -> Result<Chain, InvalidSetting> {
        let temperature = checked("temperature", Temperature::new(self.temperature))?;
        let transforms = [
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
        let xtc_threshold = stage("xtc_threshold", self.xtc_threshold, Xtc::check_threshold)?;
        let xtc = stage("xtc_probability", self.xtc_probability, |p| {
            Xtc::new(p, xtc_threshold.unwrap_or(Self::XTC_THRESHOLD))
        })?;
        let filters = [
            filter(stage("top_n_sigma", self.top_n_sigma, TopNSigma::new)?),
            filter(stage("top_k", self.top_k, TopK::new)?),
            filter(stage("typical_p", self.typical_p, Typical::new)?),
            filter(stage("top_p", self.top_p, TopP::new)?),
            filter(stage("min_p", self.min_p, MinP::new)?),
            filter(xtc.filter(|xtc| xtc.probability() > 0.0)),
        ];
        Ok(Chain {
            transforms: transforms.into_iter().flatten().collect(),
            temperature,
            filters: filters.into_iter().flatten().collect(),
        })
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
                "min_keep": 3}"#,
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
                seed: 9,
            }
        );
        assert!(serde_json::from_str::<SamplingConfig>(r#"{"top_q": 1}"#).is_err());
    }

    #[test]
    fn validate_names_the_field_of_each_refused_stage() {
        let check = |config: SamplingConfig, field: &str| {
            assert_eq!(config.validate().unwrap_err().field, field, "{config:?}");
        };
        let base = SamplingConfig::default;
        check(
            SamplingConfig {
                temperature: -1.0,
                ..base()
            },
            "temperature",
        );
        check(
            SamplingConfig {
                top_k: Some(0),
                ..base()
            },
            "top_k",
        );
        check(
            SamplingConfig {
                top_p: Some(0.0),
                ..base()
            },
            "top_p",
        );
        check(
            SamplingConfig {
                min_p: Some(-0.5),
                ..base()
            },
            "min_p",
        );
        let repetition_penalty = Some(0.0);
        check(
            SamplingConfig {
                repetition_penalty,
                ..base()
            },
            "repetition_penalty",
        );
        let presence_penalty = Some(f32::NAN);
        check(
            SamplingConfig {
                presence_penalty,
                ..base()
            },
            "presence_penalty",
        );
        let frequency_penalty = Some(f32::INFINITY);
        check(
            SamplingConfig {
                frequency_penalty,
                ..base()
            },
            "frequency_penalty",
        );
        let logit_bias = vec![(1, f32::NAN)];
        check(
            SamplingConfig {
                logit_bias,
                ..base()
            },
            "logit_bias",
        );
        for (config, field, error, message) in [
            (
                SamplingConfig {
                    typical_p: Some(0.0),
                    ..base()
                },
                "typical_p",
                Error::InvalidTypicalP { value: 0.0 },
                "typical_p must be in (0, 1], got 0",
            ),
            (
                SamplingConfig {
                    top_n_sigma: Some(-1.0),
                    ..base()
                },
                "top_n_sigma",
                Error::InvalidTopNSigma { value: -1.0 },
                "top_n_sigma must be finite and greater than 0, got -1",
            ),
            (
                SamplingConfig {
                    top_n_sigma: Some(f32::INFINITY),
                    ..base()
                },
                "top_n_sigma",
                Error::InvalidTopNSigma {
                    value: f32::INFINITY,
                },
                "top_n_sigma must be finite and greater than 0, got inf",
            ),
            (
                SamplingConfig {
                    xtc_probability: Some(1.5),
                    ..base()
                },
                "xtc_probability",
                Error::InvalidXtcProbability { value: 1.5 },
                "xtc_probability must be in [0, 1], got 1.5",
            ),
            // The threshold is checked even when XTC is off.
            (
                SamplingConfig {
                    xtc_threshold: Some(-0.5),
                    ..base()
                },
                "xtc_threshold",
                Error::InvalidXtcThreshold { value: -0.5 },
                "xtc_threshold must be in [0, 1], got -0.5",
            ),
        ] {
            let refused = config.validate().unwrap_err();
            assert_eq!(
                (refused.field, &refused.error, refused.to_string().as_str()),
                (field, &error, message)
            );
            // The sampler refuses with the same typed error.
            assert_eq!(crate::Sampler::new(&config).err(), Some(error));
        }
        // NaN is refused too (and is no value to compare with `==`).
        let nan = SamplingConfig {
            xtc_threshold: Some(f32::NAN),
            ..base()
        };
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
        assert!(off.chain().unwrap().filters.is_empty());
    }
}
