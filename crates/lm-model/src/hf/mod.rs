//! Hugging Face model directories (`config.json` and `*.safetensors`) as
//! the GGUF file llama.cpp's `convert_hf_to_gguf.py` would write from them,
//! assembled in memory so that the one GGUF loader (and the one mapping of
//! metadata to a `TransformerConfig`, `transformer/arch.rs`) serves both.
//!
//! ```text
//! dir/config.json ───────── config.rs: a table per class ──> {arch}.* metadata
//!                                      rope_scaling llama3 ─> rope_freqs.weight
//! dir/model.safetensors ─┐
//!   or the shards of     ├─ shards.rs: mapped, headers checked by the safetensors crate
//!   model.safetensors.index.json
//!                        └─ names.rs: HF names to GGUF's, shapes checked,
//!                           q/k rows permuted (llama), norms + 1 (gemma3)
//!                                   │
//!        GgufWriter::write_to_vec ──┴──> GgufFile::from_bytes ──> Llama::from_file
//! ```
//!
//! Types: F32, F16 and BF16 matrices are kept as they are (the matrix
//! code reads all three); 1-D tensors (norm gains, biases) become F32, as
//! the converter writes them. Any other dtype is refused by name.
//!
//! Cost: the assembled GGUF is one copy of the weights in memory (the
//! checkpoint's maps are dropped once it is built), the same memory a GGUF
//! file read by [`GgufFile::open`] takes, but the bytes are copied once
//! more on the way. Running from the maps instead would need a tensor
//! source that borrows from several files: `GgufFile` owns one buffer
//! today, so `Linear` and the norms would take their bytes from a shared
//! set of maps, and the q/k permutation and Gemma's `+ 1` (which change
//! bytes) would still need copies of those tensors.
//!
//! Bad input is a [`HfError`] naming the file and the field or tensor: no
//! `config.json`, an unknown class, a shard missing from the index, a
//! tensor of the wrong shape or dtype or name, a safetensors header that
//! lies. Nothing is allocated by a size read from a header before the
//! safetensors crate has checked it against the file's length.

mod config;
mod error;
mod names;
mod shards;

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use safetensors::Dtype;

pub use error::HfError;

use crate::gguf::{GgufFile, GgufWriter, MetadataValue, SourceError, TensorInfo};
use crate::quant::GgmlType;
use config::HfConfig;
use names::{Mapped, Transform};

/// The Hugging Face classes (`config.json`'s `architectures`) that
/// [`open_hf_dir`] reads.
pub const SUPPORTED_HF_CLASSES: [&str; 4] = config::SUPPORTED_CLASSES;

/// Reads the Hugging Face model directory `dir` into an in-memory GGUF
/// file (its `{arch}.*` metadata and tensors; no `tokenizer.*` keys: the
/// `lm` crate reads `tokenizer.json` itself).
pub fn open_hf_dir(dir: impl AsRef<Path>) -> Result<GgufFile, HfError> {
    let dir = dir.as_ref();
    let config = config::read(dir)?;
    let shards = shards::open(dir)?;
    let views = shards
        .shards
        .iter()
        .map(shards::Shard::tensors)
        .collect::<Result<Vec<_>, _>>()?;
    // Every tensor once, mapped and checked, in the files' order.
    let mut sources = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (shard_idx, view) in views.iter().enumerate() {
        let path = &shards.shards[shard_idx].path;
        let mut names: Vec<(&str, _)> = view.iter().collect();
        names.sort_by_key(|(name, _)| *name);
        for (name, tensor) in names {
            let bad = |reason: String| HfError::Tensor {
                path: path.clone(),
                name: name.to_owned(),
                reason,
            };
            if let Some((index_path, placed)) = &shards.index {
                let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
                if placed.get(name) != file.as_ref() {
                    return Err(HfError::Index {
                        path: index_path.clone(),
                        reason: format!(
                            "{name:?} is in {file:?}, the index says {:?}",
                            placed.get(name)
                        ),
                    });
                }
            }
            if seen.insert(name.to_owned(), shard_idx).is_some() {
                return Err(bad("present in two shards".into()));
            }
            let Some(mapped) =
                names::map(&config.arch, &config.dims, config.tied, name).map_err(bad)?
            else {
                continue;
            };
            if tensor.shape() != mapped.shape.as_slice() {
                return Err(bad(format!(
                    "shape {:?}, config.json gives {:?}",
                    tensor.shape(),
                    mapped.shape
                )));
            }
            let ty = match (tensor.dtype(), mapped.shape.len()) {
                (Dtype::F32 | Dtype::F16 | Dtype::BF16, 1) => GgmlType::F32,
                (Dtype::F32, _) => GgmlType::F32,
                (Dtype::F16, _) => GgmlType::F16,
                (Dtype::BF16, _) => GgmlType::BF16,
                (other, _) => {
                    return Err(bad(format!("dtype {other:?} (F32, F16 or BF16 are read)")));
                }
            };
            sources.push(Source {
                shard: shard_idx,
                name: name.to_owned(),
                dtype: tensor.dtype(),
                ty,
                mapped,
            });
        }
    }
    if let Some((index_path, placed)) = &shards.index
        && let Some(name) = placed.keys().find(|name| !seen.contains_key(*name))
    {
        return Err(HfError::Index {
            path: index_path.clone(),
            reason: format!("{name:?} is in no shard"),
        });
    }
    check_complete(dir, &config, &sources)?;
    let writer = writer(&config, &sources).map_err(|e| HfError::assemble(dir, e))?;
    let bytes = writer
        .write_to_vec(|idx, info| tensor_bytes(&config, &sources, &views, idx, info))
        .map_err(|e| HfError::assemble(dir, e))?;
    drop(views);
    drop(shards);
    GgufFile::from_bytes(bytes).map_err(|e| HfError::assemble(dir, e))
}

