//! `lm-cli generate`: lm-decode's loop (never another one here), with the
//! output as streamed text, a `--trace` table, one `--json` object, or
//! `--json-lines` (one line per step as it is chosen, then a summary).
//!
//! Timing: the loop's step hook fires as soon as each token is chosen, so
//! the time to the first hook is the prefill (reading the prompt, plus the
//! first choice) and the rest is decoding. Several return sequences run the
//! loop once each on streams 0, 1, ... of the seed, which gives exactly what
//! `generate_many` gives (each re-reads the prompt, so each has its timing).
//!
//! A prompt that takes longer than a second to read shows a progress bar
//! on stderr when stderr is a terminal (`progress::PrefillProgress`, fed
//! between prefill chunks), cleared when the first token is chosen.
//!
//! Ctrl-C: the step hook stops the loop ([`StopReason::Cancelled`]) and no
//! further sequence starts. A cancelled generation is printed by the same
//! code as a finished one, in every mode (the text so far, the trace of the
//! steps done, a JSON report with `"stop_reason": "cancelled"`); only then
//! does [`interruption`] turn the run into [`Interrupted`] (exit 130). Beam
//! search stops the same way, through its own step hook: its hypotheses so
//! far, the live ones cancelled.

use std::io::IsTerminal;
use std::num::NonZeroUsize;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use lm::OutputFormat;
use lm_core::{LanguageModel, TokenId};
use lm_decode::{
    BeamConfig, Generation, GenerationConfig, GenerationHook, SamplingConfig, Step, StopReason,
    Truncation, beam_search_streaming, context_room, fit_prompt, generate_speculative,
    generate_with_hook,
};
use lm_tokenize::Message;

use crate::cli::{GenerateArgs, LogitBiasArg, SamplingFlags, Seed, UsageError};
use crate::draft::DraftSource;
use crate::interrupt::{self, Interrupted};
use crate::output::Output;
use crate::printer::{TextPrinter, continuation_text};
use crate::progress::PrefillProgress;
use crate::report::json::{
    BeamReport, GenerateReport, JsonLine, SequenceReport, Settings, StepReport, Timing,
};
use crate::report::trace;
use crate::spec::{ModelSpec, ModelTask};
use crate::structured::{self, ConstraintClock};
use crate::text::TextCodec;

/// The default of `--max-new-tokens`.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 20;

/// The prompt is read in chunks of this many tokens (llama.cpp's default
/// micro-batch), so Ctrl-C stops a long prefill between chunks.
pub(crate) const PREFILL_CHUNK_LEN: NonZeroUsize = NonZeroUsize::new(512).expect("not zero");

/// Runs `lm-cli generate`.
pub fn run(mut args: GenerateArgs) -> Result<()> {
    if args.trace_prefixes && !args.json && !args.json_lines {
        return Err(UsageError::PrefixesWithoutJson.into());
    }
    // A format the engine refuses is a usage error, before any model loads.
    let format = args.structured.output_format()?;
    if args.num_beams.unwrap_or(1) > 1 {
        if !args.stop.is_empty() {
            return Err(UsageError::StopWithBeams.into());
        }
        if args.num_return_sequences > 1 {
            return Err(UsageError::SequencesWithBeams.into());
        }
        if args.draft.is_some() {
            return Err(UsageError::DraftWithBeams.into());
        }
        if let Some(flag) = flag_ignored_by_beams(&args) {
            return Err(UsageError::FlagIgnoredByBeams { flag }.into());
        }
    }
    let prompt = read_prompt(args.prompt.as_deref(), args.file.as_deref())?;
    let prompt = if args.prompt_escape {
        crate::text::unescape(&prompt).map_err(UsageError::PromptEscape)?
    } else {
        prompt
    };
    crate::interrupt::install()?;
    let (loaded, options) = crate::commands::load_model(&args.model)?;
    let spec = ModelSpec::or_default(args.model.model.as_ref());
    // Beam search and --greedy draw nothing: no sampling default applies.
    let defaults = if args.num_beams.unwrap_or(1) > 1 || args.greedy {
        None
    } else {
        crate::model_defaults::apply(&spec, &mut args.filters)?
    };
    loaded.run(
        options,
        Generate {
            args,
            spec,
            prompt,
            format,
            defaults,
        },
    )
}

