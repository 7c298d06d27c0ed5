//! SmolLM2's chat template (a committed copy of its GGUF metadata) rendered
//! against hand-written ChatML text; with the model (an ignored test), the
//! copy is checked against the file and the rendered prompt is tokenized.

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

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn committed_template_is_the_models_and_its_prompt_tokenizes_with_single_specials() {
    let file = common::smollm2_gguf();
    let vocab = common::bpe_vocab(&file);
    let committed =
        std::fs::read_to_string(common::fixture_path("tokenize/smollm2_chat_template.jinja"))
            .unwrap();
    assert_eq!(vocab.chat_template.as_deref(), Some(committed.as_str()));

    let tokenizer = lm_tokenize::Tokenizer::from_bpe_vocab(vocab).unwrap();
    let template = ChatTemplate::new(
        tokenizer.chat_template().unwrap(),
        tokenizer.special_text(tokenizer.bos_id()),
        tokenizer.special_text(tokenizer.eos_id()),
    )
    .unwrap();
    let prompt = template
        .render(&[Message::new("user", "Hi")], true)
        .unwrap();
    let ids = tokenizer.encode(&prompt).unwrap();
    // <|im_start|> = 1 and <|im_end|> = 2 appear as single tokens: three turns
    // open (system, user, assistant) and two close.
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
    assert_eq!(tokenizer.decode(&ids).unwrap(), prompt);
}
