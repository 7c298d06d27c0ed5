//! [`TextCodec`]: text <-> token ids for each kind of model.
//!
//! - the toy decoder: words of its seven-word vocabulary separated by spaces
//!   (an unknown word is an error that names it);
//! - count models: words and punctuation as lm-model's splitter cuts them,
//!   unknown words read as `<unk>`;
//! - GGUF models: the tokenizer (byte-level BPE or SentencePiece) built from
//!   the file's `tokenizer.*` metadata by the `lm` crate's loader
//!   ([`GgufText`]).
//!
//! End tokens, when `--end-token` is not given:
//!
//! ```text
//! toy      <end> (id 6)
//! count    </s>
//! GGUF     the loader's end tokens (GgufText::end_ids): 0, 2 and 4 for
//!          SmolLM2, 1, 106 and 212 for Gemma 3, as llama.cpp has it
//! ```

use anyhow::Result;
use lm::GgufText;
use lm_core::{Detokenize, TokenId};
use lm_model::ngram::{Vocab, split_words};
use lm_model::{TOY_VOCAB, Toy};
use lm_tokenize::Message;

/// Text that cannot be turned into ids, or a token that names nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// A prompt word outside the toy vocabulary.
    #[error("unknown word '{word}' for the toy model (its words are: {})", TOY_VOCAB.join(" "))]
    UnknownToyWord {
        /// The word.
        word: String,
    },
    /// An `--end-token` that is not one token of the model.
    #[error("end token '{text}' is not a single token of this model")]
    UnknownEndToken {
        /// What was given.
        text: String,
    },
    /// A chat was asked of a model without a chat template.
    #[error("the {model} model has no chat template; chat needs a GGUF model such as smollm2")]
    NoChatTemplate {
        /// The model kind.
        model: &'static str,
    },
    /// A chat was asked of a GGUF file without `tokenizer.chat_template`
    /// (a base model such as Gemma 3 270M).
    #[error(
        "{} has no chat template (tokenizer.chat_template), so it cannot chat: it is a base model; \
         continue a text with `lm-cli generate --model {} --prompt TEXT`",
        spec,
        spec
    )]
    NoChatTemplateInFile {
        /// The model as given (a file path, or `smollm2`).
        spec: String,
    },
}

/// Text <-> ids for one model.
#[derive(Debug)]
pub enum TextCodec {
    /// The toy decoder's seven words.
    Toy,
    /// A count model's words.
    Words(Vocab),
    /// A GGUF file's tokenizer, chat template and end tokens.
    Bpe(Box<GgufText>),
}

