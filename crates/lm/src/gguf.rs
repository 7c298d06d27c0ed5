//! The one GGUF loader: a file's weights into a [`Decoder`], its
//! `tokenizer.*` metadata into a [`Tokenizer`], its chat template and its end
//! tokens.
//!
//! ```text
//! file.gguf ──GgufFile──┬─ Llama::from_file ─────────────> Decoder
//!                       └─ tokenizer.* keys ─> BpeVocab ─> Tokenizer   (model "gpt2")
//!                                           └> SpmVocab ─> Tokenizer   (model "llama")
//!                          tokenizer.chat_template ──────> ChatTemplate (compiled when a chat asks)
//!                          eos, eot, eom + end-of-turn ──> end_ids
//! ```

use std::path::Path;

use lm_core::TokenId;
use lm_model::{Decoder, GgufError, GgufFile, Llama};
use lm_tokenize::{
    BpeVocab, ChatPart, ChatTemplate, Message, SpmVocab, TextPart, TokenizeError, Tokenizer,
};

use crate::error::{Error, TextError};
use crate::structured::{FormatError, OutputFormat, StructuredOutput};

/// A GGUF model ready to run: the decoder and the text side of the file.
#[derive(Debug)]
pub struct GgufModel {
    /// The transformer (a `LanguageModel`).
    pub decoder: Decoder,
    /// Its tokenizer, chat template and end tokens.
    pub text: GgufText,
}

/// What a GGUF file's `tokenizer.*` metadata gives.
#[derive(Debug)]
pub struct GgufText {
    /// The tokenizer (also a `Detokenize`, for stop strings).
    pub tokenizer: Tokenizer,
    /// The ids that end generation, ascending: EOS,
    /// `tokenizer.ggml.eot_token_id` and `eom_token_id` when present, and
    /// the end-of-turn control tokens lm-tokenize knows (`<|endoftext|>`,
    /// `<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, ...): 0, 2 and 4 for
    /// SmolLM2, 1, 106 and 212 for Gemma 3, as llama.cpp has it.
    pub end_ids: Vec<TokenId>,
}

/// Loads a llama-architecture GGUF file: the decoder first (the weights are
/// checked against the metadata), then the text side.
///
/// Each failure names the file and the stage: [`Error::FileMissing`],
/// [`Error::Model`] (not GGUF, or weights that build no decoder),
/// [`Error::Text`] (tokenizer metadata).
pub fn load_gguf(path: impl AsRef<Path>) -> Result<GgufModel, Error> {
    load_gguf_from(path.as_ref(), |path| GgufFile::open(path))
}

/// Loads a GGUF file as [`load_gguf`] does, but maps it read-only instead
/// of copying it into memory (llama.cpp's default, its `--mmap`): pages are
/// read on first use and shared with every process that maps the file, so
/// two servers of one file hold it once. The weights stream from 4 KB
/// pages instead of huge pages, and no matrix is packed into panels (a map
/// is read-only), so prompts are read on the row-major kernels, at about
/// half the speed.
pub fn map_gguf(path: impl AsRef<Path>) -> Result<GgufModel, Error> {
    load_gguf_from(path.as_ref(), |path| GgufFile::map(path))
}

