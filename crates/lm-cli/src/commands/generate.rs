//! `lm-cli generate`: lm-decode's loop (never another one here), with the
//! output as streamed text, a `--trace` table or one `--json` object.
//!
//! Timing: the loop's step hook fires as soon as each token is chosen, so
//! the time to the first hook is the prefill (reading the prompt, plus the
//! first choice) and the rest is decoding. Several return sequences run the
//! loop once each on streams 0, 1, ... of the seed, which gives exactly what
//! `generate_many` gives (each re-reads the prompt, so each has its timing).
//!
//! Ctrl-C: the step hook stops the loop ([`StopReason::Cancelled`]) and no
//! further sequence starts. A cancelled generation is printed by the same
//! code as a finished one, in every mode (the text so far, the trace of the
//! steps done, a JSON report with `"stop_reason": "cancelled"`); only then
//! does [`interruption`] turn the run into [`Interrupted`] (exit 130). Beam
//! search stops the same way, through its own step hook: its hypotheses so
//! far, the live ones cancelled.

use std::ops::ControlFlow;
use std::time::Instant;

use anyhow::Result;
use lm_core::{LanguageModel, TokenId};
use lm_decode::{
    BeamConfig, Generation, GenerationConfig, SamplingConfig, StopReason, Truncation,
    beam_search_streaming, fit_prompt, generate_streaming,
};
use lm_tokenize::Message;

use crate::cli::{GenerateArgs, UsageError};
use crate::interrupt::{self, Interrupted};
use crate::output::Output;
use crate::printer::TextPrinter;
use crate::report::json::{BeamReport, GenerateReport, SequenceReport, Settings, Timing};
use crate::report::trace;
use crate::spec::{ModelSpec, ModelTask};
use crate::text::TextCodec;

/// The default of `--max-new-tokens`.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 20;

/// Runs `lm-cli generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    if args.num_beams.unwrap_or(1) > 1 {
        if !args.stop.is_empty() {
            return Err(UsageError::StopWithBeams.into());
        }
        if args.num_return_sequences > 1 {
            return Err(UsageError::SequencesWithBeams.into());
        }
    }
    crate::interrupt::install()?;
    let (loaded, options) = crate::commands::load_model(&args.model)?;
    let spec = ModelSpec::or_default(args.model.model.as_ref());
    loaded.run(options, Generate { args, spec })
}

pub(crate) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

struct Generate {
    args: GenerateArgs,
    spec: ModelSpec,
}

/// How the results are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Json,
    Trace,
    Text { live: bool },
}

