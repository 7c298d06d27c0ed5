//! `lm-cli embed`: one L2-normalised vector per text from a transformer's
//! final hidden states (the facade's `lm::embed_tokens`, what `lm-cli
//! serve`'s `/v1/embeddings` answers), printed as JSON.

use anyhow::{Result, bail};
use serde_json::json;

use crate::cli::EmbedArgs;
use crate::output::Output;
use crate::spec::Backend;

/// Runs `lm-cli embed`: prints `{"pooling", "data": [{"index", "n_tokens",
/// "embedding"}]}`, one entry per `--text`, in order.
pub fn run(args: EmbedArgs) -> Result<()> {
    let (loaded, _) = crate::commands::load_model(&args.model)?;
    let decoder = match &loaded.backend {
        Backend::Llama(decoder) | Backend::Toy(decoder) => decoder,
        Backend::Count(_) => {
            bail!("a count model has no hidden states to embed with: give a transformer (--model)")
        }
    };
    let mut data = Vec::with_capacity(args.text.len());
    for (index, text) in args.text.iter().enumerate() {
        let ids = loaded.codec.encode(text)?;
        let embedding = lm::embed_tokens(decoder, &ids, args.pooling)?;
        data.push(json!({"index": index, "n_tokens": ids.len(), "embedding": embedding}));
    }
    Output::stdout().write_json(&json!({"pooling": args.pooling.to_string(), "data": data}))
}
