//! Structured output flags (`--json-schema`, `--format json`, `--regex`,
//! `--grammar` (GBNF or Lark), `--choice`) for `generate` and `chat`: read and checked by
//! the engine before any model is loaded (a refusal is a usage error that
//! quotes llguidance), then compiled for the loaded model's vocabulary
//! into lm-decode's constraint, with a clock on the engine's time per step
//! (`--json` timing `constraint_ms`: masks and advancing, not compiling).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use lm::{OutputFormat, StructuredOutput};
use lm_core::{Constraint, ConstraintState, TokenId, TokenMask};
use lm_decode::OutputConstraint;

use crate::cli::UsageError;
use crate::text::TextCodec;

/// What the output must be (at most one of these).
#[derive(Debug, Clone, Default, Args)]
#[group(multiple = false)]
pub struct StructuredArgs {
    /// Output JSON valid under this JSON Schema (a file, or the schema
    /// itself when it starts with `{`).
    #[arg(long, value_name = "FILE|JSON")]
    pub json_schema: Option<String>,
    /// Output any JSON object (`json`).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<FormatArg>,
    /// Output text that matches this regular expression whole.
    #[arg(long, value_name = "PATTERN")]
    pub regex: Option<String>,
    /// Output text of this grammar: GBNF (llama.cpp's, when its first rule
    /// is `name ::=`) or Lark (llguidance's dialect); a file, or the
    /// grammar itself when no file has that name and it holds a `:`.
    #[arg(long, value_name = "FILE|GRAMMAR")]
    pub grammar: Option<PathBuf>,
    /// Output exactly one of these comma-separated strings.
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    pub choice: Option<Vec<String>>,
}

/// `--format`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// Any JSON object.
    Json,
}

impl StructuredArgs {
    /// The format asked for, read (schema and grammar files) and checked by
    /// the engine; `None` when no flag is given. Runs before any model is
    /// loaded: a format the engine refuses is a usage error.
    pub fn output_format(&self) -> Result<Option<OutputFormat>> {
        let (flag, format) = if let Some(schema) = &self.json_schema {
            let text = if schema.trim_start().starts_with('{') {
                schema.clone()
            } else {
                crate::files::read_text(Path::new(schema)).context("reading the JSON Schema")?
            };
            let value = serde_json::from_str(&text).map_err(|error| UsageError::OutputFormat {
                flag: "--json-schema",
                message: format!("the schema is not JSON: {error}"),
            })?;
            ("--json-schema", OutputFormat::JsonSchema(value))
        } else if self.format.is_some() {
            ("--format", OutputFormat::JsonObject)
        } else if let Some(pattern) = &self.regex {
            ("--regex", OutputFormat::Regex(pattern.clone()))
        } else if let Some(path) = &self.grammar {
            let inline = path
                .to_str()
                .filter(|text| text.contains(':') && !path.exists());
            let text = match inline {
                Some(text) => text.to_owned(),
                None => crate::files::read_text(path).context("reading the grammar")?,
            };
            ("--grammar", OutputFormat::from_grammar(text))
        } else if let Some(options) = &self.choice {
            ("--choice", OutputFormat::Choice(options.clone()))
        } else {
            return Ok(None);
        };
        format.check().map_err(|error| UsageError::OutputFormat {
            flag,
            message: error.to_string(),
        })?;
        Ok(Some(format))
    }
}

/// The engine's time in one run, shared by the constraint and its states.
#[derive(Debug, Clone, Default)]
pub struct ConstraintClock(Arc<AtomicU64>);

impl ConstraintClock {
    /// Milliseconds spent computing masks and advancing, so far.
    pub fn ms(&self) -> f64 {
        self.0.load(Ordering::Relaxed) as f64 / 1e6
    }

    fn time<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let value = f();
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(ns, Ordering::Relaxed);
        value
    }
}

/// `format` compiled for the model behind `codec` (GGUF models only: the
/// engine needs the tokenizer's bytes), and the clock on its time.
pub fn compile(
    format: &OutputFormat,
    codec: &TextCodec,
    vocab_size: usize,
) -> Result<(OutputConstraint, ConstraintClock)> {
    let TextCodec::Bpe(text) = codec else {
        anyhow::bail!(
            "structured output needs a GGUF model (a tokenizer's vocabulary); the {} model has none",
            codec.kind()
        );
    };
    let inner = text
        .structured_output(format, vocab_size)
        .context("compiling the output format for the model's vocabulary")?;
    let clock = ConstraintClock::default();
    let timed = Timed {
        inner,
        clock: clock.clone(),
    };
    Ok((OutputConstraint::new(timed), clock))
}

/// A constraint whose every call runs on a clock.
#[derive(Debug)]
struct Timed {
    inner: StructuredOutput,
    clock: ConstraintClock,
}

impl Constraint for Timed {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn start(&self) -> lm_core::Result<Box<dyn ConstraintState>> {
        let inner = self.clock.time(|| self.inner.start())?;
        Ok(Box::new(TimedState {
            inner,
            clock: self.clock.clone(),
        }))
    }
}

struct TimedState {
    inner: Box<dyn ConstraintState>,
    clock: ConstraintClock,
}

impl ConstraintState for TimedState {
    fn fill_allowed(&mut self, mask: &mut TokenMask) -> lm_core::Result<()> {
        self.clock.time(|| self.inner.fill_allowed(mask))
    }

    fn advance(&mut self, token: TokenId) -> lm_core::Result<()> {
        self.clock.time(|| self.inner.advance(token))
    }

    fn is_accepting(&mut self) -> lm_core::Result<bool> {
        self.clock.time(|| self.inner.is_accepting())
    }

    fn fork(&self) -> Box<dyn ConstraintState> {
        Box::new(TimedState {
            inner: self.inner.fork(),
            clock: self.clock.clone(),
        })
    }
}
