//! `lm-cli chat`: a multi-turn conversation. Each turn renders the whole
//! conversation with the model's chat template (GGUF `tokenizer.chat_template`,
//! through lm-tokenize's `ChatTemplate`), generates the reply with
//! lm-decode's loop and streams it; the reply joins the conversation.
//!
//! ```text
//! input (terminal: rustyline; pipe: lines) ──> message | /command
//!   message ──> conversation ──fit (drop oldest turns)──> prompt ids
//!           ──> generate_cached (the state keeps what it read: only the new
//!               tokens are read) ──> reply streamed ──> conversation
//! ```
//!
//! Message contents are encoded literally by default (`TextCodec::encode_chat`;
//! only the template's own markup is read as special tokens), so typed
//! `<|im_start|>` text cannot open a turn; `--parse-special` reads it.
//! Ctrl-C stops the reply being written and returns to the prompt (the
//! partial reply stays in the conversation); a second Ctrl-C while the reply
//! runs exits. Each reply draws from its own stream of the seed (reply k:
//! stream k), so `--seed N` replays a whole chat.

mod conversation;
mod input;
mod session;

use std::io::IsTerminal;
use std::ops::ControlFlow;

use anyhow::Result;
use lm::OutputFormat;
use lm_core::{Bounded, LanguageModel, TokenId};
use lm_decode::{
    CachedGeneration, GenerationConfig, GenerationHook, PrefixCache, Step, StopReason,
    generate_cached,
};
use lm_tokenize::Message;
use serde::Serialize;

use self::conversation::Conversation;
use self::input::{
    COMMANDS_HELP, ChatCommand, Entry, LineSource, MessageReader, PipedLines, TerminalLines,
};
use self::session::{Resumed, SaveSession, SessionFile};
use crate::cli::{CHAT_TEMPERATURE, CHAT_TOP_P, ChatArgs};
use crate::commands::generate::{PREFILL_CHUNK_LEN, Policy, stop_if};
use crate::interrupt;
use crate::output::Output;
use crate::printer::TextPrinter;
use crate::report::json::{Settings, stop_reason_parts};
use crate::report::trace::describe_stop;
use crate::spec::{Backend, ModelSpec, ModelTask};
use crate::structured;
use crate::text::{TextCodec, TextError};

/// Runs `lm-cli chat`.
pub fn run(mut args: ChatArgs) -> Result<()> {
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
    let session = args
        .session
        .as_deref()
        .map(|path| SessionFile::new(path, crate::commands::serve::model_fingerprint(&spec)?))
        .transpose()?;
    let (loaded, options) = crate::commands::load_model(&args.model)?;
    // Fail before the first prompt when the model cannot chat.
    loaded.codec.chat_prompt(&[Message::new("user", "")])?;
    interrupt::install()?;
    // The model's sampling defaults, then chat's, for what the flags leave unset.
    let defaults = if args.greedy {
        None
    } else {
        crate::model_defaults::apply(&spec, &mut args.filters)?
    };
    args.filters.temperature.get_or_insert(CHAT_TEMPERATURE);
    args.filters.top_p.get_or_insert(CHAT_TOP_P);
    let chat = Chat {
        args,
        spec,
        format,
        defaults,
    };
    let Some(mut session) = session else {
        return loaded.run(options, chat);
    };
    // A session saves a transformer's state: the model is taken as one.
    anyhow::ensure!(
        !options.no_cache,
        "--session keeps the KV cache between runs: it cannot go with --no-cache"
    );
    let bound = loaded.backend.bound(options.context_length);
    let model = match loaded.backend {
        Backend::Toy(model) | Backend::Llama(model) => Bounded::new(*model, bound),
        Backend::Count(_) => anyhow::bail!(
            "--session saves a transformer's KV cache: a count model has none to save"
        ),
    };
    let resumed = session.resume(model.new_state());
    chat.run_with(&model, &loaded.codec, Some(Box::new(session)), resumed)
}

/// The chat command with its model spec (for the JSON report).
struct Chat {
    args: ChatArgs,
    spec: ModelSpec,
    /// The output format, read and checked before the model loaded.
    format: Option<OutputFormat>,
    /// What generation_config.json set, for the `--json` settings.
    defaults: Option<crate::model_defaults::DefaultsSource>,
}

/// `--json`: the conversation and how each reply was made.
#[derive(Debug, Serialize)]
struct ChatReport {
    model: String,
    settings: Settings,
    /// Every message at the end, the system message first.
    messages: Vec<Message>,
    /// One entry per reply generated, in order.
    replies: Vec<ReplyReport>,
}