impl TextCodec {
    /// A short name of the kind of model, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Toy => "toy",
            Self::Words(_) => "count",
            Self::Bpe(_) => "GGUF",
        }
    }

    /// The ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<TokenId>> {
        Ok(match self {
            Self::Toy => Toy::encode(text).map_err(|word| TextError::UnknownToyWord {
                word: word.to_owned(),
            })?,
            Self::Words(vocab) => split_words(text).map(|w| vocab.id_or_unk(w)).collect(),
            Self::Bpe(bpe) => bpe.tokenizer.encode(text)?,
        })
    }

    /// The ids of `text` with special-token text kept literal
    /// (`--no-parse-special`): a GGUF model's `<|im_start|>` is split as
    /// ordinary text. The toy and count models have no special tokens, so
    /// this is [`TextCodec::encode`] for them.
    pub fn encode_literal(&self, text: &str) -> Result<Vec<TokenId>> {
        match self {
            Self::Bpe(bpe) => Ok(bpe.tokenizer.encode_literal(text)?),
            Self::Toy | Self::Words(_) => self.encode(text),
        }
    }

    /// The ids of a prompt: as [`TextCodec::encode`], except that an empty
    /// prompt for a count model is the start of a sentence (`<s>`).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<TokenId>> {
        let ids = self.encode(text)?;
        match self {
            Self::Words(vocab) if ids.is_empty() => Ok(vec![vocab.bos()]),
            _ => Ok(ids),
        }
    }

    /// The text of one token, for tables.
    pub fn token_text(&self, id: TokenId) -> String {
        match self {
            Self::Toy => Toy::word(id).unwrap_or("<unk>").to_owned(),
            Self::Words(vocab) => vocab.word(id).unwrap_or("<unk>").to_owned(),
            Self::Bpe(bpe) => bpe.tokenizer.decode(&[id]).unwrap_or_default(),
        }
    }

    /// The text of one token for a tokenize listing: its decoded text, or,
    /// when that alone is not whole UTF-8 (one byte of a character split
    /// across tokens, which decodes to U+FFFD), the vocabulary's own string:
    /// `<0xF0>` in a SentencePiece vocabulary, the byte-level string (`ðŁ`)
    /// in a GPT-2 one.
    pub fn token_piece(&self, id: TokenId) -> String {
        let text = self.token_text(id);
        match self {
            Self::Bpe(bpe) if text.contains(char::REPLACEMENT_CHARACTER) => {
                bpe.tokenizer.token_text(id).map_or(text, str::to_owned)
            }
            _ => text,
        }
    }

    /// The text of `ids` as one span.
    pub fn decode_ids(&self, ids: &[TokenId]) -> String {
        match self {
            Self::Toy => toy_text(ids),
            Self::Words(vocab) => vocab.decode(ids),
            Self::Bpe(bpe) => bpe.tokenizer.decode(ids).unwrap_or_default(),
        }
    }

    /// The token a whole text is scored after, when the model has one: a
    /// GGUF file's document start ([`lm::GgufText::document_start`]: its
    /// BOS when every text gets one, else `<|endoftext|>`, so SmolLM2 does
    /// not read a text as a chat turn opened by its BOS `<|im_start|>`), a
    /// count model's `<s>` (the toy has none).
    pub fn document_start(&self) -> Option<TokenId> {
        match self {
            Self::Toy => None,
            Self::Words(vocab) => Some(vocab.bos()),
            Self::Bpe(bpe) => bpe.document_start(),
        }
    }

    /// The model's own end tokens.
    pub fn end_tokens(&self) -> Vec<TokenId> {
        match self {
            Self::Toy => vec![Toy::END],
            Self::Words(vocab) => vec![vocab.eos()],
            Self::Bpe(bpe) => bpe.end_ids.clone(),
        }
    }

    /// The ids sampling never chooses: a count model's `<unk>` stands for
    /// every word outside its vocabulary and has no text to write (its
    /// probability stays in the logits, for scoring; see lm-model's
    /// `NgramModel`).
    pub fn unwritable_ids(&self) -> Vec<TokenId> {
        match self {
            Self::Words(vocab) => vec![vocab.unk()],
            Self::Toy | Self::Bpe(_) => Vec::new(),
        }
    }

    /// The id of a token given as its text (`<end>`, `</s>`, `<|im_end|>`),
    /// or as text that encodes to exactly one token.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        let direct = match self {
            Self::Toy => Toy::id(text),
            Self::Words(vocab) => vocab.id(text),
            Self::Bpe(bpe) => bpe.tokenizer.token_id(text),
        };
        direct.or_else(|| match self.encode(text).ok().as_deref() {
            Some(&[id]) => Some(id),
            _ => None,
        })
    }

    /// The id of an `--end-token`, as [`TextCodec::token_id`] finds it.
    pub fn end_token_id(&self, text: &str) -> Result<TokenId> {
        self.token_id(text).ok_or_else(|| {
            TextError::UnknownEndToken {
                text: text.to_owned(),
            }
            .into()
        })
    }

    /// The prompt text of one user message in the model's chat template,
    /// ending with the opening of the assistant's turn.
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String> {
        let Self::Bpe(bpe) = self else {
            return Err(TextError::NoChatTemplate { model: self.kind() }.into());
        };
        match bpe.chat_prompt(messages) {
            Err(lm::TextError::NoChatTemplate) => {
                Err(TextError::NoChatTemplate { model: self.kind() }.into())
            }
            prompt => Ok(prompt?),
        }
    }

    /// The ids of the chat prompt of `messages` (as [`TextCodec::chat_prompt`]
    /// renders it). With `parse_special` the whole text is read with its
    /// special-token text; without, only the template's markup is, and each
    /// message's content stays literal (`--no-parse-special`), so a user
    /// cannot open a turn of their own by typing `<|im_start|>system`. The
    /// mechanism is the `lm` crate's ([`GgufText::encode_chat`]), which the
    /// server uses too.
    pub fn encode_chat(&self, messages: &[Message], parse_special: bool) -> Result<Vec<TokenId>> {
        let Self::Bpe(bpe) = self else {
            return Err(TextError::NoChatTemplate { model: self.kind() }.into());
        };
        match bpe.encode_chat(messages, parse_special) {
            Err(lm::TextError::NoChatTemplate) => {
                Err(TextError::NoChatTemplate { model: self.kind() }.into())
            }
            ids => Ok(ids?),
        }
    }
}

