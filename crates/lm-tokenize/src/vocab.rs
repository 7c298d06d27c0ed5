//! The plain data a tokenizer is built from: GGUF's `tokenizer.*` keys, read
//! by the caller (the `lm` crate's GGUF loader), so this crate needs no file
//! format of its own. One type per `tokenizer.ggml.model`: [`BpeVocab`] for
//! `gpt2` (byte-level BPE) and [`SpmVocab`] for `llama` (SentencePiece).

use lm_core::TokenId;

use crate::TokenizeError;

/// A byte-level BPE vocabulary as GGUF stores it.
///
/// Field by field, the GGUF key it comes from:
///
/// ```text
/// model          tokenizer.ggml.model            "gpt2"
/// pre            tokenizer.ggml.pre              "smollm", "default", "llama-bpe", ...
/// tokens         tokenizer.ggml.tokens           token text, byte-level ("Ġthe")
/// token_types    tokenizer.ggml.token_type       see TokenType; may be empty (all normal)
/// merges         tokenizer.ggml.merges           "Ġ t", by rank
/// bos_id/eos_id  tokenizer.ggml.bos_token_id / eos_token_id
/// unk_id         tokenizer.ggml.unknown_token_id
/// add_bos        tokenizer.ggml.add_bos_token    prepend bos when encoding
/// chat_template  tokenizer.chat_template         Jinja source
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BpeVocab {
    /// The tokenizer model; only `"gpt2"` (byte-level BPE) is supported.
    pub model: String,
    /// The pre-tokenizer name; `None` means llama.cpp's `"default"`.
    pub pre: Option<String>,
    /// Token text by id.
    pub tokens: Vec<String>,
    /// Token type by id (GGUF's integers); empty means every token is normal.
    pub token_types: Vec<i32>,
    /// Merge rules, two tokens separated by one space, highest priority first.
    pub merges: Vec<String>,
    /// The beginning-of-sequence token.
    pub bos_id: Option<TokenId>,
    /// The end-of-sequence token.
    pub eos_id: Option<TokenId>,
    /// The unknown token (kept for reference; byte-level BPE never needs it).
    pub unk_id: Option<TokenId>,
    /// Whether [`crate::Tokenizer::encode`] prepends the bos token.
    pub add_bos: bool,
    /// The Jinja chat template, if the model has one.
    pub chat_template: Option<String>,
}

/// A SentencePiece vocabulary as GGUF stores it (`tokenizer.ggml.model =
/// "llama"`: Llama 2, Mistral, TinyLlama, Gemma).
///
/// Field by field, the GGUF key it comes from:
///
/// ```text
/// tokens            tokenizer.ggml.tokens            token text, spaces as '▁' ("▁the"), bytes as "<0x0A>"
/// scores            tokenizer.ggml.scores            merge priority: the higher, the earlier; may be empty (all 0)
/// token_types       tokenizer.ggml.token_type        see TokenType; may be empty (all normal)
/// bos_id/eos_id     tokenizer.ggml.bos_token_id / eos_token_id
/// unk_id            tokenizer.ggml.unknown_token_id
/// add_bos/add_eos   tokenizer.ggml.add_bos_token / add_eos_token
/// add_space_prefix  tokenizer.ggml.add_space_prefix  a space before text that starts the prompt or follows a special token
/// chat_template     tokenizer.chat_template          Jinja source
/// ```
///
/// llama.cpp's defaults for absent keys (bos 1, eos 2, unk 0, add_bos and
/// add_space_prefix true) are the loader's business: here every field is
/// what the tokenizer uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpmVocab {
    /// Token text by id.
    pub tokens: Vec<String>,
    /// Token score by id; empty means every score is 0.
    pub scores: Vec<f32>,
    /// Token type by id (GGUF's integers); empty means every token is normal.
    pub token_types: Vec<i32>,
    /// The beginning-of-sequence token.
    pub bos_id: Option<TokenId>,
    /// The end-of-sequence token.
    pub eos_id: Option<TokenId>,
    /// The unknown token: stands for a byte that has no `<0xNN>` token.
    pub unk_id: Option<TokenId>,
    /// Whether [`crate::Tokenizer::encode`] prepends the bos token.
    pub add_bos: bool,
    /// Whether [`crate::Tokenizer::encode`] appends the eos token.
    pub add_eos: bool,
    /// Whether text at the start, or right after a special token, gets a
    /// leading space (Llama 2: yes; Gemma: no); decoding drops it again.
    pub add_space_prefix: bool,
    /// The Jinja chat template, if the model has one.
    pub chat_template: Option<String>,
}

/// What a token is, as GGUF's `tokenizer.ggml.token_type` says (llama.cpp's
/// `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenType {
    /// Ordinary text, produced by BPE.
    Normal,
    /// The unknown token.
    Unknown,
    /// A control token such as `<|im_start|>`: matched whole in prompt text,
    /// never produced by BPE.
    Control,
    /// A token the model's authors added: matched whole in prompt text.
    UserDefined,
    /// A reserved slot.
    Unused,
    /// A raw byte such as `<0x0A>` (SentencePiece vocabularies).
    Byte,
}

impl TokenType {
    /// The type for GGUF's integer code, or `None` for an unknown code.
    pub fn from_gguf(code: i32) -> Option<Self> {
        Some(match code {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }

    /// Whether prompt text is searched for this token before BPE runs
    /// (llama.cpp partitions on control, user-defined and unknown tokens).
    pub fn is_matched_whole(self) -> bool {
        matches!(self, Self::Control | Self::UserDefined | Self::Unknown)
    }
}

/// The parsed token types of a vocabulary, one per token (all normal when
/// `token_types` is empty).
pub(crate) fn parse_token_types(
    tokens: &[String],
    token_types: &[i32],
) -> Result<Vec<TokenType>, TokenizeError> {
    if token_types.is_empty() {
        return Ok(vec![TokenType::Normal; tokens.len()]);
    }
    if token_types.len() != tokens.len() {
        return Err(TokenizeError::TokenTypeCountMismatch {
            n_tokens: tokens.len(),
            n_token_types: token_types.len(),
        });
    }
    token_types
        .iter()
        .zip(0..)
        .map(|(&code, id)| {
            TokenType::from_gguf(code).ok_or(TokenizeError::UnknownTokenType {
                id,
                token_type: code,
            })
        })
        .collect()
}

/// Splits a GGUF merge `"a b"` into its two tokens. Like llama.cpp, the
/// separator is the first space after the first character, so a left token
/// that is itself a space still parses.
pub(crate) fn split_merge(merge: &str) -> Option<(&str, &str)> {
    let first_len = merge.chars().next()?.len_utf8();
    let space_idx = first_len + merge.get(first_len..)?.find(' ')?;
    let left = merge.get(..space_idx)?;
    let right = merge.get(space_idx + 1..)?;
    if right.is_empty() {
        return None;
    }
    Some((left, right))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_splits_at_first_space_after_first_char() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ", "t")));
        assert_eq!(split_merge("Ġt he"), Some(("Ġt", "he")));
        assert_eq!(split_merge("  x"), Some((" ", "x")));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge("a "), None);
        assert_eq!(split_merge(""), None);
    }

    #[test]
    fn token_types_round_trip_gguf_codes() {
        for code in 1..=6 {
            assert!(TokenType::from_gguf(code).is_some(), "{code}");
        }
        assert_eq!(TokenType::from_gguf(0), None);
        assert_eq!(TokenType::from_gguf(7), None);
        assert!(TokenType::Control.is_matched_whole());
        assert!(!TokenType::Normal.is_matched_whole());
    }
}
