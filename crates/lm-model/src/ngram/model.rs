//! The n-gram model in backoff form (what an ARPA file holds) and its
//! [`LanguageModel`] implementation.
//!
//! Each order is a level of a trie: an m-gram is (index of its context among
//! the (m-1)-grams, last word), with a log10 probability and, below the top
//! order, a log10 backoff weight. Levels above 1 are sorted by (context,
//! word), so the continuations of a context are one contiguous range:
//!
//! ```text
//!   level 1 (by word id)    level 2 (sorted by context, word)
//!   0 <unk>   children 0..0
//!   1 <s>     children 0..2 ──> 0 "<s> a"  1 "<s> b"
//!   2 </s>    children 2..2
//!   3 a       children 2..4 ──> 2 "a b"    3 "a </s>"
//! ```
//!
//! The probability of `w` after a context `c` is the ARPA rule: the stored
//! probability of `c w` when it exists, else `backoff(c) * p(w | c')` with
//! `c'` the context without its first word (a missing context has backoff 1).

use lm_core::{LanguageModel, Rows, SequenceState, TokenId};

use super::error::NgramError;
use super::key::{KeyMap, pack};
use super::smoothing::DiscountFallback;
use super::vocab::Vocab;

/// `ln(10)`: log10 probabilities times this are natural-log probabilities.
pub const LN_10: f32 = std::f32::consts::LN_10;

/// A count-based next-token model of order n in backoff form.
#[derive(Debug, Clone)]
pub struct NgramModel {
    vocab: Vocab,
    levels: Vec<Level>,
    /// Whether `<unk>` was missing from the source and added with log10
    /// probability -100 (KenLM's substitute).
    unk_added: bool,
    /// The orders whose Kneser-Ney discounts fell back (see
    /// [`NgramModel::discount_fallbacks`]).
    pub(crate) discount_fallbacks: Vec<DiscountFallback>,
}

/// log10 p(word | context) by the backoff rule, and where it came from
/// ([`NgramModel::log10_prob`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NgramProb {
    /// log10 p(word | context).
    pub log10_prob: f32,
    /// Length of the longest stored n-gram that ends in the word (KenLM's
    /// `ngram_length`): 1 when the model backed off to the unigram.
    pub ngram_length: usize,
}

impl NgramProb {
    /// The probability itself, `10^log10_prob`.
    pub fn probability(&self) -> f64 {
        10f64.powf(f64::from(self.log10_prob))
    }
}

/// One stored n-gram's values, as an ARPA line holds them
/// ([`NgramModel::entry`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NgramEntry {
    /// log10 probability.
    pub log10_prob: f32,
    /// log10 backoff weight (0 at the top order).
    pub log10_backoff: f32,
}

/// The n-grams of one order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Level {
    /// Context index in the level below (empty for unigrams).
    pub(crate) context: Vec<u32>,
    /// Last word.
    pub(crate) word: Vec<TokenId>,
    /// log10 probability.
    pub(crate) prob: Vec<f32>,
    /// log10 backoff (empty at the top order).
    pub(crate) backoff: Vec<f32>,
    /// `children[i]..children[i + 1]` are entry i's continuations in the
    /// level above (empty at the top order).
    pub(crate) children: Vec<u32>,
    /// (context, word) -> index (empty for unigrams).
    index: KeyMap<u32>,
    /// Indices in the order the source listed them, when that is not sorted.
    pub(crate) source_order: Option<Vec<u32>>,
}

impl Level {
    pub(crate) fn len(&self) -> usize {
        self.prob.len()
    }

    pub(crate) fn children_of(&self, idx: u32) -> std::ops::Range<usize> {
        let idx = idx as usize;
        match (self.children.get(idx), self.children.get(idx + 1)) {
            (Some(&start), Some(&end)) => start as usize..end as usize,
            _ => 0..0,
        }
    }
}

/// One n-gram as handed to [`NgramModel::from_levels`]: its context index
/// refers to the position of the context in the level below *as handed in*.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawEntry {
    pub(crate) context: u32,
    pub(crate) word: TokenId,
    pub(crate) prob: f32,
    pub(crate) backoff: f32,
}

