//! lm-cli's logger: the libraries' `log` lines (an `LM_KERNEL` or `LM_PACK`
//! value refused, a model that failed to load in `serve`, the shutdown
//! grace running out) on standard error, labelled as the command's own
//! messages are (`error:`, `warning:`, `note:`). Without `RUST_LOG`,
//! warnings and errors; `RUST_LOG=info` adds the server's notes (a model
//! loaded or unloaded).

use std::io::Write;

use log::{Level, LevelFilter};

/// Installs the logger, once, before any library logs.
pub(crate) fn install() {
    let mut builder = env_logger::Builder::new();
    builder
        .filter_level(LevelFilter::Warn)
        // lm-model warns that it runs unoptimised when it was compiled with
        // debug assertions; this workspace's dev profile compiles it at
        // opt-level 3 with them, so for lm-cli the warning is always wrong.
        .filter_module("lm_model::build_profile", LevelFilter::Off)
        // `serve` prints the `--cache-dir` notes itself (`Server::cache_notes`).
        .filter_module("lm_serve::persist", LevelFilter::Off)
        .format(|out, record| writeln!(out, "{}: {}", label(record.level()), record.args()))
        .target(env_logger::Target::Stderr);
    if let Ok(filters) = std::env::var("RUST_LOG") {
        builder.parse_filters(&filters);
    }
    // Only a second logger could be installed already: keep that one.
    let _ = builder.try_init();
}

/// The label a line of `level` starts with.
fn label(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "note",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}
