//! The ARPA text format, read and written, so models move between this
//! project, KenLM and SRILM.
//!
//! ```text
//! \data\                  (fields below are separated by tabs)
//! ngram 1=4            <- number of entries per order
//! ngram 2=3
//!
//! \1-grams:
//! -0.69897  <unk>  0         <- log10 prob, words, log10 backoff
//! 0  <s>  -0.30103            (no backoff column at the top order)
//! ...
//! \2-grams:
//! -0.30103  <s> a
//! ...
//! \end\
//! ```
//!
//! Text before the `\data\` line is skipped, as KenLM skips it.
//! Reading checks the grammar and names the line of every problem: counts
//! that disagree with the body, a missing `\end\`, bad numbers, unknown words,
//! n-grams whose context is absent, duplicates. A file without `<unk>` gets
//! one with log10 probability -100, as KenLM does. Writing lists entries in
//! the order they were read (so a file round-trips byte for byte when its
//! numbers are in shortest form, as `lmplz` writes them) or, for a trained
//! model, sorted by word ids; every entry below the top order gets a
//! backoff column, as `lmplz` writes it.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use lm_core::TokenId;

use super::error::NgramError;
use super::key::{KeyMap, pack};
use super::model::{NgramModel, RawEntry};
use super::vocab::{UNK, Vocab};

/// KenLM's log10 probability for a `<unk>` missing from an ARPA file.
pub const MISSING_UNK_LOG10_PROB: f32 = -100.0;

/// Reads lines and counts them.
struct Lines<R> {
    reader: R,
    buffer: String,
    line: usize,
}

impl<R: BufRead> Lines<R> {
    /// Reads the next line into the buffer; `false` at the end. A line that
    /// is not UTF-8 is an error naming its number.
    fn read(&mut self) -> Result<bool, NgramError> {
        let mut bytes = std::mem::take(&mut self.buffer).into_bytes();
        bytes.clear();
        if self.reader.read_until(b'\n', &mut bytes)? == 0 {
            return Ok(false);
        }
        self.line += 1;
        self.buffer = String::from_utf8(bytes)
            .map_err(|_| NgramError::ArpaInvalidUtf8 { line: self.line })?;
        Ok(true)
    }

    /// The next line, trimmed of its end-of-line, or `None` at the end.
    fn next_line(&mut self) -> Result<Option<&str>, NgramError> {
        if !self.read()? {
            return Ok(None);
        }
        Ok(Some(self.buffer.trim_end_matches(['\n', '\r'])))
    }

    /// The next line that is not blank, trimmed, with its number.
    fn next_non_blank(&mut self) -> Result<Option<(usize, String)>, NgramError> {
        loop {
            if !self.read()? {
                return Ok(None);
            }
            let text = self.buffer.trim();
            if !text.is_empty() {
                return Ok(Some((self.line, text.to_owned())));
            }
        }
    }

    /// Skips the text before the `\data\` line, as KenLM does.
    fn skip_to_data(&mut self) -> Result<(), NgramError> {
        loop {
            match self.next_line()? {
                None => return Err(NgramError::ArpaMissingHeader),
                Some(text) if text.trim() == "\\data\\" => return Ok(()),
                Some(_) => {}
            }
        }
    }
}

fn parse_number(text: &str, line: usize) -> Result<f32, NgramError> {
    text.parse::<f32>()
        .ok()
        .filter(|v| !v.is_nan() && *v != f32::INFINITY)
        .ok_or_else(|| NgramError::ArpaBadNumber {
            line,
            text: text.to_owned(),
        })
}

/// A whole number of the `\data\` header (surrounding spaces allowed), or
/// `ArpaBadNumber`.
fn parse_count<T: std::str::FromStr>(text: &str, line: usize) -> Result<T, NgramError> {
    let text = text.trim();
    text.parse().map_err(|_| NgramError::ArpaBadNumber {
        line,
        text: text.to_owned(),
    })
}

