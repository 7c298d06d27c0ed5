//! SmolLM2's chat template (a committed copy of its GGUF metadata) rendered
//! against hand-written ChatML text. The `lm` crate's tests check the copy
//! against the model file, through the GGUF loader.

use lm_tokenize::{ChatTemplate, Message};

use crate::common;

fn smollm2_template() -> ChatTemplate {
    let path = common::fixture_path("tokenize/smollm2_chat_template.jinja");
    let source = std::fs::read_to_string(&path).expect("template fixture");
    ChatTemplate::new(&source, Some("<|im_start|>"), Some("<|im_end|>")).expect("compiles")
}

const DEFAULT_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

#[test]
fn user_message_gets_the_default_system_message() {
    let text = smollm2_template()
        .render(&[Message::new("user", "What is 2+2?")], true)
        .unwrap();
    let expected = format!(
        "{DEFAULT_SYSTEM}<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(text, expected);
}

#[test]
fn given_system_message_replaces_the_default() {
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello!"),
        Message::new("user", "Bye"),
    ];
    let text = smollm2_template().render(&messages, false).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    );
}

#[test]
fn no_messages_and_no_generation_prompt_is_empty() {
    assert_eq!(smollm2_template().render(&[], false).unwrap(), "");
}
