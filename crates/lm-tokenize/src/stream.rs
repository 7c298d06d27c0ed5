//! [`TextStream`]: incremental detokenization that never emits half a UTF-8
//! character.
//!
//! A byte-level token can hold part of a character: 🙂 (F0 9F 99 82) may
//! arrive as one token with three bytes and another with the fourth. Decoding
//! each token alone would print two U+FFFD. The stream keeps a small window of
//! ids, decodes it, and emits only the new text once it no longer ends in a
//! replacement character (the approach of the `tokenizers` crate's
//! `DecodeStream`):
//!
//! ```text
//! ids in window      decoded         emitted
//! [Hi]               "Hi"            "Hi"        window -> [Hi], prefix "Hi"
//! [Hi, F0 9F 99]     "Hi\u{FFFD}"    nothing     (incomplete: wait)
//! [Hi, F0 9F 99, 82] "Hi🙂"          "🙂"        window -> [F0 9F 99, 82]
//! ```
//!
//! Keeping the previous token in the window also keeps decoders that strip a
//! leading space (SentencePiece's `▁`) from eating spaces between chunks.

use lm_core::TokenId;

use crate::{TokenizeError, Tokenizer};

/// Turns token ids, pushed one at a time, into chunks of complete UTF-8 text.
///
/// ```
/// use lm_tokenize::{BpeVocab, Tokenizer};
/// // Byte-level tokens for the two halves of "é" (C3 A9): "Ã" is byte C3, "©" is A9.
/// let vocab = BpeVocab {
///     model: "gpt2".into(),
///     tokens: vec!["Ã".into(), "©".into()],
///     ..BpeVocab::default()
/// };
/// let tokenizer = Tokenizer::from_bpe_vocab(vocab).unwrap();
/// let mut stream = tokenizer.text_stream(false);
/// assert_eq!(stream.push(0).unwrap(), None);
/// assert_eq!(stream.push(1).unwrap().as_deref(), Some("é"));
/// ```
#[derive(Debug, Clone)]
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    skip_special: bool,
    /// The window: `ids[..n_prefix_ids]` decode to `prefix` (already
    /// emitted), the rest is pending.
    ids: Vec<TokenId>,
    n_prefix_ids: usize,
    prefix: String,
}

impl<'t> TextStream<'t> {
    /// An empty stream over `tokenizer`; `skip_special` leaves control tokens
    /// out of the text.
    pub fn new(tokenizer: &'t Tokenizer, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            n_prefix_ids: 0,
            prefix: String::new(),
        }
    }

    /// Adds one id; returns the text it completes, or `None` while the
    /// pending bytes are not yet whole characters.
    pub fn push(&mut self, id: TokenId) -> Result<Option<String>, TokenizeError> {
        let vocab_size = self.tokenizer.vocab_size();
        if id as usize >= vocab_size {
            return Err(TokenizeError::TokenOutOfRange { id, vocab_size });
        }
        self.ids.push(id);
        let text = self.tokenizer.decode_with(&self.ids, self.skip_special)?;
        if text.len() <= self.prefix.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let new_text = new_suffix(&self.prefix, &text).to_owned();
        // The ids just emitted become the context of the next chunk.
        self.ids.drain(..self.n_prefix_ids);
        self.n_prefix_ids = self.ids.len();
        self.prefix = self.tokenizer.decode_with(&self.ids, self.skip_special)?;
        Ok(Some(new_text))
    }

    /// Ends the stream: returns whatever is still pending (incomplete bytes
    /// become U+FFFD) and empties the window, so the stream can be reused.
    pub fn finish(&mut self) -> Result<String, TokenizeError> {
        let rest = if self.ids.len() > self.n_prefix_ids {
            let text = self.tokenizer.decode_with(&self.ids, self.skip_special)?;
            new_suffix(&self.prefix, &text).to_owned()
        } else {
            String::new()
        };
        self.ids.clear();
        self.n_prefix_ids = 0;
        self.prefix.clear();
        Ok(rest)
    }
}

/// The part of `text` after `prefix`. When a decoder rewrote the prefix
/// (it should not), the text after the longest common prefix is returned, so
/// nothing already emitted is repeated.
fn new_suffix<'a>(prefix: &str, text: &'a str) -> &'a str {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest;
    }
    let common = prefix
        .char_indices()
        .zip(text.chars())
        .find(|((_, a), b)| a != b)
        .map_or(prefix.len().min(text.len()), |((idx, _), _)| idx);
    text.get(common..).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_suffix_strips_the_emitted_prefix() {
        assert_eq!(new_suffix("Hi", "Hi there"), " there");
        assert_eq!(new_suffix("", "abc"), "abc");
        assert_eq!(new_suffix("ab", "ax"), "x");
        assert_eq!(new_suffix("abc", "ab"), "");
    }
}
