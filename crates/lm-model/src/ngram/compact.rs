//! A compact binary form of a model, for the embedded default: the trie
//! levels with delta-coded word ids and half-precision log10 values.
//!
//! ```text
//! magic     "LMNGRAM" 0x01
//! order     varint
//! words     varint count, then per word: varint byte length, UTF-8 bytes
//!           (in id order; must contain <unk>, <s> and </s>)
//! level 1   per word id: log10 prob (f16 LE), log10 backoff (f16 LE, not at the top order)
//! level m   varint count, then per (m-1)-gram in sorted order: varint number
//!           of continuations, then per continuation: varint word id (the
//!           first absolute, the next ones as the gap to the previous, ≥ 1),
//!           log10 prob (f16 LE), log10 backoff (f16 LE, not at the top order)
//! ```
//!
//! Varints are LEB128 (7 bits per byte, low bits first). Values are rounded
//! to f16 (about 3 significant digits), so writing is lossy once; reading
//! and writing again reproduces the bytes.

use half::f16;
use lm_core::TokenId;

use super::error::NgramError;
use super::model::{NgramModel, RawEntry};
use super::vocab::Vocab;

/// The first bytes of a compact model.
pub const COMPACT_MAGIC: &[u8; 8] = b"LMNGRAM\x01";

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_f16(out: &mut Vec<u8>, value: f32) {
    out.extend_from_slice(&f16::from_f32(value).to_le_bytes());
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], NgramError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(NgramError::CompactTruncated { offset: self.at })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn varint(&mut self) -> Result<u64, NgramError> {
        let start = self.at;
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(NgramError::CompactInvalid {
            offset: start,
            what: "varint",
        })
    }

    /// A count of items that each take at least `min_bytes` bytes.
    fn count(&mut self, min_bytes: usize, what: &'static str) -> Result<usize, NgramError> {
        let start = self.at;
        let value = self.varint()?;
        let remaining = (self.bytes.len() - self.at) as u64;
        if value.saturating_mul(min_bytes as u64) > remaining {
            return Err(NgramError::CompactInvalid {
                offset: start,
                what,
            });
        }
        Ok(value as usize)
    }

    fn f16(&mut self) -> Result<f32, NgramError> {
        let start = self.at;
        let bytes = self.take(2)?;
        let value = f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
        if value.is_nan() || value == f32::INFINITY {
            return Err(NgramError::CompactInvalid {
                offset: start,
                what: "log10 value",
            });
        }
        Ok(value)
    }
}

impl NgramModel {
    /// The model in the compact binary form (see the module docs).
    pub fn to_compact(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(COMPACT_MAGIC);
        let levels = self.levels();
        let order = levels.len();
        put_varint(&mut out, order as u64);
        put_varint(&mut out, self.vocab().len() as u64);
        for word in self.vocab().words() {
            put_varint(&mut out, word.len() as u64);
            out.extend_from_slice(word.as_bytes());
        }
        for (l, level) in levels.iter().enumerate() {
            let is_top = l + 1 == order;
            if l == 0 {
                for i in 0..level.len() {
                    put_f16(&mut out, level.prob[i]);
                    if !is_top {
                        put_f16(&mut out, level.backoff[i]);
                    }
                }
                continue;
            }
            put_varint(&mut out, level.len() as u64);
            let below = &levels[l - 1];
            for context in 0..below.len() as u32 {
                let range = below.children_of(context);
                put_varint(&mut out, range.len() as u64);
                let mut previous: Option<TokenId> = None;
                for j in range {
                    let word = level.word[j];
                    put_varint(&mut out, u64::from(word - previous.unwrap_or(0)));
                    previous = Some(word);
                    put_f16(&mut out, level.prob[j]);
                    if !is_top {
                        put_f16(&mut out, level.backoff[j]);
                    }
                }
            }
        }
        out
    }

    /// Reads a model in the compact binary form.
    pub fn from_compact(bytes: &[u8]) -> Result<Self, NgramError> {
        let mut cursor = Cursor { bytes, at: 0 };
        if cursor.take(COMPACT_MAGIC.len()).ok() != Some(COMPACT_MAGIC.as_slice()) {
            return Err(NgramError::CompactBadMagic);
        }
        let order_at = cursor.at;
        let order = cursor.varint()?;
        if !(1..=super::counts::MAX_ORDER as u64).contains(&order) {
            return Err(NgramError::CompactInvalid {
                offset: order_at,
                what: "order",
            });
        }
        let order = order as usize;
        let n_words = cursor.count(1, "word count")?;
        let mut words = Vec::with_capacity(n_words);
        for _ in 0..n_words {
            let start = cursor.at;
            let len = cursor.count(1, "word length")?;
            let text =
                std::str::from_utf8(cursor.take(len)?).map_err(|_| NgramError::CompactInvalid {
                    offset: start,
                    what: "word",
                })?;
            words.push(text.to_owned());
        }
        let (vocab, unk_added) = Vocab::from_words(words)?;
        if unk_added || vocab.len() != n_words {
            return Err(NgramError::CompactInvalid {
                offset: order_at,
                what: "vocabulary (duplicate words or no <unk>)",
            });
        }
        let mut unigrams = Vec::with_capacity(n_words);
        for _ in 0..n_words {
            let prob = cursor.f16()?;
            let backoff = if order > 1 { cursor.f16()? } else { 0.0 };
            unigrams.push((prob, backoff));
        }
        let mut higher: Vec<Vec<RawEntry>> = Vec::with_capacity(order - 1);
        let mut n_below = n_words;
        for m in 2..=order {
            let is_top = m == order;
            let count_at = cursor.at;
            let n_entries = cursor.count(3, "n-gram count")?;
            let mut entries = Vec::with_capacity(n_entries);
            for context in 0..n_below as u32 {
                let group_at = cursor.at;
                let n_children = cursor.count(3, "continuation count")?;
                let mut previous: Option<TokenId> = None;
                for _ in 0..n_children {
                    let word_at = cursor.at;
                    let gap = cursor.varint()?;
                    let word = u64::from(previous.unwrap_or(0)) + gap;
                    if (previous.is_some() && gap == 0) || word >= n_words as u64 {
                        return Err(NgramError::CompactInvalid {
                            offset: word_at,
                            what: "word id",
                        });
                    }
                    let word = word as TokenId;
                    previous = Some(word);
                    let prob = cursor.f16()?;
                    let backoff = if is_top { 0.0 } else { cursor.f16()? };
                    entries.push(RawEntry {
                        context,
                        word,
                        prob,
                        backoff,
                    });
                    if entries.len() > n_entries {
                        return Err(NgramError::CompactInvalid {
                            offset: group_at,
                            what: "continuation count",
                        });
                    }
                }
            }
            if entries.len() != n_entries {
                return Err(NgramError::CompactInvalid {
                    offset: count_at,
                    what: "n-gram count",
                });
            }
            n_below = n_entries;
            higher.push(entries);
        }
        if cursor.at != bytes.len() {
            return Err(NgramError::CompactInvalid {
                offset: cursor.at,
                what: "trailing bytes",
            });
        }
        NgramModel::from_built_levels(vocab, unigrams, higher)
    }
}
