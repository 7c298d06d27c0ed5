//! The `--draft` drafters: each spec loaded once per invocation
//! ([`DraftSource`]) and turned into an lm-decode [`Drafter`] per sequence.
//!
//! - `prompt-lookup`: lm-decode's [`PromptLookup`].
//! - A decoder (`FILE.gguf`, a known model, `toy`): lm-decode's
//!   [`ModelDrafter`], which proposes token ids directly, so its vocabulary
//!   must be the model's, token for token (checked when it is loaded).
//! - A count model (`count:FILE`): its vocabulary is words, so
//!   [`CountDrafter`] goes through the text:
//!
//! ```text
//! context ids ──decode the last TAIL_TOKENS──> "... and God said"
//!   ──split into words──> [and, God, said] ──count model, greedy──> [Let, there, be]
//!   ──the words' text after the context's──> " Let there be"
//!   ──encode tail + continuation, keep what follows the tail's own tokens──> draft ids
//! ```

use anyhow::Result;
use lm_core::{Detokenize, LanguageModel, Rows, TokenId};
use lm_decode::{Draft, DraftLength, Drafter, ModelDrafter, PromptLookup};
use lm_model::Decoder;
use lm_model::ngram::{NgramModel, split_words};

use crate::cli::DrafterArg;
use crate::spec::{Backend, LoadOptions};
use crate::text::TextCodec;

/// Tokens at the end of the context a count drafter reads as text: enough
/// words for any n-gram order in practice, few enough to tokenize quickly.
const TAIL_TOKENS: usize = 32;

/// A draft model that cannot draft for this model.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    /// A decoder drafter whose vocabulary differs from the model's.
    #[error(
        "--draft {draft}: its vocabulary differs from the model's ({reason}); a draft model must share the model's tokenizer (a count:FILE drafter is mapped through the text instead)"
    )]
    VocabularyMismatch {
        /// The `--draft` spec.
        draft: String,
        /// The first difference found.
        reason: String,
    },
}

/// What `--draft` names, loaded.
#[derive(Debug)]
pub enum DraftSource {
    /// Prompt lookup, which needs no model.
    PromptLookup,
    /// A decoder over the model's vocabulary.
    Decoder(Box<Decoder>),
    /// A count model, mapped through the text.
    Count(NgramModel),
}

impl DraftSource {
    /// Loads the drafter `arg` names for a model of `vocab_size` tokens read
    /// and written by `target`.
    pub fn load(arg: &DrafterArg, target: &TextCodec, vocab_size: usize) -> Result<DraftSource> {
        let DrafterArg::Model(spec) = arg else {
            return Ok(DraftSource::PromptLookup);
        };
        let loaded = spec.load(LoadOptions::default())?;
        Ok(match loaded.backend {
            Backend::Count(model) => DraftSource::Count(model),
            Backend::Toy(decoder) | Backend::Llama(decoder) => {
                let draft_size = decoder.vocab_size();
                let reason = if draft_size != vocab_size {
                    Some(format!("{draft_size} tokens against {vocab_size}"))
                } else {
                    vocabulary_difference(&loaded.codec, target, vocab_size)
                };
                if let Some(reason) = reason {
                    return Err(DraftError::VocabularyMismatch {
                        draft: arg.to_string(),
                        reason,
                    }
                    .into());
                }
                DraftSource::Decoder(decoder)
            }
        })
    }

    /// A fresh drafter of up to `max_draft` tokens per pass, writing the
    /// model's ids (`target` maps a count model's words to them).
    pub fn drafter<'a>(&'a self, max_draft: usize, target: &'a TextCodec) -> Box<dyn Drafter + 'a> {
        match self {
            Self::PromptLookup => Box::new(PromptLookup::new(max_draft)),
            Self::Decoder(decoder) => Box::new(ModelDrafter::new(&**decoder, max_draft)),
            Self::Count(model) => Box::new(CountDrafter::new(model, target, max_draft)),
        }
    }
}

/// The first token whose text differs between two codecs of `vocab_size`
/// tokens, or a difference of kind; `None` when they are the same.
fn vocabulary_difference(
    draft: &TextCodec,
    target: &TextCodec,
    vocab_size: usize,
) -> Option<String> {
    match (draft, target) {
        (TextCodec::Toy, TextCodec::Toy) => None,
        (TextCodec::Bpe(draft), TextCodec::Bpe(target)) => (0..vocab_size).find_map(|id| {
            let id = TokenId::try_from(id).ok()?;
            let (ours, theirs) = (
                draft.tokenizer.token_text(id),
                target.tokenizer.token_text(id),
            );
            (ours != theirs).then(|| format!("token {id} is {ours:?} against {theirs:?}"))
        }),
        (draft, target) => Some(format!(
            "a {} vocabulary against a {} one",
            draft.kind(),
            target.kind()
        )),
    }
}

