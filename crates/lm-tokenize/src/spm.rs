//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`) tokenized as
//! llama.cpp does it (`tokenizer_st_partition`, then `llm_tokenizer_spm`).
//!
//! llama.cpp does not run SentencePiece's Unigram search for these
//! vocabularies: it merges by score. Each character starts as a symbol; the
//! adjacent pair whose concatenation is a token with the highest score is
//! merged first (on a tie, the leftmost pair), until no pair forms a token.
//! A symbol left that is not a token becomes its bytes' `<0xNN>` tokens.
//! The `tokenizers` crate has no model that breaks ties this way (its BPE
//! would need every split of every token as a ranked merge, its Unigram
//! finds the best-scoring segmentation instead), so the merge is written
//! here, in a few lines, to give llama.cpp's ids exactly:
//!
//! ```text
//! "<start_of_turn>user hi"                    (Gemma: no space prefix)
//!   1. special tokens, longest text first:    [<start_of_turn>] "user hi"
//!   2. ' ' -> '▁' (and a leading '▁' when add_space_prefix and the text
//!      starts the prompt or follows a special token)   "user▁hi"
//!   3. merge by score:  u s e r ▁ h i  ->  ...  ->  "user" "▁hi"
//!   4. symbols that are no token -> <0xNN> byte tokens (else the unknown token)
//! ```
//!
//! Decoding is llama.cpp's `token_to_piece`: byte tokens give their byte,
//! normal tokens their text with '▁' read as a space, control and user-defined
//! tokens their text as it is (control ones only when special tokens are
//! written out), unused tokens nothing; with `add_space_prefix` the first
//! piece loses one leading space, as `llama_detokenize` does.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use lm_core::TokenId;

use crate::TokenizeError;
use crate::vocab::{SpmVocab, TokenType, parse_token_types};

/// SentencePiece's visible space, which stands for ' ' inside tokens.
pub(crate) const SPACE_MARK: char = '\u{2581}';

/// The SentencePiece model: token lookup, scores and types, byte tokens and
/// the tokens matched whole in text, in llama.cpp's search order.
#[derive(Debug, Clone)]
pub(crate) struct SpmModel {
    text_to_id: HashMap<String, TokenId>,
    tokens: Vec<String>,
    scores: Vec<f32>,
    token_types: Vec<TokenType>,
    /// The `<0xNN>` token of each byte, when the vocabulary has it.
    byte_ids: [Option<TokenId>; 256],
    /// Control, user-defined and unknown tokens, longest text first (ties
    /// by id): the order llama.cpp splits them out of the text.
    matched_whole: Vec<TokenId>,
    unk_id: Option<TokenId>,
    add_space_prefix: bool,
}

/// A piece of prompt text after special tokens are split out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment<'t> {
    Text(&'t str),
    Token(TokenId),
}

impl SpmModel {
    /// Checks the vocabulary and indexes it. `end_texts` are token texts
    /// llama.cpp always treats as control tokens (its end-of-generation list).
    pub(crate) fn new(vocab: &SpmVocab, end_texts: &[&str]) -> Result<Self, TokenizeError> {
        let n_tokens = vocab.tokens.len();
        let mut token_types = parse_token_types(&vocab.tokens, &vocab.token_types)?;
        let scores = if vocab.scores.is_empty() {
            vec![0.0; n_tokens]
        } else if vocab.scores.len() == n_tokens {
            vocab.scores.clone()
        } else {
            return Err(TokenizeError::ScoreCountMismatch {
                n_tokens,
                n_scores: vocab.scores.len(),
            });
        };
        let mut text_to_id = HashMap::with_capacity(n_tokens);
        let mut byte_ids = [None; 256];
        for ((text, id), token_type) in vocab.tokens.iter().zip(0u32..).zip(&mut token_types) {
            if let Some(first_id) = text_to_id.insert(text.clone(), id) {
                return Err(TokenizeError::DuplicateToken {
                    text: text.clone(),
                    first_id,
                    second_id: id,
                });
            }
            if *token_type == TokenType::Byte {
                let byte =
                    parse_byte_token(text).ok_or_else(|| TokenizeError::MalformedByteToken {
                        id,
                        text: text.clone(),
                    })?;
                byte_ids[usize::from(byte)] = Some(id);
            }
            // llama.cpp makes every end-of-generation token a control token.
            if end_texts.contains(&text.as_str()) {
                *token_type = TokenType::Control;
            }
        }
        let mut matched_whole: Vec<TokenId> = (0u32..)
            .zip(&token_types)
            .filter(|&(id, token_type)| {
                token_type.is_matched_whole() && !vocab.tokens[id as usize].is_empty()
            })
            .map(|(id, _)| id)
            .collect();
        matched_whole.sort_by_key(|&id| std::cmp::Reverse(vocab.tokens[id as usize].len()));
        Ok(Self {
            text_to_id,
            tokens: vocab.tokens.clone(),
            scores,
            token_types,
            byte_ids,
            matched_whole,
            unk_id: vocab.unk_id,
            add_space_prefix: vocab.add_space_prefix,
        })
    }

