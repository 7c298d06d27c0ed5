//! Scoring text as KenLM's `query` does: each sentence starts from the `<s>`
//! context, every word gets its log10 probability by the backoff rule, `</s>`
//! is scored at the end, and a word the model does not know is read as
//! `<unk>` (and counted as out of vocabulary).
//!
//! Perplexity is `10^(-total log10 / tokens)` where the tokens are the words
//! plus one `</s>` per sentence, as `query` reports "perplexity including
//! OOVs".

use lm_core::TokenId;

use super::model::{LN_10, NgramModel, NgramProb};
use super::split::split_words;

/// The score of one token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WordScore {
    /// The id scored (`<unk>`'s for an unknown word).
    pub id: TokenId,
    /// log10 p(token | context).
    pub log10_prob: f32,
    /// Length of the longest stored n-gram that ends in the token.
    pub ngram_length: usize,
    /// Whether the word is not in the vocabulary.
    pub oov: bool,
}

/// The scores of one sentence's tokens, `</s>` last when asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SentenceScore {
    /// One score per token.
    pub words: Vec<WordScore>,
}

impl SentenceScore {
    /// Sum of the log10 probabilities.
    pub fn total_log10(&self) -> f64 {
        self.words.iter().map(|w| f64::from(w.log10_prob)).sum()
    }

    /// Sum of the natural-log probabilities.
    pub fn total_ln(&self) -> f64 {
        self.total_log10() * f64::from(LN_10)
    }

    /// Tokens that were not in the vocabulary.
    pub fn n_oov(&self) -> usize {
        self.words.iter().filter(|w| w.oov).count()
    }

    /// `10^(-total log10 / tokens)`; 1 for no token.
    pub fn perplexity(&self) -> f64 {
        let mut corpus = CorpusScore::default();
        corpus.add(self);
        corpus.perplexity()
    }
}

/// Scores summed over many sentences.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CorpusScore {
    /// Sum of every token's log10 probability.
    pub total_log10: f64,
    /// Sum over in-vocabulary tokens only.
    pub total_log10_in_vocab: f64,
    /// Tokens scored (words and `</s>`).
    pub n_tokens: u64,
    /// Tokens that were not in the vocabulary.
    pub n_oov: u64,
    /// Sentences added.
    pub n_sentences: u64,
}

impl CorpusScore {
    /// Adds a sentence.
    pub fn add(&mut self, sentence: &SentenceScore) {
        for word in &sentence.words {
            self.total_log10 += f64::from(word.log10_prob);
            if !word.oov {
                self.total_log10_in_vocab += f64::from(word.log10_prob);
            }
            self.n_tokens += 1;
            self.n_oov += u64::from(word.oov);
        }
        self.n_sentences += 1;
    }

    /// Sum of the natural-log probabilities.
    pub fn total_ln(&self) -> f64 {
        self.total_log10 * f64::from(LN_10)
    }

    /// Perplexity including out-of-vocabulary tokens (KenLM's first figure).
    pub fn perplexity(&self) -> f64 {
        perplexity_of(self.total_log10, self.n_tokens)
    }

    /// Perplexity over in-vocabulary tokens only.
    pub fn perplexity_excluding_oov(&self) -> f64 {
        perplexity_of(self.total_log10_in_vocab, self.n_tokens - self.n_oov)
    }
}

fn perplexity_of(total_log10: f64, n_tokens: u64) -> f64 {
    if n_tokens == 0 {
        return 1.0;
    }
    10f64.powf(-total_log10 / n_tokens as f64)
}

impl NgramModel {
    /// Scores `words` as one sentence: from the `<s>` context when `bos`
    /// (else from no context), with `</s>` scored at the end when `eos`.
    /// This is KenLM's `Model.score` / `full_scores` with the same flags.
    ///
    /// ```
    /// let model = lm_model::ngram::embedded_default().unwrap();
    /// let known = model.score(["In", "the", "beginning"], true, true);
    /// let odd = model.score(["beginning", "the", "In"], true, true);
    /// assert!(known.total_log10() > odd.total_log10());
    /// assert_eq!(model.score(["zyzzyva"], true, true).n_oov(), 1);
    /// ```
    pub fn score<'a>(
        &self,
        words: impl IntoIterator<Item = &'a str>,
        bos: bool,
        eos: bool,
    ) -> SentenceScore {
        let vocab = self.vocab();
        let history = self.order().saturating_sub(1);
        let mut context: Vec<TokenId> = Vec::with_capacity(history + 1);
        if bos {
            context.push(vocab.bos());
        }
        let mut scores = Vec::new();
        let mut score_one = |id: TokenId, oov: bool, context: &mut Vec<TokenId>| {
            let NgramProb {
                log10_prob,
                ngram_length,
            } = self.log10_prob(context, id);
            scores.push(WordScore {
                id,
                log10_prob,
                ngram_length,
                oov,
            });
            if history > 0 {
                if context.len() == history {
                    context.remove(0);
                }
                context.push(id);
            }
        };
        for word in words {
            let (id, oov) = match vocab.id(word) {
                Some(id) => (id, false),
                None => (vocab.unk(), true),
            };
            score_one(id, oov, &mut context);
        }
        if eos {
            score_one(vocab.eos(), false, &mut context);
        }
        SentenceScore { words: scores }
    }

    /// Scores a line as KenLM's `query` does (`<s>` context, `</s>` at the
    /// end), its words cut by [`split_words`], the splitter training uses, so
    /// "mat." is the two tokens a model trained on "the mat." knows. On text
    /// split by white space already it agrees with `query`.
    pub fn score_line(&self, line: &str) -> SentenceScore {
        self.score(split_words(line), true, true)
    }
}