/// How one reply was made.
#[derive(Debug, Serialize)]
struct ReplyReport {
    /// The prompt's length in tokens.
    prompt_tokens: usize,
    /// Prompt tokens the model had read in an earlier turn (not read again).
    reused_tokens: usize,
    /// Messages dropped before this reply to fit the context.
    dropped_messages: usize,
    /// The reply's token ids.
    ids: Vec<TokenId>,
    /// The reply's text.
    text: String,
    /// Why it stopped.
    stop_reason: &'static str,
}

impl ModelTask for Chat {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        self.run_with(model, codec, None, None)
    }
}

impl Chat {
    /// Runs the chat, saving it after each reply with `saver` (`--session`),
    /// from the conversation and state of `resumed`.
    fn run_with<M: LanguageModel>(
        self,
        model: &M,
        codec: &TextCodec,
        saver: Option<Box<dyn SaveSession<M::State>>>,
        resumed: Option<Resumed<M::State>>,
    ) -> Result<()> {
        let args = &self.args;
        let constraint = self
            .format
            .as_ref()
            .map(|format| structured::compile(format, codec, model.vocab_size()))
            .transpose()?
            .map(|(constraint, _clock)| constraint);
        let policy = Policy::new(args.sampling_flags(), codec, model.vocab_size(), false)?;
        policy.note_fresh_seed();
        let settings = Settings {
            max_new_tokens: args.max_new_tokens,
            min_new_tokens: args.min_new_tokens,
            end_tokens: codec.end_tokens(),
            context_length: model.context_length(),
            defaults: self.defaults.clone(),
            ..policy.settings()
        };
        let config = GenerationConfig {
            max_new_tokens: args.max_new_tokens,
            min_new_tokens: args.min_new_tokens,
            sampling: policy.sampling,
            end_tokens: codec.end_tokens(),
            prefill_chunk_len: Some(PREFILL_CHUNK_LEN),
            constraint,
            ..GenerationConfig::default()
        };
        let mut session = Session {
            model,
            codec,
            config,
            cache: PrefixCache::one_state(),
            conversation: Conversation::new(args.system.clone()),
            parse_special: args.parse_special,
            live: !args.json,
            out: Output::stdout(),
            replies: Vec::new(),
            n_earlier_replies: 0,
            saver,
        };
        if let Some(resumed) = resumed {
            session.conversation = resumed.conversation;
            session.n_earlier_replies = resumed.n_replies;
            session.cache.insert(resumed.tokens, resumed.state);
        }
        if std::io::stdin().is_terminal() {
            eprintln!(
                "chatting with {}; /help lists the commands, Ctrl-D or /exit ends the chat",
                self.spec
            );
            session.talk(MessageReader::new(TerminalLines::new()?))?;
        } else {
            session.talk(MessageReader::new(PipedLines::new(std::io::stdin().lock())))?;
        }
        if args.json {
            let report = ChatReport {
                model: self.spec.to_string(),
                settings,
                messages: session.conversation.messages,
                replies: session.replies,
            };
            session.out.write_json(&report)?;
        }
        Ok(())
    }
}

/// A chat in progress.
struct Session<'a, M: LanguageModel> {
    model: &'a M,
    codec: &'a TextCodec,
    config: GenerationConfig,
    /// What the model has read, kept between turns.
    cache: PrefixCache<M::State>,
    conversation: Conversation,
    /// `--parse-special`: read special-token text in user messages.
    parse_special: bool,
    /// Stream the replies (not with `--json`).
    live: bool,
    out: Output,
    replies: Vec<ReplyReport>,
    /// Replies of the runs a `--session` resumed.
    n_earlier_replies: usize,
    /// `--session`: saves the chat after each reply.
    saver: Option<Box<dyn SaveSession<M::State>>>,
}

