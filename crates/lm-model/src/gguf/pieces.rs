//! A GGUF file assembled from pieces instead of read from one buffer: its
//! header (metadata and tensor infos) in memory, and each tensor's bytes
//! either a range of a read-only file map (a Hugging Face checkpoint's
//! safetensors shard, borrowed as it is) or a buffer of its own (a tensor
//! whose bytes had to change: llama's permuted q/k rows, a norm made F32).
//!
//! ```text
//! offset 0 ........ data_offset ... data_offset + info.offset ..........
//! | head (Vec<u8>) |  pad  | piece: map[k][range] | pad | piece: Vec<u8> |
//! ```
//!
//! The GGUF reader addresses the file by offsets as always; a range that
//! is not one piece's (or within the head) reads as absent, which the
//! reader reports as a tensor outside the data section.

use std::ops::Range;

use memmap2::Mmap;

/// Where a piece's bytes are.
pub(crate) enum PieceSource {
    /// `range` of the map `map` (an index into [`Pieces`]' maps).
    Mapped { map: usize, range: Range<usize> },
    /// A buffer of the piece's own.
    Owned(Vec<u8>),
}

/// One tensor's bytes, starting at `start` of the assembled file.
pub(crate) struct Piece {
    pub start: usize,
    pub source: PieceSource,
}

/// The assembled file: `head` holds bytes `0..head.len()`, the pieces the
/// rest (sorted by start, not overlapping).
pub(crate) struct Pieces {
    head: Vec<u8>,
    maps: Vec<Mmap>,
    pieces: Vec<Piece>,
    len: usize,
}

impl Pieces {
    /// Assembles `head` and `pieces`; `None` when a piece overlaps the head
    /// or another piece, or a mapped range lies outside its map.
    pub fn new(head: Vec<u8>, maps: Vec<Mmap>, mut pieces: Vec<Piece>) -> Option<Pieces> {
        pieces.sort_by_key(|piece| piece.start);
        let mut end = head.len();
        for piece in &pieces {
            if let PieceSource::Mapped { map, range } = &piece.source {
                maps.get(*map)?.get(range.clone())?;
            }
            if piece.start < end {
                return None;
            }
            end = piece.start.checked_add(len_of(&piece.source))?;
        }
        Some(Pieces {
            head,
            maps,
            pieces,
            len: end,
        })
    }

    /// Bytes `0..data_offset`: the header, metadata and tensor infos.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// The assembled file's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes of `range` when it lies within the head or one piece.
    pub fn slice(&self, range: Range<usize>) -> Option<&[u8]> {
        if range.end <= self.head.len() {
            return self.head.get(range);
        }
        let idx = self
            .pieces
            .partition_point(|piece| piece.start <= range.start)
            .checked_sub(1)?;
        let piece = &self.pieces[idx];
        let bytes = match &piece.source {
            PieceSource::Mapped { map, range } => &self.maps[*map][range.clone()],
            PieceSource::Owned(bytes) => bytes,
        };
        bytes.get(range.start - piece.start..range.end.checked_sub(piece.start)?)
    }
}

fn len_of(source: &PieceSource) -> usize {
    match source {
        PieceSource::Mapped { range, .. } => range.len(),
        PieceSource::Owned(bytes) => bytes.len(),
    }
}