/// The prompt from `--prompt TEXT`, `--prompt -` (stdin), `--file FILE`, or
/// stdin when none is given and stdin is not a terminal. Text read from a
/// file or stdin loses one final newline (as llama.cpp's `-f` does), so
/// `echo TEXT |` and `--prompt TEXT` give the same prompt. No prompt at all
/// (an empty stdin, or a terminal) is a usage error.
pub(crate) fn read_prompt(prompt: Option<&str>, file: Option<&Path>) -> Result<String> {
    let text = match (prompt, file) {
        (Some(text), _) if text != "-" => return Ok(text.to_owned()),
        (Some(_), _) => read_stdin()?,
        (None, Some(path)) => crate::files::read_text(path).context("reading the prompt")?,
        (None, None) if std::io::stdin().is_terminal() => {
            return Err(UsageError::NoPrompt.into());
        }
        (None, None) => {
            let text = read_stdin()?;
            if text.is_empty() {
                return Err(UsageError::NoPrompt.into());
            }
            text
        }
    };
    let text = text.strip_suffix('\n').unwrap_or(&text);
    Ok(text.strip_suffix('\r').unwrap_or(text).to_owned())
}

fn read_stdin() -> Result<String> {
    crate::files::read_stdin_text().context("reading the prompt")
}

/// The `--logit-bias` flags as ids.
#[derive(Debug, Default)]
struct ResolvedBiases {
    /// The finite biases, for the sampler's bias stage.
    finite: Vec<(TokenId, f32)>,
    /// The tokens biased by -inf: banned.
    banned: Vec<TokenId>,
}

/// Resolves each `--logit-bias` token to an id. A token that is neither an
/// id of the vocabulary nor one token's text is a usage error.
fn resolve_logit_biases(
    biases: &[LogitBiasArg],
    codec: &TextCodec,
    vocab_size: usize,
) -> Result<ResolvedBiases> {
    let mut resolved = ResolvedBiases::default();
    for bias in biases {
        let id = match bias.token.parse::<TokenId>() {
            Ok(id) => Some(id),
            Err(_) => codec.token_id(&bias.token),
        }
        .filter(|&id| (id as usize) < vocab_size)
        .ok_or_else(|| UsageError::UnknownBiasToken {
            token: bias.token.clone(),
            model: codec.kind(),
            vocab_size,
        })?;
        if bias.bias == f32::NEG_INFINITY {
            resolved.banned.push(id);
        } else {
            resolved.finite.push((id, bias.bias));
        }
    }
    Ok(resolved)
}

/// The sampling policy of the flags `generate` and `chat` share, with the
/// `--logit-bias` tokens resolved against the model.
#[derive(Debug)]
pub(crate) struct Policy {
    /// The policy and its seed (a fresh one unless `--seed N`).
    pub sampling: SamplingConfig,
    /// The tokens `--logit-bias` bans (`-inf`), for the JSON settings.
    pub banned_by_bias: Vec<TokenId>,
    /// True when the run draws: it samples (T > 0) and is no beam search.
    pub draws: bool,
    /// True when the seed is a fresh one, not `--seed N`.
    fresh_seed: bool,
}

