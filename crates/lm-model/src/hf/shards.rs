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

/// One safetensors file, mapped.
pub(crate) struct Shard {
    pub path: PathBuf,
    map: Mmap,
}

impl Shard {
    /// The file's tensors, its header checked.
    pub fn tensors(&self) -> Result<SafeTensors<'_>, HfError> {
        SafeTensors::deserialize(&self.map).map_err(|e| HfError::Safetensors {
            path: self.path.clone(),
            reason: e.to_string(),
        })
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
    })
}
