//! `lm-cli chat`: a multi-turn conversation. Each turn renders the whole
//! conversation with the model's chat template (GGUF `tokenizer.chat_template`,
//! through lm-tokenize's `ChatTemplate`), generates the reply with
//! lm-decode's loop and streams it; the reply joins the conversation.

use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;

use anyhow::{Context, Result};
use lm::OutputFormat;
use lm_core::LanguageModel;
use lm_decode::{GenerationConfig, SamplingConfig, generate_streaming};
use lm_tokenize::Message;

use crate::cli::ChatArgs;
use crate::output::Output;
use crate::printer::TextPrinter;
use crate::report::trace::describe_stop;
use crate::spec::{ModelSpec, ModelTask};
use crate::structured;
use crate::text::{TextCodec, TextError};

/// Runs `lm-cli chat`.
pub fn run(args: ChatArgs) -> Result<()> {
    // A format the engine refuses is a usage error, before any model loads.
    let format = args.structured.output_format()?;
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
    loaded.run(options, Chat { args, format })
}

/// `chat`'s arguments with the output format read and checked.
struct Chat {
    args: ChatArgs,
    format: Option<OutputFormat>,
}

/// The chat loop, written once for every model type.
impl ModelTask for Chat {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        let args = &self.args;
        let constraint = self
            .format
            .as_ref()
            .map(|format| structured::compile(format, codec, model.vocab_size()))
            .transpose()?
            .map(|(constraint, _clock)| constraint);
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
            constraint,
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
            let generation =
                generate_streaming(model, &prompt_ids, &config, Some(codec), |step| {
                    printer.push(step.token, &mut out);
                    Ok::<_, anyhow::Error>(ControlFlow::Continue(()))
                })?;
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
