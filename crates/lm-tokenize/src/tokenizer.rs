//! [`Tokenizer`]: text to token ids and back, from a GGUF vocabulary
//! ([`BpeVocab`] on the `tokenizers` crate, [`SpmVocab`] merged by score as
//! llama.cpp does, in `spm.rs`) or from a `tokenizer.json`.
//!
//! Encoding a prompt, as llama.cpp does it for a byte-level BPE vocabulary:
//!
//! ```text
//! "<|im_start|>user\nHi 42"
//!   1. special tokens matched whole:   [<|im_start|>] "user\nHi 42"
//!   2. pre-tokenizer splits the rest:  "user" "\n" "Hi" " " "4" "2"  (smollm)
//!   3. bytes mapped to printable chars, then BPE merges by rank inside each piece
//! ```

use std::path::Path;
use std::sync::OnceLock;

use lm_core::{Detokenize, TokenId};
use tokenizers::AddedToken;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};

use crate::pre_tokenizer::PreTokenizerSpec;
use crate::spm::SpmModel;
use crate::vocab::{BpeVocab, SpmVocab, TokenType, parse_token_types, split_merge};
use crate::{TextStream, TokenizeError};

mod hf;
pub use hf::HfTokenizerConfig;

/// Token texts that end generation wherever they appear in a vocabulary,
/// mirroring llama.cpp's end-of-generation list (including its fill-in-the-
/// middle pad, repository and file-separator tokens, and `</s>`, which the
/// pinned llama.cpp counts too). For SmolLM2 this gives ids 0 `<|endoftext|>`,
/// 2 `<|im_end|>` and 4 `<reponame>`; for Gemma 3, 106 `<end_of_turn>` and
/// 212 `</s>`.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
    "</s>",
];

/// One part of a text for [`Tokenizer::encode_parts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextPart<'a> {
    /// The text.
    pub text: &'a str,
    /// Whether control-token text in it (`<|im_start|>`) becomes those
    /// tokens (template markup) or stays literal (a user's words).
    pub parse_special: bool,
}

/// A tokenizer: encodes text (special tokens included) and decodes ids.
///
/// ```
/// use lm_tokenize::{BpeVocab, Tokenizer};
/// // A toy byte-level vocabulary: "h", "i", "hi" and one control token.
/// let vocab = BpeVocab {
///     model: "gpt2".into(),
///     pre: Some("smollm".into()),
///     tokens: vec!["<|end|>".into(), "h".into(), "i".into(), "hi".into()],
///     token_types: vec![3, 1, 1, 1],
///     merges: vec!["h i".into()],
///     eos_id: Some(0),
///     ..BpeVocab::default()
/// };
/// let tokenizer = Tokenizer::from_bpe_vocab(vocab).unwrap();
/// assert_eq!(tokenizer.encode("hih<|end|>").unwrap(), vec![3, 1, 0]);
/// assert_eq!(tokenizer.decode(&[3, 1, 0]).unwrap(), "hih<|end|>");
/// ```
#[derive(Debug, Clone)]
pub struct Tokenizer {
    /// What turns text into ids and back.
    pub(crate) backend: Backend,
    /// Token text by id, in the vocabulary's own form ("Ġthe"); empty where
    /// a `tokenizer.json` leaves a hole.
    pub(crate) id_to_text: Vec<String>,
    /// Which ids are special (skipped by [`Tokenizer::decode_skipping_special`]).
    is_special: Vec<bool>,
    bos_id: Option<TokenId>,
    eos_id: Option<TokenId>,
    /// Every id that ends generation, ascending.
    end_ids: Vec<TokenId>,
    add_bos: bool,
    /// Whether [`Tokenizer::encode`] appends the eos token.
    add_eos: bool,
    chat_template: Option<String>,
}

/// The encoder and decoder behind a [`Tokenizer`], by vocabulary kind.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// A `tokenizers` pipeline: byte-level BPE or a `tokenizer.json`.
    Pipeline(Box<Pipeline>),
    /// A SentencePiece vocabulary, merged by score as llama.cpp does.
    Spm(Box<SpmModel>),
}

/// A `tokenizers` pipeline (added tokens, pre-tokenizer, model, decoder).
#[derive(Debug, Clone)]
pub(crate) struct Pipeline {
    /// The pipeline.
    pub(crate) pipeline: tokenizers::Tokenizer,
    /// The same pipeline with special-token text split as ordinary text,
    /// built on the first [`Tokenizer::encode_literal`].
    literal: OnceLock<tokenizers::Tokenizer>,
}

