//! Structured output on llguidance: an [`OutputFormat`] (JSON Schema, any
//! JSON object, a regular expression, a Lark grammar, a GBNF grammar
//! (llama.cpp's, translated into Lark by [`crate::gbnf_to_lark`]), a choice
//! of strings)
//! compiled for a tokenizer's vocabulary into a [`StructuredOutput`], which
//! is lm-core's [`Constraint`] (lm-decode masks each step with it).
//!
//! The engine sees the vocabulary as bytes: lm-tokenize's
//! [`Tokenizer::token_bytes`] for both kinds (byte-level BPE and
//! SentencePiece), special tokens as llguidance's `0xFF`-marked names (a
//! Lark grammar can ask for one by name, `<|im_end|>`), so one token trie is
//! built the same way for every model. End tokens are the loop's: the
//! engine's masks leave them out, and lm-decode allows them once the output
//! is complete.
//!
//! This module puts a grammar engine and a file's tokenizer together,
//! which is the facade's job; lm-decode only sees the trait.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use lm_core::{Constraint, ConstraintState, TokenId, TokenMask};
use lm_tokenize::{TokenBytes, Tokenizer};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// The whitespace JSON output may put between two of its tokens: one space,
/// or one or two newlines and up to 20 spaces or tabs of indent, as
/// llama.cpp's JSON Schema grammars allow (their `space` rule). llguidance's
/// default allows any run, and a sampled model can fill it with newlines
/// until its token limit (SmolLM2 did, with a schema's optional field).
const JSON_WHITESPACE: &str = r"(?: |\n{1,2}[ \t]{0,20})";

/// `schema` with JSON output's whitespace between tokens bounded (one
/// space, or one or two newlines and up to 20 spaces or tabs, as llama.cpp's
/// JSON Schema grammars allow), unless it sets its own compile options
/// (llguidance's `x-guidance` key) or is not an object. [`OutputFormat::JsonSchema`] and
/// [`OutputFormat::JsonObject`] compile through it; a Lark grammar that
/// embeds a schema (`%json {...}`) can too.
///
/// ```
/// let schema = serde_json::json!({"type": "object"});
/// let bounded = lm::bounded_json_whitespace(&schema);
/// assert!(bounded["x-guidance"]["whitespace_pattern"].is_string());
/// let own = serde_json::json!({"x-guidance": {"whitespace_flexible": true}});
/// assert_eq!(lm::bounded_json_whitespace(&own), own);
/// ```
pub fn bounded_json_whitespace(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
    }
    schema
}

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// JSON that validates against this JSON Schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object (`--format json`; OpenAI's `json_object`).
    JsonObject,
    /// Text matching this regular expression whole (Rust `regex` syntax).
    Regex(String),
    /// Text of this Lark grammar (llguidance's dialect).
    Lark(String),
    /// Text of this GBNF grammar (llama.cpp's format, `root ::= ...`).
    Gbnf(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

impl OutputFormat {
    /// A grammar's text as the format it is written in: GBNF when its first
    /// rule is `name ::=` ([`crate::is_gbnf`]), else Lark. The server's
    /// `grammar` fields and the CLI's `--grammar` read grammars this way.
    ///
    /// ```
    /// use lm::OutputFormat;
    /// let gbnf = OutputFormat::from_grammar("root ::= \"a\"".into());
    /// assert_eq!(gbnf, OutputFormat::Gbnf("root ::= \"a\"".into()));
    /// let lark = OutputFormat::from_grammar("start: \"a\"".into());
    /// assert_eq!(lark, OutputFormat::Lark("start: \"a\"".into()));
    /// ```
    pub fn from_grammar(text: String) -> Self {
        if crate::is_gbnf(&text) {
            Self::Gbnf(text)
        } else {
            Self::Lark(text)
        }
    }

    /// The grammar llguidance compiles.
    fn grammar(&self) -> Result<TopLevelGrammar, FormatError> {
        Ok(match self {
            Self::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(bounded_json_whitespace(schema))
            }
            Self::JsonObject => TopLevelGrammar::from_json_schema(bounded_json_whitespace(
                &serde_json::json!({"type": "object"}),
            )),
            Self::Regex(pattern) => TopLevelGrammar::from_regex(pattern),
            Self::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
            Self::Gbnf(grammar) => TopLevelGrammar::from_lark(
                crate::gbnf_to_lark(grammar).map_err(FormatError::engine)?,
            ),
            Self::Choice(options) => {
                let alternatives: Vec<String> = options
                    .iter()
                    .map(|option| crate::gbnf::lark_string(option))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
        })
    }

    /// Checks the format with the engine alone, before any model is loaded
    /// (a front end refuses a bad schema early): it is compiled for a
    /// vocabulary of the 256 single bytes.
    ///
    /// ```
    /// use lm::OutputFormat;
    /// assert!(OutputFormat::Regex("[0-9]{3}".into()).check().is_ok());
    /// let error = OutputFormat::Regex("[0-9".into()).check().unwrap_err();
    /// assert!(error.to_string().starts_with("the output format was refused: "));
    /// ```
    pub fn check(&self) -> Result<(), FormatError> {
        let mut bytes: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
        bytes.push(TokenBytes::Special);
        let env = VocabularyEnv::new(&bytes, bytes.len(), &[256], |_| "<end>".into())?;
        StructuredOutput::with_env(self, env).map(|_| ())
    }
}

/// A format the engine refused, or a vocabulary it cannot use; the
/// engine's own message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the output format was refused: {message}")]
pub struct FormatError {
    /// llguidance's message.
    pub message: String,
}

impl FormatError {
    fn engine(error: impl std::fmt::Display) -> Self {
        Self {
            message: error.to_string(),
        }
    }
}

/// An [`OutputFormat`] compiled for one vocabulary: the [`Constraint`] a
/// [`lm_decode::GenerationConfig`] takes (wrapped in
/// [`lm_decode::OutputConstraint`]).
pub struct StructuredOutput {
    /// A matcher at the start of the output, cloned for each sequence.
    start: Matcher,
    vocab_size: usize,
    end_tokens: Vec<TokenId>,
}

impl std::fmt::Debug for StructuredOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StructuredOutput")
            .field("vocab_size", &self.vocab_size)
            .field("end_tokens", &self.end_tokens)
            .finish_non_exhaustive()
    }
}

