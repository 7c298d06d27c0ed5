//! The typed errors of lm-tokenize: every bad vocabulary, id or template names
//! the value that was wrong.

use lm_core::TokenId;

/// The error type of the `tokenizers` crate, kept as the source of ours.
pub type BackendError = Box<dyn std::error::Error + Send + Sync>;

/// Bad input to a tokenizer, a text stream or a chat template.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizeError {
    /// The vocabulary has no tokens at all.
    #[error("the vocabulary is empty")]
    EmptyVocabulary,
    /// `tokenizer.ggml.model` names a tokenizer this crate cannot build.
    #[error(
        "unsupported tokenizer model {model:?} (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece)"
    )]
    UnsupportedModel {
        /// The rejected model name.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("unknown pre-tokenizer {name:?}")]
    UnknownPreTokenizer {
        /// The rejected pre-tokenizer name.
        name: String,
    },
    /// The token-type list and the token list differ in length.
    #[error("{n_token_types} token types for {n_tokens} tokens")]
    TokenTypeCountMismatch {
        /// Number of tokens.
        n_tokens: usize,
        /// Number of token types.
        n_token_types: usize,
    },
    /// A token type outside 1..=6 (normal, unknown, control, user-defined, unused, byte).
    #[error("token {id} has unknown token type {token_type}")]
    UnknownTokenType {
        /// The token whose type is bad.
        id: TokenId,
        /// The rejected type.
        token_type: i32,
    },
    /// The score list and the token list differ in length.
    #[error("{n_scores} scores for {n_tokens} tokens")]
    ScoreCountMismatch {
        /// Number of tokens.
        n_tokens: usize,
        /// Number of scores.
        n_scores: usize,
    },
    /// A token of the byte type whose text is not `<0xNN>`.
    #[error("byte token {id} has the text {text:?}, not <0xNN>")]
    MalformedByteToken {
        /// The token.
        id: TokenId,
        /// Its text.
        text: String,
    },
    /// Text holds a character the SentencePiece vocabulary cannot spell: no
    /// token, no `<0xNN>` byte token and no unknown token.
    #[error("no token for byte 0x{byte:02X} (no byte token and no unknown token)")]
    NoByteToken {
        /// The byte.
        byte: u8,
    },
    /// Two ids carry the same token text, so text cannot map back to one id.
    #[error("token {second_id} repeats the text {text:?} of token {first_id}")]
    DuplicateToken {
        /// The repeated text.
        text: String,
        /// The first id with this text.
        first_id: TokenId,
        /// The later id with the same text.
        second_id: TokenId,
    },
    /// The vocabulary holds more tokens than a token id can address.
    #[error("{n_tokens} tokens do not fit in 32-bit token ids")]
    VocabularyTooLarge {
        /// Number of tokens.
        n_tokens: usize,
    },
    /// A merge rule is not two tokens separated by a space.
    #[error("merge {merge_idx} is malformed: {merge:?}")]
    MalformedMerge {
        /// Position of the merge in the merge list.
        merge_idx: usize,
        /// The merge text.
        merge: String,
    },
    /// A merge rule names a token (or produces one) missing from the vocabulary.
    #[error("merge {merge_idx} ({merge:?}) needs the unknown token {token:?}")]
    MergeUnknownToken {
        /// Position of the merge in the merge list.
        merge_idx: usize,
        /// The merge text.
        merge: String,
        /// The token missing from the vocabulary.
        token: String,
    },
    /// A special-token id (bos, eos, unk) outside the vocabulary.
    #[error("{role} token id {id} is out of range for a vocabulary of {vocab_size}")]
    SpecialTokenOutOfRange {
        /// Which special token: "bos", "eos" or "unk".
        role: &'static str,
        /// The rejected id.
        id: TokenId,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A token id beyond the vocabulary was given to decode.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The rejected id.
        id: TokenId,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A `tokenizer.json` file could not be read.
    #[error("cannot read tokenizer file {path}")]
    ReadJson {
        /// The file that failed.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A `tokenizer.json` document is not a valid tokenizer.
    #[error("invalid tokenizer.json")]
    InvalidJson {
        /// Why the `tokenizers` crate rejected it.
        #[source]
        source: BackendError,
    },
    /// The `tokenizers` crate failed while building, encoding or decoding.
    #[error("tokenizer backend failed while {stage}")]
    Backend {
        /// What was being done: "building the BPE model", "encoding", ...
        stage: &'static str,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// A chat template that does not parse.
    #[error("chat template does not compile")]
    TemplateSyntax {
        /// The template engine's error (with line number).
        #[source]
        source: minijinja::Error,
    },
    /// A chat template that failed while rendering (including `raise_exception`).
    #[error("chat template failed to render")]
    TemplateRender {
        /// The template engine's error.
        #[source]
        source: minijinja::Error,
    },
    /// A chat template that needed more than a render may take (a loop
    /// without a practical end, an output beyond any context).
    #[error(
        "chat template `{template}` needed more than {limit} to render (a loop or a value without a practical end?)"
    )]
    TemplateTooCostly {
        /// The template's name (`tokenizer.chat_template`).
        template: String,
        /// The budget it exceeded: instructions or bytes of output.
        limit: String,
    },
    /// A chat message holds a private-use character that marks message
    /// contents while rendering ([`crate::ChatTemplate::render_parts`]).
    #[error(
        "chat message {message_idx} contains U+E000 or U+E001 (characters used to mark messages)"
    )]
    MarkerInMessage {
        /// The message's index.
        message_idx: usize,
    },
    /// The last message is the assistant's, but the chat template does not
    /// write it, so the reply cannot continue it.
    #[error(
        "the chat template does not write the final assistant message, so the reply cannot continue it"
    )]
    CannotContinueMessage,
}