impl Policy {
    /// The policy of `flags`; `beams` when beam search will run it (which
    /// draws nothing).
    pub(crate) fn new(
        flags: SamplingFlags<'_>,
        codec: &TextCodec,
        vocab_size: usize,
        beams: bool,
    ) -> Result<Self> {
        let penalties = flags.penalties;
        let ResolvedBiases {
            finite: logit_bias,
            banned: banned_by_bias,
        } = resolve_logit_biases(&penalties.logit_bias, codec, vocab_size)?;
        let mut banned_tokens = banned_by_bias.clone();
        banned_tokens.extend(codec.unwritable_ids());
        let settings = penalties.sampling(flags.filters.sampling());
        let sampling = SamplingConfig {
            temperature: if flags.greedy {
                0.0
            } else {
                settings.temperature
            },
            logit_bias,
            seed: flags.seed.unwrap_or(Seed::Random).resolve(),
            banned_tokens,
            ..settings
        };
        Ok(Self {
            draws: !beams && sampling.temperature > 0.0,
            fresh_seed: flags.seed.is_none_or(|given| given == Seed::Random),
            sampling,
            banned_by_bias,
        })
    }

    /// Tells stderr a fresh seed of a run that draws, so it can be replayed.
    pub(crate) fn note_fresh_seed(&self) {
        if self.draws && self.fresh_seed {
            let seed = self.sampling.seed;
            eprintln!("note: seed {seed} (replay with --seed {seed})");
        }
    }

    /// The `--json` settings of this policy; the caller sets the rest.
    pub(crate) fn settings(&self) -> Settings {
        Settings::of_policy(&self.sampling, self.banned_by_bias.clone(), self.draws)
    }
}

/// The first flag given that beam search could not honour (it ranks by the
/// model's log-probabilities, adjusted by the penalties, the logit bias and
/// `--no-repeat-ngram-size`, and draws nothing), so `--json` settings never
/// list a setting that was not applied. A flag at its off value (`--top-k
/// 0`, `--mirostat 0`, `--dry-multiplier 0`, ...) sets nothing and is no
/// conflict.
fn flag_ignored_by_beams(args: &GenerateArgs) -> Option<&'static str> {
    let filters = &args.filters;
    let config = args.penalties.sampling(filters.sampling());
    let default_temperature = crate::cli::DEFAULT_TEMPERATURE;
    [
        (
            "--temperature",
            filters
                .temperature
                .is_some_and(|t| t != default_temperature),
        ),
        ("--greedy", args.greedy),
        ("--top-k", config.top_k.is_some()),
        ("--top-p", config.top_p.is_some()),
        ("--min-p", config.min_p.is_some()),
        ("--typical", config.typical_p.is_some()),
        ("--top-nsigma", config.top_n_sigma.is_some()),
        ("--xtc-probability", config.xtc_probability.is_some()),
        ("--xtc-threshold", config.xtc_threshold.is_some()),
        ("--min-keep", config.min_keep.is_some()),
        ("--dynatemp-range", config.dynatemp_range.is_some()),
        ("--dynatemp-exp", config.dynatemp_exponent.is_some()),
        ("--epsilon-cutoff", config.epsilon_cutoff.is_some()),
        ("--eta-cutoff", config.eta_cutoff.is_some()),
        ("--mirostat", config.mirostat.is_some()),
        ("--mirostat-lr", config.mirostat_eta.is_some()),
        ("--mirostat-ent", config.mirostat_tau.is_some()),
        ("--samplers", config.order.is_some()),
        ("--dry-multiplier", config.dry_multiplier.is_some()),
        ("--dry-base", config.dry_base.is_some()),
        ("--dry-allowed-length", config.dry_allowed_length.is_some()),
        ("--dry-penalty-last-n", config.dry_penalty_last_n.is_some()),
        (
            "--dry-sequence-breaker",
            config.dry_sequence_breakers.is_some(),
        ),
        ("--seed", args.seed.is_some()),
        ("--min-new-tokens", args.min_new_tokens > 0),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag))
}

/// `--context-length` (`requested`) when it is beyond the context the model
/// runs under (its trained length; [`crate::spec::Backend::bound`] warns),
/// for `--json`.
fn context_beyond_model(requested: Option<u64>, context_length: Option<usize>) -> Option<usize> {
    let requested = to_usize(requested?);
    (requested > context_length?).then_some(requested)
}