impl StructuredOutput {
    /// Compiles `format` for `tokenizer`'s vocabulary, padded to the model's
    /// `vocab_size` (ids past the tokenizer's are never allowed);
    /// `end_tokens` (at least one) are the ids the loop ends on, which the
    /// engine's masks leave out.
    pub fn new(
        format: &OutputFormat,
        tokenizer: &Tokenizer,
        vocab_size: usize,
        end_tokens: &[TokenId],
    ) -> Result<Self, FormatError> {
        let bytes = tokenizer.token_bytes();
        let name = |id: TokenId| tokenizer.token_text(id).unwrap_or_default().to_owned();
        let env = VocabularyEnv::new(&bytes, vocab_size, end_tokens, name)?;
        Self::with_env(format, env)
    }

    fn with_env(format: &OutputFormat, env: VocabularyEnv) -> Result<Self, FormatError> {
        let vocab_size = env.trie.vocab_size();
        let end_tokens = env.trie.eos_tokens().to_vec();
        let env: TokEnv = Arc::new(env);
        let mut factory = ParserFactory::new_simple(&env).map_err(FormatError::engine)?;
        factory.quiet();
        let parser = factory
            .create_parser(format.grammar()?)
            .map_err(FormatError::engine)?;
        let start = Matcher::new(Ok(parser));
        if let Some(message) = start.get_error() {
            return Err(FormatError { message });
        }
        Ok(Self {
            start,
            vocab_size,
            end_tokens,
        })
    }
}

impl Constraint for StructuredOutput {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn start(&self) -> lm_core::Result<Box<dyn ConstraintState>> {
        Ok(Box::new(StructuredState {
            matcher: self.start.deep_clone(),
            end_tokens: self.end_tokens.clone(),
        }))
    }
}

/// One sequence's llguidance matcher.
struct StructuredState {
    matcher: Matcher,
    end_tokens: Vec<TokenId>,
}

impl StructuredState {
    /// A stopped matcher's error, if it stopped on one (else it completed).
    fn stop_error(&self) -> lm_core::Result<()> {
        self.matcher
            .get_error()
            .map_or(Ok(()), |e| Err(engine_error(e)))
    }
}

fn engine_error(error: impl std::fmt::Display) -> lm_core::Error {
    lm_core::Error::ConstraintEngine {
        message: error.to_string(),
    }
}

impl ConstraintState for StructuredState {
    fn fill_allowed(&mut self, mask: &mut TokenMask) -> lm_core::Result<()> {
        // A matcher stops once nothing can follow: it allows nothing more.
        if self.matcher.is_stopped() {
            mask.clear();
            return self.stop_error();
        }
        let allowed = self.matcher.compute_mask().map_err(engine_error)?;
        mask.copy_from_words(allowed.as_slice());
        for &id in &self.end_tokens {
            mask.forbid(id);
        }
        Ok(())
    }

