//! The `*.safetensors` files of a directory: `model.safetensors`, or the
//! shards `model.safetensors.index.json`'s `weight_map` names, each mapped
//! read-only and its header checked by the `safetensors` crate (header
//! length at most 100 MB and within the file, offsets contiguous, each
//! tensor's byte length its shape times its dtype, the data ending at the
//! file's end) before any tensor is read.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::SafeTensors;
use serde_json::Value;

use super::HfError;
use super::config::read_json_object;
use crate::gguf::map_read_only;
use crate::quant::GgmlType;

/// One safetensors file, mapped (and open, to validate tensors by reading
/// rather than through the map).
pub(crate) struct Shard {
    pub path: PathBuf,
    file: File,
    map: Mmap,
}

/// Bytes read at a time by [`Shard::validate`] (whole F32, F16 and BF16
/// values).
const VALIDATE_CHUNK: usize = 4 << 20;

impl Shard {
    /// The file's tensors, its header checked.
    pub fn tensors(&self) -> Result<SafeTensors<'_>, HfError> {
        SafeTensors::deserialize(&self.map).map_err(|e| HfError::Safetensors {
            path: self.path.clone(),
            reason: e.to_string(),
        })
    }

    /// The byte range of `data`, a slice of this shard's map.
    pub fn range_of(&self, data: &[u8]) -> Option<std::ops::Range<usize>> {
        let start = (data.as_ptr() as usize).checked_sub(self.map.as_ptr() as usize)?;
        let range = start..start.checked_add(data.len())?;
        (range.end <= self.map.len()).then_some(range)
    }

    /// Checks the values of `range` finite (`GgmlType::validate`), reading
    /// the file a chunk at a time: the map's pages are not touched, so
    /// loading leaves none resident.
    pub fn validate(&self, range: std::ops::Range<usize>, ty: GgmlType) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let mut buffer = vec![0; VALIDATE_CHUNK.min(range.len())];
        let mut at = range.start;
        while at < range.end {
            let n = VALIDATE_CHUNK.min(range.end - at);
            self.file
                .read_exact_at(&mut buffer[..n], at as u64)
                .map_err(|e| format!("cannot read bytes at {at}: {e}"))?;
            if !all_finite(ty, &buffer[..n]) {
                // The first bad value, named as the GGUF loader names it.
                ty.validate(&buffer[..n])
                    .map_err(|e| format!("{e} (in the {n} bytes at file offset {at})"))?;
            }
            at += n;
        }
        Ok(())
    }

    /// The map, for the assembled file to borrow from.
    pub fn into_map(self) -> Mmap {
        self.map
    }
}

/// The shards of `dir`, and the index's tensor-to-shard map when sharded
/// (to check each tensor is where the index says).
pub(crate) struct Shards {
    pub shards: Vec<Shard>,
    pub index: Option<(PathBuf, HashMap<String, String>)>,
}

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// Opens and maps the safetensors files of `dir`.
pub(crate) fn open(dir: &Path) -> Result<Shards, HfError> {
    let index_path = dir.join(INDEX);
    if !index_path.exists() {
        let shard = map(&dir.join(SINGLE))?;
        return Ok(Shards {
            shards: vec![shard],
            index: None,
        });
    }
    let json = read_json_object(&index_path)?;
    let bad = |reason: String| HfError::Index {
        path: index_path.clone(),
        reason,
    };
    let Some(Value::Object(weight_map)) = json.get("weight_map") else {
        return Err(HfError::MissingField {
            path: index_path.clone(),
            field: "weight_map".into(),
        });
    };
    let mut files = BTreeSet::new();
    let mut placed = HashMap::with_capacity(weight_map.len());
    for (name, file) in weight_map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("{name:?} maps to {file}, not a file name")))?;
        // A plain file name beside the index: no directories, no `..`.
        if file.is_empty() || file.contains(['/', '\\']) || file == ".." || file == "." {
            return Err(bad(format!("{file:?} is not a file name in the directory")));
        }
        files.insert(file.to_owned());
        placed.insert(name.clone(), file.to_owned());
    }
    if files.is_empty() {
        return Err(bad("names no tensor".into()));
    }
    let shards = files
        .iter()
        .map(|file| {
            let path = dir.join(file);
            if !path.is_file() {
                return Err(bad(format!("shard {file:?} is missing")));
            }
            map(&path)
        })
        .collect::<Result<_, _>>()?;
    Ok(Shards {
        shards,
        index: Some((index_path, placed)),
    })
}

/// Maps `path` read-only.
fn map(path: &Path) -> Result<Shard, HfError> {
    let io = |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(io(std::io::Error::other("not a regular file")));
    }
    Ok(Shard {
        path: path.to_path_buf(),
        map: map_read_only(&file).map_err(io)?,
        file,
    })
}

/// Whether every value of `data` (F32, F16 or BF16; other types are left
/// to `GgmlType::validate`) is finite: its exponent bits not all set.
/// Eight bytes at a time, each lane's exponent masked and tested for all
/// ones by the zero-lane trick (a lane of `(x & m) ^ m` is zero exactly
/// when its exponent is all ones; the masks leave each lane's top bit
/// clear, so `(y - 1) & high` sets a lane's top bit only after a zero
/// lane): a branch-free pass the compiler vectorizes, many times faster
/// than the per-value check, which then runs only to name a bad value.
pub(super) fn all_finite(ty: GgmlType, data: &[u8]) -> bool {
    let (mask, ones, high) = match ty {
        GgmlType::F32 => (
            0x7F80_0000_7F80_0000_u64,
            0x0000_0001_0000_0001,
            0x8000_0000_8000_0000,
        ),
        GgmlType::F16 => (
            0x7C00_7C00_7C00_7C00,
            0x0001_0001_0001_0001,
            0x8000_8000_8000_8000,
        ),
        GgmlType::BF16 => (
            0x7F80_7F80_7F80_7F80,
            0x0001_0001_0001_0001,
            0x8000_8000_8000_8000,
        ),
        _ => return false,
    };
    let zero_lane = |word: u64| {
        let y = (word & mask) ^ mask;
        y.wrapping_sub(ones) & high
    };
    let words = data.chunks_exact(8);
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    let any = words.fold(0, |any, word| {
        any | zero_lane(u64::from_le_bytes(word.try_into().unwrap_or_default()))
    });
    (any | zero_lane(u64::from_le_bytes(tail))) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 16-bit pattern in every lane, against the per-value check.
    #[test]
    fn all_finite_agrees_with_validate_on_every_half_and_bf16_pattern() {
        for ty in [GgmlType::F16, GgmlType::BF16] {
            for bits in 0..=u16::MAX {
                for lane in 0..5 {
                    let mut data = vec![0u8; 10];
                    data[2 * lane..2 * lane + 2].copy_from_slice(&bits.to_le_bytes());
                    assert_eq!(
                        all_finite(ty, &data),
                        ty.validate(&data).is_ok(),
                        "{ty:?} {bits:#x} lane {lane}"
                    );
                }
            }
        }
        for bits in [
            0x7F80_0000_u32,
            0xFF80_0000,
            0x7FC0_0001,
            0x7F7F_FFFF,
            0x8000_0000,
            1,
        ] {
            for lane in 0..3 {
                let mut data = vec![0u8; 12];
                data[4 * lane..4 * lane + 4].copy_from_slice(&bits.to_le_bytes());
                assert_eq!(
                    all_finite(GgmlType::F32, &data),
                    GgmlType::F32.validate(&data).is_ok(),
                    "{bits:#x}"
                );
            }
        }
    }
}