/// One tensor of the checkpoint and where it goes.
struct Source {
    shard: usize,
    name: String,
    dtype: Dtype,
    ty: GgmlType,
    mapped: Mapped,
}

/// A missing required tensor named by its HF name; a missing
/// `lm_head.weight` when the embeddings are not tied.
fn check_complete(dir: &Path, config: &HfConfig, sources: &[Source]) -> Result<(), HfError> {
    let present: std::collections::HashSet<&str> =
        sources.iter().map(|s| s.mapped.gguf.as_str()).collect();
    let mut required = names::required(&config.arch, &config.dims);
    if !config.tied {
        required.push(("output.weight".into(), "lm_head.weight".into()));
    }
    match required
        .iter()
        .find(|(gguf, _)| !present.contains(gguf.as_str()))
    {
        Some((_, hf)) => Err(HfError::Tensor {
            path: dir.to_path_buf(),
            name: hf.clone(),
            reason: "missing".into(),
        }),
        None => Ok(()),
    }
}

/// The writer: config.json's metadata, `rope_freqs.weight` first when
/// Llama 3 scaling gives it, then the checkpoint's tensors.
fn writer(config: &HfConfig, sources: &[Source]) -> Result<GgufWriter, crate::gguf::WriteError> {
    let mut writer = GgufWriter::new();
    for (key, value) in &config.metadata {
        writer.set(key, value.clone());
    }
    writer.set("tokenizer.ggml.model", MetadataValue::String("none".into()));
    if let Some(factors) = &config.rope_freqs {
        writer.add_tensor("rope_freqs.weight", &[factors.len()], GgmlType::F32)?;
    }
    for source in sources {
        let dims: Vec<usize> = source.mapped.shape.iter().rev().copied().collect();
        writer.add_tensor(&source.mapped.gguf, &dims, source.ty)?;
    }
    Ok(writer)
}

/// The GGUF bytes of tensor `idx` (after `rope_freqs.weight` when present).
fn tensor_bytes(
    config: &HfConfig,
    sources: &[Source],
    views: &[safetensors::SafeTensors<'_>],
    idx: usize,
    info: &TensorInfo,
) -> Result<Vec<u8>, SourceError> {
    let idx = match &config.rope_freqs {
        Some(factors) if idx == 0 => return Ok(f32_bytes(factors.iter().copied())),
        Some(_) => idx - 1,
        None => idx,
    };
    let source = &sources[idx];
    let data = views[source.shard].tensor(&source.name)?.data();
    if info.dims.len() == 1 {
        let plus = if source.mapped.transform == Transform::PlusOne {
            1.0
        } else {
            0.0
        };
        return Ok(f32_bytes(to_f32(source.dtype, data).map(|v| v + plus)));
    }
    match source.mapped.transform {
        Transform::Permute { n_head } => {
            let row_bytes = data.len() / info.n_rows().max(1);
            names::permute_rows(data, row_bytes, n_head).ok_or_else(|| {
                format!(
                    "{} rows do not split into {n_head} heads of pairs",
                    info.n_rows()
                )
                .into()
            })
        }
        Transform::Keep | Transform::PlusOne => Ok(data.to_vec()),
    }
}

/// The values of little-endian `data` of a float dtype.
fn to_f32(dtype: Dtype, data: &[u8]) -> Box<dyn Iterator<Item = f32> + '_> {
    match dtype {
        Dtype::F16 => Box::new(
            data.chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        Dtype::BF16 => Box::new(
            data.chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        _ => Box::new(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
    }
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}
