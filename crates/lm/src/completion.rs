//! One call from a loaded model to an answer: [`GgufModel::generate`],
//! [`GgufModel::chat`] and [`GgufModel::generate_with`] (streaming, with a
//! cancel between steps) give a [`Completion`]; [`GgufModel::score`] gives
//! a text's [`Score`] from BOS.
//!
//! Each is lm-decode's function with the parts a file gives filled in (the
//! tokenizer, the chat template, the end tokens, the vocabulary an output
//! format is compiled for):
//!
//! ```text
//! Prompt ─prompt_ids─> ids ─┐
//! Options ─generation_config─> GenerationConfig ─> lm_decode::generate_streaming ─> Completion
//! text ─encode─> BOS + ids ─> lm_decode::score_continuation ─> Score
//! ```
//!
//! With [`Options::draft`] the loop is lm-decode's speculative one;
//! [`GgufModel::generate_batch`] runs several prompts through the
//! multi-sequence forward and [`GgufModel::beam_search`] runs lm-decode's
//! beam search, each from the same [`GenerationConfig`].

use std::ops::ControlFlow;

use lm_core::{LanguageModel, TokenId};
use lm_decode::{
    BeamConfig, BeamStep, Drafter, Generation, GenerationConfig, Hypothesis, ModelDrafter,
    OutputConstraint, PromptLookup, StopReason,
};
use lm_tokenize::Message;

use crate::error::Error;
use crate::gguf::GgufModel;
use crate::options::{Drafting, Options, Prompt};

/// The most tokens a drafter proposes per round (lm-cli's default).
const MAX_DRAFT: usize = 8;

/// What a one-call generation gives: the text and the trace it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The generated text: no end token, cut before a stop string.
    pub text: String,
    /// lm-decode's trace: every step's token, probabilities and top
    /// candidates, and why the run stopped.
    pub generation: Generation,
}

impl Completion {
    /// The generated token ids; an end token that stopped the run is the
    /// last.
    pub fn ids(&self) -> &[TokenId] {
        &self.generation.tokens
    }

    /// The model's natural-log probability of each generated token (softmax
    /// at temperature 1 of the raw logits), one per id.
    pub fn logprobs(&self) -> Vec<f64> {
        self.generation
            .steps
            .iter()
            .map(|step| step.logprob)
            .collect()
    }

    /// Why the run stopped.
    pub fn stop_reason(&self) -> &StopReason {
        &self.generation.stop_reason
    }

    /// True when the model, a stop string or the output format ended the
    /// run; false when a limit or a cancel cut it off.
    pub fn is_finished(&self) -> bool {
        self.generation.is_finished()
    }

    fn new(generation: Generation) -> Self {
        Self {
            text: generation.text.clone().unwrap_or_default(),
            generation,
        }
    }
}

/// A text's log-probability under the model, token by token
/// ([`GgufModel::score`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// What the scored tokens were read after and is not scored itself:
    /// [`GgufText::document_start`](crate::GgufText::document_start), or the text's first token when the
    /// vocabulary has no such token.
    pub context: Vec<TokenId>,
    /// The scored tokens.
    pub tokens: Vec<TokenId>,
    /// `ln p(tokens[i] | context, tokens[..i])`, one per token.
    pub logprobs: Vec<f64>,
    /// Their sum: the chain-rule log-probability of the tokens.
    pub logprob: f64,
}

impl Score {
    /// `exp(-logprob / n)`: the geometric mean of the inverse token
    /// probabilities.
    pub fn perplexity(&self) -> f64 {
        (-self.logprob / self.tokens.len() as f64).exp()
    }
}

