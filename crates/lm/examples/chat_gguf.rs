//! Chat with SmolLM2 from its GGUF file: load it through the one loader,
//! render the chat template for one question, generate greedily and stream
//! the answer without special tokens, stopping on the model's end tokens.
//! `cargo run --release -p lm --example chat_gguf [MODEL.gguf] ["question"]`;
//! without a path it uses SmolLM2 from the models folder, and when that is
//! missing it says "skipped: ..." naming the command that fetches it and
//! exits 0 (CI runs every example, the model or not).

use std::error::Error;
use std::io::Write;
use std::ops::ControlFlow;
use std::process::ExitCode;
use std::time::Instant;

use lm::lm_decode::{GenerationConfig, SamplingConfig, generate_streaming};
use lm::lm_model::catalog::SMOLLM2;
use lm::lm_tokenize::Message;

const QUESTION: &str = "What is 2 plus 2?";

fn main() -> ExitCode {
    let Err(error) = chat() else {
        return ExitCode::SUCCESS;
    };
    eprintln!("error: {}", lm::lm_core::error_chain(&*error));
    ExitCode::FAILURE
}

fn chat() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let path = match args.next() {
        Some(path) => path.into(),
        None => match SMOLLM2.path() {
            Ok(path) => path,
            Err(error) => {
                eprintln!("skipped: {error}"); // it names the fetch command
                return Ok(());
            }
        },
    };
    let question = args.next().unwrap_or_else(|| QUESTION.into());
    let model = lm::load_gguf(&path)?;
    let text = &model.text;
    let prompt = text.chat_prompt(&[Message::new("user", question.as_str())])?;
    let config = GenerationConfig {
        max_new_tokens: 64,
        sampling: SamplingConfig::greedy(),
        end_tokens: text.end_ids.clone(),
        ..GenerationConfig::default()
    };

    println!("> {question}");
    let mut stream = text.tokenizer.text_stream(true);
    let mut stdout = std::io::stdout().lock();
    let start = Instant::now();
    let prompt_ids = text.tokenizer.encode(&prompt)?;
    // Each token's text as soon as it is whole (an emoji may span tokens);
    // a failed write or detokenization ends the run with that error.
    let generation = generate_streaming(&model.decoder, &prompt_ids, &config, None, |step| {
        if let Some(piece) = stream.push(step.token)? {
            write!(stdout, "{piece}")?;
            stdout.flush()?;
        }
        Ok::<_, Box<dyn Error>>(ControlFlow::Continue(()))
    })?;
    let rate = generation.tokens.len() as f64 / start.elapsed().as_secs_f64();
    writeln!(stdout, "{}", stream.finish()?)?;
    eprintln!("{rate:.1} tokens/s, the prompt's prefill included");
    Ok(())
}
