//! `lm-cli tokenize`: the ids of a text under a model's codec, or of the
//! chat prompt that wraps it (`--chat`).

use anyhow::Result;
use lm_tokenize::Message;

use crate::cli::{TokenizeArgs, UsageError};
use crate::commands::generate::read_prompt;
use crate::output::Output;
use crate::report::json::TokenizeReport;
use crate::report::token_label;
use crate::spec::ModelSpec;

/// Runs `lm-cli tokenize`.
pub fn run(args: TokenizeArgs) -> Result<()> {
    // The text as `generate` reads its prompt: --text, `-` or piped stdin.
    let text = read_prompt(args.text.as_deref(), None).map_err(|error| {
        match error.downcast_ref::<UsageError>() {
            Some(UsageError::NoPrompt) => UsageError::NoText.into(),
            _ => error,
        }
    })?;
    let spec = ModelSpec::or_default(args.model.model.as_ref());
    let codec = spec.load_codec()?;
    let text = if args.chat {
        codec.chat_prompt(&[Message::new("user", text)])?
    } else {
        text
    };
    let ids = if args.no_parse_special {
        codec.encode_literal(&text)?
    } else {
        codec.encode(&text)?
    };
    let tokens: Vec<String> = ids.iter().map(|&id| codec.token_piece(id)).collect();
    let mut out = Output::stdout();
    if args.json {
        return out.write_json(&TokenizeReport { ids, tokens });
    }
    let mut text = format!("{} tokens\n{:>8}  token\n", ids.len(), "id");
    for (id, token) in ids.iter().zip(&tokens) {
        text.push_str(&format!("{id:>8}  {}\n", token_label(token)));
    }
    out.write_now(&text)?;
    Ok(())
}
