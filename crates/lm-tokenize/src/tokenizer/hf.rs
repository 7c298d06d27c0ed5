//! A `tokenizer.json` completed by what Hugging Face keeps beside it:
//! `tokenizer_config.json`'s bos and eos tokens, its `add_bos_token` and
//! `add_eos_token`, its chat template and `added_tokens_decoder`, and
//! `generation_config.json`'s end tokens. The `lm` crate reads those files;
//! this takes their values.
//!
//! Where `tokenizer_config.json` does not say whether bos (or eos) is
//! added, the tokenizer's post-processor decides, as `transformers` does:
//! bos is added when the post-processor puts it before a text.

use lm_core::TokenId;

use super::{Backend, Tokenizer, end_of_generation_ids};
use crate::TokenizeError;

/// What a Hugging Face directory adds to its `tokenizer.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HfTokenizerConfig {
    /// The bos token (`tokenizer_config.json`'s `bos_token`).
    pub bos_id: Option<TokenId>,
    /// The eos token (`eos_token`).
    pub eos_id: Option<TokenId>,
    /// `add_bos_token`; `None`: as the post-processor does.
    pub add_bos: Option<bool>,
    /// `add_eos_token`; `None`: as the post-processor does.
    pub add_eos: Option<bool>,
    /// More ids that end generation (`generation_config.json`'s
    /// `eos_token_id`, an id or a list).
    pub end_ids: Vec<TokenId>,
    /// Ids `added_tokens_decoder` marks special.
    pub special_ids: Vec<TokenId>,
    /// The chat template (`chat_template`, or the one named "default").
    pub chat_template: Option<String>,
}

impl Tokenizer {
    /// A tokenizer of a `tokenizer.json` ([`Tokenizer::from_json_str`])
    /// completed with `config` (whose ids the caller finds by
    /// [`Tokenizer::token_id`]). An id of `config` outside the vocabulary is
    /// an error.
    pub fn with_hf_config(self, config: HfTokenizerConfig) -> Result<Self, TokenizeError> {
        let mut tokenizer = self;
        let vocab_size = tokenizer.vocab_size();
        let check = |role, id: Option<TokenId>| match id {
            Some(id) if id as usize >= vocab_size => Err(TokenizeError::SpecialTokenOutOfRange {
                role,
                id,
                vocab_size,
            }),
            _ => Ok(()),
        };
        check("bos", config.bos_id)?;
        check("eos", config.eos_id)?;
        for &id in config.end_ids.iter().chain(&config.special_ids) {
            check("end", Some(id))?;
        }
        let (post_bos, post_eos) = tokenizer.post_processor_adds(config.bos_id, config.eos_id)?;
        tokenizer.bos_id = config.bos_id;
        tokenizer.eos_id = config.eos_id;
        tokenizer.add_bos = config.add_bos.unwrap_or(post_bos) && config.bos_id.is_some();
        tokenizer.add_eos = config.add_eos.unwrap_or(post_eos) && config.eos_id.is_some();
        for id in config.special_ids {
            tokenizer.is_special[id as usize] = true;
        }
        let mut end_ids = end_of_generation_ids(&tokenizer.id_to_text, config.eos_id);
        end_ids.extend(config.end_ids);
        end_ids.sort_unstable();
        end_ids.dedup();
        tokenizer.end_ids = end_ids;
        tokenizer.chat_template = config.chat_template;
        Ok(tokenizer)
    }

    /// Whether the post-processor puts `bos` first and `eos` last around a
    /// text (compared with the same text encoded without it).
    fn post_processor_adds(
        &self,
        bos: Option<TokenId>,
        eos: Option<TokenId>,
    ) -> Result<(bool, bool), TokenizeError> {
        let Backend::Pipeline(boxed) = &self.backend else {
            return Ok((false, false));
        };
        let encode = |add_special| {
            boxed
                .pipeline
                .encode_fast("a", add_special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|source| TokenizeError::Backend {
                    stage: "encoding",
                    source,
                })
        };
        let (with, without) = (encode(true)?, encode(false)?);
        let added = with.len() > without.len();
        Ok((
            added && bos.is_some() && with.first().copied() == bos,
            added && eos.is_some() && with.last().copied() == eos,
        ))
    }
}