impl Detokenize for TextCodec {
    fn decode(&self, ids: &[TokenId]) -> String {
        self.decode_ids(ids)
    }
}

/// The server's view of the codec, so `lm-cli serve` serves every kind
/// of model (the toy, count models, GGUF files) the same way.
impl lm_serve::ServedText for TextCodec {
    fn detokenizer(&self) -> &dyn Detokenize {
        self
    }

    fn encode(&self, text: &str) -> std::result::Result<Vec<TokenId>, lm_serve::TextFailure> {
        self.encode_prompt(text).map_err(Into::into)
    }

    fn chat_prompt(
        &self,
        messages: &[Message],
    ) -> std::result::Result<String, lm_serve::TextFailure> {
        TextCodec::chat_prompt(self, messages).map_err(Into::into)
    }

    fn encode_chat(
        &self,
        messages: &[Message],
        parse_special: bool,
    ) -> std::result::Result<Vec<TokenId>, lm_serve::TextFailure> {
        TextCodec::encode_chat(self, messages, parse_special).map_err(Into::into)
    }

    fn chat_template_source(&self) -> Option<String> {
        match self {
            Self::Bpe(text) => lm_serve::ServedText::chat_template_source(text.as_ref()),
            Self::Toy | Self::Words(_) => None,
        }
    }

    fn chat_reads_tools(&self) -> bool {
        match self {
            Self::Bpe(text) => lm_serve::ServedText::chat_reads_tools(text.as_ref()),
            Self::Toy | Self::Words(_) => false,
        }
    }

    fn encode_chat_with_variables(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        variables: &lm_serve::TemplateVariables,
        parse_special: bool,
    ) -> std::result::Result<Vec<TokenId>, lm_serve::TextFailure> {
        let Self::Bpe(text) = self else {
            return Err(TextError::NoChatTemplate { model: self.kind() }.into());
        };
        lm_serve::ServedText::encode_chat_with_variables(
            text.as_ref(),
            messages,
            tools,
            variables,
            parse_special,
        )
    }

    fn end_tokens(&self) -> Vec<TokenId> {
        TextCodec::end_tokens(self)
    }

    fn banned_tokens(&self) -> Vec<TokenId> {
        self.unwritable_ids()
    }

    fn token_text(&self, id: TokenId) -> String {
        TextCodec::token_text(self, id)
    }

    fn output_constraint(
        &self,
        format: &lm::OutputFormat,
        vocab_size: usize,
    ) -> std::result::Result<lm_decode::OutputConstraint, lm_serve::OutputFormatError> {
        match self {
            Self::Bpe(text) => {
                lm_serve::ServedText::output_constraint(text.as_ref(), format, vocab_size)
            }
            Self::Toy | Self::Words(_) => Err(lm_serve::OutputFormatError::NoVocabulary),
        }
    }
}