    /// The id whose text is exactly `text`.
    pub(crate) fn token_id(&self, text: &str) -> Option<TokenId> {
        self.text_to_id.get(text).copied()
    }

    /// The type of each token, by id.
    pub(crate) fn token_types(&self) -> &[TokenType] {
        &self.token_types
    }

    /// Appends the ids of `text` to `out`. With `parse_special`, control and
    /// unknown token texts become those tokens; user-defined ones always do.
    /// `prev_is_special` tells whether what came before ended with a token
    /// matched whole (or nothing came before: `true`), which gives the text
    /// its space prefix; it is updated for a text that continues this one.
    pub(crate) fn encode(
        &self,
        text: &str,
        parse_special: bool,
        prev_is_special: &mut bool,
        out: &mut Vec<TokenId>,
    ) -> Result<(), TokenizeError> {
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    *prev_is_special = true;
                }
                Fragment::Text(text) => {
                    let mut escaped = String::with_capacity(text.len() + 3);
                    if self.add_space_prefix && *prev_is_special {
                        escaped.push(SPACE_MARK);
                    }
                    escaped.extend(text.chars().map(|c| if c == ' ' { SPACE_MARK } else { c }));
                    self.merge(&escaped, out)?;
                    *prev_is_special = false;
                }
            }
        }
        Ok(())
    }

    /// Splits the text around the tokens matched whole, as llama.cpp's
    /// `tokenizer_st_partition`: one token at a time, longest first, every
    /// occurrence in every text fragment left.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(text));
        for &id in &self.matched_whole {
            let token_type = self.token_types[id as usize];
            if !parse_special && token_type != TokenType::UserDefined {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            if !fragments
                .iter()
                .any(|fragment| matches!(fragment, Fragment::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(text) = fragment else {
                    split.push(fragment);
                    continue;
                };
                let mut rest = text;
                while let Some(idx) = rest.find(needle) {
                    if idx > 0 {
                        split.push(Fragment::Text(&rest[..idx]));
                    }
                    split.push(Fragment::Token(id));
                    rest = &rest[idx + needle.len()..];
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        fragments
    }

    /// llama.cpp's `llm_tokenizer_spm_session::tokenize` on escaped text.
    fn merge(&self, text: &str, out: &mut Vec<TokenId>) -> Result<(), TokenizeError> {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n_symbols = symbols.len();
        for (idx, symbol) in symbols.iter_mut().enumerate() {
            symbol.prev = idx.checked_sub(1);
            symbol.next = Some(idx + 1).filter(|&next| next < n_symbols);
        }
        let mut queue = BinaryHeap::new();
        for left in 1..n_symbols {
            self.push_pair(text, &symbols, left - 1, left, &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (left, right) = (symbols[pair.left], symbols[pair.right]);
            // A pair whose symbols changed since it was queued is stale.
            if left.len == 0 || right.len == 0 || left.len + right.len != pair.len {
                continue;
            }
            symbols[pair.left].len = pair.len;
            symbols[pair.right].len = 0;
            symbols[pair.left].next = right.next;
            if let Some(next) = right.next {
                symbols[next].prev = Some(pair.left);
            }
            if let Some(prev) = left.prev {
                self.push_pair(text, &symbols, prev, pair.left, &mut queue);
            }
            if let Some(next) = right.next {
                self.push_pair(text, &symbols, pair.left, next, &mut queue);
            }
        }
        let mut idx = (n_symbols > 0).then_some(0);
        while let Some(symbol) = idx.map(|idx| symbols[idx]) {
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match self.token_id(piece) {
                Some(id) => out.push(id),
                // Only a single character can fail to be a token: a merge
                // always makes one.
                None => {
                    for &byte in piece.as_bytes() {
                        out.push(self.byte_token(byte)?);
                    }
                }
            }
            idx = symbol.next;
        }
        Ok(())
    }

    /// Queues the merge of two adjacent symbols when their text is a token.
    fn push_pair(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Pair>,
    ) {
        let start = symbols[left].start;
        let len = symbols[left].len + symbols[right].len;
        if let Some(id) = self.token_id(&text[start..start + len]) {
            queue.push(Pair {
                score: self.scores[id as usize],
                left,
                right,
                len,
            });
        }
    }

    /// The token of a byte of a character that is no token: its `<0xNN>`
    /// token, else the unknown token (where llama.cpp, which looks for a
    /// token spelling the byte alone, would throw).
    fn byte_token(&self, byte: u8) -> Result<TokenId, TokenizeError> {
        self.byte_ids[usize::from(byte)]
            .or(self.unk_id)
            .ok_or(TokenizeError::NoByteToken { byte })
    }

    /// Appends the bytes of `ids` to `out` (llama.cpp's `llama_detokenize`
    /// without removing bos/eos); `skip_special` leaves control and unknown
    /// tokens out. An id outside the vocabulary gives U+FFFD.
    pub(crate) fn decode_bytes(&self, ids: &[TokenId], skip_special: bool, out: &mut Vec<u8>) {
        let mut strip_space = self.add_space_prefix;
        for &id in ids {
            let start = out.len();
            self.push_piece(id, skip_special, out);
            if strip_space && out.get(start) == Some(&b' ') {
                out.remove(start);
            }
            strip_space = false;
        }
    }

    /// The bytes of one token, as llama.cpp's `token_to_piece`.
    fn push_piece(&self, id: TokenId, skip_special: bool, out: &mut Vec<u8>) {
        let (Some(text), Some(&token_type)) = (
            self.tokens.get(id as usize),
            self.token_types.get(id as usize),
        ) else {
            out.extend_from_slice(
                char::REPLACEMENT_CHARACTER
                    .encode_utf8(&mut [0; 4])
                    .as_bytes(),
            );
            return;
        };
        match token_type {
            TokenType::Control | TokenType::Unknown if skip_special => {}
            TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                out.extend_from_slice(text.as_bytes());
            }
            TokenType::Normal => {
                for c in text.chars() {
                    let c = if c == SPACE_MARK { ' ' } else { c };
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
            }
            TokenType::Byte => out.extend(parse_byte_token(text)),
            TokenType::Unused => {}
        }
    }
}

/// The byte of a `<0xNN>` token.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A run of characters in the text being merged: `text[start..start + len]`,
/// `len == 0` once merged into its left neighbour.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols whose text (`len` bytes) is a
/// token with `score`.
#[derive(Debug, Clone, Copy)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

/// The queue's order: the highest score first, then the leftmost pair.
impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse_two_hex_digits() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xff>"), Some(255));
        assert_eq!(parse_byte_token("<0x1>"), None);
        assert_eq!(parse_byte_token("<0x100>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
    }

    #[test]
    fn queue_pops_highest_score_then_leftmost() {
        let pair = |score, left| Pair {
            score,
            left,
            right: left + 1,
            len: 2,
        };
        let mut queue: BinaryHeap<Pair> = [pair(-1.0, 0), pair(2.0, 5), pair(2.0, 3), pair(0.5, 1)]
            .into_iter()
            .collect();
        let order: Vec<usize> = std::iter::from_fn(|| queue.pop().map(|p| p.left)).collect();
        assert_eq!(order, [3, 5, 1, 0]);
    }
}