    fn advance(&mut self, token: TokenId) -> lm_core::Result<()> {
        self.matcher.consume_token(token).map_err(|error| {
            match self.matcher.validate_tokens(&[token]) {
                Ok(0) => lm_core::Error::TokenNotAllowed { id: token },
                _ => engine_error(error),
            }
        })
    }

    fn is_accepting(&mut self) -> lm_core::Result<bool> {
        if self.matcher.is_stopped() {
            return self.stop_error().map(|()| true);
        }
        self.matcher.is_accepting().map_err(engine_error)
    }

    fn fork(&self) -> Box<dyn ConstraintState> {
        Box::new(StructuredState {
            matcher: self.matcher.deep_clone(),
            end_tokens: self.end_tokens.clone(),
        })
    }
}

/// The vocabulary as llguidance reads it: a trie of each token's bytes
/// (special tokens as `0xFF` followed by their name).
struct VocabularyEnv {
    trie: TokTrie,
}

impl VocabularyEnv {
    fn new(
        bytes: &[TokenBytes],
        vocab_size: usize,
        end_tokens: &[TokenId],
        name: impl Fn(TokenId) -> String,
    ) -> Result<Self, FormatError> {
        let n = u32::try_from(vocab_size)
            .map_err(|_| FormatError::engine(format!("a vocabulary of {vocab_size} tokens")))?;
        let Some(&eos) = end_tokens.first() else {
            return Err(FormatError::engine(
                "no end token to finish the output with",
            ));
        };
        if let Some(&id) = end_tokens.iter().find(|&&id| id >= n) {
            return Err(FormatError::engine(format!(
                "end token {id} is beyond the vocabulary of {vocab_size}"
            )));
        }
        let words: Vec<Vec<u8>> = (0..n)
            .map(|id| match bytes.get(id as usize) {
                Some(TokenBytes::Text(text)) => text.clone(),
                Some(TokenBytes::Special) => {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend_from_slice(name(id).as_bytes());
                    marked
                }
                _ => Vec::new(),
            })
            .collect();
        let trie = TokTrie::from(&TokRxInfo::new(n, eos), &words).with_eos_tokens(end_tokens);
        Ok(Self { trie })
    }
}

impl TokenizerEnv for VocabularyEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    impl OutputFormat {
        /// Whether the engine takes `text` whole: compiled for the 256
        /// single bytes (as [`OutputFormat::check`]), each byte must be
        /// allowed by the mask before it is consumed, and the end must be
        /// accepting.
        pub(crate) fn accepts(&self, text: &str) -> Result<bool, FormatError> {
            let mut bytes: Vec<TokenBytes> =
                (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
            bytes.push(TokenBytes::Special);
            let env = VocabularyEnv::new(&bytes, bytes.len(), &[256], |_| "<end>".into())?;
            let output = StructuredOutput::with_env(self, env)?;
            let mut state = output.start().map_err(FormatError::engine)?;
            let mut mask = TokenMask::new(output.vocab_size());
            for &byte in text.as_bytes() {
                state.fill_allowed(&mut mask).map_err(FormatError::engine)?;
                if !mask.is_allowed(TokenId::from(byte)) {
                    return Ok(false);
                }
                state
                    .advance(TokenId::from(byte))
                    .map_err(FormatError::engine)?;
            }
            state.is_accepting().map_err(FormatError::engine)
        }
    }

    #[test]
    fn json_whitespace_is_bounded_as_llama_cpp_bounds_it() {
        let schema = OutputFormat::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {"admin": {"type": "boolean"}},
            "required": ["admin"],
        }));
        for format in [&schema, &OutputFormat::JsonObject] {
            for text in [
                r#"{"admin":false}"#,
                r#"{ "admin": false }"#,
                "{\n  \"admin\": false\n}",
                "{\n\n\t\"admin\" :\n false\n}",
                &format!("{{\n{}\"admin\": false}}", " ".repeat(20)),
            ] {
                assert_eq!(format.accepts(text), Ok(true), "{text:?}");
            }
            for text in [
                "{\n\n\n\"admin\": false}",
                &format!("{{\n{}\"admin\": false}}", " ".repeat(21)),
                "{\"admin\": false  }",
                "{\"admin\": false}\n\n\n\n",
            ] {
                assert_eq!(format.accepts(text), Ok(false), "{text:?}");
            }
        }
        // A schema's own compile options win.
        let own = OutputFormat::JsonSchema(serde_json::json!({
            "type": "object",
            "x-guidance": {"whitespace_flexible": true},
        }));
        assert_eq!(own.accepts("{\n\n\n\n}"), Ok(true));
    }
}