/// [`load_gguf`] with the file opened by `open_file`.
fn load_gguf_from(
    path: &Path,
    open_file: impl FnOnce(&Path) -> Result<GgufFile, GgufError>,
) -> Result<GgufModel, Error> {
    let file = open(path, open_file, |source| Error::Model {
        path: path.to_path_buf(),
        source: Box::new(source.into()),
    })?;
    // The text side reads only metadata; it is read first so that the
    // decoder gets the file to itself (and may pack its weights in place),
    // but a broken decoder is still reported before a broken tokenizer.
    let text = GgufText::from_file(&file);
    let decoder = Llama::from_file(file).map_err(|source| Error::Model {
        path: path.to_path_buf(),
        source: Box::new(source.into()),
    })?;
    let text = text.map_err(|source| Error::Text {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(GgufModel { decoder, text })
}

impl GgufText {
    /// Only the text side of a GGUF file: the weights are neither built nor
    /// read (to tokenize without loading a model, even one whose weight
    /// types lm-model cannot read).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        exists(path)?;
        let file = GgufFile::open_metadata(path).map_err(|source| Error::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_file(&file).map_err(|source| Error::Text {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The tokenizer, chat template and end tokens of an open GGUF file.
    pub fn from_file(file: &GgufFile) -> Result<Self, TextError> {
        let tokenizer = match file.get_str("tokenizer.ggml.model")? {
            "gpt2" => Tokenizer::from_bpe_vocab(bpe_vocab(file)?)?,
            "llama" => Tokenizer::from_spm_vocab(spm_vocab(file)?)?,
            model => {
                return Err(TokenizeError::UnsupportedModel {
                    model: model.to_owned(),
                }
                .into());
            }
        };
        let mut end_ids = tokenizer.end_ids().to_vec();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = optional(file, key, GgufFile::get_u32)?
                && (id as usize) < tokenizer.vocab_size()
            {
                end_ids.push(id);
            }
        }
        end_ids.sort_unstable();
        end_ids.dedup();
        Ok(Self { tokenizer, end_ids })
    }

    /// The file's `tokenizer.chat_template`, compiled with the file's BOS and
    /// EOS texts. Compiled when asked for, not at load: a template that does
    /// not compile fails a chat, never a plain generation.
    pub fn chat_template(&self) -> Result<ChatTemplate, TextError> {
        let tokenizer = &self.tokenizer;
        let source = tokenizer.chat_template().ok_or(TextError::NoChatTemplate)?;
        Ok(ChatTemplate::new(
            source,
            tokenizer.special_text(tokenizer.bos_id()),
            tokenizer.special_text(tokenizer.eos_id()),
        )?
        .with_name("tokenizer.chat_template"))
    }

    /// The prompt text of `messages` in the chat template, ending with the
    /// opening of the assistant's turn, or inside the final message when it
    /// is the assistant's (prefill: the reply continues it).
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String, TextError> {
        Ok(self.chat_template()?.render_prompt(messages)?)
    }

    /// The ids of the chat prompt of `messages` (as [`GgufText::chat_prompt`]
    /// renders it). Without `parse_special`, special-token text is read
    /// only in the template's markup: every message's content stays
    /// literal, so no speaker can open a turn of their own by writing
    /// `<|im_end|><|im_start|>system`. With it, the whole text is read with
    /// its special-token text (`lm-cli chat --parse-special`, `serve
    /// --parse-special`).
    pub fn encode_chat(
        &self,
        messages: &[Message],
        parse_special: bool,
    ) -> Result<Vec<TokenId>, TextError> {
        let template = self.chat_template()?;
        if parse_special {
            return Ok(self.tokenizer.encode(&template.render_prompt(messages)?)?);
        }
        self.encode_chat_parts(&template.render_parts(messages)?, false)
    }

    /// A rendered conversation's ids: its parts' texts joined and read with
    /// special tokens parsed everywhere (`parse_special`), or the template's
    /// own text parsed and the messages' contents read as plain text.
    pub fn encode_chat_parts(
        &self,
        parts: &[ChatPart],
        parse_special: bool,
    ) -> Result<Vec<TokenId>, TextError> {
        if parse_special {
            let text: String = parts.iter().map(|part| part.text.as_str()).collect();
            return Ok(self.tokenizer.encode(&text)?);
        }
        let parts: Vec<TextPart<'_>> = parts
            .iter()
            .map(|part| TextPart {
                text: &part.text,
                parse_special: !part.is_content,
            })
            .collect();
        Ok(self.tokenizer.encode_parts(&parts)?)
    }

    /// The token a whole text is read after when it is scored from its
    /// start ([`GgufModel::score`]): the BOS token when the tokenizer adds
    /// it to every text (Llama, Gemma: the model always saw it first), else
    /// `<|endoftext|>` when the vocabulary has it (byte-level BPE families
    /// such as GPT-2, SmolLM2 and Qwen separate their training documents
    /// with it; SmolLM2-Instruct's BOS is `<|im_start|>`, which opens a chat
    /// turn, and gives "The cat sat on the mat." a perplexity of 393
    /// against 19 after `<|endoftext|>`), else the BOS token, else none.
    pub fn document_start(&self) -> Option<TokenId> {
        let tokenizer = &self.tokenizer;
        match tokenizer.bos_id() {
            Some(bos) if tokenizer.add_bos() => Some(bos),
            bos => tokenizer.token_id("<|endoftext|>").or(bos),
        }
    }

    /// `format` compiled for this tokenizer and a model of `vocab_size`
    /// tokens, ending on the file's end tokens (structured output).
    pub fn structured_output(
        &self,
        format: &OutputFormat,
        vocab_size: usize,
    ) -> Result<StructuredOutput, FormatError> {
        StructuredOutput::new(format, &self.tokenizer, vocab_size, &self.end_ids)
    }
}

/// Fills a [`BpeVocab`] from GGUF's `tokenizer.*` keys (see [`BpeVocab`]
/// for the key of each field): the tokens and the model name are required,
/// every other key optional, and a key of the wrong type is an error.
pub fn bpe_vocab(file: &GgufFile) -> Result<BpeVocab, GgufError> {
    let owned = |items: Vec<&str>| items.into_iter().map(str::to_owned).collect::<Vec<_>>();
    Ok(BpeVocab {
        model: file.get_str("tokenizer.ggml.model")?.to_owned(),
        pre: optional(file, "tokenizer.ggml.pre", GgufFile::get_str)?.map(str::to_owned),
        tokens: owned(file.get_string_array("tokenizer.ggml.tokens")?),
        token_types: optional(file, "tokenizer.ggml.token_type", GgufFile::get_i32_array)?
            .unwrap_or_default(),
        merges: optional(file, "tokenizer.ggml.merges", GgufFile::get_string_array)?
            .map(owned)
            .unwrap_or_default(),
        bos_id: optional(file, "tokenizer.ggml.bos_token_id", GgufFile::get_u32)?,
        eos_id: optional(file, "tokenizer.ggml.eos_token_id", GgufFile::get_u32)?,
        unk_id: optional(file, "tokenizer.ggml.unknown_token_id", GgufFile::get_u32)?,
        add_bos: optional(file, "tokenizer.ggml.add_bos_token", GgufFile::get_bool)?
            .unwrap_or(false),
        chat_template: optional(file, "tokenizer.chat_template", GgufFile::get_str)?
            .map(str::to_owned),
    })
}

/// Fills an [`SpmVocab`] from GGUF's `tokenizer.*` keys (see [`SpmVocab`]
/// for the key of each field). The tokens are required; an absent key takes
/// llama.cpp's default for SentencePiece vocabularies: bos 1, eos 2, unk 0,
/// add_bos and add_space_prefix true, add_eos false, no scores (all 0).
pub fn spm_vocab(file: &GgufFile) -> Result<SpmVocab, GgufError> {
    let tokens: Vec<String> = file
        .get_string_array("tokenizer.ggml.tokens")?
        .into_iter()
        .map(str::to_owned)
        .collect();
    // A present id is checked by the tokenizer; a default one is kept only
    // when the vocabulary has it.
    let id_or = |key, default: TokenId| -> Result<Option<TokenId>, GgufError> {
        Ok(optional(file, key, GgufFile::get_u32)?
            .or(Some(default).filter(|&id| (id as usize) < tokens.len())))
    };
    let flag_or = |key, default| -> Result<bool, GgufError> {
        Ok(optional(file, key, GgufFile::get_bool)?.unwrap_or(default))
    };
    Ok(SpmVocab {
        scores: optional(file, "tokenizer.ggml.scores", GgufFile::get_f32_array)?
            .unwrap_or_default(),
        token_types: optional(file, "tokenizer.ggml.token_type", GgufFile::get_i32_array)?
            .unwrap_or_default(),
        bos_id: id_or("tokenizer.ggml.bos_token_id", 1)?,
        eos_id: id_or("tokenizer.ggml.eos_token_id", 2)?,
        unk_id: id_or("tokenizer.ggml.unknown_token_id", 0)?,
        add_bos: flag_or("tokenizer.ggml.add_bos_token", true)?,
        add_eos: flag_or("tokenizer.ggml.add_eos_token", false)?,
        add_space_prefix: flag_or("tokenizer.ggml.add_space_prefix", true)?,
        chat_template: optional(file, "tokenizer.chat_template", GgufFile::get_str)?
            .map(str::to_owned),
        tokens,
    })
}

/// `Some(value)` when `key` is present, `None` when absent, an error when it
/// has the wrong type.
fn optional<'f, T>(
    file: &'f GgufFile,
    key: &str,
    get: impl FnOnce(&'f GgufFile, &str) -> Result<T, GgufError>,
) -> Result<Option<T>, GgufError> {
    file.get(key).map(|_| get(file, key)).transpose()
}

/// Opens `path` as GGUF with `open_file`; a missing file is
/// [`Error::FileMissing`], a malformed one the error `malformed` builds.
fn open(
    path: &Path,
    open_file: impl FnOnce(&Path) -> Result<GgufFile, GgufError>,
    malformed: impl FnOnce(GgufError) -> Error,
) -> Result<GgufFile, Error> {
    exists(path)?;
    open_file(path).map_err(malformed)
}

/// [`Error::FileMissing`] when nothing is at `path`; a directory or a FIFO
/// goes on to the GGUF reader, which names it (`GgufError::NotRegularFile`)
/// without reading or waiting on it.
fn exists(path: &Path) -> Result<(), Error> {
    if path.exists() {
        Ok(())
    } else {
        Err(Error::FileMissing {
            path: path.to_path_buf(),
        })
    }
}
