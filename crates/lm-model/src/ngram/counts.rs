//! Training counts: how often each n-gram of order 1..=n occurs, in tables
//! keyed by (context index, word id), so memory grows with the number of
//! distinct n-grams and never with the corpus.
//!
//! Each sentence is read as `<s> w1 .. wk </s>` (one `<s>`, as KenLM's
//! `lmplz` counts real n-grams: its extra `<s>` padding only makes pseudo
//! n-grams it throws away). Every n-gram also records the index of its
//! suffix (the n-gram without its first word), which Kneser-Ney needs for
//! continuation counts and interpolation:
//!
//! ```text
//!   level 3  "the cat sat"  context -> "the cat" (level 2), suffix -> "cat sat" (level 2)
//!   level 2  "cat sat"      context -> "cat"     (level 1), suffix -> "sat"     (level 1)
//!   level 1  "sat"          index = word id
//! ```

use std::io::BufRead;

use lm_core::TokenId;

use super::error::NgramError;
use super::key::{KeyMap, pack};
use super::split::{Utf8Policy, for_each_line, split_words};
use super::vocab::Vocab;

/// The largest n-gram order supported.
pub const MAX_ORDER: usize = 10;

/// Counts of every n-gram of order 1..=n seen in a corpus.
#[derive(Debug, Clone)]
pub struct NgramCounts {
    vocab: Vocab,
    /// `levels[m - 1]` holds the m-grams; level 0 is indexed by word id.
    levels: Vec<CountLevel>,
    n_sentences: u64,
    n_words: u64,
    n_markers_skipped: u64,
    /// Ids of the sentence being counted (reused).
    sentence: Vec<TokenId>,
    /// Indices of the n-grams ending at the previous and current word (reused).
    ending_before: Vec<u32>,
    ending_here: Vec<u32>,
}

/// The n-grams of one order.
#[derive(Debug, Clone, Default)]
pub(crate) struct CountLevel {
    /// Index of the context in the level below (unused for unigrams).
    pub(crate) context: Vec<u32>,
    /// Last word.
    pub(crate) word: Vec<TokenId>,
    /// Index of the suffix in the level below (unused for unigrams).
    pub(crate) suffix: Vec<u32>,
    /// Occurrences.
    pub(crate) count: Vec<u64>,
    index: KeyMap<u32>,
}

impl CountLevel {
    pub(crate) fn len(&self) -> usize {
        self.count.len()
    }
}

impl NgramCounts {
    /// Empty counts for n-grams up to `order`.
    pub fn new(order: usize) -> Result<Self, NgramError> {
        if !(1..=MAX_ORDER).contains(&order) {
            return Err(NgramError::InvalidOrder {
                order,
                max: MAX_ORDER,
            });
        }
        let vocab = Vocab::new();
        let mut levels = vec![CountLevel::default(); order];
        let unigrams = &mut levels[0];
        for id in 0..vocab.len() as TokenId {
            unigrams.word.push(id);
            unigrams.count.push(0);
        }
        Ok(Self {
            vocab,
            levels,
            n_sentences: 0,
            n_words: 0,
            n_markers_skipped: 0,
            sentence: Vec::new(),
            ending_before: vec![0; order],
            ending_here: vec![0; order],
        })
    }

