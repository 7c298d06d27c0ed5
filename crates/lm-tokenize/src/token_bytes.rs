//! What each token writes, as bytes: the vocabulary an engine needs to match
//! output text token by token (structured output builds its token trie from
//! it), for both vocabulary kinds.
//!
//! ```text
//! byte-level BPE (gpt2)   "Ġthe" -> b" the"   (each char stands for one byte: GPT-2's printable map)
//! SentencePiece           "▁the" -> b" the",  "<0x0A>" -> b"\n"
//! either                  "<|im_end|>" (control) -> Special;   user-defined -> its text as is
//! ```

use std::collections::HashMap;

use tokenizers::decoders::DecoderWrapper;

use crate::Tokenizer;
use crate::spm::SPACE_MARK;
use crate::tokenizer::Backend;
use crate::vocab::TokenType;

/// The output of one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenBytes {
    /// Text: these bytes (a byte token, or a byte-level one, may hold part of
    /// a UTF-8 character).
    Text(Vec<u8>),
    /// A special token (control or unknown type): markup, not text.
    Special,
    /// A reserved slot, or a text the vocabulary's byte map cannot read:
    /// never output.
    Unused,
}

impl Tokenizer {
    /// The bytes each token id writes, in id order (see [`TokenBytes`]).
    ///
    /// ```
    /// use lm_tokenize::{BpeVocab, TokenBytes, Tokenizer};
    /// let vocab = BpeVocab {
    ///     model: "gpt2".into(),
    ///     tokens: vec!["<|end|>".into(), "Ġhi".into(), "Ċ".into()],
    ///     token_types: vec![3, 1, 1],
    ///     ..BpeVocab::default()
    /// };
    /// let bytes = Tokenizer::from_bpe_vocab(vocab).unwrap().token_bytes();
    /// assert_eq!(bytes[0], TokenBytes::Special);
    /// assert_eq!(bytes[1], TokenBytes::Text(b" hi".to_vec()));
    /// assert_eq!(bytes[2], TokenBytes::Text(b"\n".to_vec()));
    /// ```
    pub fn token_bytes(&self) -> Vec<TokenBytes> {
        match &self.backend {
            Backend::Spm(model) => self
                .id_to_text
                .iter()
                .zip(model.token_types())
                .map(|(text, &token_type)| match token_type {
                    TokenType::Control | TokenType::Unknown => TokenBytes::Special,
                    TokenType::UserDefined => TokenBytes::Text(text.as_bytes().to_vec()),
                    TokenType::Normal => {
                        TokenBytes::Text(text.replace(SPACE_MARK, " ").into_bytes())
                    }
                    TokenType::Byte => byte_token(text)
                        .map_or(TokenBytes::Unused, |byte| TokenBytes::Text(vec![byte])),
                    TokenType::Unused => TokenBytes::Unused,
                })
                .collect(),
            Backend::Pipeline(boxed) => {
                let pipeline = &boxed.pipeline;
                // Added tokens that are not special (user-defined) are
                // matched as their text, which no byte map encodes.
                let added: HashMap<u32, String> = pipeline
                    .get_added_tokens_decoder()
                    .into_iter()
                    .filter(|(_, token)| !token.special)
                    .map(|(id, token)| (id, token.content))
                    .collect();
                let byte_level = pipeline.get_decoder().is_some_and(is_byte_level);
                let byte_of_char = byte_level_map();
                (0u32..)
                    .zip(&self.id_to_text)
                    .map(|(id, text)| {
                        if self.is_special(id) {
                            TokenBytes::Special
                        } else if let Some(content) = added.get(&id) {
                            TokenBytes::Text(content.as_bytes().to_vec())
                        } else if text.is_empty() {
                            TokenBytes::Unused
                        } else if byte_level {
                            text.chars()
                                .map(|c| byte_of_char.get(&c).copied())
                                .collect::<Option<Vec<u8>>>()
                                .map_or(TokenBytes::Unused, TokenBytes::Text)
                        } else if let Some(byte) = byte_token(text) {
                            TokenBytes::Text(vec![byte])
                        } else {
                            TokenBytes::Text(text.replace(SPACE_MARK, " ").into_bytes())
                        }
                    })
                    .collect()
            }
        }
    }
}

