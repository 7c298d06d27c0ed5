//! Compiled `response_format`s, kept for the next request that asks for
//! the same one, and bounded. Compiling puts the whole vocabulary into the
//! engine's token trie: a fraction of a second and a few MB on SmolLM2's
//! 49,152 tokens, over a second and about 100 MB on Gemma 3's 262,144. So
//! compiling runs on a blocking thread, never on the threads that answer
//! HTTP; the few most recently used distinct formats are kept; and the
//! compiled formats alive at once (kept, used by running requests, or
//! compiling) are at most `max_formats` (`--max-formats`): a request that
//! needs one more when none can be freed gets a 429 with `Retry-After`.
//! A format is counted until the cache and the last request using it let
//! go of it, so what finished requests held is freed with them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use lm::OutputFormat;
use lm_core::{Constraint, ConstraintState};
use lm_decode::OutputConstraint;

use crate::error::ApiError;
use crate::text::{OutputFormatError, ServedText};

/// How many distinct compiled formats are kept (fewer when `max_formats`
/// is smaller).
const KEPT_FORMATS: usize = 4;

/// Seconds a client refused for want of a format slot should wait.
const RETRY_AFTER_SECONDS: u64 = 1;

/// The compiled formats, most recently used first, and the count of those
/// alive.
pub(crate) struct FormatCache {
    entries: Mutex<VecDeque<(OutputFormat, Arc<Counted>)>>,
    /// Compiled formats alive now: kept, in use by requests, or compiling.
    held: Arc<AtomicUsize>,
    /// The most that may be alive at once.
    max_held: usize,
}

/// One compiled format's place in the count, given back when dropped: with
/// the last clone of its constraint (the cache's and every request's), or
/// when compiling fails.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A compiled format carrying its [`Slot`].
#[derive(Debug)]
struct Counted {
    constraint: OutputConstraint,
    _slot: Slot,
}

impl Constraint for Counted {
    fn vocab_size(&self) -> usize {
        self.constraint.get().vocab_size()
    }

    fn start(&self) -> lm_core::Result<Box<dyn ConstraintState>> {
        self.constraint.get().start()
    }
}

/// The constraint requests use: clones of one `Arc`, so the cache can see
/// whether any request still holds it.
fn shared(counted: Arc<Counted>) -> OutputConstraint {
    OutputConstraint::from(counted as Arc<dyn Constraint>)
}

impl FormatCache {
    /// A cache that lets at most `max_held` compiled formats be alive.
    pub(crate) fn new(max_held: usize) -> Self {
        Self {
            entries: Mutex::new(VecDeque::new()),
            held: Arc::new(AtomicUsize::new(0)),
            max_held,
        }
    }

    /// The constraint for `format` over `text`'s vocabulary: the kept one,
    /// or a new one compiled (and kept). A format the engine refuses, or a
    /// model without a vocabulary, is a 400 naming `response_format`; no
    /// room for one more compiled format is a 429.
    #[cfg(test)]
    pub(crate) async fn constraint(
        &self,
        text: &Arc<dyn ServedText>,
        format: &OutputFormat,
        vocab_size: usize,
    ) -> Result<OutputConstraint, ApiError> {
        self.constraint_for(text, format, vocab_size, "response_format")
            .await
    }