impl NgramModel {
    /// [`NgramModel::from_levels`] for levels built in this crate (an
    /// estimate, a compact file): no source lines to name, no source order
    /// to keep, no `<unk>` added.
    pub(crate) fn from_built_levels(
        vocab: Vocab,
        unigrams: Vec<(f32, f32)>,
        higher: Vec<Vec<RawEntry>>,
    ) -> Result<Self, NgramError> {
        Self::from_levels(
            vocab,
            false,
            unigrams,
            higher,
            false,
            |_, _| 0,
            |_, _| String::new(),
        )
    }

    /// Builds the model from unigram (prob, backoff) pairs in id order and
    /// higher levels in any order (each entry's context is an index into the
    /// level below as handed in). With `keep_source_order`, writing the model
    /// lists the entries in the order handed in (so an ARPA file round-trips).
    /// `line_of(order, i)` names the source line of entry i for errors.
    pub(crate) fn from_levels(
        vocab: Vocab,
        unk_added: bool,
        unigrams: Vec<(f32, f32)>,
        higher: Vec<Vec<RawEntry>>,
        keep_source_order: bool,
        line_of: impl Fn(usize, usize) -> usize,
        describe: impl Fn(usize, usize) -> String,
    ) -> Result<Self, NgramError> {
        let order = higher.len() + 1;
        let mut levels = Vec::with_capacity(order);
        let top = order == 1;
        let unigram_level = Level {
            word: (0..unigrams.len() as TokenId).collect(),
            prob: unigrams.iter().map(|&(p, _)| p).collect(),
            backoff: if top {
                Vec::new()
            } else {
                unigrams.iter().map(|&(_, b)| b).collect()
            },
            ..Level::default()
        };
        levels.push(unigram_level);
        // Maps a lower entry's position as handed in to its sorted index.
        let mut lower_sorted_idx: Vec<u32> = (0..unigrams.len() as u32).collect();
        for (m_minus_2, entries) in higher.into_iter().enumerate() {
            let order_here = m_minus_2 + 2;
            let is_top = order_here == order;
            let n_lower = lower_sorted_idx.len();
            let mut keyed: Vec<(u32, TokenId, u32)> = Vec::with_capacity(entries.len());
            for (position, entry) in entries.iter().enumerate() {
                let context = lower_sorted_idx
                    .get(entry.context as usize)
                    .copied()
                    .ok_or_else(|| NgramError::ArpaMissingContext {
                        line: line_of(order_here, position),
                        ngram: describe(order_here, position),
                    })?;
                keyed.push((context, entry.word, position as u32));
            }
            keyed.sort_unstable();
            let mut level = Level {
                context: Vec::with_capacity(keyed.len()),
                word: Vec::with_capacity(keyed.len()),
                prob: Vec::with_capacity(keyed.len()),
                backoff: Vec::with_capacity(if is_top { 0 } else { keyed.len() }),
                ..Level::default()
            };
            level.index.reserve(keyed.len());
            let mut sorted_idx = vec![0u32; keyed.len()];
            for (idx, &(context, word, position)) in keyed.iter().enumerate() {
                let idx = idx as u32;
                if level.index.insert(pack(context, word), idx).is_some() {
                    return Err(NgramError::ArpaDuplicate {
                        line: line_of(order_here, position as usize),
                        ngram: describe(order_here, position as usize),
                    });
                }
                let entry = entries[position as usize];
                level.context.push(context);
                level.word.push(word);
                level.prob.push(entry.prob);
                if !is_top {
                    level.backoff.push(entry.backoff);
                }
                sorted_idx[position as usize] = idx;
            }
            // Children ranges of the level below.
            let lower = levels.last_mut().ok_or(NgramError::ArpaMissingHeader)?;
            let mut children = vec![0u32; n_lower + 1];
            for &context in &level.context {
                children[context as usize + 1] += 1;
            }
            for i in 0..n_lower {
                children[i + 1] += children[i];
            }
            lower.children = children;
            if keep_source_order && sorted_idx.iter().enumerate().any(|(i, &s)| s as usize != i) {
                level.source_order = Some(sorted_idx.clone());
            }
            levels.push(level);
            lower_sorted_idx = sorted_idx;
        }
        Ok(Self {
            vocab,
            levels,
            unk_added,
            discount_fallbacks: Vec::new(),
        })
    }