impl Backend {
    fn pipeline(pipeline: tokenizers::Tokenizer) -> Self {
        Self::Pipeline(Box::new(Pipeline {
            pipeline,
            literal: OnceLock::new(),
        }))
    }
}

impl Tokenizer {
    /// Builds a byte-level BPE tokenizer from a GGUF vocabulary.
    ///
    /// Control, user-defined and unknown tokens become added tokens that are
    /// matched whole in the text before BPE; control and unknown ones are
    /// special (hidden by [`Tokenizer::decode_skipping_special`]).
    pub fn from_bpe_vocab(vocab: BpeVocab) -> Result<Self, TokenizeError> {
        if vocab.model != "gpt2" {
            return Err(TokenizeError::UnsupportedModel { model: vocab.model });
        }
        let n_tokens = vocabulary_size(&vocab.tokens)?;
        let token_types = parse_token_types(&vocab.tokens, &vocab.token_types)?;
        let spec = PreTokenizerSpec::from_gguf_name(vocab.pre.as_deref())?;
        check_special_ids(n_tokens, vocab.bos_id, vocab.eos_id, vocab.unk_id)?;

        let mut text_to_id = Vocab::with_capacity(n_tokens);
        for (text, id) in vocab.tokens.iter().zip(0u32..) {
            if let Some(&first_id) = text_to_id.get(text) {
                return Err(TokenizeError::DuplicateToken {
                    text: text.clone(),
                    first_id,
                    second_id: id,
                });
            }
            text_to_id.insert(text.clone(), id);
        }
        let merges = parse_merges(&vocab.merges, &text_to_id)?;

        let bpe = BPE::builder()
            .vocab_and_merges(text_to_id, merges)
            .ignore_merges(spec.ignore_merges)
            .build()
            .map_err(|source| TokenizeError::Backend {
                stage: "building the BPE model",
                source,
            })?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(spec.build()?));
        inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));

        let mut is_special = vec![false; n_tokens];
        let mut added = Vec::new();
        for ((text, &token_type), special) in vocab
            .tokens
            .iter()
            .zip(&token_types)
            .zip(is_special.iter_mut())
        {
            if token_type.is_matched_whole() {
                *special = token_type != TokenType::UserDefined;
                added.push(AddedToken::from(text.clone(), *special).normalized(false));
            }
        }
        inner.add_tokens(&added);

        Ok(Self::assemble(
            Backend::pipeline(inner),
            vocab.tokens,
            is_special,
            [vocab.bos_id, vocab.eos_id],
            [vocab.add_bos, false],
            vocab.chat_template,
        ))
    }

    /// Builds a SentencePiece tokenizer from a GGUF vocabulary, giving
    /// llama.cpp's ids (see `spm.rs` for the algorithm).
    ///
    /// Control, user-defined and unknown token texts are matched whole in
    /// the text before merging, longest first; control and unknown ones are
    /// special (hidden by [`Tokenizer::decode_skipping_special`]), and so are
    /// the end-of-generation tokens llama.cpp makes control tokens (`</s>`).
    ///
    /// ```
    /// use lm_tokenize::{SpmVocab, Tokenizer};
    /// let vocab = SpmVocab {
    ///     tokens: vec!["<bos>".into(), "▁".into(), "h".into(), "i".into(), "▁hi".into(), "hi".into()],
    ///     scores: vec![0.0, -1.0, -2.0, -2.0, -1.0, -3.0],
    ///     token_types: vec![3, 1, 1, 1, 1, 1],
    ///     bos_id: Some(0),
    ///     add_bos: true,
    ///     add_space_prefix: true,
    ///     ..SpmVocab::default()
    /// };
    /// let tokenizer = Tokenizer::from_spm_vocab(vocab).unwrap();
    /// // " hi" merges ▁ h i -> ▁ hi -> ▁hi ("hi" scores -3, "▁hi" -1).
    /// assert_eq!(tokenizer.encode("hi").unwrap(), vec![0, 4]);
    /// // Decoding drops the prefix space of the first piece, as llama.cpp.
    /// assert_eq!(tokenizer.decode(&[4]).unwrap(), "hi");
    /// assert_eq!(tokenizer.decode(&[0, 4]).unwrap(), "<bos> hi");
    /// ```
    pub fn from_spm_vocab(vocab: SpmVocab) -> Result<Self, TokenizeError> {
        let n_tokens = vocabulary_size(&vocab.tokens)?;
        check_special_ids(n_tokens, vocab.bos_id, vocab.eos_id, vocab.unk_id)?;
        let model = SpmModel::new(&vocab, END_OF_GENERATION_TEXTS)?;
        let is_special = model
            .token_types()
            .iter()
            .map(|&token_type| matches!(token_type, TokenType::Control | TokenType::Unknown))
            .collect();
        Ok(Self::assemble(
            Backend::Spm(Box::new(model)),
            vocab.tokens,
            is_special,
            [vocab.bos_id, vocab.eos_id],
            [vocab.add_bos, vocab.add_eos],
            vocab.chat_template,
        ))
    }

    /// Loads a Hugging Face `tokenizer.json` file.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self, TokenizeError> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|source| TokenizeError::ReadJson {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json_str(&json)
    }

    /// Parses a Hugging Face `tokenizer.json` document.
    ///
    /// Such a file names no bos or eos token (those live in
    /// `tokenizer_config.json`), so [`Tokenizer::bos_id`] and
    /// [`Tokenizer::eos_id`] are `None` and [`Tokenizer::end_ids`] holds the
    /// vocabulary's well-known end-of-generation tokens.
    pub fn from_json_str(json: &str) -> Result<Self, TokenizeError> {
        let inner: tokenizers::Tokenizer = json
            .parse()
            .map_err(|source| TokenizeError::InvalidJson { source })?;
        let vocab = inner.get_vocab(true);
        let n_tokens = vocab
            .values()
            .max()
            .map_or(0, |&max_id| max_id as usize + 1);
        if n_tokens == 0 {
            return Err(TokenizeError::EmptyVocabulary);
        }
        let mut id_to_text = vec![String::new(); n_tokens];
        for (text, id) in vocab {
            if let Some(slot) = id_to_text.get_mut(id as usize) {
                *slot = text;
            }
        }
        let mut is_special = vec![false; n_tokens];
        for (id, token) in inner.get_added_tokens_decoder() {
            if let Some(slot) = is_special.get_mut(id as usize) {
                *slot = token.special;
            }
        }
        let backend = Backend::pipeline(inner);
        Ok(Self::assemble(
            backend, id_to_text, is_special, [None; 2], [false; 2], None,
        ))
    }

    /// A tokenizer of `backend` over the vocabulary `id_to_text`, with its
    /// `[bos, eos]` ids and `[add_bos, add_eos]` flags: the one place every
    /// kind of vocabulary finds the ids that end generation.
    fn assemble(
        backend: Backend,
        id_to_text: Vec<String>,
        is_special: Vec<bool>,
        [bos_id, eos_id]: [Option<TokenId>; 2],
        [add_bos, add_eos]: [bool; 2],
        chat_template: Option<String>,
    ) -> Self {
        let end_ids = end_of_generation_ids(&id_to_text, eos_id);
        Self {
            backend,
            id_to_text,
            is_special,
            bos_id,
            eos_id,
            end_ids,
            add_bos,
            add_eos,
            chat_template,
        }
    }

    /// Token ids of `text`. Special tokens written in the text (such as
    /// `<|im_start|>`) become single tokens; the bos token is prepended (and
    /// the eos token appended) when the vocabulary asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<TokenId>, TokenizeError> {
        self.encode_with(text, true)
    }

    /// Token ids of `text` with special-token text kept literal: a user's
    /// `<|im_start|>` is split as ordinary text, so it cannot open a turn
    /// (llama.cpp's `--no-parse-special`). User-defined tokens are still
    /// matched whole, as llama.cpp does.
    pub fn encode_literal(&self, text: &str) -> Result<Vec<TokenId>, TokenizeError> {
        self.encode_with(text, false)
    }

    /// Encodes, matching control-token text when `parse_special` is set, and
    /// adds bos and eos when the vocabulary asks for them.
    fn encode_with(&self, text: &str, parse_special: bool) -> Result<Vec<TokenId>, TokenizeError> {
        self.encode_parts(&[TextPart {
            text,
            parse_special,
        }])
    }

    /// Token ids of a text given in parts, some read with special-token
    /// text as control tokens and some kept literal: a chat prompt whose
    /// template markup opens turns while the user's words cannot. The parts
    /// are encoded as one text (bos and eos once; SentencePiece's space
    /// prefix only where a whole text would have it), each split on its own.
    pub fn encode_parts(&self, parts: &[TextPart<'_>]) -> Result<Vec<TokenId>, TokenizeError> {
        let n_bytes: usize = parts.iter().map(|part| part.text.len()).sum();
        let mut ids = Vec::with_capacity(n_bytes / 3 + 2);
        if let Some(bos_id) = self.bos_id.filter(|_| self.add_bos) {
            ids.push(bos_id);
        }
        let mut prev_is_special = true;
        for &TextPart {
            text,
            parse_special,
        } in parts
        {
            match &self.backend {
                Backend::Pipeline(boxed) => {
                    let Pipeline { pipeline, literal } = boxed.as_ref();
                    let pipeline = if parse_special {
                        pipeline
                    } else {
                        // Cloned once, on the first literal encoding.
                        literal.get_or_init(|| {
                            let mut literal = pipeline.clone();
                            literal.set_encode_special_tokens(true);
                            literal
                        })
                    };
                    let encoding = pipeline.encode_fast(text, false).map_err(|source| {
                        TokenizeError::Backend {
                            stage: "encoding",
                            source,
                        }
                    })?;
                    ids.extend_from_slice(encoding.get_ids());
                }
                Backend::Spm(model) => {
                    model.encode(text, parse_special, &mut prev_is_special, &mut ids)?;
                }
            }
        }
        if let Some(eos_id) = self.eos_id.filter(|_| self.add_eos) {
            ids.push(eos_id);
        }
        Ok(ids)
    }

    /// The text of `ids`, special tokens written out. Bytes that do not form
    /// complete UTF-8 are replaced by U+FFFD; use [`TextStream`] to decode
    /// token by token.
    pub fn decode(&self, ids: &[TokenId]) -> Result<String, TokenizeError> {
        self.decode_with(ids, false)
    }

    /// The text of `ids` without the special (control) tokens.
    pub fn decode_skipping_special(&self, ids: &[TokenId]) -> Result<String, TokenizeError> {
        self.decode_with(ids, true)
    }

    /// Decodes, leaving out special tokens when `skip_special` is set.
    pub(crate) fn decode_with(
        &self,
        ids: &[TokenId],
        skip_special: bool,
    ) -> Result<String, TokenizeError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size()) {
            return Err(TokenizeError::TokenOutOfRange {
                id,
                vocab_size: self.vocab_size(),
            });
        }
        match &self.backend {
            Backend::Pipeline(boxed) => {
                boxed
                    .pipeline
                    .decode(ids, skip_special)
                    .map_err(|source| TokenizeError::Backend {
                        stage: "decoding",
                        source,
                    })
            }
            Backend::Spm(model) => Ok(spm_text(model, ids, skip_special)),
        }
    }

    /// A stream that turns ids, one at a time, into complete UTF-8 text.
    pub fn text_stream(&self, skip_special: bool) -> TextStream<'_> {
        TextStream::new(self, skip_special)
    }

    /// The vocabulary's text for `id` (byte-level form, e.g. `"Ġthe"`), or
    /// `None` when `id` is out of range.
    pub fn token_text(&self, id: TokenId) -> Option<&str> {
        self.id_to_text.get(id as usize).map(String::as_str)
    }

    /// The id whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        match &self.backend {
            Backend::Pipeline(boxed) => boxed.pipeline.token_to_id(text),
            Backend::Spm(model) => model.token_id(text),
        }
    }

    /// Whether `id` is a special token (control or unknown type).
    pub fn is_special(&self, id: TokenId) -> bool {
        self.is_special.get(id as usize).copied().unwrap_or(false)
    }

    /// Number of token ids (the largest id plus one).
    pub fn vocab_size(&self) -> usize {
        self.id_to_text.len()
    }

    /// The beginning-of-sequence token, if the vocabulary names one.
    pub fn bos_id(&self) -> Option<TokenId> {
        self.bos_id
    }

    /// The end-of-sequence token, if the vocabulary names one.
    pub fn eos_id(&self) -> Option<TokenId> {
        self.eos_id
    }

    /// Every token that ends generation (the eos token and the well-known
    /// end-of-turn tokens, as llama.cpp counts them), ascending.
    pub fn end_ids(&self) -> &[TokenId] {
        &self.end_ids
    }

    /// Whether `id` ends generation.
    pub fn is_end(&self, id: TokenId) -> bool {
        self.end_ids.binary_search(&id).is_ok()
    }

    /// Whether [`Tokenizer::encode`] prepends the bos token.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether [`Tokenizer::encode`] appends the eos token.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The Jinja chat template stored with the vocabulary.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The text of a special token id, for chat templates' `bos_token` and
    /// `eos_token` variables.
    pub fn special_text(&self, id: Option<TokenId>) -> Option<&str> {
        id.and_then(|id| self.token_text(id))
    }
}