    /// Counts one sentence given as words (the caller's tokens). The markers
    /// `<s>`, `</s>` and `<unk>` inside a sentence are skipped, as `lmplz`
    /// treats them as white space; a sentence with no word is skipped too.
    pub fn add_sentence<'a>(
        &mut self,
        words: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), NgramError> {
        self.sentence.clear();
        self.sentence.push(self.vocab.bos());
        for word in words {
            let id = self.vocab.insert(word)?;
            if self.vocab.is_marker(id) {
                self.n_markers_skipped += 1;
                continue;
            }
            self.sentence.push(id);
        }
        if self.sentence.len() == 1 {
            return Ok(());
        }
        self.sentence.push(self.vocab.eos());
        self.count_sentence()
    }

    /// Counts a corpus: each line is a sentence, split by [`split_words`].
    /// Calls `on_progress` with the bytes read so far about every MiB.
    /// Returns the bytes read.
    pub fn add_text<R: BufRead>(
        &mut self,
        reader: R,
        policy: Utf8Policy,
        on_progress: impl FnMut(u64),
    ) -> Result<u64, NgramError> {
        for_each_line(reader, policy, on_progress, |line| {
            self.add_sentence(split_words(line))
        })
    }

    fn count_sentence(&mut self) -> Result<(), NgramError> {
        let unigrams = &mut self.levels[0];
        while unigrams.count.len() < self.vocab.len() {
            unigrams.word.push(unigrams.count.len() as TokenId);
            unigrams.count.push(0);
        }
        for (position, &word) in self.sentence.iter().enumerate() {
            self.ending_here[0] = word;
            if let Some(count) = self.levels[0].count.get_mut(word as usize) {
                *count += 1;
            }
            let longest = self.levels.len().min(position + 1);
            for m in 2..=longest {
                let context = self.ending_before[m - 2];
                let suffix = self.ending_here[m - 2];
                let level = &mut self.levels[m - 1];
                let idx = match level.index.get(&pack(context, word)) {
                    Some(&idx) => idx,
                    None => {
                        let idx = u32::try_from(level.len())
                            .ok()
                            .filter(|&idx| idx < u32::MAX)
                            .ok_or(NgramError::TooManyNgrams { order: m })?;
                        level.index.insert(pack(context, word), idx);
                        level.context.push(context);
                        level.word.push(word);
                        level.suffix.push(suffix);
                        level.count.push(0);
                        idx
                    }
                };
                if let Some(count) = level.count.get_mut(idx as usize) {
                    *count += 1;
                }
                self.ending_here[m - 1] = idx;
            }
            std::mem::swap(&mut self.ending_before, &mut self.ending_here);
        }
        self.n_sentences += 1;
        self.n_words += (self.sentence.len() - 2) as u64;
        Ok(())
    }

    /// The highest order counted.
    pub fn order(&self) -> usize {
        self.levels.len()
    }

    /// The words seen so far, with the markers.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Sentences counted.
    pub fn n_sentences(&self) -> u64 {
        self.n_sentences
    }

    /// Words counted (without `<s>` and `</s>`).
    pub fn n_words(&self) -> u64 {
        self.n_words
    }

    /// Markers found inside sentences and skipped.
    pub fn n_markers_skipped(&self) -> u64 {
        self.n_markers_skipped
    }

    /// Distinct n-grams stored for `order` (unigrams: the vocabulary size).
    pub fn n_distinct(&self, order: usize) -> usize {
        order
            .checked_sub(1)
            .and_then(|m| self.levels.get(m))
            .map_or(0, CountLevel::len)
    }

    /// Distinct n-grams stored over all orders: what memory grows with.
    pub fn n_stored(&self) -> usize {
        self.levels.iter().map(CountLevel::len).sum()
    }

    /// How often the n-gram `words` occurred (`None` for an unseen n-gram or
    /// one longer than the order).
    pub fn count(&self, words: &[&str]) -> Option<u64> {
        let (m, idx) = self.find(words)?;
        self.levels.get(m)?.count.get(idx as usize).copied()
    }

    /// The level and index of an n-gram.
    fn find(&self, words: &[&str]) -> Option<(usize, u32)> {
        let (first, rest) = words.split_first()?;
        let mut idx = self.vocab.id(first)?;
        for (m, word) in rest.iter().enumerate() {
            let word = self.vocab.id(word)?;
            idx = *self.levels.get(m + 1)?.index.get(&pack(idx, word))?;
        }
        Some((words.len() - 1, idx))
    }

    pub(crate) fn levels(&self) -> &[CountLevel] {
        &self.levels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_include_sentence_markers() {
        let mut counts = NgramCounts::new(3).unwrap();
        counts.add_sentence(["a", "b", "a"]).unwrap();
        counts.add_sentence(["a", "<unk>", "b"]).unwrap();
        counts.add_sentence([]).unwrap();
        // <s> a b a </s> and <s> a b </s>.
        assert_eq!(counts.n_sentences(), 2);
        assert_eq!(counts.n_words(), 5);
        assert_eq!(counts.n_markers_skipped(), 1);
        assert_eq!(counts.count(&["a"]), Some(3));
        assert_eq!(counts.count(&["<s>"]), Some(2));
        assert_eq!(counts.count(&["</s>"]), Some(2));
        assert_eq!(counts.count(&["<s>", "a"]), Some(2));
        assert_eq!(counts.count(&["a", "b"]), Some(2));
        assert_eq!(counts.count(&["b", "a"]), Some(1));
        assert_eq!(counts.count(&["<s>", "a", "b"]), Some(2));
        assert_eq!(counts.count(&["b", "a", "</s>"]), Some(1));
        assert_eq!(counts.count(&["a", "b", "</s>"]), Some(1));
        assert_eq!(counts.count(&["b", "b"]), None);
        // Distinct bigrams: <s> a, a b, b a, a </s>, b </s>.
        assert_eq!(counts.n_distinct(2), 5);
        // Distinct trigrams: <s> a b, a b a, b a </s>, a b </s>.
        assert_eq!(counts.n_distinct(3), 4);
    }

    #[test]
    fn order_out_of_range_is_an_error() {
        assert!(matches!(
            NgramCounts::new(0),
            Err(NgramError::InvalidOrder { order: 0, .. })
        ));
        assert!(matches!(
            NgramCounts::new(MAX_ORDER + 1),
            Err(NgramError::InvalidOrder { .. })
        ));
    }
}