    /// The highest order: 2 for a bigram model, 3 for a trigram model.
    pub fn order(&self) -> usize {
        self.levels.len()
    }

    /// The vocabulary (word <-> id).
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Number of n-grams stored for `order`.
    pub fn n_ngrams(&self, order: usize) -> usize {
        order
            .checked_sub(1)
            .and_then(|m| self.levels.get(m))
            .map_or(0, Level::len)
    }

    /// Whether `<unk>` was absent from the source and added with log10
    /// probability -100, as KenLM does.
    pub fn unk_was_added(&self) -> bool {
        self.unk_added
    }

    /// The orders whose modified Kneser-Ney discounts the corpus could not
    /// give, estimated with the fallback discounts instead (see
    /// [`TrainOptions`](super::TrainOptions)). Empty for a model read from a
    /// file or estimated otherwise.
    pub fn discount_fallbacks(&self) -> &[DiscountFallback] {
        &self.discount_fallbacks
    }

    pub(crate) fn levels(&self) -> &[Level] {
        &self.levels
    }

    /// The index of the n-gram `ids` in level `ids.len()`, if stored.
    pub(crate) fn find(&self, ids: &[TokenId]) -> Option<u32> {
        let (&first, rest) = ids.split_first()?;
        if first as usize >= self.vocab.len() {
            return None;
        }
        let mut idx = first;
        for (m, &word) in rest.iter().enumerate() {
            idx = *self.levels.get(m + 1)?.index.get(&pack(idx, word))?;
        }
        Some(idx)
    }

    /// The stored log10 probability and backoff of the n-gram `words`
    /// (backoff 0 at the top order), or `None` when it is not stored.
    pub fn entry(&self, words: &[&str]) -> Option<NgramEntry> {
        let mut ids = Vec::with_capacity(words.len());
        for word in words {
            ids.push(self.vocab.id(word)?);
        }
        let idx = self.find(&ids)? as usize;
        let level = self.levels.get(ids.len() - 1)?;
        Some(NgramEntry {
            log10_prob: *level.prob.get(idx)?,
            log10_backoff: level.backoff.get(idx).copied().unwrap_or(0.0),
        })
    }

    /// log10 p(`word` | `context`) by the backoff rule, and the length of the
    /// longest stored n-gram that ends in `word` (KenLM's `ngram_length`).
    /// Only the last `order - 1` ids of `context` matter. An id beyond the
    /// vocabulary is read as `<unk>`.
    pub fn log10_prob(&self, context: &[TokenId], word: TokenId) -> NgramProb {
        let word = if (word as usize) < self.vocab.len() {
            word
        } else {
            self.vocab.unk()
        };
        let mut prob = self.levels[0].prob[word as usize];
        let mut matched = 1;
        let mut backoff_sum = 0.0;
        let longest = context.len().min(self.order() - 1);
        for k in 1..=longest {
            let Some(context_idx) = self.find(&context[context.len() - k..]) else {
                continue;
            };
            match self.levels[k].index.get(&pack(context_idx, word)) {
                Some(&idx) => {
                    prob = self.levels[k].prob[idx as usize];
                    matched = k + 1;
                    backoff_sum = 0.0;
                }
                None => backoff_sum += self.levels[k - 1].backoff[context_idx as usize],
            }
        }
        NgramProb {
            log10_prob: prob + backoff_sum,
            ngram_length: matched,
        }
    }

    /// Writes log10 p(w | `context`) for every word w into `row` (one entry
    /// per vocabulary id), by the backoff rule applied from the shortest
    /// context up. `<s>` gets its stored value; the caller masks it.
    pub fn fill_log10_row(&self, context: &[TokenId], row: &mut [f32]) {
        row.copy_from_slice(&self.levels[0].prob);
        let longest = context.len().min(self.order() - 1);
        for k in 1..=longest {
            let Some(context_idx) = self.find(&context[context.len() - k..]) else {
                continue;
            };
            let below = &self.levels[k - 1];
            let backoff = below.backoff[context_idx as usize];
            if backoff != 0.0 {
                row.iter_mut().for_each(|value| *value += backoff);
            }
            let level = &self.levels[k];
            for j in below.children_of(context_idx) {
                if let Some(slot) = row.get_mut(level.word[j] as usize) {
                    *slot = level.prob[j];
                }
            }
        }
    }
}