impl Detokenize for Tokenizer {
    /// The text of `ids` with special tokens written out; an id outside the
    /// vocabulary reads as U+FFFD.
    fn decode(&self, ids: &[TokenId]) -> String {
        let pipeline = match &self.backend {
            Backend::Pipeline(boxed) => &boxed.pipeline,
            Backend::Spm(model) => return spm_text(model, ids, false),
        };
        let vocab_size = self.vocab_size();
        let mut text = String::new();
        for run in ids.split_inclusive(|&id| id as usize >= vocab_size) {
            let (valid, bad) = match run.split_last() {
                Some((&last, head)) if last as usize >= vocab_size => (head, true),
                _ => (run, false),
            };
            match pipeline.decode(valid, false) {
                Ok(piece) => text.push_str(&piece),
                Err(_) => text.push(char::REPLACEMENT_CHARACTER),
            }
            if bad {
                text.push(char::REPLACEMENT_CHARACTER);
            }
        }
        text
    }
}

/// The text of `ids` in a SentencePiece vocabulary; bytes that are not
/// UTF-8 read as U+FFFD.
fn spm_text(model: &SpmModel, ids: &[TokenId], skip_special: bool) -> String {
    let mut bytes = Vec::with_capacity(ids.len() * 4);
    model.decode_bytes(ids, skip_special, &mut bytes);
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
    }
}