/// The header after `\data\`: the declared count of every order, from its
/// `ngram m=count` lines, and the first section's header line after them.
fn read_declared_counts<R: BufRead>(
    lines: &mut Lines<R>,
) -> Result<(Vec<u64>, String), NgramError> {
    let mut declared: Vec<u64> = Vec::new();
    let first_section = loop {
        let Some((line, text)) = lines.next_non_blank()? else {
            return Err(NgramError::ArpaMissingEnd);
        };
        if text.starts_with('\\') {
            break text;
        }
        let text = text.as_str();
        let unexpected = || NgramError::ArpaUnexpectedLine {
            line,
            expected: "an `ngram N=count` line",
            found: text.to_owned(),
        };
        let (order_text, count_text) = text
            .strip_prefix("ngram")
            .and_then(|rest| rest.split_once('='))
            .ok_or_else(unexpected)?;
        let order: usize = parse_count(order_text, line)?;
        if order != declared.len() + 1 {
            return Err(unexpected());
        }
        let count: u64 = parse_count(count_text, line)?;
        declared.push(count);
    };
    if declared.is_empty() {
        return Err(NgramError::ArpaUnexpectedLine {
            line: lines.line,
            expected: "an `ngram N=count` line",
            found: first_section,
        });
    }
    Ok((declared, first_section))
}

/// One `\m-grams:` section as the header declared it.
#[derive(Clone, Copy)]
struct Section {
    /// The order.
    m: usize,
    /// The highest order: its entries have no backoff column.
    is_top: bool,
    /// Entries declared by the `ngram m=count` line.
    n_declared: u64,
}

/// What the sections of an ARPA file have given so far.
#[derive(Default)]
struct ArpaBody {
    /// The unigrams' words, in the order read (their ids).
    words: Vec<String>,
    word_ids: HashMap<String, TokenId>,
    /// (log10 prob, log10 backoff) per unigram.
    unigrams: Vec<(f32, f32)>,
    /// The entries of every order above 1, as read.
    higher: Vec<Vec<RawEntry>>,
    /// (context position, word) -> position, per level above 1, as read.
    read_index: Vec<KeyMap<u32>>,
    /// The ids of one n-gram's words (reused from line to line).
    ids: Vec<TokenId>,
}

impl ArpaBody {
    /// Reads the section `section`, whose header line is `header` when the
    /// previous section already read it, and returns the header line that
    /// ended it, if any.
    fn read_section<R: BufRead>(
        &mut self,
        lines: &mut Lines<R>,
        section: Section,
        header: Option<String>,
    ) -> Result<Option<String>, NgramError> {
        let Section { m, n_declared, .. } = section;
        let header_line = match header {
            Some(text) => text,
            None => match lines.next_non_blank()? {
                Some((_, text)) => text,
                None => return Err(NgramError::ArpaMissingEnd),
            },
        };
        if header_line != format!("\\{m}-grams:") {
            return Err(NgramError::ArpaUnexpectedLine {
                line: lines.line,
                expected: "an n-gram section header",
                found: header_line,
            });
        }
        let mut found: u64 = 0;
        let mut entries = Vec::new();
        let mut index = KeyMap::default();
        let mut next_header = None;
        loop {
            let line = lines.line + 1;
            let Some(text) = lines.next_line()? else {
                return Err(NgramError::ArpaMissingEnd);
            };
            let text = text.trim();
            if text.is_empty() {
                if found == n_declared {
                    break;
                }
                continue;
            }
            if text.starts_with('\\') {
                next_header = Some(text.to_owned());
                break;
            }
            found += 1;
            if found > n_declared {
                break;
            }
            self.read_entry(section, line, text, &mut entries, &mut index)?;
        }
        if found != n_declared {
            return Err(NgramError::ArpaCountMismatch {
                order: m,
                declared: n_declared,
                found,
            });
        }
        if m > 1 {
            self.higher.push(entries);
            self.read_index.push(index);
        }
        Ok(next_header)
    }

