//! The vocabulary of an n-gram model: word <-> id, with KenLM's three markers.
//!
//! `<unk>` stands for every word the model has not seen, `<s>` is the context
//! a sentence starts from (never predicted), `</s>` ends a sentence. A model
//! trained here numbers them 0, 1, 2 and the corpus words from 3 on in order
//! of first appearance; a model read from an ARPA file numbers its words in
//! the order of the file's unigram section, so always ask
//! [`Vocab::unk`], [`Vocab::bos`] and [`Vocab::eos`] instead of assuming ids.

use std::collections::HashMap;

use lm_core::{Detokenize, TokenId};

use super::error::NgramError;

/// The unknown-word marker.
pub const UNK: &str = "<unk>";
/// The begin-of-sentence marker.
pub const BOS: &str = "<s>";
/// The end-of-sentence marker.
pub const EOS: &str = "</s>";

/// Word <-> id mapping of an n-gram model.
#[derive(Debug, Clone)]
pub struct Vocab {
    words: Vec<String>,
    ids: HashMap<String, TokenId>,
    unk: TokenId,
    bos: TokenId,
    eos: TokenId,
}

impl Default for Vocab {
    fn default() -> Self {
        Self::new()
    }
}

impl Vocab {
    /// A vocabulary with only the markers: `<unk>` = 0, `<s>` = 1, `</s>` = 2.
    pub fn new() -> Self {
        let words: Vec<String> = [UNK, BOS, EOS].map(String::from).into();
        let ids = words
            .iter()
            .zip(0..)
            .map(|(w, id)| (w.clone(), id))
            .collect();
        Self {
            words,
            ids,
            unk: 0,
            bos: 1,
            eos: 2,
        }
    }

    /// A vocabulary from words in id order. `<unk>` is appended when absent
    /// (as KenLM does for ARPA files without it); `<s>` and `</s>` must be
    /// present. Returns the vocabulary and whether `<unk>` was appended.
    pub(crate) fn from_words(words: Vec<String>) -> Result<(Self, bool), NgramError> {
        let mut words = words;
        let mut ids = HashMap::with_capacity(words.len() + 1);
        for (id, word) in (0..).zip(&words) {
            ids.insert(word.clone(), id);
        }
        let mut unk_added = false;
        if !ids.contains_key(UNK) {
            let id = id_of_len(words.len())?;
            ids.insert(UNK.to_owned(), id);
            words.push(UNK.to_owned());
            unk_added = true;
        }
        let bos = *ids
            .get(BOS)
            .ok_or(NgramError::MissingSpecial { word: BOS })?;
        let eos = *ids
            .get(EOS)
            .ok_or(NgramError::MissingSpecial { word: EOS })?;
        let unk = ids.get(UNK).copied().unwrap_or_default();
        let vocab = Self {
            words,
            ids,
            unk,
            bos,
            eos,
        };
        Ok((vocab, unk_added))
    }

    /// The id of `word`, if the model knows it.
    pub fn id(&self, word: &str) -> Option<TokenId> {
        self.ids.get(word).copied()
    }

    /// The id of `word`, or `<unk>`'s id for a word the model does not know.
    pub fn id_or_unk(&self, word: &str) -> TokenId {
        self.id(word).unwrap_or(self.unk)
    }

    /// The word with id `id`, or `None` beyond the vocabulary.
    pub fn word(&self, id: TokenId) -> Option<&str> {
        self.words.get(id as usize).map(String::as_str)
    }

    /// Every word, in id order.
    pub fn words(&self) -> impl ExactSizeIterator<Item = &str> {
        self.words.iter().map(String::as_str)
    }

    /// Number of words, markers included.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether the vocabulary is empty (never true: the markers are always in).
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Id of `<unk>`.
    pub fn unk(&self) -> TokenId {
        self.unk
    }

    /// Id of `<s>`.
    pub fn bos(&self) -> TokenId {
        self.bos
    }

    /// Id of `</s>`.
    pub fn eos(&self) -> TokenId {
        self.eos
    }

    /// Whether `id` is one of the three markers.
    pub fn is_marker(&self, id: TokenId) -> bool {
        id == self.unk || id == self.bos || id == self.eos
    }

    /// The id of `word`, adding it when new.
    pub(crate) fn insert(&mut self, word: &str) -> Result<TokenId, NgramError> {
        if let Some(&id) = self.ids.get(word) {
            return Ok(id);
        }
        let id = id_of_len(self.words.len())?;
        self.words.push(word.to_owned());
        self.ids.insert(word.to_owned(), id);
        Ok(id)
    }
}

fn id_of_len(len: usize) -> Result<TokenId, NgramError> {
    TokenId::try_from(len)
        .ok()
        .filter(|&id| id < TokenId::MAX)
        .ok_or(NgramError::TooManyNgrams { order: 1 })
}

/// Joins words into text: one space between words, none before closing
/// punctuation (`, . ; : ! ? ) ] } '` and `%`) and none after opening brackets
/// (`( [ {`). `<s>` is dropped, `</s>` becomes a line break (a sentence is a
/// line of the corpus), and `<unk>` stays visible. Ids beyond the vocabulary
/// are skipped.
///
/// ```
/// use lm_core::Detokenize;
/// let model = lm_model::ngram::embedded_default().unwrap();
/// let vocab = model.vocab();
/// let ids: Vec<_> = ["And", "God", "said", ",", "Let", "there", "be", "light", ":", "zyzzyva", "</s>"]
///     .iter()
///     .map(|w| vocab.id_or_unk(w))
///     .collect();
/// assert_eq!(vocab.decode(&ids), "And God said, Let there be light: <unk>\n");
/// ```
impl Detokenize for Vocab {
    fn decode(&self, ids: &[TokenId]) -> String {
        let mut text = String::new();
        let mut glue_next = true;
        for &id in ids {
            if id == self.bos {
                continue;
            }
            if id == self.eos {
                text.push('\n');
                glue_next = true;
                continue;
            }
            let Some(word) = self.word(id) else {
                continue;
            };
            if !glue_next && !attaches_left(word) {
                text.push(' ');
            }
            text.push_str(word);
            glue_next = attaches_right(word);
        }
        text
    }
}

/// Whether `word` is written without a space before it.
fn attaches_left(word: &str) -> bool {
    !word.is_empty() && word.chars().all(|c| ",.;:!?)]}'%".contains(c))
}

/// Whether the word after `word` is written without a space before it.
fn attaches_right(word: &str) -> bool {
    !word.is_empty() && word.chars().all(|c| "([{".contains(c))
}