/// The number of tokens of a GGUF vocabulary: at least one, and few enough
/// for a `u32` id.
fn vocabulary_size(tokens: &[String]) -> Result<usize, TokenizeError> {
    let n_tokens = tokens.len();
    if n_tokens == 0 {
        return Err(TokenizeError::EmptyVocabulary);
    }
    if u32::try_from(n_tokens).is_err() {
        return Err(TokenizeError::VocabularyTooLarge { n_tokens });
    }
    Ok(n_tokens)
}

/// Checks that the bos, eos and unk ids are inside a vocabulary of
/// `n_tokens`.
fn check_special_ids(
    n_tokens: usize,
    bos_id: Option<TokenId>,
    eos_id: Option<TokenId>,
    unk_id: Option<TokenId>,
) -> Result<(), TokenizeError> {
    for (role, id) in [("bos", bos_id), ("eos", eos_id), ("unk", unk_id)] {
        if let Some(id) = id.filter(|&id| id as usize >= n_tokens) {
            return Err(TokenizeError::SpecialTokenOutOfRange {
                role,
                id,
                vocab_size: n_tokens,
            });
        }
    }
    Ok(())
}

/// Parses GGUF merges into pairs, checking that both sides and their
/// concatenation are tokens.
fn parse_merges(
    merges: &[String],
    text_to_id: &Vocab,
) -> Result<Vec<(String, String)>, TokenizeError> {
    merges
        .iter()
        .enumerate()
        .map(|(merge_idx, merge)| {
            let (left, right) =
                split_merge(merge).ok_or_else(|| TokenizeError::MalformedMerge {
                    merge_idx,
                    merge: merge.clone(),
                })?;
            let merged = format!("{left}{right}");
            for token in [left, right, merged.as_str()] {
                if !text_to_id.contains_key(token) {
                    return Err(TokenizeError::MergeUnknownToken {
                        merge_idx,
                        merge: merge.clone(),
                        token: token.to_owned(),
                    });
                }
            }
            Ok((left.to_owned(), right.to_owned()))
        })
        .collect()
}

/// The eos id plus every token whose text is a well-known end of generation,
/// sorted and without repeats.
fn end_of_generation_ids(tokens: &[String], eos_id: Option<TokenId>) -> Vec<TokenId> {
    let mut end_ids: Vec<TokenId> = tokens
        .iter()
        .zip(0u32..)
        .filter(|(text, _)| END_OF_GENERATION_TEXTS.contains(&text.as_str()))
        .map(|(_, id)| id)
        .chain(eos_id)
        .collect();
    end_ids.sort_unstable();
    end_ids.dedup();
    end_ids
}
