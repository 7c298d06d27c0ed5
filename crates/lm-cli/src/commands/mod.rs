//! One module per subcommand, each with a `run(args)`.

pub mod chat;
pub mod completions;
pub mod enumerate;
pub mod generate;
pub mod probs;
pub mod score;
pub mod tokenize;
pub mod train;

use anyhow::{Context, Result};

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