impl GgufModel {
    /// The ids the model reads for `prompt`: text through the tokenizer
    /// (special-token text parsed, BOS added when the file asks for it),
    /// ids as they are, a chat through the chat template.
    pub fn prompt_ids<'p>(&self, prompt: impl Into<Prompt<'p>>) -> Result<Vec<TokenId>, Error> {
        Ok(match prompt.into() {
            Prompt::Text(text) => self.text.tokenizer.encode(text)?,
            Prompt::Ids(ids) => ids.to_vec(),
            Prompt::Chat(messages) => self.text.encode_chat(messages, false)?,
        })
    }

    /// `options` as lm-decode's [`GenerationConfig`] for this model: its end
    /// tokens, and the output format compiled for its vocabulary. The
    /// one-call methods run lm-decode's loop with exactly this config, so
    /// a caller who needs more (beam search, speculative decoding, a batch)
    /// starts from it.
    pub fn generation_config(&self, options: &Options) -> Result<GenerationConfig, Error> {
        options.sampling.validate()?;
        let constraint = match &options.format {
            Some(format) => Some(OutputConstraint::new(
                self.text
                    .structured_output(format, self.decoder.vocab_size())?,
            )),
            None => None,
        };
        Ok(GenerationConfig {
            max_new_tokens: options.max_new_tokens,
            sampling: options.sampling.clone(),
            end_tokens: self.text.end_ids.clone(),
            stop_strings: options.stop.clone(),
            n_top_candidates: options.n_top_candidates,
            constraint,
            ..GenerationConfig::default()
        })
    }

    /// Continues `prompt` (text, ids or a chat; see [`Prompt`]) as
    /// `options` say: greedy by default.
    ///
    /// ```no_run
    /// use lm::prelude::*;
    /// let model = lm::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let completion = model.generate("The capital of France is", &Options::default().max_new_tokens(8))?;
    /// println!("{} ({})", completion.text, completion.stop_reason());
    /// # Ok::<(), lm::Error>(())
    /// ```
    pub fn generate<'p>(
        &self,
        prompt: impl Into<Prompt<'p>>,
        options: &Options,
    ) -> Result<Completion, Error> {
        self.generate_with(prompt, options, |_| ControlFlow::Continue(()))
    }

    /// The assistant's answer to `messages`, rendered with the model's chat
    /// template (contents kept literal) and ending on its end tokens.
    ///
    /// ```no_run
    /// use lm::prelude::*;
    /// let model = lm::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let answer = model.chat(&[Message::new("user", "What is 2 plus 2?")], &Options::default())?;
    /// println!("{}", answer.text);
    /// # Ok::<(), lm::Error>(())
    /// ```
    pub fn chat(&self, messages: &[Message], options: &Options) -> Result<Completion, Error> {
        self.generate(messages, options)
    }

    /// [`GgufModel::generate`] streaming: `on_piece` gets the text each
    /// step made final as soon as its token is chosen (often empty: a
    /// character split over tokens, or text that may start a stop string,
    /// waits), then once more what was held back when the run ended, if
    /// anything. The pieces join to [`Completion::text`].
    ///
    /// `on_piece` returning `ControlFlow::Break(())` stops the run after
    /// that step ([`StopReason::Cancelled`]): it is called at every step, so
    /// a Ctrl-C flag or a consumer that went away stops the model within
    /// one token.
    ///
    /// ```no_run
    /// use std::io::Write;
    /// use lm::prelude::*;
    /// let model = lm::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let messages = [Message::new("user", "Tell me a story.")];
    /// let story = model.generate_with(&messages[..], &Options::default(), |piece| {
    ///     print!("{piece}");
    ///     let _ = std::io::stdout().flush();
    ///     ControlFlow::Continue(())
    /// })?;
    /// # Ok::<(), lm::Error>(())
    /// ```
    pub fn generate_with<'p>(
        &self,
        prompt: impl Into<Prompt<'p>>,
        options: &Options,
        on_piece: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Completion, Error> {
        let ids = self.prompt_ids(prompt)?;
        let config = self.generation_config(options)?;
        self.run(&ids, &config, options.draft.as_ref(), on_piece)
    }

    /// lm-decode's loop over `ids` with `config` (the speculative one with
    /// `draft`), each step's text to `on_piece`, then the text held back at
    /// the end.
    pub(crate) fn run(
        &self,
        ids: &[TokenId],
        config: &GenerationConfig,
        draft: Option<&Drafting>,
        mut on_piece: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Completion, Error> {
        let tokenizer = Some(&self.text.tokenizer as &dyn lm_core::Detokenize);
        let hook = |step: &lm_decode::Step| Ok::<_, lm_decode::Error>(on_piece(&step.text));
        let generation = match draft {
            None => lm_decode::generate_streaming(&self.decoder, ids, config, tokenizer, hook)?,
            Some(draft) => {
                // One speculative call, whichever drafter proposes.
                let (mut lookup, mut by_model);
                let drafter: &mut dyn Drafter = match draft {
                    Drafting::PromptLookup => {
                        lookup = PromptLookup::new(MAX_DRAFT);
                        &mut lookup
                    }
                    Drafting::Model(draft) => {
                        let (target, drafted) =
                            (self.decoder.vocab_size(), draft.decoder.vocab_size());
                        if drafted != target {
                            // The draft's ids must mean the target's tokens.
                            return Err(lm_decode::Error::from(lm_core::Error::LengthMismatch {
                                left: drafted,
                                right: target,
                            })
                            .into());
                        }
                        by_model = ModelDrafter::new(&draft.decoder, MAX_DRAFT);
                        &mut by_model
                    }
                };
                lm_decode::generate_speculative(
                    &self.decoder,
                    ids,
                    config,
                    tokenizer,
                    drafter,
                    hook,
                )?
                .0
            }
        };
        if !generation.held_back_text.is_empty() {
            // The run is over: there is nothing left to stop.
            let _ = on_piece(&generation.held_back_text);
        }
        Ok(Completion::new(generation))
    }

    /// Continues every prompt of `prompts` with `options`, the rows still
    /// running read together by the multi-sequence forward
    /// ([`lm_decode::generate_batch`]; row i draws from random stream
    /// `i`, so greedy rows give exactly the ids one-by-one calls give).
    /// [`Options::draft`] is not used.
    pub fn generate_batch(
        &self,
        prompts: &[Prompt<'_>],
        options: &Options,
    ) -> Result<Vec<Completion>, Error> {
        let ids = prompts
            .iter()
            .map(|&prompt| self.prompt_ids(prompt))
            .collect::<Result<Vec<_>, _>>()?;
        let slices: Vec<&[TokenId]> = ids.iter().map(Vec::as_slice).collect();
        let config = self.generation_config(options)?;
        let runs =
            lm_decode::generate_batch(&self.decoder, &slices, &config, Some(&self.text.tokenizer))?;
        Ok(runs.into_iter().map(Completion::new).collect())
    }

    /// lm-decode's beam search from `prompt`: up to `num_beams`
    /// hypotheses, best first, ranked by the log-probability divided by
    /// `((5 + length) / 6)^length_penalty` (HF's `length_penalty`). It uses
    /// the options' limit, end tokens, penalties, logit bias, output
    /// format and top candidates, and no temperature, filter or seed.
    pub fn beam_search<'p>(
        &self,
        prompt: impl Into<Prompt<'p>>,
        options: &Options,
        num_beams: usize,
        length_penalty: f32,
    ) -> Result<Vec<Hypothesis>, Error> {
        self.beam_search_with(prompt, options, num_beams, length_penalty, |_| {
            ControlFlow::Continue(())
        })
    }

    /// [`GgufModel::beam_search`] with `on_step` called after every step;
    /// `ControlFlow::Break(())` stops the search, its live beams then
    /// ranked as [`StopReason::Cancelled`] hypotheses (a Ctrl-C flag stops
    /// it within one step).
    pub fn beam_search_with<'p>(
        &self,
        prompt: impl Into<Prompt<'p>>,
        options: &Options,
        num_beams: usize,
        length_penalty: f32,
        mut on_step: impl FnMut(&BeamStep) -> ControlFlow<()>,
    ) -> Result<Vec<Hypothesis>, Error> {
        let ids = self.prompt_ids(prompt)?;
        let config = self.generation_config(options)?;
        let beams = BeamConfig {
            num_beams,
            length_penalty,
            max_new_tokens: config.max_new_tokens,
            end_tokens: config.end_tokens,
            adjustments: config.sampling,
            n_top_candidates: config.n_top_candidates,
            constraint: config.constraint,
            ..BeamConfig::default()
        };
        Ok(lm_decode::beam_search_streaming(
            &self.decoder,
            &ids,
            &beams,
            |step| Ok::<_, lm_decode::Error>(on_step(step)),
        )?)
    }

    /// The model's log-probability of `text` token by token, read from the
    /// start of a document: after [`GgufText::document_start`](crate::GgufText::document_start) (SmolLM2's
    /// `<|endoftext|>`, Gemma's BOS; the same token leading the text is
    /// that context, not scored), else, for a vocabulary with neither BOS
    /// nor `<|endoftext|>`, after the text's first token, which is then not
    /// scored. For SmolLM2 this is `lm-cli score --prompt "<|endoftext|>"
    /// --continuation TEXT`; the text is tokenized with special-token text
    /// parsed.
    ///
    /// ```no_run
    /// let model = lm::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let score = model.score("The cat sat on the mat.")?;
    /// println!("ln p = {:.3}, perplexity {:.2}", score.logprob, score.perplexity());
    /// # Ok::<(), lm::Error>(())
    /// ```
    pub fn score(&self, text: &str) -> Result<Score, Error> {
        let mut tokens = self.text.tokenizer.encode(text)?;
        let n_tokens = tokens.len();
        let context = match self.text.document_start() {
            Some(start) if tokens.first() == Some(&start) => vec![tokens.remove(0)],
            Some(start) => vec![start],
            None if n_tokens > 1 => vec![tokens.remove(0)],
            None => return Err(Error::NothingToScore { n_tokens }),
        };
        if tokens.is_empty() {
            return Err(Error::NothingToScore { n_tokens });
        }
        let scored = lm_decode::score_continuation(&self.decoder, &context, &tokens)?;
        Ok(Score {
            context,
            tokens: scored.tokens,
            logprobs: scored.logprobs,
            logprob: scored.logprob,
        })
    }
}