    /// Reads the entry `text` at line `line` of `section`: a unigram into
    /// the words, a higher n-gram, its context found among the n-grams
    /// read, into the section's `entries` and `index`.
    fn read_entry(
        &mut self,
        section: Section,
        line: usize,
        text: &str,
        entries: &mut Vec<RawEntry>,
        index: &mut KeyMap<u32>,
    ) -> Result<(), NgramError> {
        let m = section.m;
        let fields: Vec<&str> = text.split_ascii_whitespace().collect();
        let n_fields = fields.len();
        if n_fields != m + 1 && (section.is_top || n_fields != m + 2) {
            return Err(NgramError::ArpaBadEntry {
                line,
                order: m,
                found: text.to_owned(),
            });
        }
        let prob = parse_number(fields[0], line)?;
        let backoff = match fields.get(m + 1) {
            Some(text) => parse_number(text, line)?,
            None => 0.0,
        };
        let ngram_words = &fields[1..=m];
        if m == 1 {
            let word = ngram_words[0];
            let id = self.words.len() as TokenId;
            if self.word_ids.insert(word.to_owned(), id).is_some() {
                return Err(NgramError::ArpaDuplicate {
                    line,
                    ngram: word.to_owned(),
                });
            }
            self.words.push(word.to_owned());
            self.unigrams.push((prob, backoff));
            return Ok(());
        }
        self.ids.clear();
        for word in ngram_words {
            let id = self
                .word_ids
                .get(*word)
                .ok_or_else(|| NgramError::ArpaUnknownWord {
                    line,
                    word: (*word).to_owned(),
                })?;
            self.ids.push(*id);
        }
        let missing_context = || NgramError::ArpaMissingContext {
            line,
            ngram: ngram_words.join(" "),
        };
        let mut context = self.ids[0];
        for (level, &word) in self.read_index.iter().zip(&self.ids[1..m - 1]) {
            context = *level
                .get(&pack(context, word))
                .ok_or_else(missing_context)?;
        }
        let word = self.ids[m - 1];
        let position = entries.len() as u32;
        if index.insert(pack(context, word), position).is_some() {
            return Err(NgramError::ArpaDuplicate {
                line,
                ngram: ngram_words.join(" "),
            });
        }
        entries.push(RawEntry {
            context,
            word,
            prob,
            backoff,
        });
        Ok(())
    }
}

impl NgramModel {
    /// Reads an ARPA file.
    pub fn read_arpa<R: BufRead>(reader: R) -> Result<Self, NgramError> {
        let mut lines = Lines {
            reader,
            buffer: String::new(),
            line: 0,
        };
        lines.skip_to_data()?;
        let (declared, first_section) = read_declared_counts(&mut lines)?;
        let mut body = ArpaBody::default();
        let mut header = Some(first_section);
        for (l, &n_declared) in declared.iter().enumerate() {
            let section = Section {
                m: l + 1,
                is_top: l + 1 == declared.len(),
                n_declared,
            };
            header = body.read_section(&mut lines, section, header)?;
        }
        let end = match header.take() {
            Some(text) => Some(text),
            None => lines.next_non_blank()?.map(|(_, text)| text),
        };
        match end {
            Some(text) if text == "\\end\\" => {}
            Some(text) => {
                return Err(NgramError::ArpaUnexpectedLine {
                    line: lines.line,
                    expected: "\\end\\",
                    found: text,
                });
            }
            None => return Err(NgramError::ArpaMissingEnd),
        }
        let (vocab, unk_added) = Vocab::from_words(body.words)?;
        let mut unigrams = body.unigrams;
        if unk_added {
            unigrams.push((MISSING_UNK_LOG10_PROB, 0.0));
        }
        debug_assert_eq!(vocab.word(vocab.unk()), Some(UNK));
        NgramModel::from_levels(
            vocab,
            unk_added,
            unigrams,
            body.higher,
            true,
            |_, _| 0,
            |_, _| String::new(),
        )
    }

    /// Writes the model as an ARPA file (see the module docs for the order).
    pub fn write_arpa<W: Write>(&self, mut out: W) -> Result<(), NgramError> {
        let levels = self.levels();
        let order = levels.len();
        writeln!(out, "\\data\\")?;
        for (m, level) in levels.iter().enumerate() {
            writeln!(out, "ngram {}={}", m + 1, level.len())?;
        }
        let mut ids: Vec<TokenId> = Vec::with_capacity(order);
        for (l, level) in levels.iter().enumerate() {
            writeln!(out)?;
            writeln!(out, "\\{}-grams:", l + 1)?;
            let is_top = l + 1 == order;
            for position in 0..level.len() {
                let idx = level
                    .source_order
                    .as_ref()
                    .map_or(position, |order| order[position] as usize);
                ids.clear();
                let mut at = idx;
                for up in (0..=l).rev() {
                    ids.push(levels[up].word[at]);
                    if up > 0 {
                        at = levels[up].context[at] as usize;
                    }
                }
                ids.reverse();
                write!(out, "{}\t", level.prob[idx])?;
                for (i, &id) in ids.iter().enumerate() {
                    if i > 0 {
                        write!(out, " ")?;
                    }
                    write!(out, "{}", self.vocab().word(id).unwrap_or(UNK))?;
                }
                if is_top {
                    writeln!(out)?;
                } else {
                    writeln!(out, "\t{}", level.backoff[idx])?;
                }
            }
        }
        writeln!(out)?;
        writeln!(out, "\\end\\")?;
        Ok(())
    }
}
