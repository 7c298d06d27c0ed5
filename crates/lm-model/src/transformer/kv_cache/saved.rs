//! A cache as a state file holds it (`state_file.rs` writes the file): the
//! position, the ring's floor, and the stored values of the chunks that
//! hold positions, as little-endian bytes; and a fresh cache filled back
//! from them. A child of `kv_cache` so it reads the chunks' storage
//! directly, and written over the storage variants generically: a new
//! precision adds one arm to [`Chunk::put_le_bytes`],
//! [`Chunk::from_le_bytes`] and [`saved_chunk_bytes`].

use std::sync::Arc;

use half::f16;

use super::{CHUNK_LEN, Chunk, KvCache, KvPrecision, KvShape, Store};

/// What a state file holds of a cache, and how it puts one back.
impl KvCache {
    /// Chunks to save per store (the full store, then the ring): those
    /// holding positions below `pos`.
    pub(in crate::transformer) fn n_saved_chunks(&self) -> (usize, usize) {
        let needed = self.pos.div_ceil(CHUNK_LEN);
        let full = needed.min(self.full.chunks.len());
        let ring = self
            .ring
            .as_ref()
            .map_or(0, |ring| needed.min(ring.chunks.len()));
        (full, ring)
    }

    /// Layers in the ring (sliding-window layers) and the ring's chunk
    /// count; `(0, 0)` without a ring.
    pub(in crate::transformer) fn ring_layout(&self) -> (usize, usize) {
        self.ring.as_ref().map_or((0, 0), |ring| {
            (ring.shape.n_layer, ring.n_ring_chunks.unwrap_or(0))
        })
    }

    /// The ring's floor (0 without a ring).
    pub(in crate::transformer) fn ring_floor(&self) -> usize {
        self.ring.as_ref().map_or(0, |ring| ring.floor)
    }

    fn saved_store(&self, ring: bool) -> Option<&Store> {
        if ring {
            self.ring.as_ref()
        } else {
            Some(&self.full)
        }
    }

    /// Bytes of one saved chunk of the full store (`ring: false`) or the
    /// ring (0 without a ring).
    pub(in crate::transformer) fn chunk_bytes(&self, ring: bool) -> usize {
        self.saved_store(ring)
            .map_or(0, |store| saved_chunk_bytes(&store.shape, self.precision))
    }

    /// Appends chunk `idx` of a store's stored values to `out`.
    pub(in crate::transformer) fn put_chunk(&self, ring: bool, idx: usize, out: &mut Vec<u8>) {
        if let Some(store) = self.saved_store(ring) {
            store.chunks[idx].put_le_bytes(out);
        }
    }

    /// Replaces the contents of this fresh cache (of the saved shape,
    /// precision and ring) with the saved chunks, at position `pos` and
    /// ring floor `floor`; `full` and `ring` hold whole saved chunks.
    pub(in crate::transformer) fn restore(
        &mut self,
        pos: usize,
        floor: usize,
        full: &[u8],
        ring: &[u8],
    ) {
        let precision = self.precision;
        let rebuild = |store: &mut Store, bytes: &[u8]| {
            let shape = store.shape;
            store.chunks = bytes
                .chunks_exact(saved_chunk_bytes(&shape, precision))
                .map(|bytes| Arc::new(Chunk::from_le_bytes(&shape, precision, bytes)))
                .collect();
        };
        rebuild(&mut self.full, full);
        if let Some(store) = &mut self.ring {
            rebuild(store, ring);
            store.floor = floor;
        }
        self.pos = pos;
    }
}

/// Bytes of one chunk of `shape` at `precision` as saved (a q8_0 chunk:
/// its int8s, then its scales).
fn saved_chunk_bytes(shape: &KvShape, precision: KvPrecision) -> usize {
    match precision {
        KvPrecision::F32 => 4 * shape.chunk_len(),
        KvPrecision::F16 => 2 * shape.chunk_len(),
        KvPrecision::Q8_0 => shape.chunk_len() + 2 * shape.n_layer * 2 * shape.half_layer_scales(),
    }
}

impl Chunk {
    /// Appends the stored values, little-endian, to `out`.
    fn put_le_bytes(&self, out: &mut Vec<u8>) {
        match self {
            Self::F32(data) => out.extend(data.iter().flat_map(|v| v.to_le_bytes())),
            Self::F16(data) => out.extend(data.iter().flat_map(|v| v.to_le_bytes())),
            Self::Q8_0 { quants, scales } => {
                out.extend(quants.iter().flat_map(|v| v.to_le_bytes()));
                out.extend(scales.iter().flat_map(|v| v.to_le_bytes()));
            }
        }
    }

    /// A chunk of `shape` at `precision` from [`Chunk::put_le_bytes`]'s
    /// bytes (exactly [`saved_chunk_bytes`] of them).
    fn from_le_bytes(shape: &KvShape, precision: KvPrecision, bytes: &[u8]) -> Self {
        let f16s = |bytes: &[u8]| -> Vec<f16> {
            bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]))
                .collect()
        };
        match precision {
            KvPrecision::F32 => Self::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            KvPrecision::F16 => Self::F16(f16s(bytes)),
            KvPrecision::Q8_0 => {
                let (quants, scales) = bytes.split_at(shape.chunk_len());
                Self::Q8_0 {
                    quants: quants.iter().map(|&b| i8::from_le_bytes([b])).collect(),
                    scales: f16s(scales),
                }
            }
        }
    }
}
