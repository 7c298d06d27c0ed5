//! Compiled `response_format`s, kept for the next request that asks for
//! the same one. Compiling puts the whole vocabulary into the engine's
//! token trie: a fraction of a second on SmolLM2's 49,152 tokens, over a
//! second (and about 100 MB) on Gemma 3's 262,144. So the few most recently
//! used distinct formats are kept, and compiling runs on a blocking thread,
//! never on the threads that answer HTTP.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use lm::OutputFormat;
use lm_decode::OutputConstraint;

use crate::error::ApiError;
use crate::text::{OutputFormatError, ServedText};

/// How many distinct compiled formats are kept.
const KEPT_FORMATS: usize = 4;

/// The compiled formats, most recently used first.
#[derive(Default)]
pub(crate) struct FormatCache {
    entries: Mutex<VecDeque<(OutputFormat, OutputConstraint)>>,
}

impl FormatCache {
    /// The constraint for `format` over `text`'s vocabulary: the kept one,
    /// or a new one compiled (and kept). A format the engine refuses, or a
    /// model without a vocabulary, is a 400 naming `response_format`.
    pub(crate) async fn constraint(
        &self,
        text: &Arc<dyn ServedText>,
        format: &OutputFormat,
        vocab_size: usize,
    ) -> Result<OutputConstraint, ApiError> {
        if let Some(constraint) = self.take_kept(format) {
            return Ok(constraint);
        }
        let (text, owned) = (Arc::clone(text), format.clone());
        let compiled =
            tokio::task::spawn_blocking(move || text.output_constraint(&owned, vocab_size))
                .await
                .map_err(|_| {
                    ApiError::status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "compiling the response format failed",
                    )
                })?;
        let constraint = compiled.map_err(|error| {
            let message = match &error {
                OutputFormatError::Refused(refused) => format!("'response_format': {refused}"),
                _ => format!("'response_format' cannot be used: {error}"),
            };
            ApiError::invalid("response_format", message)
        })?;
        self.keep(format, &constraint);
        Ok(constraint)
    }

    /// The kept constraint for `format`, moved to the front.
    fn take_kept(&self, format: &OutputFormat) -> Option<OutputConstraint> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let idx = entries.iter().position(|(kept, _)| kept == format)?;
        let entry = entries.remove(idx)?;
        let constraint = entry.1.clone();
        entries.push_front(entry);
        Some(constraint)
    }

    fn keep(&self, format: &OutputFormat, constraint: &OutputConstraint) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.iter().any(|(kept, _)| kept == format) {
            return;
        }
        entries.push_front((format.clone(), constraint.clone()));
        entries.truncate(KEPT_FORMATS);
    }

    /// How many formats are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lm_core::{Detokenize, SequenceChoice, TokenId};
    use lm_tokenize::Message;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A text side whose "engine" counts its compiles and refuses a regex.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Detokenize for Counting {
        fn decode(&self, ids: &[TokenId]) -> String {
            format!("{ids:?}")
        }
    }

    impl ServedText for Counting {
        fn detokenizer(&self) -> &dyn Detokenize {
            self
        }
        fn encode(&self, _: &str) -> Result<Vec<TokenId>, crate::TextFailure> {
            Ok(vec![0])
        }
        fn chat_prompt(&self, _: &[Message]) -> Result<String, crate::TextFailure> {
            Ok(String::new())
        }
        fn end_tokens(&self) -> Vec<TokenId> {
            vec![0]
        }
        fn output_constraint(
            &self,
            format: &OutputFormat,
            vocab_size: usize,
        ) -> Result<OutputConstraint, OutputFormatError> {
            if let OutputFormat::Regex(pattern) = format {
                return Err(lm::FormatError {
                    message: format!("bad pattern {pattern}"),
                }
                .into());
            }
            self.0.fetch_add(1, Ordering::Relaxed);
            let choice = SequenceChoice::new(vocab_size, vec![vec![1]]).unwrap();
            Ok(OutputConstraint::new(choice))
        }
    }

    #[tokio::test]
    async fn a_format_is_compiled_once_and_few_are_kept() {
        let counting = Arc::new(Counting::default());
        let text: Arc<dyn ServedText> = Arc::clone(&counting) as Arc<dyn ServedText>;
        let cache = FormatCache::default();
        let schema = |n: u64| OutputFormat::JsonSchema(serde_json::json!({"maximum": n}));
        let first = cache.constraint(&text, &schema(0), 4).await.unwrap();
        let again = cache.constraint(&text, &schema(0), 4).await.unwrap();
        assert_eq!(first, again, "the kept constraint, not a new one");
        assert_eq!(counting.0.load(Ordering::Relaxed), 1);
        for n in 1..=KEPT_FORMATS as u64 {
            cache.constraint(&text, &schema(n), 4).await.unwrap();
        }
        assert_eq!(cache.len(), KEPT_FORMATS);
        // schema(0) was the least recently used: dropped, compiled again.
        cache.constraint(&text, &schema(0), 4).await.unwrap();
        assert_eq!(counting.0.load(Ordering::Relaxed), KEPT_FORMATS + 2);
        // The most recent one stays.
        cache.constraint(&text, &schema(0), 4).await.unwrap();
        assert_eq!(counting.0.load(Ordering::Relaxed), KEPT_FORMATS + 2);
    }

    #[tokio::test]
    async fn a_refusal_is_a_400_quoting_the_engine() {
        let text: Arc<dyn ServedText> = Arc::new(Counting::default());
        let cache = FormatCache::default();
        let error = cache
            .constraint(&text, &OutputFormat::Regex("[".into()), 4)
            .await
            .unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert_eq!(error.param.as_deref(), Some("response_format"));
        assert_eq!(
            error.message,
            "'response_format': the output format was refused: bad pattern ["
        );
        assert_eq!(cache.len(), 0);
    }
}
