//! [`ServedText`]: what the server needs from a model's text side (text to
//! ids, ids to text, the end tokens, the chat template), so any model with
//! a codec can be served: a GGUF file through [`lm::GgufText`], or a codec
//! of the embedding program's own (lm-cli serves its toy and count models
//! through one).

use lm::{FormatError, GgufText, OutputFormat};
use lm_core::{Detokenize, TokenId};
use lm_decode::OutputConstraint;
use lm_tokenize::Message;

/// The error a [`ServedText`] reports (its own type, boxed): a prompt that
/// does not encode, a model without a chat template. The server answers it
/// with a 400 that quotes it.
pub type TextFailure = Box<dyn std::error::Error + Send + Sync>;

/// Extra variables of a chat template render (`chat_template_kwargs`).
pub type TemplateVariables = serde_json::Map<String, serde_json::Value>;

/// Why a [`ServedText`] has no constraint for a `response_format`; the
/// server answers either with a 400 naming `response_format`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputFormatError {
    /// The model has no vocabulary the engine can read (a count model, the
    /// toy): structured output needs a tokenizer's token bytes.
    #[error(
        "structured output needs a model with a tokenizer's vocabulary (a GGUF file); this model has none"
    )]
    NoVocabulary,
    /// The engine refused the format; its message.
    #[error(transparent)]
    Refused(#[from] FormatError),
}

/// A model's text side as the server uses it.
pub trait ServedText: Send + Sync {
    /// Decodes generated ids (incrementally, for streaming and stop
    /// strings).
    fn detokenizer(&self) -> &dyn Detokenize;

    /// The ids of a prompt, as `lm-cli generate` reads one (special-token
    /// texts parsed, BOS added when the vocabulary asks for it).
    fn encode(&self, text: &str) -> Result<Vec<TokenId>, TextFailure>;

    /// The prompt text of `messages` in the model's chat template, ending
    /// with the opening of the assistant's turn (or, when the last message
    /// is the assistant's, inside it: the reply continues it).
    fn chat_prompt(&self, messages: &[Message]) -> Result<String, TextFailure>;

    /// The ids of the chat prompt of `messages`. Unless `parse_special`,
    /// special-token text is read only in the template's markup and every
    /// message's content stays literal, so a client cannot open a turn by
    /// writing `<|im_end|><|im_start|>system` in a message. The default
    /// encodes [`ServedText::chat_prompt`] whole, which is right only for a
    /// text side without special tokens (the toy); one with them overrides
    /// it (a GGUF file's does, through `lm`'s `GgufText::encode_chat`).
    fn encode_chat(
        &self,
        messages: &[Message],
        parse_special: bool,
    ) -> Result<Vec<TokenId>, TextFailure> {
        let _ = parse_special;
        self.encode(&self.chat_prompt(messages)?)
    }

    /// The chat template's source, which picks the tool-call format
    /// (`tools.rs`); `None` without a template.
    fn chat_template_source(&self) -> Option<String> {
        None
    }

    /// Whether the chat template renders the `tools` variable
    /// ([`lm_tokenize::ChatTemplate::reads_tools`]); when it does not, the
    /// server writes the tools into a system message itself.
    fn chat_reads_tools(&self) -> bool {
        false
    }

    /// The ids of the chat prompt of `messages` with `variables` added to
    /// the template's (a request's `chat_template_kwargs`, such as Qwen3's
    /// `enable_thinking`) and, when given, its `tools` variable set to
    /// `tools` (OpenAI's array; passed only when
    /// [`ServedText::chat_reads_tools`]). By default there is no template
    /// to render them with.
    fn encode_chat_with_variables(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        variables: &TemplateVariables,
        parse_special: bool,
    ) -> Result<Vec<TokenId>, TextFailure> {
        let _ = (messages, tools, variables, parse_special);
        Err(
            "this model has no chat template to render 'tools' or 'chat_template_kwargs' with"
                .into(),
        )
    }

    /// The ids that end a response when generated.
    fn end_tokens(&self) -> Vec<TokenId>;

    /// Ids sampling must never choose (a count model's `<unk>`); none by
    /// default.
    fn banned_tokens(&self) -> Vec<TokenId> {
        Vec::new()
    }

    /// The text of one token, for `logprobs`.
    fn token_text(&self, id: TokenId) -> String {
        self.detokenizer().decode(&[id])
    }

    /// `format` compiled for this vocabulary, padded to the model's
    /// `vocab_size` (OpenAI's `response_format`). This may take seconds
    /// (the whole vocabulary goes into the engine's token trie), so the
    /// server calls it off its async threads and caches the result. By
    /// default there is no vocabulary to compile for.
    fn output_constraint(
        &self,
        format: &OutputFormat,
        vocab_size: usize,
    ) -> Result<OutputConstraint, OutputFormatError> {
        let _ = (format, vocab_size);
        Err(OutputFormatError::NoVocabulary)
    }
}

impl ServedText for GgufText {
    fn detokenizer(&self) -> &dyn Detokenize {
        &self.tokenizer
    }

    fn encode(&self, text: &str) -> Result<Vec<TokenId>, TextFailure> {
        Ok(self.tokenizer.encode(text)?)
    }

    fn chat_prompt(&self, messages: &[Message]) -> Result<String, TextFailure> {
        Ok(GgufText::chat_prompt(self, messages)?)
    }

    fn encode_chat(
        &self,
        messages: &[Message],
        parse_special: bool,
    ) -> Result<Vec<TokenId>, TextFailure> {
        Ok(GgufText::encode_chat(self, messages, parse_special)?)
    }

    fn chat_template_source(&self) -> Option<String> {
        self.tokenizer.chat_template().map(str::to_owned)
    }

    fn chat_reads_tools(&self) -> bool {
        self.chat_template().is_ok_and(|t| t.reads_tools())
    }

    fn encode_chat_with_variables(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        variables: &TemplateVariables,
        parse_special: bool,
    ) -> Result<Vec<TokenId>, TextFailure> {
        let parts = self
            .chat_template()?
            .with_variables(variables.clone())
            .render_parts_with_tools(messages, tools)?;
        Ok(self.encode_chat_parts(&parts, parse_special)?)
    }

    fn end_tokens(&self) -> Vec<TokenId> {
        self.end_ids.clone()
    }

    fn output_constraint(
        &self,
        format: &OutputFormat,
        vocab_size: usize,
    ) -> Result<OutputConstraint, OutputFormatError> {
        Ok(OutputConstraint::new(
            self.structured_output(format, vocab_size)?,
        ))
    }
}