pub(crate) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

struct Generate {
    args: GenerateArgs,
    spec: ModelSpec,
    prompt: String,
    format: Option<OutputFormat>,
    /// What generation_config.json set, for the `--json` settings.
    defaults: Option<crate::model_defaults::DefaultsSource>,
}

/// How the results are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One report at the end, or (`lines`) a line per step as it is chosen
    /// and the report without its steps.
    Json {
        lines: bool,
    },
    Trace,
    Text {
        live: bool,
    },
}

impl ModelTask for Generate {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        let args = &self.args;
        let (prompt, prompt_ids) = encode_prompt(args, codec, self.prompt.clone())?;
        let end_tokens = end_tokens(args, codec)?;
        let max_new_tokens = args.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS);
        note_context_fit(args, model.context_length(), &prompt_ids, max_new_tokens)?;
        let num_beams = args.num_beams.map_or(1, to_usize);
        let policy = Policy::new(
            args.sampling_flags(),
            codec,
            model.vocab_size(),
            num_beams > 1,
        )?;
        let draft = args
            .draft
            .as_ref()
            .map(|arg| DraftSource::load(arg, codec, model.vocab_size()))
            .transpose()?;
        policy.note_fresh_seed();
        let settings = Settings {
            max_new_tokens,
            min_new_tokens: args.min_new_tokens,
            end_tokens: end_tokens.clone(),
            stop: args.stop.clone(),
            num_beams,
            context_length: model.context_length(),
            context_length_requested: context_beyond_model(
                args.model.context_length,
                model.context_length(),
            ),
            draft: args.draft.as_ref().map(ToString::to_string),
            draft_tokens: args.draft.is_some().then(|| to_usize(args.draft_tokens)),
            defaults: self.defaults.clone(),
            ..policy.settings()
        };
        let (constraint, clock) = match &self.format {
            Some(format) => {
                let (constraint, clock) = structured::compile(format, codec, model.vocab_size())?;
                (Some(constraint), Some(clock))
            }
            None => (None, None),
        };
        let mut out = Output::stdout();
        let run = Run {
            clock,
            args,
            spec: &self.spec,
            codec,
            prompt,
            prompt_ids,
            end_tokens,
            settings,
            mode: Mode::of(args),
            draft,
        };
        if num_beams > 1 {
            let config = BeamConfig {
                num_beams,
                length_penalty: args.length_penalty,
                max_new_tokens,
                end_tokens: run.end_tokens.clone(),
                truncation: args.truncate,
                adjustments: policy.sampling,
                n_top_candidates: args.top_logprobs,
                constraint,
            };
            return run.beams(model, config, &mut out);
        }
        let config = GenerationConfig {
            max_new_tokens,
            min_new_tokens: args.min_new_tokens,
            sampling: policy.sampling,
            end_tokens: run.end_tokens.clone(),
            stop_strings: args.stop.clone(),
            n_top_candidates: args.top_logprobs,
            truncation: args.truncate,
            num_return_sequences: 1,
            rng_stream: 0,
            prefill_chunk_len: Some(PREFILL_CHUNK_LEN),
            constraint,
        };
        run.sample(model, &config, &mut out)
    }
}

impl Mode {
    /// The output mode the flags ask for.
    fn of(args: &GenerateArgs) -> Self {
        if args.json_lines || (args.json && args.stream) {
            Mode::Json { lines: true }
        } else if args.json {
            Mode::Json { lines: false }
        } else if args.trace {
            Mode::Trace
        } else {
            // Text is written as it becomes final, to a pipe too: a reader
            // that closes the pipe (`| head -c 5`) is seen at the next
            // token's write, and the run stops there. Only `--no-stream`
            // holds it to the end.
            Mode::Text {
                live: !args.no_stream,
            }
        }
    }
}

