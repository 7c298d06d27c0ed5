//! `lm-cli serve`: loads the model once and serves it with lm-serve's
//! OpenAI-compatible server until Ctrl-C or SIGTERM.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use lm_core::{Bounded, LanguageModel};
use lm_model::ModelFingerprint;
use lm_serve::{CacheDir, ServeConfig, ServedText, Server, SpeculativeDrafter};

use crate::cli::{DrafterArg, ServeArgs};
use crate::commands::generate::to_usize;
use crate::spec::{Backend, ModelSpec};

/// Runs `lm-cli serve`.
pub fn run(args: ServeArgs) -> Result<()> {
    let (loaded, options) = crate::commands::load_model(&args.model)?;
    anyhow::ensure!(
        !options.no_cache,
        "--no-cache is not supported by serve (every sequence keeps its cache in the batch)"
    );
    let draft = match &args.draft {
        None => None,
        Some(DrafterArg::PromptLookup) => Some(SpeculativeDrafter::PromptLookup {
            max_tokens: NonZeroUsize::new(to_usize(args.draft_tokens))
                .context("--draft-tokens must be at least 1")?,
        }),
        Some(DrafterArg::Model(spec)) => anyhow::bail!(
            "--draft {spec}: serve drafts with prompt-lookup only (a draft model's passes would \
             run outside the scheduler's batch); lm-cli generate --draft {spec} takes a draft model"
        ),
    };
    let config = ServeConfig {
        addr: std::net::SocketAddr::new(args.host, args.port),
        api_key: args.api_key.clone(),
        cors_origins: args.cors.clone(),
        parallel: to_usize(args.parallel),
        queue_len: to_usize(args.queue),
        max_body_bytes: to_usize(args.max_body_bytes),
        shutdown_grace: Duration::from_secs_f64(args.shutdown_grace),
        prefill_chunk_len: NonZeroUsize::new(to_usize(args.prefill_chunk))
            .context("--prefill-chunk must be at least 1")?,
        model_name: ModelSpec::or_default(args.model.model.as_ref()).to_string(),
        cache_bytes: to_usize(args.cache_mb).saturating_mul(1 << 20),
        parse_special: args.parse_special,
        any_model: args.any_model,
        max_formats: to_usize(args.max_formats),
        webui: !args.no_webui,
        reasoning: args.reasoning != "off",
        request_defaults: crate::model_defaults::request_defaults(&ModelSpec::or_default(
            args.model.model.as_ref(),
        ))?,
        cache_dir: args
            .cache_dir
            .as_ref()
            .map(|path| -> Result<CacheDir> {
                let spec = ModelSpec::or_default(args.model.model.as_ref());
                Ok(CacheDir {
                    path: path.clone(),
                    model: model_fingerprint(&spec)?,
                })
            })
            .transpose()?,
        draft,
    };
    let text: Arc<dyn ServedText> = Arc::new(loaded.codec);
    let bound = loaded.backend.bound(options.context_length);
    // A transformer's weights also answer /v1/embeddings (shared, not copied).
    let with_embedder = |decoder: Box<lm_model::Decoder>| {
        let decoder = Arc::new(*decoder);
        let embedder = lm::Embedder::new(Arc::clone(&decoder), args.pooling);
        (Arc::new(Bounded::new(decoder, bound)), Some(embedder))
    };
    match loaded.backend {
        Backend::Toy(model) => {
            let (model, embedder) = with_embedder(model);
            serve(model, text, config, embedder)
        }
        Backend::Count(model) => serve(Arc::new(Bounded::new(model, bound)), text, config, None),
        Backend::Llama(model) => {
            let (model, embedder) = with_embedder(model);
            serve(model, text, config, embedder)
        }
    }
}

fn serve<M>(
    model: Arc<M>,
    text: Arc<dyn ServedText>,
    config: ServeConfig,
    embedder: Option<lm::Embedder>,
) -> Result<()>
where
    M: LanguageModel + Send + Sync + 'static,
    M::State: lm_serve::StateSize + lm_serve::SavedState + Send + 'static,
{
    let (parallel, name) = (config.parallel, config.model_name.clone());
    if !config.request_defaults.is_empty() {
        let fields = serde_json::Value::Object(config.request_defaults.clone());
        eprintln!("note: requests that leave them out take generation_config.json's {fields}");
    }
    let server = Server::bind(model, text, config)?;
    let server = match embedder {
        Some(embedder) => server.with_embeddings(embedder),
        None => server,
    };
    let notes = server.cache_notes().unwrap_or_default();
    let print_notes = || notes.take().iter().for_each(|line| eprintln!("{line}"));
    print_notes();
    eprintln!(
        "serving {name} on http://{} ({parallel} at once); Ctrl-C stops",
        server.local_addr()
    );
    server.run_until_signal()?;
    print_notes();
    eprintln!("stopped");
    Ok(())
}

/// The fingerprint a saved state of the model `spec` names carries
/// (`--cache-dir`, `chat --session`): a file's or directory's
/// (`ModelFingerprint::of_path`), or the spec's name for a model without one.
pub(crate) fn model_fingerprint(spec: &ModelSpec) -> Result<ModelFingerprint> {
    let path = match spec {
        ModelSpec::Gguf(path) => path.clone(),
        ModelSpec::Known(model) => model.path()?,
        ModelSpec::Toy | ModelSpec::Count(_) | ModelSpec::Embedded => {
            return Ok(ModelFingerprint::of_bytes(spec.to_string().as_bytes()));
        }
    };
    ModelFingerprint::of_path(&path)
        .with_context(|| format!("reading {} for its fingerprint", path.display()))
}