impl ModelTask for Generate {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        let args = &self.args;
        let prompt = if args.chat {
            codec.chat_prompt(&[Message::new("user", args.prompt.clone())])?
        } else {
            args.prompt.clone()
        };
        let prompt_ids = codec.encode_prompt(&prompt)?;
        let end_tokens = if args.no_end_token {
            Vec::new()
        } else if args.end_token.is_empty() {
            codec.end_tokens()
        } else {
            args.end_token
                .iter()
                .map(|text| codec.end_token_id(text))
                .collect::<Result<Vec<_>>>()?
        };
        let max_new_tokens = args.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS);
        let fitted = fit_prompt(&prompt_ids, model.context_length(), args.truncate)?;
        if fitted.n_dropped > 0 {
            eprintln!(
                "note: the prompt has {} tokens; --truncate dropped {} to fit the context of {}",
                prompt_ids.len(),
                fitted.n_dropped,
                model.context_length().unwrap_or_default()
            );
        }
        if let (Some(requested), Some(max)) = (args.max_new_tokens, model.context_length()) {
            let room = max.saturating_sub(fitted.tokens.len());
            if requested > room {
                eprintln!(
                    "note: --max-new-tokens {requested} clipped to {room}: the context holds {max} tokens and the prompt uses {}",
                    fitted.tokens.len()
                );
            }
        }
        let filters = args.filters.sampling();
        let sampling = SamplingConfig {
            temperature: if args.greedy {
                0.0
            } else {
                filters.temperature
            },
            repetition_penalty: args.repetition_penalty,
            seed: args.seed,
            banned_tokens: codec.unwritable_ids(),
            ..filters
        };
        let num_beams = args.num_beams.map_or(1, to_usize);
        let settings = Settings {
            max_new_tokens,
            temperature: sampling.temperature,
            top_k: sampling.top_k,
            top_p: sampling.top_p,
            min_p: sampling.min_p,
            repetition_penalty: sampling.repetition_penalty,
            seed: sampling.seed,
            end_tokens: end_tokens.clone(),
            stop: args.stop.clone(),
            num_beams,
            context_length: model.context_length(),
        };
        let mode = if args.json {
            Mode::Json
        } else if args.trace {
            Mode::Trace
        } else {
            let live = if args.no_stream {
                false
            } else {
                args.stream || Output::is_terminal()
            };
            Mode::Text { live }
        };
        let mut out = Output::stdout();
        let run = Run {
            args,
            spec: &self.spec,
            codec,
            prompt,
            prompt_ids,
            end_tokens,
            settings,
            mode,
        };
        if num_beams > 1 {
            let config = BeamConfig {
                num_beams,
                length_penalty: args.length_penalty,
                max_new_tokens,
                end_tokens: run.end_tokens.clone(),
                truncation: args.truncate,
            };
            return run.beams(model, &config, &mut out);
        }
        let config = GenerationConfig {
            max_new_tokens,
            sampling,
            end_tokens: run.end_tokens.clone(),
            stop_strings: args.stop.clone(),
            n_top_candidates: args.top_logprobs,
            truncation: args.truncate,
            num_return_sequences: 1,
            rng_stream: 0,
        };
        run.sample(model, &config, &mut out)
    }
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
        if self.mode == Mode::Json {
            self.write_json(&sequences, timing, out)?;
        }
        match interruption(&sequences, n_sequences) {
            Some(interrupted) => Err(interrupted.into()),
            None => Ok(()),
        }
    }

    /// The `--json` report of the sequences run (all of them, or those done
    /// before Ctrl-C, the last one cancelled).
    fn write_json(
        self,
        sequences: &[(Generation, String)],
        timing: Timing,
        out: &mut Output,
    ) -> Result<()> {
        let mut reports: Vec<SequenceReport> = sequences
            .iter()
            .map(|(generation, text)| {
                SequenceReport::from_generation(generation, text.clone(), self.codec)
            })
            .collect();
        let (first, _) = sequences
            .first()
            .ok_or_else(|| anyhow::anyhow!("no sequence was generated"))?;
        let prompt_ids = first.prompt.clone();
        let n_prompt_dropped = first.n_prompt_dropped;
        // Asked for several: a list, even when Ctrl-C left only one.
        let (best, rest) = if self.args.num_return_sequences > 1 {
            let best = SequenceReport::from_generation(first, sequences[0].1.clone(), self.codec);
            (best, Some(reports))
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
        out.write_json(&report)
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
        let mut printer = TextPrinter::new(
            self.codec,
            &self.prompt_ids,
            &self.end_tokens,
            &self.args.stop,
            live,
        );
        let start = Instant::now();
        let mut first_step: Option<Instant> = None;
        let generated =
            generate_streaming(model, &self.prompt_ids, config, Some(self.codec), |step| {
                first_step.get_or_insert_with(Instant::now);
                printer.push(step.token, out);
                Ok::<_, anyhow::Error>(if interrupt::after_step() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                })
            });
        let generation = generated?;
        let end = Instant::now();
        let text = generation.text.clone().unwrap_or_default();
        if matches!(self.mode, Mode::Text { .. }) {
            printer.finish(out)?;
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
        };
        Ok((generation, text, timing))
    }

    fn beams<M: LanguageModel>(
        self,
        model: &M,
        config: &BeamConfig,
        out: &mut Output,
    ) -> Result<()> {
        let start = Instant::now();
        let beams = beam_search_streaming(model, &self.prompt_ids, config, |_| {
            Ok::<_, anyhow::Error>(if interrupt::after_step() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
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
            truncation => fit_prompt(&self.prompt_ids, model.context_length(), truncation)?.tokens,
        };
        let best = beams
            .first()
            .ok_or_else(|| anyhow::anyhow!("beam search returned no hypothesis"))?;
        let printed = match self.mode {
            Mode::Json => {
                let n_new: usize = beams.iter().map(|b| b.tokens.len()).sum();
                let report = GenerateReport {
                    model: self.spec.to_string(),
                    prompt: self.prompt,
                    n_prompt_dropped: self.prompt_ids.len() - prompt_ids.len(),
                    best: SequenceReport::from_hypothesis(&prompt_ids, best, self.codec),
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
                    }),
                };
                out.write_json(&report)
            }
            Mode::Trace => {
                out.write_now(&trace::render_beams(&prompt_ids, &beams, self.codec))?;
                Ok(())
            }
            Mode::Text { .. } => {
                let mut printer =
                    TextPrinter::new(self.codec, &prompt_ids, &self.end_tokens, &[], false);
                for &token in &best.tokens {
                    printer.push(token, out);
                }
                if !self.args.chat {
                    out.write_now(&self.prompt)?;
                }
                printer.finish(out)?;
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