/// Toy words joined by single spaces, as [`Toy`]'s `Detokenize`
/// writes them (without building the decoder's weights).
fn toy_text(ids: &[TokenId]) -> String {
    ids.iter()
        .map(|&id| Toy::word(id).unwrap_or("<unk>"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// An escape `--prompt-escape` does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EscapeError {
    /// A backslash followed by a character that is not a known escape.
    #[error("unknown escape '\\{escape}' (known: \\n \\t \\r \\\\ \\\" \\' \\xNN)")]
    Unknown {
        /// What followed the backslash.
        escape: char,
    },
    /// `\x` not followed by two hex digits of an ASCII character (00 to 7f).
    #[error("'\\x{digits}' is not \\x and two hex digits of an ASCII character (00 to 7f)")]
    BadHex {
        /// What followed `\x` (up to two characters).
        digits: String,
    },
    /// A backslash at the very end.
    #[error("a lone backslash ends the prompt (write \\\\ for a backslash)")]
    Trailing,
}

/// `text` with its escapes read, as llama.cpp's `-e` reads them: `\n`,
/// `\t`, `\r`, `\\`, `\"`, `\'` and `\xNN` (an ASCII character, so the
/// result stays UTF-8). Any other escape is an error naming it, never kept
/// as typed or dropped.
pub fn unescape(text: &str) -> Result<String, EscapeError> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let escaped = match chars.next().ok_or(EscapeError::Trailing)? {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            '\\' => '\\',
            '"' => '"',
            '\'' => '\'',
            'x' => {
                let digits: String = chars.by_ref().take(2).collect();
                u8::from_str_radix(&digits, 16)
                    .ok()
                    .filter(|&byte| digits.len() == 2 && byte.is_ascii())
                    .map(char::from)
                    .ok_or(EscapeError::BadHex { digits })?
            }
            escape => return Err(EscapeError::Unknown { escape }),
        };
        out.push(escaped);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lm_serve::ServedText;

    /// A GGUF file's template that renders `tools` renders them in
    /// `lm-cli serve` too (the codec forwards `chat_reads_tools`; without
    /// it the server wrote the tools into a system message of its own).
    #[test]
    fn a_template_that_reads_tools_renders_them_through_the_codec() {
        let vocab = lm_tokenize::SpmVocab {
            tokens: ["<unk>", "<s>", "</s>"]
                .into_iter()
                .map(String::from)
                .chain((b' '..=b'~').map(|b| char::from(b).to_string()))
                .collect(),
            scores: vec![0.0; 3 + 95],
            token_types: [2, 3, 3].into_iter().chain([1; 95]).collect(),
            bos_id: Some(1),
            eos_id: Some(2),
            unk_id: Some(0),
            chat_template: Some(
                "{% if tools %}[{{ tools[0].function.name }}]{% endif %}\
                 {% for m in messages %}{{ m.content }}{% endfor %}"
                    .into(),
            ),
            ..lm_tokenize::SpmVocab::default()
        };
        let text = GgufText {
            tokenizer: lm_tokenize::Tokenizer::from_spm_vocab(vocab).unwrap(),
            end_ids: vec![2],
        };
        let codec = TextCodec::Bpe(Box::new(text));
        assert!(codec.chat_reads_tools());
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let messages = [Message::new("user", "hi")];
        let none = lm_serve::TemplateVariables::new();
        let ids = codec
            .encode_chat_with_variables(&messages, Some(&tools), &none, false)
            .unwrap();
        assert_eq!(codec.decode_ids(&ids), "[f]hi");
        assert!(!TextCodec::Toy.chat_reads_tools());
    }

    #[test]
    fn toy_words_round_trip_and_unknown_words_are_named() {
        let codec = TextCodec::Toy;
        assert_eq!(codec.encode("<start> the cat").unwrap(), vec![0, 1, 2]);
        assert_eq!(codec.decode_ids(&[0, 1, 2]), "<start> the cat");
        let error = codec.encode("<start> the zebra").unwrap_err();
        assert!(error.to_string().contains("'zebra'"), "{error}");
        assert_eq!(codec.end_tokens(), vec![6]);
        assert_eq!(codec.end_token_id("sat").unwrap(), 4);
        assert!(codec.end_token_id("cow").is_err());
    }

    #[test]
    fn count_words_use_the_splitter_and_unk() {
        let vocab = Vocab::new();
        let codec = TextCodec::Words(vocab.clone());
        assert_eq!(codec.encode("zebra, ok").unwrap(), vec![vocab.unk(); 3]);
        assert_eq!(codec.encode_prompt("").unwrap(), vec![vocab.bos()]);
        assert_eq!(codec.end_tokens(), vec![vocab.eos()]);
    }

    #[test]
    fn prompt_escapes_are_read_and_unknown_ones_named() {
        let ok = |text: &str, expected: &str| assert_eq!(unescape(text).as_deref(), Ok(expected));
        ok(r"a\nb\tc\rd", "a\nb\tc\rd");
        ok(r#"\\ \" \' \x41\x7f"#, "\\ \" ' A\u{7f}");
        ok("no escapes, ünïcode", "no escapes, ünïcode");
        assert_eq!(unescape(r"a\qb"), Err(EscapeError::Unknown { escape: 'q' }));
        assert_eq!(
            unescape(r"\x4"),
            Err(EscapeError::BadHex {
                digits: "4".to_owned()
            })
        );
        assert_eq!(
            unescape(r"\xff"),
            Err(EscapeError::BadHex {
                digits: "ff".to_owned()
            })
        );
        assert_eq!(unescape("end\\"), Err(EscapeError::Trailing));
        assert_eq!(
            EscapeError::Unknown { escape: 'q' }.to_string(),
            r#"unknown escape '\q' (known: \n \t \r \\ \" \' \xNN)"#
        );
    }
}