/// Whether a `tokenizers` decoder reads tokens through GPT-2's byte map.
fn is_byte_level(decoder: &DecoderWrapper) -> bool {
    match decoder {
        DecoderWrapper::ByteLevel(_) => true,
        DecoderWrapper::Sequence(sequence) => sequence.get_decoders().iter().any(is_byte_level),
        _ => false,
    }
}

/// The character GPT-2's byte-level alphabet writes for `byte` in a
/// byte-level BPE vocabulary: the printable bytes stand for themselves, the
/// other 68 are the characters from U+0100 on, in byte order.
pub fn byte_level_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(0x100 + rank).expect("U+0100..U+0144 are chars")
}

/// GPT-2's byte-level alphabet, inverted.
fn byte_level_map() -> HashMap<char, u8> {
    (0..=255u8)
        .map(|byte| (byte_level_char(byte), byte))
        .collect()
}

/// The byte of a `<0xNN>` token.
fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BpeVocab, SpmVocab};

    #[test]
    fn the_byte_level_chars_are_the_tokenizers_crates_alphabet() {
        let ours: std::collections::HashSet<char> = (0..=255u8).map(byte_level_char).collect();
        let theirs: std::collections::HashSet<char> =
            tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
                .into_iter()
                .collect();
        assert_eq!(ours.len(), 256);
        assert_eq!(ours, theirs);
        assert_eq!(byte_level_char(b' '), '\u{120}');
        assert_eq!(byte_level_char(b'\n'), '\u{10a}');
    }

    #[test]
    fn the_byte_level_map_inverts_the_pipelines_own_decoding_for_every_byte() {
        // Each of the 256 single-byte tokens, decoded by the `tokenizers`
        // byte-level decoder itself (the independent reference), gives the
        // byte our map gives.
        let map = byte_level_map();
        assert_eq!(map.len(), 256);
        let mut chars: Vec<(char, u8)> = map.into_iter().collect();
        chars.sort_by_key(|&(_, b)| b);
        let tokens: Vec<String> = chars.iter().map(|&(c, _)| c.to_string()).collect();
        let vocab = BpeVocab {
            model: "gpt2".into(),
            token_types: vec![1; tokens.len()],
            tokens,
            ..BpeVocab::default()
        };
        let tokenizer = Tokenizer::from_bpe_vocab(vocab).unwrap();
        let bytes = tokenizer.token_bytes();
        for (id, (_, byte)) in (0u32..).zip(&chars) {
            assert_eq!(bytes[id as usize], TokenBytes::Text(vec![*byte]));
            if byte.is_ascii() {
                assert_eq!(tokenizer.decode(&[id]).unwrap().as_bytes(), [*byte]);
            }
        }
    }

    #[test]
    fn sentencepiece_tokens_write_their_pieces_with_spaces_and_bytes() {
        let vocab = SpmVocab {
            tokens: ["<bos>", "▁the", "<0x0A>", "<mask>", "<unused0>", "é"]
                .map(String::from)
                .to_vec(),
            token_types: vec![3, 1, 6, 4, 5, 1],
            ..SpmVocab::default()
        };
        let bytes = Tokenizer::from_spm_vocab(vocab).unwrap().token_bytes();
        assert_eq!(
            bytes,
            vec![
                TokenBytes::Special,
                TokenBytes::Text(b" the".to_vec()),
                TokenBytes::Text(b"\n".to_vec()),
                TokenBytes::Text(b"<mask>".to_vec()),
                TokenBytes::Unused,
                TokenBytes::Text("é".as_bytes().to_vec()),
            ]
        );
    }
}
