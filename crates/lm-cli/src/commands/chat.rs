//! `lm-cli chat`: a multi-turn conversation. Each turn renders the whole
//! conversation with the model's chat template (GGUF `tokenizer.chat_template`,
//! through lm-tokenize's `ChatTemplate`), generates the reply with
//! lm-decode's loop and streams it; the reply joins the conversation. Each
//! turn starts from the state the previous one left (lm-decode's
//! `generate_from_state`, the mechanism of lm-serve's prefix cache), so it
//! reads only what the conversation added, not the whole of it again.

use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;

use anyhow::{Context, Result};
use lm_core::{LanguageModel, SequenceState, TokenId};
use lm_decode::{GenerationConfig, SamplingConfig, generate_from_state};
use lm_tokenize::Message;

use crate::cli::ChatArgs;
use crate::output::Output;
use crate::printer::TextPrinter;
use crate::report::trace::describe_stop;
use crate::spec::{ModelSpec, ModelTask};
use crate::text::{TextCodec, TextError};

/// Runs `lm-cli chat`.
pub fn run(args: ChatArgs) -> Result<()> {
    // A GGUF file without a chat template is refused from its metadata alone,
    // before its weights are read.
    let spec = ModelSpec::or_default(args.model.model.as_ref());
    if matches!(spec, ModelSpec::Gguf(_) | ModelSpec::Known(_)) {
        let codec = spec.load_codec()?;
        if let Err(err) = codec.chat_prompt(&[Message::new("user", "")]) {
            return Err(match err.downcast_ref::<TextError>() {
                Some(TextError::NoChatTemplate { .. }) => TextError::NoChatTemplateInFile {
                    spec: spec.to_string(),
                }
                .into(),
                _ => err,
            });
        }
    }
    let (loaded, options) = crate::commands::load_model(&args.model)?;
    // Fail before the first prompt when the model cannot chat.
    loaded.codec.chat_prompt(&[Message::new("user", "")])?;
    loaded.run(options, args)
}

/// The chat loop, written once for every model type.
impl ModelTask for ChatArgs {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        let args = &self;
        let config = GenerationConfig {
            max_new_tokens: args.max_new_tokens,
            sampling: SamplingConfig {
                temperature: args.temperature,
                top_k: args.top_k,
                top_p: args.top_p,
                seed: args.seed,
                ..SamplingConfig::default()
            },
            end_tokens: codec.end_tokens(),
            ..GenerationConfig::default()
        };
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(Message::new("system", system.clone()));
        }
        let stdin = std::io::stdin();
        let interactive = stdin.is_terminal();
        if interactive {
            eprintln!(
                "chatting with {}; an empty line or Ctrl-D ends the chat",
                codec.kind()
            );
        }
        let mut out = Output::stdout();
        let mut line = String::new();
        // The tokens the last turn's state has read, and that state.
        let mut kept: Option<(Vec<TokenId>, M::State)> = None;
        for turn in 0u64.. {
            if interactive {
                eprint!("> ");
                let _ = std::io::stderr().flush();
            }
            line.clear();
            if stdin.lock().read_line(&mut line).context("reading stdin")? == 0 {
                break;
            }
            let user = line.trim();
            if user.is_empty() {
                break;
            }
            messages.push(Message::new("user", user));
            let prompt_ids = codec.encode(&codec.chat_prompt(&messages)?)?;
            let config = GenerationConfig {
                rng_stream: turn,
                ..config.clone()
            };
            let mut printer = TextPrinter::new(codec, &prompt_ids, &config.end_tokens, &[], true);
            // The previous turn's state, cut to what this prompt shares with it.
            let state = match kept.take() {
                Some((tokens, mut state)) => {
                    let shared = tokens
                        .iter()
                        .zip(&prompt_ids)
                        .take_while(|(a, b)| a == b)
                        .count();
                    state.truncate(shared);
                    state
                }
                None => model.new_state(),
            };
            let (generation, state) = generate_from_state(
                model,
                state,
                &prompt_ids,
                &config,
                Some(codec),
                |step: &lm_decode::Step| {
                    printer.push(step.token, &mut out);
                    Ok::<_, anyhow::Error>(ControlFlow::Continue(()))
                },
            )?;
            let mut read: Vec<TokenId> =
                [generation.prompt.as_slice(), &generation.tokens].concat();
            read.truncate(state.pos());
            kept = Some((read, state));
            let reply = printer.finish(&mut out)?;
            out.write_now("\n")?;
            if !generation.stop_reason.is_finished() {
                eprintln!(
                    "note: {}",
                    describe_stop(&generation.stop_reason, generation.tokens.len())
                );
            }
            messages.push(Message::new("assistant", reply.trim()));
        }
        Ok(())
    }
}