/// A count model as a drafter for a model with another vocabulary: the
/// context's last [`TAIL_TOKENS`] tokens as words, the count model's greedy
/// continuation of them (never `<unk>`, `<s>` or `</s>`), and that text
/// tokenized by the model's tokenizer (see the module docs). A proposal the
/// tokenizer would merge into the context's last token is dropped (nothing
/// is proposed that round). How many it proposes adapts ([`DraftLength`]).
pub struct CountDrafter<'a> {
    model: &'a NgramModel,
    target: &'a TextCodec,
    length: DraftLength,
    logits: Vec<f32>,
}

impl std::fmt::Debug for CountDrafter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountDrafter")
            .field("length", &self.length)
            .finish_non_exhaustive()
    }
}

impl<'a> CountDrafter<'a> {
    /// Drafts up to `max_draft` of `target`'s tokens with `model`.
    pub fn new(model: &'a NgramModel, target: &'a TextCodec, max_draft: usize) -> Self {
        Self {
            model,
            target,
            length: DraftLength::new(max_draft),
            logits: Vec::new(),
        }
    }

    /// The count model's greedy continuation of `words`, `n_words` long
    /// (shorter if it can only end the sentence), appended to `words`.
    fn continue_words(&mut self, words: &mut Vec<TokenId>, n_words: usize) -> lm_core::Result<()> {
        let vocab = self.model.vocab();
        let mut state = self.model.new_state();
        self.model
            .forward(&mut state, words, Rows::Last, &mut self.logits)?;
        for index in 0..n_words {
            for marker in [vocab.unk(), vocab.bos(), vocab.eos()] {
                if let Some(logit) = self.logits.get_mut(marker as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
            let word = lm_core::argmax(&self.logits)?;
            if self.logits[word as usize] == f32::NEG_INFINITY {
                break;
            }
            words.push(word);
            if index + 1 < n_words {
                self.model
                    .forward(&mut state, &[word], Rows::Last, &mut self.logits)?;
            }
        }
        Ok(())
    }

    /// The model's ids of the count model's continuation of `context`, at
    /// most `n` of them.
    fn draft_ids(&mut self, context: &[TokenId], n: usize) -> lm_core::Result<Vec<TokenId>> {
        let tail = &context[context.len().saturating_sub(TAIL_TOKENS)..];
        let tail_text = self.target.decode_ids(tail);
        let vocab = self.model.vocab();
        let mut words: Vec<TokenId> = split_words(&tail_text)
            .map(|word| vocab.id_or_unk(word))
            .collect();
        if words.is_empty() {
            words.push(vocab.bos());
        }
        let n_context = words.len();
        // Every word is at least one of the model's tokens.
        self.continue_words(&mut words, n)?;
        let vocab = self.model.vocab();
        let context_text = vocab.decode(&words[..n_context]);
        let Some(continuation) = vocab
            .decode(&words)
            .strip_prefix(&context_text)
            .map(str::to_owned)
        else {
            return Ok(Vec::new());
        };
        let encode = |text: &str| self.target.encode_literal(text).ok();
        let (Some(base), Some(mut ids)) = (
            encode(&tail_text),
            encode(&(tail_text.clone() + &continuation)),
        ) else {
            return Ok(Vec::new());
        };
        if !ids.starts_with(&base) {
            return Ok(Vec::new());
        }
        ids.drain(..base.len());
        ids.truncate(n);
        Ok(ids)
    }
}

impl Drafter for CountDrafter<'_> {
    fn propose(
        &mut self,
        context: &[TokenId],
        max_tokens: usize,
        draft: &mut Draft,
    ) -> lm_decode::Result<()> {
        let n = self.length.next_length().min(max_tokens);
        if n == 0 || context.is_empty() {
            return Ok(());
        }
        for token in self.draft_ids(context, n)? {
            draft.push(token);
        }
        Ok(())
    }

    fn observe(&mut self, n_proposed: usize, n_accepted: usize) {
        self.length.observe(n_proposed, n_accepted);
    }
}