/// The prompt as the model reads it (wrapped in the chat template with
/// `--chat`) and its ids.
fn encode_prompt(
    args: &GenerateArgs,
    codec: &TextCodec,
    prompt: String,
) -> Result<(String, Vec<TokenId>)> {
    let prompt = if args.chat {
        codec.chat_prompt(&[Message::new("user", prompt)])?
    } else {
        prompt
    };
    // An empty prompt has no special text; encode_prompt gives a count
    // model its sentence start.
    let prompt_ids = if args.no_parse_special && !prompt.is_empty() {
        codec.encode_literal(&prompt)?
    } else {
        codec.encode_prompt(&prompt)?
    };
    Ok((prompt, prompt_ids))
}

/// The end tokens: the model's, `--end-token`'s, or none (`--no-end-token`).
fn end_tokens(args: &GenerateArgs, codec: &TextCodec) -> Result<Vec<TokenId>> {
    if args.no_end_token {
        Ok(Vec::new())
    } else if args.end_token.is_empty() {
        Ok(codec.end_tokens())
    } else {
        args.end_token
            .iter()
            .map(|text| codec.end_token_id(text))
            .collect()
    }
}

/// Checks that the prompt fits the context (by `--truncate`) and tells
/// stderr what `--truncate` dropped and when `--max-new-tokens` is more
/// than the context leaves.
fn note_context_fit(
    args: &GenerateArgs,
    context_length: Option<usize>,
    prompt_ids: &[TokenId],
    max_new_tokens: usize,
) -> Result<()> {
    let fitted = fit_prompt(prompt_ids, context_length, args.truncate, max_new_tokens)?;
    if fitted.n_dropped > 0 {
        eprintln!(
            "note: the prompt has {} tokens; --truncate dropped {} to fit the context of {}",
            prompt_ids.len(),
            fitted.n_dropped,
            context_length.unwrap_or_default()
        );
    }
    let room = context_room(context_length, fitted.tokens.len());
    if let (Some(requested), Some(room), Some(max)) = (args.max_new_tokens, room, context_length)
        && requested > room
    {
        eprintln!(
            "note: --max-new-tokens {requested} clipped to {room}: the context holds {max} tokens and the prompt uses {}",
            fitted.tokens.len()
        );
    }
    Ok(())
}

/// Everything one invocation shares between its sequences.
struct Run<'a> {
    args: &'a GenerateArgs,
    spec: &'a ModelSpec,
    codec: &'a TextCodec,
    prompt: String,
    prompt_ids: Vec<TokenId>,
    end_tokens: Vec<TokenId>,
    settings: Settings,
    mode: Mode,
    /// The structured-output engine's clock, when there is a format.
    clock: Option<ConstraintClock>,
    /// The `--draft` drafter, loaded once for every sequence.
    draft: Option<DraftSource>,
}

