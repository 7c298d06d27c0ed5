//! `lm-cli serve`: loads the model (or each of several) and serves it with
//! lm-serve's OpenAI-compatible server until Ctrl-C or SIGTERM.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use lm_core::Bounded;
use lm_model::ModelFingerprint;
use lm_serve::{
    CacheDir, LoadModel, LoadedModel, ModelSource, ServeConfig, ServeError, ServedText, Server,
    SpeculativeDrafter,
};

use crate::cli::{DrafterArg, ModelArgs, ServeArgs};
use crate::commands::generate::to_usize;
use crate::spec::{Backend, ModelSpec};

/// Runs `lm-cli serve`.
pub fn run(args: ServeArgs) -> Result<()> {
    // Once for every model (a second global pool cannot be built).
    crate::commands::configure_threads(args.model.options.threads)?;
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
    let models: Vec<(Option<String>, ModelArgs)> = args
        .model
        .each()
        .into_iter()
        .map(|(id, model)| {
            let model = ModelArgs {
                threads: None,
                ..model
            };
            (id, model)
        })
        .collect();
    let several = models.len() > 1 || args.idle_unload.is_some();
    let mut sources = Vec::with_capacity(models.len());
    for (id, model) in models {
        let spec = ModelSpec::or_default(model.model.as_ref());
        let mut config = model_config(&args, &spec, draft)?;
        let id = id.unwrap_or_else(|| config.model_id());
        if !config.request_defaults.is_empty() {
            let fields = serde_json::Value::Object(config.request_defaults.clone());
            let whose = if several {
                format!(" to {id}")
            } else {
                String::new()
            };
            eprintln!(
                "note: requests{whose} that leave them out take generation_config.json's {fields}"
            );
        }
        if !several {
            let name = config.model_name.clone();
            let model = load_served(&model, config, args.pooling)?;
            let at_once = format!("{} at once", args.parallel);
            return serve(Server::bind_loaded(model)?, &name, &at_once);
        }
        if let Some(dir) = &mut config.cache_dir {
            // Each model's states in a directory of its own.
            dir.path = dir.path.join(&id);
        }
        let pooling = args.pooling;
        let load: LoadModel = {
            let id = id.clone();
            Arc::new(move || {
                load_served(&model, config.clone(), pooling).map_err(|error| ServeError::Load {
                    id: id.clone(),
                    source: error.into(),
                })
            })
        };
        sources.push(ModelSource { id, load });
    }
    let mut names = sources
        .iter()
        .map(|source| source.id.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(seconds) = args.idle_unload {
        names.push_str(&format!("; each unloaded after {seconds} s idle"));
    }
    // The server's own settings (address, key, ...): any model's but its name.
    let front = model_config(&args, &ModelSpec::Toy, None)?;
    let idle_unload = args.idle_unload.map(Duration::from_secs);
    let server = Server::bind_models(sources, front, idle_unload)?;
    serve(server, &names, &format!("{} at once each", args.parallel))
}

/// `args`' settings for the model `spec` names.
fn model_config(
    args: &ServeArgs,
    spec: &ModelSpec,
    draft: Option<SpeculativeDrafter>,
) -> Result<ServeConfig> {
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
        model_name: spec.to_string(),
        cache_bytes: to_usize(args.cache_mb).saturating_mul(1 << 20),
        parse_special: args.parse_special,
        any_model: args.any_model,
        max_formats: to_usize(args.max_formats),
        webui: !args.no_webui,
        reasoning: args.reasoning != "off",
        request_defaults: crate::model_defaults::request_defaults(spec)?,
        cache_dir: args
            .cache_dir
            .as_ref()
            .map(|path| -> Result<CacheDir> {
                Ok(CacheDir {
                    path: path.clone(),
                    model: model_fingerprint(spec)?,
                })
            })
            .transpose()?,
        draft,
    };
    Ok(config)
}

/// Loads `model` for serving with `config`: a transformer's weights also
/// answer /v1/embeddings (shared, not copied).
fn load_served(
    model: &ModelArgs,
    config: ServeConfig,
    pooling: lm::Pooling,
) -> Result<LoadedModel> {
    let (loaded, options) = crate::commands::load_model(model)?;
    anyhow::ensure!(
        !options.no_cache,
        "--no-cache is not supported by serve (every sequence keeps its cache in the batch)"
    );
    let text: Arc<dyn ServedText> = Arc::new(loaded.codec);
    let bound = loaded.backend.bound(options.context_length);
    let with_embedder = |decoder: Box<lm_model::Decoder>| {
        let decoder = Arc::new(*decoder);
        let embedder = lm::Embedder::new(Arc::clone(&decoder), pooling);
        (Arc::new(Bounded::new(decoder, bound)), embedder)
    };
    let model = match loaded.backend {
        Backend::Toy(model) | Backend::Llama(model) => {
            let (model, embedder) = with_embedder(model);
            LoadedModel::new(model, text, config)?.with_embeddings(embedder)
        }
        Backend::Count(model) => {
            LoadedModel::new(Arc::new(Bounded::new(model, bound)), text, config)?
        }
    };
    Ok(model)
}

/// Runs `server` until a signal, saying what it serves (`names`) and how
/// many sequences at once.
fn serve(server: Server, names: &str, at_once: &str) -> Result<()> {
    let notes = server.cache_notes().unwrap_or_default();
    let print_notes = || notes.take().iter().for_each(|line| eprintln!("{line}"));
    print_notes();
    eprintln!(
        "serving {names} on http://{} ({at_once}); Ctrl-C stops",
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
