//! The one-call API (`lm::prelude`, `GgufModel::{generate, chat, score,
//! generate_with, stream}`) on SmolLM2: each call is lm-decode's function
//! with the file's parts filled in, checked against lm-decode called by
//! hand and against log-softmax computed here from the model's own rows.
//! The README's snippet is checked to be the quickstart example's, and the
//! errors that need no model are checked without one.

use std::ops::ControlFlow;
use std::sync::{Arc, OnceLock};

use lm::lm_core::{LanguageModel, Prefix, Rows};
use lm::lm_decode::{GenerationConfig, PromptLookup, SamplingConfig, generate_speculative};
use lm::prelude::*;

use crate::common;

const QUESTION: &str = "What is 2 plus 2?";

/// SmolLM2 shared behind an `Arc`, as [`GgufModel::stream`] takes it
/// (panics without the model, naming the fetch command).
fn smollm2_arc() -> Arc<GgufModel> {
    static MODEL: OnceLock<Arc<GgufModel>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| Arc::new(lm::load(common::smollm2_path()).unwrap())))
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn generate_is_lm_decodes_generate_with_the_files_end_tokens() {
    let model = common::smollm2();
    let options = Options::default().max_new_tokens(24);
    let completion = model
        .generate("The capital of France is", &options)
        .unwrap();
    // The same run spelled out with lm-decode and the tokenizer.
    let ids = model
        .text
        .tokenizer
        .encode("The capital of France is")
        .unwrap();
    let config = GenerationConfig {
        max_new_tokens: 24,
        sampling: SamplingConfig::greedy(),
        end_tokens: vec![0, 2, 4],
        ..GenerationConfig::default()
    };
    let by_hand = generate(&model.decoder, &ids, &config, Some(&model.text.tokenizer)).unwrap();
    assert_eq!(completion.ids(), by_hand.tokens);
    assert_eq!(Some(&completion.text), by_hand.text.as_ref());
    assert_eq!(completion.generation, by_hand);
    let logprobs: Vec<f64> = by_hand.steps.iter().map(|step| step.logprob).collect();
    assert_eq!(completion.logprobs(), logprobs);
    assert!(completion.text.contains("Paris"), "{:?}", completion.text);
    // Ids are read as they are: the same run.
    assert_eq!(model.generate(&ids, &options).unwrap().generation, by_hand);
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn sampled_generate_is_lm_decodes_with_the_same_seed() {
    let model = common::smollm2();
    let options = Options::default()
        .max_new_tokens(16)
        .temperature(0.8)
        .top_k(40)
        .top_p(0.95)
        .min_p(0.05)
        .repetition_penalty(1.1)
        .seed(7);
    let completion = model.generate("Once upon a time", &options).unwrap();
    let config = model.generation_config(&options).unwrap();
    assert_eq!(config.sampling.seed, 7);
    assert_eq!(config.sampling.top_k, Some(40));
    let ids = model.text.tokenizer.encode("Once upon a time").unwrap();
    let by_hand = generate(&model.decoder, &ids, &config, Some(&model.text.tokenizer)).unwrap();
    assert_eq!(completion.generation, by_hand);
    assert!(
        completion
            .generation
            .steps
            .iter()
            .all(|step| step.u.is_some()),
        "sampled"
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn chat_answers_with_the_template_and_ends_on_an_end_token() {
    let model = common::smollm2();
    let question = [Message::new("user", QUESTION)];
    let answer = model.chat(&question, &Options::default()).unwrap();
    assert!(answer.text.contains('4'), "{:?}", answer.text);
    assert!(
        matches!(answer.stop_reason(), StopReason::EndToken(2)),
        "{:?}",
        answer.stop_reason()
    );
    assert!(answer.is_finished());
    // The prompt was the template's, contents kept literal.
    let prompt = model.text.encode_chat(&question, false).unwrap();
    assert_eq!(answer.generation.prompt, prompt);
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn the_readme_snippets_call_answers_four() {
    // The call examples/quickstart.rs makes, checked here for its answer.
    let model = common::smollm2();
    let question = [Message::new("user", "What is 2 plus 2?")];
    let answer = model.chat(&question, &Options::default()).unwrap();
    assert!(answer.text.contains('4'), "{:?}", answer.text);
}

#[test]
fn the_readme_snippet_is_the_quickstart_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let section = &readme[readme.find("## Use as a library").unwrap()..];
    let start = section.find("```rust\n").unwrap() + "```rust\n".len();
    let snippet = &section[start..start + section[start..].find("```").unwrap()];
    let example =
        std::fs::read_to_string(format!("{root}/crates/lm/examples/quickstart.rs")).unwrap();
    let begin = example.find("// README begin\n").unwrap() + "// README begin\n".len();
    let end = example.find("    // README end").unwrap();
    let indented: String = snippet
        .lines()
        .map(|line| {
            if line.is_empty() {
                "\n".to_owned()
            } else {
                format!("    {line}\n")
            }
        })
        .collect();
    assert_eq!(&example[begin..end], indented);
    assert!(snippet.starts_with("use lm::prelude::*;"));
    // And lib.rs's doc shows the same snippet.
    let lib = std::fs::read_to_string(format!("{root}/crates/lm/src/lib.rs")).unwrap();
    let doc: String = snippet
        .lines()
        .map(|line| format!("//!{}{line}\n", if line.is_empty() { "" } else { " " }))
        .collect();
    assert!(
        lib.contains(&doc),
        "lib.rs's doc differs from the README's snippet"
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn score_is_the_sum_of_log_softmax_over_the_models_rows_from_the_document_start() {
    let model = common::smollm2();
    let text = "The cat sat on the mat.";
    let score = model.score(text).unwrap();
    // SmolLM2's BOS is <|im_start|> (a chat turn's opening) and it adds none:
    // a document starts after <|endoftext|>, id 0.
    assert_eq!(model.text.tokenizer.bos_id(), Some(1));
    assert_eq!(score.context, [0]);
    let ids = model.text.tokenizer.encode(text).unwrap();
    assert_eq!(score.tokens, ids);
    // One pass over context + text, every row, then log-softmax by hand.
    let mut state = model.decoder.new_state();
    let mut rows = Vec::new();
    let fed: Vec<TokenId> = [0].iter().chain(&ids[..ids.len() - 1]).copied().collect();
    model
        .decoder
        .forward(&mut state, &fed, Rows::All, &mut rows)
        .unwrap();
    let vocab_size = model.decoder.vocab_size();
    let expected: Vec<f64> = rows
        .chunks_exact(vocab_size)
        .zip(&ids)
        .map(|(row, &token)| common::log_softmax_at(row, token))
        .collect();
    assert_eq!(score.logprobs.len(), expected.len());
    for (got, want) in score.logprobs.iter().zip(&expected) {
        assert!((got - want).abs() < 1e-4, "{got} against {want}");
    }
    let total: f64 = expected.iter().sum();
    assert!(
        (score.logprob - total).abs() < 1e-3,
        "{} against {total}",
        score.logprob
    );
    // `lm-cli score --model smollm2 --prompt "<|endoftext|>" --continuation
    // "The cat sat on the mat."` printed -20.6863 and perplexity 19.2053
    // (Q4_1 in panels; row-major: -20.6752 and 19.1750).
    assert!((score.logprob - -20.6863).abs() < 5e-3, "{}", score.logprob);
    assert!(
        (score.perplexity() - 19.2053).abs() < 0.01,
        "{}",
        score.perplexity()
    );
    // A text that starts with the document-start token has it as context.
    let led = model.score("<|endoftext|>The cat sat on the mat.").unwrap();
    assert_eq!((led.context, led.logprobs), (score.context, score.logprobs));
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn streamed_pieces_join_to_the_text_and_a_break_cancels() {
    let model = common::smollm2();
    let question = [Message::new("user", "Write a short poem about the sea.")];
    let options = Options::default().max_new_tokens(40);
    let mut pieces = Vec::new();
    let whole = model
        .generate_with(&question[..], &options, |piece| {
            pieces.push(piece.to_owned());
            ControlFlow::Continue(())
        })
        .unwrap();
    assert!(whole.ids().len() > 5);
    assert_eq!(pieces.concat(), whole.text);
    assert_eq!(
        whole.generation,
        model.chat(&question, &options).unwrap().generation
    );
    // Break at the fourth step: four tokens, cancelled, their text a prefix.
    let mut n_calls = 0;
    let cut = model
        .generate_with(&question[..], &options, |_| {
            n_calls += 1;
            if n_calls == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(cut.stop_reason(), &StopReason::Cancelled);
    assert_eq!(cut.ids(), &whole.ids()[..4]);
    assert!(
        whole.text.starts_with(&cut.text),
        "{:?} / {:?}",
        cut.text,
        whole.text
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn a_stream_iterates_the_pieces_and_stops_when_cancelled_or_dropped() {
    let model = smollm2_arc();
    let options = Options::default().max_new_tokens(32);
    let prompt = "The history of the Roman Empire";
    let stream = Arc::clone(&model).stream(prompt, &options).unwrap();
    let pieces: Vec<String> = stream.collect();
    let whole = model.generate(prompt, &options).unwrap();
    assert!(pieces.iter().all(|piece| !piece.is_empty()));
    assert_eq!(pieces.concat(), whole.text);
    // Finished after reading all: the same completion.
    let mut stream = Arc::clone(&model).stream(prompt, &options).unwrap();
    stream.by_ref().for_each(drop);
    assert_eq!(stream.finish().unwrap().generation, whole.generation);
    // Cancelled after two pieces: it stops early, the pieces read a prefix.
    let mut stream = Arc::clone(&model).stream(prompt, &options).unwrap();
    let read: String = stream.by_ref().take(2).collect();
    stream.cancel();
    let cut = stream.finish().unwrap();
    assert_eq!(cut.stop_reason(), &StopReason::Cancelled);
    assert!(
        cut.ids().len() < whole.ids().len(),
        "{} tokens",
        cut.ids().len()
    );
    assert!(cut.text.starts_with(&read) && whole.text.starts_with(&cut.text));
    // Dropped unread: the thread stops and is joined (no hang, no panic).
    drop(Arc::clone(&model).stream(prompt, &options).unwrap());
    assert_eq!(
        Arc::strong_count(&model),
        2,
        "the stream's thread let go of the model"
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn structured_output_needs_no_vocabulary_size() {
    let model = common::smollm2();
    let choices = vec!["red".to_owned(), "green".to_owned(), "blue".to_owned()];
    let question = [Message::new("user", "Name a colour of the sky.")];
    let options = Options::default().format(OutputFormat::Choice(choices.clone()));
    let answer = model.chat(&question, &options).unwrap();
    assert!(choices.contains(&answer.text), "{:?}", answer.text);
    let digits = Options::default().format(OutputFormat::Regex("[0-9]{1,3}".into()));
    let answer = model
        .chat(&[Message::new("user", QUESTION)], &digits)
        .unwrap();
    assert!(answer.text.chars().all(|c| c.is_ascii_digit()) && !answer.text.is_empty());
    assert!(answer.is_finished(), "{:?}", answer.stop_reason());
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn bad_input_is_a_typed_error() {
    let model = common::smollm2();
    let bad = Options {
        sampling: SamplingConfig {
            min_p: Some(1.5),
            ..SamplingConfig::greedy()
        },
        ..Options::default()
    };
    let error = model.generate("Hi", &bad).unwrap_err();
    assert!(
        matches!(&error, Error::Setting(setting) if setting.field == "min_p"),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "min_p must be in [0, 1], got 1.5");
    let error = model.score("").unwrap_err();
    assert!(
        matches!(error, Error::NothingToScore { n_tokens: 0 }),
        "{error:?}"
    );
    let error = model.generate("", &Options::default()).unwrap_err();
    assert!(matches!(error, Error::Decode(_)), "{error:?}");
    let error = model
        .generate(
            "Hi",
            &Options::default().format(OutputFormat::Regex("[0-9".into())),
        )
        .unwrap_err();
    assert!(matches!(error, Error::Format(_)), "{error:?}");
}

/// Writes one logits row fewer than asked for whenever it reads more than
/// one token (the speculative verification pass).
struct ShortRows;

impl LanguageModel for ShortRows {
    type State = Prefix;
    fn vocab_size(&self) -> usize {
        4
    }
    fn context_length(&self) -> Option<usize> {
        None
    }
    fn new_state(&self) -> Prefix {
        Prefix::default()
    }
    fn forward(
        &self,
        state: &mut Prefix,
        tokens: &[TokenId],
        rows: Rows,
        logits: &mut Vec<f32>,
    ) -> lm::lm_core::Result<()> {
        state.tokens.extend_from_slice(tokens);
        let n_rows = match rows {
            Rows::Last => 1,
            Rows::All => tokens.len().saturating_sub(1).max(1),
        };
        logits.clear();
        for _ in 0..n_rows {
            logits.extend([0.0, 1.0, 0.0, 0.0]);
        }
        Ok(())
    }
}

#[test]
fn speculative_decoding_names_the_vocabulary_size_when_rows_are_short() {
    let config = GenerationConfig {
        max_new_tokens: 8,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    // Token 1 repeats, so prompt lookup drafts and the target reads 1 + draft.
    let error = generate_speculative(
        &ShortRows,
        &[1, 1, 1, 1],
        &config,
        None,
        PromptLookup::new(3),
        (),
    )
    .unwrap_err();
    let message = error.to_string();
    assert!(message.ends_with("rows of 4"), "{message}");
    assert!(
        matches!(
            error,
            lm::lm_decode::Error::LogitsRows { vocab_size: 4, .. }
        ),
        "{error:?}"
    );
}
