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

use crate::cli::ModelArgs;
use crate::spec::{LoadedModel, ModelSpec, RunOptions};

/// Loads the model `args` names (the embedded default when none), after
/// sizing the thread pool, with the options every model command runs it
/// under: the one preamble of `generate`, `chat`, `score` and `enumerate`.
pub fn load_model(args: &ModelArgs) -> Result<(LoadedModel, RunOptions)> {
    let context_length = args.context_length.map(generate::to_usize);
    configure_threads(args.threads)?;
    let loaded = ModelSpec::or_default(args.model.as_ref()).load(context_length)?;
    let options = RunOptions {
        no_cache: args.no_cache,
        context_length,
    };
    Ok((loaded, options))
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
