//! Hugging Face model directories (`config.json` and `*.safetensors`) as
//! the GGUF file llama.cpp's `convert_hf_to_gguf.py` would write from them,
//! assembled from pieces so that the one GGUF loader (and the one mapping of
//! metadata to a `TransformerConfig`, `transformer/arch.rs`) serves both.
//!
//! ```text
//! dir/config.json ───────── config.rs: a table per class ──> {arch}.* metadata
//!                                      rope_scaling llama3 ─> rope_freqs.weight
//!                                      rope_scaling longrope > rope_factors_{long,short}.weight
//! dir/model.safetensors ─┐
//!   or the shards of     ├─ shards.rs: mapped, headers checked by the safetensors crate
//!   model.safetensors.index.json
//!                        └─ names.rs: HF names to GGUF's, shapes checked,
//!                           q/k rows permuted (llama), norms + 1 (gemma),
//!                           one matrix per expert stacked into *_exps,
//!                           gpt-oss's MXFP4 blocks + scales repacked (mxfp4.rs)
//!                                   │
//!        GgufWriter::head ──────────┴──> GgufFile::from_pieces ──> Llama::from_file
//!        (header in memory)              (tensors: ranges of the maps, or copies)
//! ```
//!
//! Types: F32, F16 and BF16 matrices are kept as they are (the matrix
//! code reads all three); 1-D tensors (norm gains, biases) and gpt-oss's
//! 2-D expert biases become F32, as the converter writes them; gpt-oss's
//! MXFP4 experts (U8 `*_blocks` and `*_scales`) become GGUF's MXFP4. Any
//! other dtype is refused by name.
//!
//! Cost: nothing is copied but what must change. The file is assembled
//! from pieces (`gguf/pieces.rs`): its header in memory, each F32, F16 or
//! BF16 matrix a range of its shard's read-only map, used in place; only
//! llama's q/k matrices (rows permuted), the 1-D tensors (made F32, Gemma's
//! `+ 1`), the generated `rope_freqs.weight` / `rope_factors_*` and the
//! experts are buffers of their own.
//!
//! Every value is checked finite at load by reading the files (`pread`),
//! not the maps, so resident memory after loading is the copies alone and
//! grows with use as pages of the maps are read (measured in
//! docs/performance.md).
//!
//! Experts: Hugging Face stores each expert's matrices as their own 2-d
//! tensors (`mlp.experts.{e}.gate_proj`, Mixtral's
//! `block_sparse_moe.experts.{e}.w1`), the GGUF path's mixture reads one
//! 3-d `ffn_{gate,up,down}_exps` per layer, so a layer's experts are
//! copied, in expert order, into one buffer at load (the tensor the
//! converter writes). The cost: a mixture's expert weights are resident
//! from the start, instead of mapped and paged in as the router chooses
//! them (as a GGUF file's are): Qwen3-30B-A3B in BF16 holds 29 billion
//! expert weights, 54 GiB of RAM (with `--quantize q4_k`, the quantized
//! size). Using each expert's matrix in place would need the mixture
//! (`transformer/moe.rs`) to take one matrix per expert.
//!
//! gpt-oss's experts are one tensor per projection already, but not in
//! GGML's bytes: a block's scale and codes live in two tensors and the
//! codes' nibbles are in another order (`mxfp4.rs`), and gate and up rows
//! alternate in one tensor. They are repacked at load into buffers of
//! their own, the size of the HF tensors (17 bytes per 32 weights):
//! gpt-oss-20b's experts are 19.1 billion weights, 9.5 GiB resident from
//! the start (gpt-oss-120b's 115 billion, 57 GiB), where a GGUF file's are
//! mapped and paged in as the router chooses them.
//!
//! Bad input is a [`HfError`] naming the file and the field or tensor: no
//! `config.json`, an unknown class, a shard missing from the index, a
//! tensor of the wrong shape or dtype or name, a safetensors header that
//! lies. Nothing is allocated by a size read from a header before the
//! safetensors crate has checked it against the file's length.

mod config;
mod error;
mod mxfp4;
mod names;
mod shards;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use rayon::prelude::*;
use safetensors::Dtype;

pub use error::HfError;

