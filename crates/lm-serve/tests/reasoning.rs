//! Reasoning replies and `chat_template_kwargs` on SmolLM2's weights with a
//! Qwen3 chat template (`qwen3_chat_template.jinja`, the template of
//! Qwen/Qwen3-8B's tokenizer_config.json) written into a copy of the file:
//! a reply forced by `guided_regex` to `<think>a</think>b` comes back as
//! `reasoning_content` "a" and `content` "b", whole and streamed;
//! `enable_thinking: false` reaches the template (its prompt closes an
//! empty block, counted against the hand-written text) and leaves the
//! reply whole; a non-object `chat_template_kwargs` is a 400.

use std::path::PathBuf;

use lm_serve::{ServeConfig, ServedText};
use serde_json::{Value, json};

use crate::common::{TestServer, post_body, smollm2_path};
use crate::tool_calls::with_chat_template;

/// A greedy chat request for `messages` whose reply is `regex`.
fn forced(messages: Value, regex: &str) -> Value {
    json!({"messages": messages, "guided_regex": regex, "temperature": 0, "max_tokens": 40})
}

/// The (reasoning, content) a stream's deltas assemble to.
fn streamed(server: &TestServer, mut body: Value) -> (String, String) {
    body["stream"] = json!(true);
    let response = post_body(server.addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(response.status, 200);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for chunk in response.chunks() {
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    (reasoning, content)
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn think_blocks_become_reasoning_content_and_kwargs_reach_qwen3_s_template() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lm-serve-reasoning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("smollm2-qwen3-template.gguf");
    with_chat_template(
        &smollm2_path(),
        &path,
        include_str!("qwen3_chat_template.jinja"),
    );
    let lm::GgufModel { decoder, text, .. } = lm::load_gguf(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    // The prompts by hand, for the prompt sizes the server reports.
    let hand = |tail: &str| {
        let prompt = format!("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n{tail}");
        ServedText::encode(&text, &prompt).unwrap().len()
    };
    let (n_plain, n_off) = (hand(""), hand("<think>\n\n</think>\n\n"));
    assert!(n_off > n_plain);
    let server = TestServer::start(decoder, text, ServeConfig::default());
    let user = json!([{"role": "user", "content": "Hi"}]);

    let body = forced(user.clone(), "<think>a</think>b");
    let (status, answer) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "a", "{answer}");
    assert_eq!(message["content"], "b", "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"], n_plain);
    assert_eq!(streamed(&server, body), ("a".into(), "b".into()));

    // A prompt that opened the block (here a prefilled assistant turn):
    // the reply starts inside it.
    let prefilled =
        json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>"}]);
    let body = forced(prefilled, "x y</think>\n\nz");
    let (_, answer) = server.post("/v1/chat/completions", &body);
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "x y", "{answer}");
    assert_eq!(message["content"], "\n\nz", "{answer}");
    assert_eq!(streamed(&server, body), ("x y".into(), "\n\nz".into()));

    // Thinking off: the template closes an empty block in the prompt, and
    // the reply is left whole.
    let mut body = forced(user.clone(), "<think>a</think>b");
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (status, answer) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["content"], "<think>a</think>b", "{answer}");
    assert_eq!(message.get("reasoning_content"), None, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"], n_off);
    assert_eq!(
        streamed(&server, body),
        ("".into(), "<think>a</think>b".into())
    );

    for kwargs in [json!([1]), json!("enable_thinking")] {
        let mut body = forced(user.clone(), "b");
        body["chat_template_kwargs"] = kwargs;
        let (status, answer) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], "chat_template_kwargs", "{answer}");
    }
}
