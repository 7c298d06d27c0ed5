//! One module per subcommand, each with a `run(args)`.

pub mod chat;
pub mod completions;
pub mod enumerate;
pub mod generate;
pub mod probs;
pub mod quantize;
pub mod score;
pub mod serve;
pub mod tokenize;
pub mod train;

use anyhow::{Context, Result};

use lm_model::KvPrecision;

use crate::cli::{KvType, ModelArgs};
use crate::spec::{Backend, LoadOptions, LoadedModel, ModelSpec, RunOptions};

/// Loads the model `args` names (the embedded default when none), after
/// sizing the thread pool, with the options every model command runs it
/// under: the one preamble of `generate`, `chat`, `score` and `enumerate`.
pub fn load_model(args: &ModelArgs) -> Result<(LoadedModel, RunOptions)> {
    let context_length = args.context_length.map(generate::to_usize);
    configure_threads(args.threads)?;
    let spec = ModelSpec::or_default(args.model.as_ref());
    let mut loaded = match (args.quantize, &spec) {
        (Some(_), _) if args.mmap => {
            anyhow::bail!("--mmap maps a GGUF file; --quantize converts a Hugging Face directory")
        }
        (Some(ty), ModelSpec::Gguf(dir)) if dir.is_dir() => {
            let lm::GgufModel { decoder, text } = lm::load_hf_dir_quantized(dir, ty.ggml_type())?;
            LoadedModel {
                backend: Backend::Llama(Box::new(decoder)),
                codec: crate::text::TextCodec::Bpe(Box::new(text)),
            }
        }
        (Some(_), _) => anyhow::bail!(
            "--quantize quantizes a Hugging Face directory while loading; {spec} is not one"
        ),
        (None, _) => spec.load(LoadOptions {
            context_length,
            mmap: args.mmap,
        })?,
    };
    if let Some(kv_type) = args.kv_type {
        loaded.backend = with_kv_type(loaded.backend, kv_type)?;
    }
    let options = RunOptions {
        no_cache: args.no_cache,
        context_length,
    };
    Ok((loaded, options))
}

/// `backend` with its KV cache stored as `kv_type` says (`--kv-type`); a
/// count model has no KV cache, so the flag is refused for it.
fn with_kv_type(backend: Backend, kv_type: KvType) -> Result<Backend> {
    let precision = match kv_type {
        KvType::F32 => KvPrecision::F32,
        KvType::F16 => KvPrecision::F16,
        KvType::Q8_0 => KvPrecision::Q8_0,
    };
    match backend {
        Backend::Toy(decoder) => Ok(Backend::Toy(Box::new(decoder.with_kv_precision(precision)))),
        Backend::Llama(decoder) => Ok(Backend::Llama(Box::new(
            decoder.with_kv_precision(precision),
        ))),
        Backend::Count(_) => {
            anyhow::bail!("--kv-type applies to transformer models; a count model has no KV cache")
        }
    }
}

/// Sizes rayon's global pool (the model's matrix products) to `threads`
/// when given. Results do not depend on it: each output row is computed by
/// one thread in a fixed order.
pub fn configure_threads(threads: Option<u64>) -> Result<()> {
    let Some(threads) = threads else {
        return Ok(());
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(generate::to_usize(threads))
        .build_global()
        .with_context(|| format!("starting {threads} worker threads"))
}
