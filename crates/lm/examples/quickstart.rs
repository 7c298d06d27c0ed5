//! The README's "Use as a library" snippet, run as written: SmolLM2
//! answers "What is 2 plus 2?" in one `chat` call, greedy by default.
//! `cargo run --release -p lm --example quickstart`. The snippet names the
//! file as the models folder holds it, so it runs there; without SmolLM2
//! this says "skipped: ..." naming the command that fetches it and exits 0
//! (CI runs every example, the model or not). A test checks that the
//! snippet below is the README's, line for line.

use std::process::ExitCode;

use lm::lm_model::catalog::SMOLLM2;

fn main() -> ExitCode {
    let path = match SMOLLM2.path() {
        Ok(path) => path,
        Err(error) => {
            eprintln!("skipped: {error}"); // it names the fetch command
            return ExitCode::SUCCESS;
        }
    };
    if let Some(folder) = path.parent()
        && let Err(error) = std::env::set_current_dir(folder)
    {
        eprintln!("error: entering {}: {error}", folder.display());
        return ExitCode::FAILURE;
    }
    match readme_snippet() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", lm::lm_core::error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// The README's snippet between the markers, indented one level.
#[rustfmt::skip]
fn readme_snippet() -> Result<(), lm::Error> {
    // README begin
    use lm::prelude::*;

    fn main() -> Result<(), lm::Error> {
        let model = lm::load("SmolLM2-135M-Instruct.Q4_1.gguf")?; // a GGUF file or a Hugging Face directory
        let question = [Message::new("user", "What is 2 plus 2?")];
        let answer = model.chat(&question, &Options::default())?; // greedy, up to 256 tokens
        println!("{}", answer.text);
        Ok(())
    }
    // README end
    main()
}
