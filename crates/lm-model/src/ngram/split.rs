//! The default splitter: plain text into words and punctuation, and a corpus
//! into lines, streamed so memory does not grow with the corpus.
//!
//! A word is a run of letters, digits and `_`, with `'`, `’` or `-` allowed
//! between two such characters (`LORD's`, `well-known`). Every other
//! character that is not white space is a token of its own. A line of the
//! corpus is a sentence, as in KenLM's `lmplz`.
//!
//! ```
//! use lm_model::ngram::split_words;
//! let words: Vec<&str> = split_words("And God said, Let there be light: the LORD's day.").collect();
//! assert_eq!(
//!     words,
//!     ["And", "God", "said", ",", "Let", "there", "be", "light", ":", "the", "LORD's", "day", "."]
//! );
//! ```

use std::borrow::Cow;
use std::io::BufRead;

use super::error::NgramError;

/// What to do with bytes that are not UTF-8.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Utf8Policy {
    /// Fail with [`NgramError::InvalidUtf8`] and the byte offset.
    #[default]
    Strict,
    /// Replace each invalid sequence with U+FFFD and go on.
    Lossy,
}

/// Splits `text` into words and punctuation (see the module docs).
pub fn split_words(text: &str) -> WordSplit<'_> {
    WordSplit { rest: text }
}

/// The iterator [`split_words`] returns.
#[derive(Debug, Clone)]
pub struct WordSplit<'a> {
    rest: &'a str,
}

impl<'a> Iterator for WordSplit<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let text = self.rest.trim_start();
        let mut chars = text.char_indices();
        let (_, first) = chars.next()?;
        let mut end = first.len_utf8();
        if is_word_char(first) {
            let mut previous_is_word = true;
            for (idx, c) in chars {
                if is_word_char(c) {
                    previous_is_word = true;
                } else if is_joiner(c) && previous_is_word {
                    let after = text
                        .get(idx + c.len_utf8()..)
                        .and_then(|s| s.chars().next());
                    if !after.is_some_and(is_word_char) {
                        break;
                    }
                    previous_is_word = false;
                } else {
                    break;
                }
                end = idx + c.len_utf8();
            }
        }
        let (word, rest) = text.split_at(end);
        self.rest = rest;
        Some(word)
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn is_joiner(c: char) -> bool {
    matches!(c, '\'' | '\u{2019}' | '-')
}

/// How often [`for_each_line`] reports progress, in bytes.
pub const PROGRESS_INTERVAL: u64 = 1 << 20;

/// Calls `on_line` with every line of `reader` (without its `\n` or `\r\n`),
/// reusing one buffer, so memory stays that of the longest line. Calls
/// `on_progress` with the bytes read so far about every
/// [`PROGRESS_INTERVAL`] bytes and once at the end. Returns the bytes read.
pub fn for_each_line<R: BufRead>(
    mut reader: R,
    policy: Utf8Policy,
    mut on_progress: impl FnMut(u64),
    mut on_line: impl FnMut(&str) -> Result<(), NgramError>,
) -> Result<u64, NgramError> {
    let mut buffer = Vec::new();
    let mut offset: u64 = 0;
    let mut next_report = PROGRESS_INTERVAL;
    loop {
        buffer.clear();
        let n_read = reader.read_until(b'\n', &mut buffer)?;
        if n_read == 0 {
            break;
        }
        let mut line = buffer.as_slice();
        if let Some(stripped) = line.strip_suffix(b"\n") {
            line = stripped.strip_suffix(b"\r").unwrap_or(stripped);
        }
        let text: Cow<'_, str> = match std::str::from_utf8(line) {
            Ok(text) => Cow::Borrowed(text),
            Err(error) => match policy {
                Utf8Policy::Strict => {
                    return Err(NgramError::InvalidUtf8 {
                        offset: offset + error.valid_up_to() as u64,
                    });
                }
                Utf8Policy::Lossy => String::from_utf8_lossy(line),
            },
        };
        on_line(&text)?;
        offset += n_read as u64;
        if offset >= next_report {
            on_progress(offset);
            next_report = (offset / PROGRESS_INTERVAL + 1) * PROGRESS_INTERVAL;
        }
    }
    on_progress(offset);
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: &[&str]) {
        let words: Vec<&str> = split_words(text).collect();
        assert_eq!(words, expected, "splitting {text:?}");
    }

    #[test]
    fn words_and_punctuation() {
        check("", &[]);
        check("  \t ", &[]);
        check("a", &["a"]);
        check("Hello, world!", &["Hello", ",", "world", "!"]);
        check("(yea, verily)", &["(", "yea", ",", "verily", ")"]);
        check("men's brethren' x", &["men's", "brethren", "'", "x"]);
        check(
            "Maher-shalal-hash-baz -x- a--b",
            &["Maher-shalal-hash-baz", "-", "x", "-", "a", "-", "-", "b"],
        );
        check(
            "don’t 3.14 über_alles",
            &["don’t", "3", ".", "14", "über_alles"],
        );
        check("'tis", &["'", "tis"]);
        check("...", &[".", ".", "."]);
    }

    #[test]
    fn lines_strip_terminators_and_report_offsets() {
        let mut lines = Vec::new();
        let mut reports = Vec::new();
        let n = for_each_line(
            &b"a b\r\nc\n\nd"[..],
            Utf8Policy::Strict,
            |bytes| reports.push(bytes),
            |line| {
                lines.push(line.to_owned());
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(lines, ["a b", "c", "", "d"]);
        // 5 + 2 + 1 + 1 bytes.
        assert_eq!(n, 9);
        assert_eq!(reports, [9]);
    }

    #[test]
    fn invalid_utf8_names_the_byte_offset() {
        // "ok\n" is 3 bytes, then "ab" and the bad byte at offset 5.
        let corpus = b"ok\nab\xffc\n";
        let result = for_each_line(&corpus[..], Utf8Policy::Strict, |_| {}, |_| Ok(()));
        assert!(
            matches!(result, Err(NgramError::InvalidUtf8 { offset: 5 })),
            "{result:?}"
        );
        let mut lines = Vec::new();
        for_each_line(
            &corpus[..],
            Utf8Policy::Lossy,
            |_| {},
            |line| {
                lines.push(line.to_owned());
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(lines, ["ok", "ab\u{fffd}c"]);
    }
}