impl Run<'_> {
    fn sample<M: LanguageModel>(
        self,
        model: &M,
        config: &GenerationConfig,
        out: &mut Output,
    ) -> Result<()> {
        let n_sequences = to_usize(self.args.num_return_sequences);
        let mut sequences = Vec::with_capacity(n_sequences);
        let mut timing = Timing::default();
        if let (Mode::Trace, Some(seed)) = (self.mode, self.settings.seed) {
            out.write_now(&format!("seed: {seed} (replay with --seed {seed})\n"))?;
        }
        for index in 0..n_sequences {
            // Ctrl-C after a sequence ended on its own: start no other.
            if index > 0 && interrupt::requested() {
                break;
            }
            let config = GenerationConfig {
                rng_stream: index as u64,
                ..config.clone()
            };
            if n_sequences > 1 && matches!(self.mode, Mode::Text { .. }) {
                if index > 0 {
                    out.write_now("\n")?;
                }
                out.write_now(&format!("--- sequence {} ---\n", index + 1))?;
            }
            let (generation, text, one_timing) = self.sample_one(model, &config, out)?;
            timing.add(&one_timing);
            if self.mode == Mode::Trace {
                if n_sequences > 1 {
                    out.write_now(&format!("--- sequence {} ---\n", index + 1))?;
                }
                out.write_now(&trace::render_generation(&generation, &text, self.codec))?;
            }
            let cancelled = generation.stop_reason == StopReason::Cancelled;
            sequences.push((generation, text));
            if cancelled {
                break;
            }
        }
        if let Mode::Json { lines } = self.mode {
            self.write_json(&sequences, timing, lines, out)?;
        }
        match interruption(&sequences, n_sequences) {
            Some(interrupted) => Err(interrupted.into()),
            None => Ok(()),
        }
    }

    /// The `--json` report of the sequences run (all of them, or those done
    /// before Ctrl-C, the last one cancelled); with `lines`, the summary
    /// line, without the steps already written.
    fn write_json(
        self,
        sequences: &[(Generation, String)],
        timing: Timing,
        lines: bool,
        out: &mut Output,
    ) -> Result<()> {
        let report = |generation: &Generation, text: &String| {
            let mut report = SequenceReport::from_generation(
                generation,
                text.clone(),
                self.codec,
                self.args.trace_prefixes,
            );
            if lines {
                report.steps = None;
            }
            report
        };
        let mut reports: Vec<SequenceReport> = sequences
            .iter()
            .map(|(generation, text)| report(generation, text))
            .collect();
        let (first, _) = sequences
            .first()
            .ok_or_else(|| anyhow::anyhow!("no sequence was generated"))?;
        let prompt_ids = first.prompt.clone();
        let n_prompt_dropped = first.n_prompt_dropped;
        // Asked for several: a list, even when Ctrl-C left only one.
        let (best, rest) = if self.args.num_return_sequences > 1 {
            (report(first, &sequences[0].1), Some(reports))
        } else {
            (reports.remove(0), None)
        };
        let report = GenerateReport {
            model: self.spec.to_string(),
            prompt: self.prompt,
            prompt_ids,
            n_prompt_dropped,
            best,
            sequences: rest,
            beams: None,
            settings: self.settings,
            timing: (!self.args.no_timing).then_some(timing),
        };
        write_report(&report, lines, out)
    }

    /// One run of the loop; streams when asked.
    fn sample_one<M: LanguageModel>(
        &self,
        model: &M,
        config: &GenerationConfig,
        out: &mut Output,
    ) -> Result<(Generation, String, Timing)> {
        let live = matches!(self.mode, Mode::Text { live: true });
        let echo_prompt = matches!(self.mode, Mode::Text { .. }) && !self.args.chat;
        if echo_prompt {
            out.write_now(&self.prompt)?;
        }
        let mut printer = TextPrinter::new(live);
        let start = Instant::now();
        let constraint_start_ms = self.clock.as_ref().map(ConstraintClock::ms);
        let mut watch = Watch {
            printer: &mut printer,
            out,
            first_step: None,
            prefill: PrefillProgress::start(),
            lines: (self.mode == Mode::Json { lines: true }).then_some(StepLines {
                codec: self.codec,
                sequence: usize::try_from(config.rng_stream).unwrap_or(usize::MAX),
                prefix: self.args.trace_prefixes.then(|| self.prompt_ids.clone()),
            }),
        };
        let generated = match &self.draft {
            None => generate_with_hook(
                model,
                &self.prompt_ids,
                config,
                Some(self.codec),
                &mut watch,
            )
            .map(|generation| (generation, None)),
            Some(source) => {
                let mut drafter = source.drafter(to_usize(self.args.draft_tokens), self.codec);
                generate_speculative(
                    model,
                    &self.prompt_ids,
                    config,
                    Some(self.codec),
                    &mut *drafter,
                    &mut watch,
                )
                .map(|(generation, stats)| (generation, Some(stats)))
            }
        };
        let first_step = watch.first_step;
        let (generation, speculation) = generated?;
        let end = Instant::now();
        let text = generation.text.clone().unwrap_or_default();
        if matches!(self.mode, Mode::Text { .. }) {
            printer.finish(&generation.held_back_text, out)?;
            out.write_now("\n")?;
            // Ctrl-C gets its own note (main's `note: interrupted ...`).
            if !generation.stop_reason.is_finished()
                && !matches!(
                    generation.stop_reason,
                    StopReason::MaxNewTokens | StopReason::Cancelled
                )
            {
                eprintln!(
                    "note: {}",
                    trace::describe_stop(&generation.stop_reason, generation.tokens.len())
                );
            }
        }
        let ms = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64() * 1e3;
        let timing = Timing {
            prefill_tokens: generation.prompt.len(),
            prefill_ms: Some(first_step.map_or(0.0, |t| ms(start, t))),
            decode_tokens: generation.steps.len().saturating_sub(1),
            decode_ms: Some(first_step.map_or(0.0, |t| ms(t, end))),
            total_ms: ms(start, end),
            drafted_tokens: speculation.map(|stats| stats.drafted_tokens),
            accepted_tokens: speculation.map(|stats| stats.accepted_tokens),
            target_passes: speculation.map(|stats| stats.target_passes),
            constraint_ms: self
                .clock
                .as_ref()
                .zip(constraint_start_ms)
                .map(|(clock, from)| clock.ms() - from),
        };
        Ok((generation, text, timing))
    }

    fn beams<M: LanguageModel>(
        self,
        model: &M,
        config: BeamConfig,
        out: &mut Output,
    ) -> Result<()> {
        let start = Instant::now();
        let beams = beam_search_streaming(model, &self.prompt_ids, &config, |_| {
            Ok::<_, anyhow::Error>(stop_if(interrupt::after_step()))
        })?;
        let interrupted = beams
            .iter()
            .any(|beam| beam.stop_reason == StopReason::Cancelled)
            .then(|| Interrupted {
                n_tokens: beams.first().map_or(0, |best| best.tokens.len()),
            });
        let total_ms = start.elapsed().as_secs_f64() * 1e3;
        let prompt_ids = match config.truncation {
            Truncation::Refuse => self.prompt_ids.clone(),
            truncation => {
                fit_prompt(
                    &self.prompt_ids,
                    model.context_length(),
                    truncation,
                    config.max_new_tokens,
                )?
                .tokens
            }
        };
        let best = beams
            .first()
            .ok_or_else(|| anyhow::anyhow!("beam search returned no hypothesis"))?;
        let printed = match self.mode {
            Mode::Json { lines } => {
                let n_new: usize = beams.iter().map(|b| b.tokens.len()).sum();
                let mut report = GenerateReport {
                    model: self.spec.to_string(),
                    prompt: self.prompt,
                    n_prompt_dropped: self.prompt_ids.len() - prompt_ids.len(),
                    best: SequenceReport::from_hypothesis(
                        &prompt_ids,
                        best,
                        self.codec,
                        self.args.trace_prefixes,
                    ),
                    prompt_ids,
                    sequences: None,
                    beams: Some(
                        beams
                            .iter()
                            .map(|b| BeamReport::from_hypothesis(b, self.codec))
                            .collect(),
                    ),
                    settings: self.settings,
                    timing: (!self.args.no_timing).then_some(Timing {
                        prefill_tokens: self.prompt_ids.len(),
                        prefill_ms: None,
                        decode_tokens: n_new,
                        decode_ms: None,
                        total_ms,
                        ..Timing::default()
                    }),
                };
                if lines {
                    // Beam search chooses its steps at the end: they come
                    // out together, then the summary.
                    for step in report.best.steps.take().unwrap_or_default() {
                        out.write_json_line(&JsonLine {
                            event: "step",
                            sequence: Some(0),
                            body: &step,
                        })?;
                    }
                }
                write_report(&report, lines, out)
            }
            Mode::Trace => {
                out.write_now(&trace::render_beams(&prompt_ids, &beams, self.codec))?;
                Ok(())
            }
            Mode::Text { .. } => {
                let text =
                    continuation_text(self.codec, &prompt_ids, &self.end_tokens, &best.tokens);
                if !self.args.chat {
                    out.write_now(&self.prompt)?;
                }
                out.write_now(&text)?;
                out.write_now("\n")?;
                Ok(())
            }
        };
        printed?;
        match interrupted {
            Some(interrupted) => Err(interrupted.into()),
            None => Ok(()),
        }
    }
}