    /// [`FormatCache::constraint`] for a format given by the request field
    /// `param` (`response_format`, `guided_regex`, `tools`...), which its
    /// errors name.
    pub(crate) async fn constraint_for(
        &self,
        text: &Arc<dyn ServedText>,
        format: &OutputFormat,
        vocab_size: usize,
        param: &str,
    ) -> Result<OutputConstraint, ApiError> {
        if let Some(constraint) = self.take_kept(format) {
            return Ok(constraint);
        }
        let slot = self.acquire().ok_or_else(|| {
            let mut error = ApiError::status(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "'{param}': {} distinct output formats are compiled and in use, \
                     the most this server holds (--max-formats); retry when a request finishes",
                    self.max_held
                ),
            )
            .retry_after(RETRY_AFTER_SECONDS);
            error.param = Some(param.to_owned());
            error
        })?;
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
        let compiled = compiled.map_err(|error| {
            let message = match &error {
                OutputFormatError::Refused(refused) => format!("'{param}': {refused}"),
                _ => format!("'{param}' cannot be used: {error}"),
            };
            ApiError::invalid(param, message)
        })?;
        let counted = Arc::new(Counted {
            constraint: compiled,
            _slot: slot,
        });
        self.keep(format, &counted);
        Ok(shared(counted))
    }

    /// A place in the count for one more compiled format: when all are
    /// taken, the least recently used kept format that no request uses is
    /// let go of; when every kept one is in use, there is none.
    fn acquire(&self) -> Option<Slot> {
        loop {
            let held = self.held.load(Ordering::SeqCst);
            if held < self.max_held {
                if self
                    .held
                    .compare_exchange(held, held + 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return Some(Slot(Arc::clone(&self.held)));
                }
                continue;
            }
            let evicted = {
                let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
                // Only the cache holds it: no request uses it.
                let idle = entries
                    .iter()
                    .rposition(|(_, counted)| Arc::strong_count(counted) == 1)?;
                entries.remove(idle)
            };
            // Dropped outside the lock, which frees its slot.
            drop(evicted);
        }
    }

    /// The kept constraint for `format`, moved to the front.
    fn take_kept(&self, format: &OutputFormat) -> Option<OutputConstraint> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let idx = entries.iter().position(|(kept, _)| kept == format)?;
        let entry = entries.remove(idx)?;
        let counted = Arc::clone(&entry.1);
        entries.push_front(entry);
        Some(shared(counted))
    }

    fn keep(&self, format: &OutputFormat, counted: &Arc<Counted>) {
        let dropped: Vec<_> = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if entries.iter().any(|(kept, _)| kept == format) {
                return;
            }
            entries.push_front((format.clone(), Arc::clone(counted)));
            let kept = KEPT_FORMATS.min(self.max_held);
            let kept = kept.min(entries.len());
            entries.drain(kept..).collect()
        };
        drop(dropped);
    }

    /// How many compiled formats are alive (kept, in use or compiling).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
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
        let cache = FormatCache::new(8);
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
        let cache = FormatCache::new(8);
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

    /// Regression (issue 33): 32 distinct schemas at once were all compiled
    /// (3.5 GB on Gemma 3) and 1.28 GB stayed held. Now at most `max_held`
    /// are alive: kept ones are let go of to make room, the one beyond is a
    /// 429, and what requests held is freed when they end.
    #[tokio::test]
    async fn compiled_formats_alive_at_once_are_bounded_and_freed() {
        let text: Arc<dyn ServedText> = Arc::new(Counting::default());
        let cache = FormatCache::new(3);
        let schema = |n: u64| OutputFormat::JsonSchema(serde_json::json!({"maximum": n}));
        // Three requests in flight, each holding its format.
        let mut in_use = Vec::new();
        for n in 0..3 {
            in_use.push(cache.constraint(&text, &schema(n), 4).await.unwrap());
        }
        assert_eq!((cache.held(), cache.len()), (3, 3));
        // A fourth distinct one: every kept one is in use, so none frees.
        let error = cache.constraint(&text, &schema(3), 4).await.unwrap_err();
        assert_eq!(error.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(error.retry_after, Some(RETRY_AFTER_SECONDS));
        assert_eq!(error.param.as_deref(), Some("response_format"));
        assert_eq!((cache.held(), cache.len()), (3, 3), "kept while in use");
        // A kept one is still served while the others run.
        assert_eq!(
            cache.constraint(&text, &schema(2), 4).await.unwrap(),
            in_use[2]
        );
        // The requests end: the cache keeps them, and lets go of the idle
        // ones to make room for new formats.
        drop(in_use);
        for n in 10..13 {
            let constraint = cache.constraint(&text, &schema(n), 4).await.unwrap();
            drop(constraint);
        }
        assert_eq!((cache.held(), cache.len()), (3, 3));
        let held = Arc::clone(&cache.held);
        drop(cache);
        assert_eq!(held.load(Ordering::SeqCst), 0, "nothing else held them");
    }

    #[tokio::test]
    async fn a_refused_format_gives_its_slot_back() {
        let text: Arc<dyn ServedText> = Arc::new(Counting::default());
        let cache = FormatCache::new(1);
        for _ in 0..3 {
            let error = cache
                .constraint(&text, &OutputFormat::Regex("[".into()), 4)
                .await
                .unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
        }
        assert_eq!(cache.held(), 0);
    }
}