/// The state of one sequence: every token read, after an implicit `<s>`.
///
/// A fresh state is at the start of a sentence (KenLM's begin-sentence
/// state), so the first row of `forward` is the distribution after
/// `<s> tokens[0]`. Feeding `<s>` itself first is harmless: the context
/// `<s> <s>` is never stored and backs off to `<s>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramState {
    /// `<s>` followed by the tokens read.
    tokens: Vec<TokenId>,
}

impl NgramState {
    /// The tokens read, without the implicit `<s>`.
    pub fn tokens(&self) -> &[TokenId] {
        self.tokens.get(1..).unwrap_or_default()
    }
}

impl SequenceState for NgramState {
    fn pos(&self) -> usize {
        self.tokens.len().saturating_sub(1)
    }

    fn truncate(&mut self, pos: usize) {
        self.tokens.truncate(pos.saturating_add(1));
    }
}

/// Logits are natural-log probabilities (log10 times ln 10), so a softmax
/// gives back the model's distribution. `<s>` is never generated: its logit
/// is `-inf`. `</s>` ([`Vocab::eos`]) is the end token. The context is
/// unbounded (`context_length` is `None`); only the last `order - 1` tokens
/// matter.
///
/// `<unk>` keeps its probability: it is the mass of every word outside the
/// vocabulary, and scoring a text through these logits must agree with
/// [`NgramModel::score`] (KenLM's `query`), which gives an unknown word
/// `<unk>`'s probability. Generation, which has no word to write for it,
/// bans it in the sampler, as lm-cli does for every count model:
///
/// ```
/// use lm_decode::{GenerationConfig, SamplingConfig, generate};
/// use lm_model::ngram::{TrainOptions, train};
/// let model = train("a b\nb a\n".as_bytes(), &TrainOptions::default(), |_| {}).unwrap();
/// let vocab = model.vocab();
/// let config = GenerationConfig {
///     max_new_tokens: 50,
///     sampling: SamplingConfig {
///         banned_tokens: vec![vocab.unk()], // never write "<unk>"
///         ..SamplingConfig::default()
///     },
///     ..GenerationConfig::default()
/// };
/// let run = generate(&model, &[vocab.bos()], &config, None).unwrap();
/// assert!(!run.tokens.contains(&vocab.unk()));
/// ```
impl LanguageModel for NgramModel {
    type State = NgramState;

    fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    fn context_length(&self) -> Option<usize> {
        None
    }

    fn new_state(&self) -> NgramState {
        NgramState {
            tokens: vec![self.vocab.bos()],
        }
    }

    fn forward(
        &self,
        state: &mut NgramState,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        self.check_input(state.pos(), tokens)?;
        let vocab_size = self.vocab.len();
        let n_rows = match rows {
            Rows::Last => 1,
            Rows::All => tokens.len(),
        };
        logits.clear();
        logits.resize(n_rows * vocab_size, 0.0);
        let first_row_token = tokens.len() - n_rows;
        let bos = self.vocab.bos() as usize;
        let history = self.order().saturating_sub(1);
        for (i, &token) in tokens.iter().enumerate() {
            state.tokens.push(token);
            let Some(row_idx) = i.checked_sub(first_row_token) else {
                continue;
            };
            let row = &mut logits[row_idx * vocab_size..(row_idx + 1) * vocab_size];
            let start = state.tokens.len().saturating_sub(history);
            self.fill_log10_row(&state.tokens[start..], row);
            row.iter_mut().for_each(|value| *value *= LN_10);
            row[bos] = f32::NEG_INFINITY;
        }
        Ok(())
    }
}

/// Text of ids as [`Vocab`]'s `decode` writes it.
impl lm_core::Detokenize for NgramModel {
    fn decode(&self, ids: &[TokenId]) -> String {
        self.vocab.decode(ids)
    }
}