/// The report as one pretty object, or as the `--json-lines` summary line.
fn write_report(report: &GenerateReport, lines: bool, out: &mut Output) -> Result<()> {
    if lines {
        out.write_json_line(&JsonLine {
            event: "summary",
            sequence: None,
            body: report,
        })
    } else {
        out.write_json(report)
    }
}

/// What `generate` does while the loop runs: shows the progress of a slow
/// prompt (on a terminal), prints each step (streamed text, or a
/// `--json-lines` line) and stops on Ctrl-C, between steps or between
/// prompt chunks, or when the reader closed the pipe.
struct Watch<'w> {
    printer: &'w mut TextPrinter,
    out: &'w mut Output,
    /// When the first token was chosen: the end of the prefill.
    first_step: Option<Instant>,
    /// The bar of a prompt that is slow to read (a terminal's stderr only).
    prefill: PrefillProgress,
    /// The `--json-lines` step writer.
    lines: Option<StepLines<'w>>,
}

/// Writes each step as a `--json-lines` line.
struct StepLines<'w> {
    codec: &'w TextCodec,
    /// The sequence the steps belong to.
    sequence: usize,
    /// The prefix read so far (`--trace-prefixes` only).
    prefix: Option<Vec<TokenId>>,
}

impl StepLines<'_> {
    /// Writes the line of `step`; a failed write ends the run.
    fn write(&mut self, step: &Step, out: &mut Output) -> Result<()> {
        let report = StepReport::new(step, self.prefix.clone(), self.codec);
        if let Some(prefix) = &mut self.prefix {
            prefix.push(step.token);
        }
        let line = JsonLine {
            event: "step",
            sequence: Some(self.sequence),
            body: &report,
        };
        out.write_json_line(&line)
    }
}

