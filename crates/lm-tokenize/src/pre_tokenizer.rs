//! Pre-tokenizers named by GGUF's `tokenizer.ggml.pre`, as llama.cpp splits text
//! before byte-level BPE.
//!
//! llama.cpp applies a list of regexes in turn: each regex splits every piece
//! left by the previous one, and the text between two matches stays a piece of
//! its own. The `tokenizers` crate's `Split` with the `Isolated` behaviour does
//! exactly that, so each name maps to a `Sequence` of `Split`s followed by a
//! byte-level mapping that no longer splits:
//!
//! ```text
//! "Hello world 123"
//!   --split \p{N}-->        ["Hello world ", "1", "2", "3"]       (smollm only)
//!   --split GPT-2 regex-->  ["Hello", " world", " ", "1", "2", "3"]
//!   --byte-level map-->     ["Hello", "Ġworld", "Ġ", "1", "2", "3"]  then BPE per piece
//! ```
//!
//! Names that llama.cpp knows but this table lacks are rejected with
//! [`TokenizeError::UnknownPreTokenizer`]; there is no silent fallback, since a
//! wrong split gives plausible but different token ids.

use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

use crate::TokenizeError;

/// GPT-2's split: contractions, letters, numbers, other symbols, each with an
/// optional leading space; whitespace not followed by a non-space.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Every numeric character alone (SmolLM, StarCoder and relatives).
const EACH_DIGIT: &str = r"\p{N}";

/// Llama 3's split (case-insensitive contractions, numbers in groups of three).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's split (like Llama 3, but every digit alone).
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one `tokenizer.ggml.pre` name splits text and runs BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PreTokenizerSpec {
    /// Regexes applied in order, each splitting the pieces of the previous one.
    pub regexes: &'static [&'static str],
    /// Whether a piece that is itself a token skips the merges (llama.cpp's
    /// `ignore_merges`, set for the Llama 3 family).
    pub ignore_merges: bool,
}

impl PreTokenizerSpec {
    /// The spec for a GGUF pre-tokenizer name; `None` (a missing key) means
    /// llama.cpp's "default".
    pub fn from_gguf_name(name: Option<&str>) -> Result<Self, TokenizeError> {
        let plain = |regexes| Self {
            regexes,
            ignore_merges: false,
        };
        let spec = match name.unwrap_or("default") {
            "default" => plain(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" | "trillion"
            | "granite-docling" | "roberta-bpe" | "jina-es" | "jina-de" | "jina-v2-es"
            | "jina-v2-de" | "gigachat" | "mellum" => plain(&[GPT2]),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => plain(&[EACH_DIGIT, GPT2]),
            "falcon" => plain(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe" => {
                Self {
                    regexes: &[LLAMA3],
                    ignore_merges: !matches!(name, Some("dbrx" | "smaug-bpe")),
                }
            }
            "chatglm-bpe" | "glm4" => plain(&[LLAMA3]),
            "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" | "hunyuan" => plain(&[QWEN2]),
            "poro-chat" | "bloom" | "gpt3-finnish" => plain(&[r" ?[^(\s|.,!?…。，、।۔،)]+"]),
            "viking" => plain(&[r" ?[^(\s|.,!?…。，、।۔،)]+", EACH_DIGIT]),
            other => {
                return Err(TokenizeError::UnknownPreTokenizer {
                    name: other.to_owned(),
                });
            }
        };
        Ok(spec)
    }

    /// The `tokenizers` pipeline: one isolating split per regex, then the
    /// byte-level mapping (which must not split again).
    pub fn build(&self) -> Result<PreTokenizerWrapper, TokenizeError> {
        let mut stages = Vec::with_capacity(self.regexes.len() + 1);
        for regex in self.regexes {
            let split = Split::new(
                SplitPattern::Regex((*regex).to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|source| TokenizeError::Backend {
                stage: "compiling a pre-tokenizer regex",
                source,
            })?;
            stages.push(PreTokenizerWrapper::Split(split));
        }
        stages.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(stages)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// Pieces of `text` after the pre-tokenizer named `name`, in byte-level form.
    fn pieces(name: &str, text: &str) -> Vec<String> {
        let pre = PreTokenizerSpec::from_gguf_name(Some(name))
            .and_then(|spec| spec.build())
            .expect("known pre-tokenizer");
        let mut pretokenized = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut pretokenized).expect("pre-tokenize");
        pretokenized
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.to_owned())
            .collect()
    }

    fn check(name: &str, text: &str, expected: &[&str]) {
        assert_eq!(pieces(name, text), expected, "{name} on {text:?}");
    }

    #[test]
    fn smollm_splits_every_digit() {
        // Hand-worked: the digit pass isolates 1, 2, 3; the GPT-2 pass then
        // leaves the space before them as a piece of its own ("Ġ" is byte 0x20).
        check(
            "smollm",
            "Hello world 123",
            &["Hello", "Ġworld", "Ġ", "1", "2", "3"],
        );
    }

    #[test]
    fn gpt2_keeps_numbers_whole_with_their_space() {
        check("gpt2", "Hello world 123", &["Hello", "Ġworld", "Ġ123"]);
    }

    #[test]
    fn gpt2_whitespace_run_leaves_last_space_to_the_word() {
        // "\s+(?!\S)" takes all but the last space; " ?\p{L}+" takes " b".
        check("gpt2", "a   b", &["a", "ĠĠ", "Ġb"]);
        // A tab before a letter is matched by nothing and stays a piece.
        check("gpt2", "a\tb", &["a", "ĉ", "b"]);
    }

    #[test]
    fn gpt2_contractions_are_case_sensitive() {
        check("gpt2", "it's IT'S", &["it", "'s", "ĠIT", "'", "S"]);
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        check("llama-bpe", "12345", &["123", "45"]);
    }

    #[test]
    fn unknown_name_is_a_typed_error() {
        let err = PreTokenizerSpec::from_gguf_name(Some("no-such-pre")).unwrap_err();
        assert!(
            matches!(&err, TokenizeError::UnknownPreTokenizer { name } if name == "no-such-pre"),
            "{err:?}"
        );
    }

    #[test]
    fn missing_name_means_default() {
        assert_eq!(
            PreTokenizerSpec::from_gguf_name(None).unwrap(),
            PreTokenizerSpec::from_gguf_name(Some("default")).unwrap()
        );
    }
}