use crate::gguf::{GgufFile, GgufWriter, MetadataValue, Piece, PieceSource, Pieces, TensorInfo};
use crate::quant::GgmlType;
use config::HfConfig;
use names::{Mapped, Transform};

/// The Hugging Face classes (`config.json`'s `architectures`) that
/// [`open_hf_dir`] reads.
pub const SUPPORTED_HF_CLASSES: [&str; 15] = config::SUPPORTED_CLASSES;

/// Reads the Hugging Face model directory `dir` into an in-memory GGUF
/// file (its `{arch}.*` metadata and tensors; no `tokenizer.*` keys: the
/// `lm` crate reads `tokenizer.json` itself).
pub fn open_hf_dir(dir: impl AsRef<Path>) -> Result<GgufFile, HfError> {
    open(dir.as_ref(), None)
}

/// Reads `dir` as [`open_hf_dir`] does, quantizing to `ty` while loading
/// (in-situ quantization) every matrix whose rows split into `ty`'s
/// blocks (the others, and the 1-D tensors, as [`open_hf_dir`] keeps
/// them): each row dequantized to f32 and quantized by ggml's reference
/// quantizer ([`GgmlType::quantize_row`]), what `lm-cli quantize DIR OUT
/// TYPE` writes for those matrices without llama.cpp's per-tensor mixes.
/// A type this crate cannot quantize to is a [`HfError::Quantize`].
pub fn open_hf_dir_quantized(dir: impl AsRef<Path>, ty: GgmlType) -> Result<GgufFile, HfError> {
    let dir = dir.as_ref();
    if !ty.can_quantize() || is_float(ty) {
        return Err(HfError::Quantize {
            path: dir.to_path_buf(),
            reason: format!("{ty} is not a type weights are quantized to"),
        });
    }
    open(dir, Some(ty))
}

/// [`open_hf_dir`], with the matrices quantized to `quantize` when given.
fn open(dir: &Path, quantize: Option<GgmlType>) -> Result<GgufFile, HfError> {
    let config = config::read(dir)?;
    let shards = shards::open(dir)?;
    let views = shards
        .shards
        .iter()
        .map(shards::Shard::tensors)
        .collect::<Result<Vec<_>, _>>()?;
    // Every tensor once, mapped and checked, in the files' order; a
    // layer's experts gathered into one tensor where the first was met.
    let mut tensors: Vec<Tensor> = Vec::new();
    let mut stacked: HashMap<String, usize> = HashMap::new();
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
            for mapped in names::map(&config.arch, &config.dims, config.tied, name).map_err(bad)? {
                if tensor.shape() != mapped.shape.as_slice() {
                    return Err(bad(format!(
                        "shape {:?}, config.json gives {:?}",
                        tensor.shape(),
                        mapped.shape
                    )));
                }
                let dtype = tensor.dtype();
                match mapped.transform {
                    Transform::Mxfp4(_) if dtype != Dtype::U8 => {
                        return Err(bad(format!(
                            "dtype {dtype:?} (MXFP4 blocks and scales are U8)"
                        )));
                    }
                    Transform::Mxfp4(_) => {}
                    _ if !matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) => {
                        return Err(bad(format!("dtype {dtype:?} (F32, F16 or BF16 are read)")));
                    }
                    _ => {}
                }
                let part = Part {
                    shard: shard_idx,
                    name: name.to_owned(),
                };
                let Some((part_idx, n_parts)) = mapped.part else {
                    tensors.push(Tensor::new(mapped, dtype, vec![Some(part)], quantize));
                    continue;
                };
                let idx = *stacked.entry(mapped.gguf.clone()).or_insert_with(|| {
                    let parts = vec![None; n_parts];
                    tensors.push(Tensor::new(mapped, dtype, parts, quantize));
                    tensors.len() - 1
                });
                if tensors[idx].dtype != dtype {
                    return Err(bad(format!(
                        "dtype {dtype:?}, the layer's other experts {:?}",
                        tensors[idx].dtype
                    )));
                }
                tensors[idx].parts[part_idx] = Some(part);
            }
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
    check_complete(dir, &config, &tensors)?;
    let tensors: Vec<Tensor> = tensors;
    let writer = writer(&config, &tensors).map_err(|e| HfError::assemble(dir, e))?;
    let (head, placed) = writer.head().map_err(|e| HfError::assemble(dir, e))?;
    let data_offset = head.len();
    // In parallel: each piece's values are read and checked.
    let pieces = placed
        .par_iter()
        .enumerate()
        .map(|(idx, info)| {
            let source = piece(&config, &tensors, &shards, &views, idx, info)?;
            Ok(Piece {
                start: data_offset + info.offset,
                source,
            })
        })
        .collect::<Result<Vec<_>, HfError>>()?;
    drop(views);
    let maps = shards
        .shards
        .into_iter()
        .map(shards::Shard::into_map)
        .collect();
    let pieces = Pieces::new(head, maps, pieces).ok_or_else(|| HfError::Tensor {
        path: dir.to_path_buf(),
        name: "(all)".into(),
        reason: "tensor ranges overlap".into(),
    })?;
    GgufFile::from_pieces(pieces).map_err(|e| HfError::assemble(dir, e))
}