impl GenerationHook for &mut Watch<'_> {
    type Error = anyhow::Error;

    fn on_step(&mut self, step: &Step) -> Result<ControlFlow<()>> {
        if self.first_step.is_none() {
            self.first_step = Some(Instant::now());
            self.prefill.finish();
        }
        self.printer.push(&step.text, self.out);
        if let Some(lines) = &mut self.lines {
            lines.write(step, self.out)?;
        }
        // Ctrl-C, or a reader that closed the pipe: stop here (the printer
        // returns its write error when it finishes).
        Ok(stop_if(
            interrupt::after_step() || self.printer.write_failed(),
        ))
    }

    fn after_prefill_chunk(&mut self, n_read: usize, n_prompt: usize) -> Result<ControlFlow<()>> {
        self.prefill.chunk_read(n_read, n_prompt);
        Ok(stop_if(interrupt::after_prefill_chunk()))
    }
}

/// `Break` when `stop`, else `Continue`.
pub(crate) fn stop_if(stop: bool) -> ControlFlow<()> {
    if stop {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

/// Whether Ctrl-C cut the run short, and how many tokens it had generated:
/// its last sequence was cancelled, or fewer than `n_sequences` were run.
/// The one place an interrupted run becomes exit 130, after every mode has
/// printed what the run has.
fn interruption(sequences: &[(Generation, String)], n_sequences: usize) -> Option<Interrupted> {
    let cancelled = sequences
        .last()
        .is_some_and(|(generation, _)| generation.stop_reason == StopReason::Cancelled);
    (cancelled || sequences.len() < n_sequences).then(|| Interrupted {
        n_tokens: sequences
            .iter()
            .map(|(generation, _)| generation.tokens.len())
            .sum(),
    })
}