impl<M: LanguageModel> Session<'_, M> {
    /// Reads messages and commands until the end of the chat.
    fn talk<S: LineSource>(&mut self, mut reader: MessageReader<S>) -> Result<()> {
        loop {
            match reader.next_entry()? {
                Entry::End | Entry::Command(ChatCommand::Exit) => return Ok(()),
                Entry::Message(text) => {
                    self.conversation.push("user", text);
                    self.reply()?;
                }
                Entry::Command(command) => self.command(command)?,
            }
        }
    }

    /// Carries out a slash command; what goes wrong is told, and the chat
    /// goes on.
    fn command(&mut self, command: ChatCommand) -> Result<()> {
        match command {
            ChatCommand::Clear => {
                self.conversation.clear();
                eprintln!("(conversation cleared)");
            }
            ChatCommand::System(text) => {
                let what = if text.is_some() { "set" } else { "removed" };
                self.conversation.set_system(text);
                eprintln!("(system message {what})");
            }
            ChatCommand::Regen => {
                if self.conversation.pop_reply() {
                    self.reply()?;
                } else {
                    eprintln!("note: there is no reply to generate again");
                }
            }
            ChatCommand::Save(path) => match self.conversation.save(&path) {
                Ok(()) => eprintln!(
                    "(saved {} messages to {})",
                    self.conversation.messages.len(),
                    path.display()
                ),
                Err(error) => eprintln!("note: {error:#}"),
            },
            ChatCommand::Load(path) => match Conversation::load(&path) {
                Ok(conversation) => {
                    eprintln!(
                        "(loaded {} messages from {})",
                        conversation.messages.len(),
                        path.display()
                    );
                    self.conversation = conversation;
                }
                Err(error) => eprintln!("note: {error:#}"),
            },
            ChatCommand::Help => eprintln!("{COMMANDS_HELP}"),
            ChatCommand::Exit => {}
        }
        Ok(())
    }

    /// Generates the assistant's reply to the conversation and appends it.
    fn reply(&mut self) -> Result<()> {
        let codec = self.codec;
        let parse_special = self.parse_special;
        let context_length = self.model.context_length().unwrap_or(usize::MAX);
        // Room for the reply, by the rule keep-head truncation follows.
        let room = lm_decode::room_for_new_tokens(self.config.max_new_tokens, context_length);
        let fitted = self
            .conversation
            .fit(context_length - room, context_length, |messages| {
                codec.encode_chat(messages, parse_special)
            });
        let (prompt_ids, n_dropped) = match fitted {
            Ok(fitted) => fitted,
            Err(error) => {
                // The message stays unanswered; the chat goes on.
                eprintln!("note: {error:#}");
                self.conversation.messages.pop();
                return Ok(());
            }
        };
        if n_dropped > 0 {
            eprintln!(
                "note: the conversation outgrew the context of {context_length} tokens: \
                 left the {n_dropped} oldest messages after the system message out of the \
                 prompt (/save keeps them)"
            );
        }
        let config = GenerationConfig {
            rng_stream: (self.n_earlier_replies + self.replies.len()) as u64,
            ..self.config.clone()
        };
        let mut printer = TextPrinter::new(self.live);
        let hook = Watch {
            printer: &mut printer,
            out: &mut self.out,
        };
        let CachedGeneration {
            generation,
            n_reused,
        } = generate_cached(
            self.model,
            &mut self.cache,
            &prompt_ids,
            &config,
            Some(codec),
            hook,
        )?;
        let text = if self.live {
            let text = printer.finish(&generation.held_back_text, &mut self.out)?;
            self.out.write_now("\n")?;
            text
        } else {
            generation.text.clone().unwrap_or_default()
        };
        match generation.stop_reason {
            StopReason::Cancelled => {
                interrupt::reset();
                eprintln!("note: reply stopped (Ctrl-C); Ctrl-C twice exits");
            }
            ref reason if !reason.is_finished() => {
                eprintln!("note: {}", describe_stop(reason, generation.tokens.len()));
            }
            _ => {}
        }
        self.conversation.push("assistant", text.trim());
        self.replies.push(ReplyReport {
            prompt_tokens: prompt_ids.len(),
            reused_tokens: n_reused,
            dropped_messages: n_dropped,
            ids: generation.tokens.clone(),
            text,
            stop_reason: stop_reason_parts(&generation.stop_reason).0,
        });
        if let Some(saver) = &self.saver {
            let n_replies = self.n_earlier_replies + self.replies.len();
            saver.save(&self.conversation, n_replies, &mut self.cache);
        }
        Ok(())
    }
}

/// What the chat does while a reply runs: streams it, and stops on Ctrl-C
/// (between steps or prompt chunks) or when stdout is closed.
struct Watch<'w> {
    printer: &'w mut TextPrinter,
    out: &'w mut Output,
}

impl GenerationHook for Watch<'_> {
    type Error = anyhow::Error;

    fn on_step(&mut self, step: &Step) -> Result<ControlFlow<()>> {
        self.printer.push(&step.text, self.out);
        Ok(stop_if(
            interrupt::after_step() || self.printer.write_failed(),
        ))
    }

    fn after_prefill_chunk(&mut self, _n_read: usize, _n_prompt: usize) -> Result<ControlFlow<()>> {
        Ok(stop_if(interrupt::after_prefill_chunk()))
    }
}