/// Where tensor `idx` of the GGUF (after the generated F32 tensors) is: a
/// range of its shard's map when its bytes are used as they are (one HF
/// matrix kept F32, F16 or BF16), else a buffer of its own (a vector made
/// F32, rows permuted, experts stacked, quantized). Either way its values
/// are checked finite here, a map's through the file (`pread`), so that no
/// page of it is left resident by loading.
fn piece(
    config: &HfConfig,
    tensors: &[Tensor],
    shards: &shards::Shards,
    views: &[safetensors::SafeTensors<'_>],
    idx: usize,
    info: &TensorInfo,
) -> Result<PieceSource, HfError> {
    let Some(tensor) = idx
        .checked_sub(config.generated.len())
        .map(|idx| &tensors[idx])
    else {
        let values = &config.generated[idx].1;
        return Ok(PieceSource::Owned(f32_bytes(values.iter().copied())));
    };
    let first = tensor.parts().next().expect("a tensor has a part");
    let shard = &shards.shards[first.shard];
    let bad = |reason: String| HfError::Tensor {
        path: shard.path.clone(),
        name: first.name.clone(),
        reason,
    };
    if info.dims.len() > 1
        && tensor.ty == source_float_type(tensor.dtype)
        && tensor.parts.len() == 1
        && tensor.transform == Transform::Keep
        && !tensor.mapped.vector
    {
        let data = views[first.shard]
            .tensor(&first.name)
            .map_err(|e| bad(e.to_string()))?
            .data();
        let range = shard
            .range_of(data)
            .ok_or_else(|| bad("not within its file".into()))?;
        shard.validate(range.clone(), info.ggml_type).map_err(bad)?;
        return Ok(PieceSource::Mapped {
            map: first.shard,
            range,
        });
    }
    if let Transform::Mxfp4(rows) = tensor.transform {
        // Every byte is a finite MXFP4 value: nothing to check.
        return mxfp4_piece(tensor, shards, views, rows).map(PieceSource::Owned);
    }
    let data = tensor.source_bytes(views).map_err(bad)?;
    if !is_float(info.ggml_type) {
        return Ok(PieceSource::Owned(
            quantized(tensor.dtype, info, &data).map_err(bad)?,
        ));
    }
    let bytes = if info.dims.len() > 1
        && tensor.ty == source_float_type(tensor.dtype)
        && tensor.transform != Transform::PlusOne
    {
        data.into_owned()
    } else {
        let plus = if tensor.transform == Transform::PlusOne {
            1.0
        } else {
            0.0
        };
        f32_bytes(to_f32(tensor.dtype, &data).map(|v| v + plus))
    };
    if !shards::all_finite(info.ggml_type, &bytes) {
        // The first bad value, named as the GGUF loader names it.
        info.ggml_type
            .validate(&bytes)
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(PieceSource::Owned(bytes))
}

/// gpt-oss's MXFP4 experts of one projection (`rows` of them: gate's or
/// up's, or all) from HF's blocks and scales (parts 0 and 1), repacked.
fn mxfp4_piece(
    tensor: &Tensor,
    shards: &shards::Shards,
    views: &[safetensors::SafeTensors<'_>],
    rows: names::Rows,
) -> Result<Vec<u8>, HfError> {
    let mut data = Vec::with_capacity(2);
    for part in tensor.parts() {
        let bad = |reason: String| HfError::Tensor {
            path: shards.shards[part.shard].path.clone(),
            name: part.name.clone(),
            reason,
        };
        let view = views[part.shard]
            .tensor(&part.name)
            .map_err(|e| bad(e.to_string()))?;
        // Rows are the first two dimensions: expert, then output row.
        let n_rows = view.shape().iter().take(2).product::<usize>();
        let bytes = view.data();
        data.push(match rows {
            names::Rows::All => Cow::Borrowed(bytes),
            _ => Cow::Owned(
                names::pick_rows(bytes, n_rows, rows)
                    .ok_or_else(|| bad(format!("{n_rows} rows do not pair gate and up")))?,
            ),
        });
    }
    let (Some(first), [blocks, scales]) = (tensor.parts().next(), &data[..]) else {
        return Err(HfError::Tensor {
            path: PathBuf::new(),
            name: tensor.mapped.gguf.clone(),
            reason: "MXFP4 blocks or scales missing".into(),
        });
    };
    mxfp4::ggml_blocks(blocks, scales).ok_or_else(|| HfError::Tensor {
        path: shards.shards[first.shard].path.clone(),
        name: first.name.clone(),
        reason: "not one scale per block".into(),
    })
}

/// One GGUF tensor of the checkpoint: one HF tensor, or a layer's experts,
/// one HF matrix each, stacked in expert order into GGUF's 3-d `*_exps`,
/// or gpt-oss's MXFP4 blocks and scales of one projection.
struct Tensor {
    /// GGUF name, shape (HF order: experts first when stacked), transform.
    mapped: Mapped,
    /// The source dtype, the same for every part.
    dtype: Dtype,
    /// The GGUF type written.
    ty: GgmlType,
    /// The HF tensors, one per expert when stacked (`None` until found).
    parts: Vec<Option<Part>>,
    transform: Transform,
}

/// One HF tensor: its shard and name.
#[derive(Debug, Clone)]
struct Part {
    shard: usize,
    name: String,
}

impl Tensor {
    /// The tensor `mapped` of source `dtype`, written as `quantize` when
    /// given and its rows split into that type's blocks; MXFP4 experts stay
    /// MXFP4, vectors and biases become F32 (as the converter writes them).
    fn new(
        mapped: Mapped,
        dtype: Dtype,
        parts: Vec<Option<Part>>,
        quantize: Option<GgmlType>,
    ) -> Self {
        let shape = &mapped.out_shape;
        let ty = match quantize {
            _ if matches!(mapped.transform, Transform::Mxfp4(_)) => GgmlType::MXFP4,
            _ if mapped.gguf.ends_with(".bias") => GgmlType::F32,
            Some(target)
                if shape.len() >= 2
                    && !mapped.vector
                    && shape[shape.len() - 1].is_multiple_of(target.block_size()) =>
            {
                target
            }
            _ if shape.len() == 1 || mapped.vector => GgmlType::F32,
            _ => source_float_type(dtype),
        };
        Tensor {
            transform: mapped.transform,
            mapped,
            dtype,
            ty,
            parts,
        }
    }

    fn parts(&self) -> impl Iterator<Item = &Part> {
        self.parts.iter().flatten()
    }

    /// The values in the source dtype, rows permuted (llama's q/k) or
    /// picked (gpt-oss's gate, up biases) and experts stacked: borrowed
    /// from the map when there is nothing to do.
    fn source_bytes<'a>(
        &self,
        views: &'a [safetensors::SafeTensors<'_>],
    ) -> Result<Cow<'a, [u8]>, String> {
        let data = |part: &Part| -> Result<&'a [u8], String> {
            Ok(views[part.shard]
                .tensor(&part.name)
                .map_err(|e| e.to_string())?
                .data())
        };
        let mut parts = self.parts();
        let first = parts.next().ok_or("no part")?;
        if self.parts.len() > 1 {
            let mut out = data(first)?.to_vec();
            for part in parts {
                out.extend_from_slice(data(part)?);
            }
            return Ok(Cow::Owned(out));
        }
        let data = data(first)?;
        match self.transform {
            Transform::Permute { n_head } => {
                let n_rows = self.mapped.shape[0];
                let row_bytes = data.len() / n_rows.max(1);
                names::permute_rows(data, row_bytes, n_head)
                    .map(Cow::Owned)
                    .ok_or_else(|| {
                        format!("{n_rows} rows do not split into {n_head} heads of pairs")
                    })
            }
            Transform::Rows(rows) => {
                let n_rows = self.mapped.shape.iter().take(2).product::<usize>();
                names::pick_rows(data, n_rows, rows)
                    .map(Cow::Owned)
                    .ok_or_else(|| format!("{n_rows} rows do not pair gate and up"))
            }
            Transform::Keep | Transform::PlusOne | Transform::Mxfp4(_) => Ok(Cow::Borrowed(data)),
        }
    }
}

