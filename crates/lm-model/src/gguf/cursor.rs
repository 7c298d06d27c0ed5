//! A bounds-checked little-endian reader over the file's bytes.
//!
//! Every read checks the remaining length first and reports what was being
//! read and where; counts are checked against the bytes left before anything
//! is allocated for them.

use super::GgufError;

/// A position in a byte slice; reads advance it.
#[derive(Debug)]
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, pos: 0 }
    }

    /// The current offset from the start.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current offset.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes, or a `Truncated` error naming `what`.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n as u64,
                available: self.remaining() as u64,
            })?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// A little-endian u32.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A little-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a count and checks that `count` items of at least `min_item_bytes`
    /// each fit in the rest of the file, so it is safe to allocate for them.
    pub fn count(&mut self, what: &'static str, min_item_bytes: u64) -> Result<usize, GgufError> {
        let offset = self.pos as u64;
        let count = self.u64(what)?;
        let remaining = self.remaining() as u64;
        let fits = count
            .checked_mul(min_item_bytes)
            .is_some_and(|total| total <= remaining);
        match usize::try_from(count) {
            Ok(count) if fits => Ok(count),
            _ => Err(GgufError::CountBeyondFile {
                what,
                count,
                min_item_bytes,
                offset,
                remaining,
            }),
        }
    }

    /// A GGUF string: a u64 byte length, then that many UTF-8 bytes.
    pub fn string(&mut self, what: &'static str) -> Result<&'a str, GgufError> {
        let len = self.u64(what)?;
        let offset = self.pos as u64;
        let remaining = self.remaining() as u64;
        let n = usize::try_from(len)
            .ok()
            .filter(|&n| n <= self.remaining())
            .ok_or(GgufError::StringBeyondFile {
                what,
                len,
                offset,
                remaining,
            })?;
        let bytes = self.take(n, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { what, offset })
    }
}