/// A missing required tensor named by its HF name (an expert's matrix by
/// the expert's); a missing `lm_head.weight` when the embeddings are not
/// tied.
fn check_complete(dir: &Path, config: &HfConfig, tensors: &[Tensor]) -> Result<(), HfError> {
    let mut present: std::collections::HashSet<String> = std::collections::HashSet::new();
    for tensor in tensors {
        present.insert(tensor.mapped.gguf.clone());
        if tensor.parts.len() > 1 {
            for (idx, part) in tensor.parts.iter().enumerate() {
                if part.is_some() {
                    present.insert(format!("{}#{idx}", tensor.mapped.gguf));
                }
            }
        }
    }
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

/// The writer: config.json's metadata, the generated F32 tensors
/// (`rope_freqs.weight`, `rope_factors_*`), then the checkpoint's.
fn writer(config: &HfConfig, tensors: &[Tensor]) -> Result<GgufWriter, crate::gguf::WriteError> {
    let mut writer = GgufWriter::new();
    for (key, value) in &config.metadata {
        writer.set(key, value.clone());
    }
    writer.set("tokenizer.ggml.model", MetadataValue::String("none".into()));
    for (name, values) in &config.generated {
        writer.add_tensor(name, &[values.len()], GgmlType::F32)?;
    }
    for tensor in tensors {
        let shape = &tensor.mapped.out_shape;
        let dims: Vec<usize> = match tensor.mapped.vector {
            true => vec![shape.iter().product()],
            false => shape.iter().rev().copied().collect(),
        };
        writer.add_tensor(&tensor.mapped.gguf, &dims, tensor.ty)?;
    }
    Ok(writer)
}

/// `data` (source `dtype`) quantized to `info`'s type, row by row in
/// parallel: each row converted to f32 into a buffer of the thread's,
/// checked finite, quantized (no f32 copy of the whole tensor).
fn quantized(dtype: Dtype, info: &TensorInfo, data: &[u8]) -> Result<Vec<u8>, String> {
    let row_len = info.dims[0];
    let n_rows = info.n_rows().max(1);
    let mut out = vec![0; info.n_bytes];
    out.par_chunks_mut(info.n_bytes / n_rows)
        .zip(data.par_chunks(data.len() / n_rows))
        .enumerate()
        .try_for_each_init(
            || vec![0f32; row_len],
            |row, (r, (dst, src))| {
                row_to_f32(dtype, src, row);
                if let Some(at) = row.iter().position(|v| !v.is_finite()) {
                    return Err(format!("value {} is {}", r * row_len + at, row[at]));
                }
                info.ggml_type
                    .quantize_row(row, dst)
                    .map_err(|e| e.to_string())
            },
        )?;
    Ok(out)
}

/// Converts the little-endian float values of `src` (of `dtype`) into `out`.
fn row_to_f32(dtype: Dtype, src: &[u8], out: &mut [f32]) {
    match dtype {
        Dtype::F16 => {
            for (v, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *v = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        Dtype::BF16 => {
            for (v, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *v = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        _ => {
            for (v, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// Whether `ty` is a float type (used from the map as it is).
fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The GGUF float type of a safetensors float dtype.
fn source_float_type(dtype: Dtype) -> GgmlType {
    match dtype {
        Dtype::F16 => GgmlType::F16,
        Dtype::BF16 => GgmlType::BF16,
        _ => GgmlType::F32,
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
