//! Tool calls and guided decoding through the official `openai` Python
//! client (`tool_calls.py`, validating with `jsonschema`): on SmolLM2, whose
//! template does not read `tools` (the server's generic rendering), with the
//! regex, choice, Lark and `json_schema` fields too; and on SmolLM2's weights
//! with Qwen 2.5's real chat template (`qwen2.5_chat_template.jinja`, from
//! Qwen/Qwen2.5-7B-Instruct's tokenizer_config.json) written into a copy of
//! the file, so the template renders the tools and calls are
//! `<tool_call>` JSON; and with Llama 3.1's real template
//! (`llama3.1_chat_template.jinja`: the `chat_template` of
//! meta-llama/Llama-3.1-8B-Instruct's tokenizer_config.json, the text
//! llama.cpp keeps as models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja,
//! transcribed from a public copy of it), whose calls are
//! `{"name", "parameters"}` JSON and whose tool results are `ipython`
//! turns. The interpreter is `<target>/openai-venv`, where
//! `.ci/run` installs `openai` and `jsonschema`, or `LM_OPENAI_PYTHON`.

use std::path::{Path, PathBuf};

use lm_model::{GgufFile, GgufWriter, MetadataValue};
use lm_serve::{ServeConfig, ServedText};

use crate::common::{TestServer, run_checks, smollm2_path, venv_python};

/// Runs `tool_calls.py` against `server` with `args`; fails with its output.
fn run_script(server: &TestServer, args: &[&str]) {
    let python = venv_python("LM_OPENAI_PYTHON", "openai-venv", &["openai", "jsonschema"]);
    let url = format!("http://{}/v1", server.addr);
    let args: Vec<&str> = std::iter::once(url.as_str())
        .chain(args.iter().copied())
        .collect();
    run_checks(&python, "tool_calls.py", &args);
}

#[test]
#[ignore = "needs SmolLM2 and the openai venv: cargo xtask fetch-model smollm2; .ci/run installs openai and jsonschema"]
fn tool_calls_and_guided_fields_on_smollm2_through_the_openai_client() {
    let server = TestServer::named(smollm2_path(), "smollm2", ServeConfig::default());
    run_script(&server, &["smollm2", "--guided"]);
}

/// A copy of `source` at `dest` whose `tokenizer.chat_template` is
/// `template` (every other key and tensor as they are).
pub(crate) fn with_chat_template(source: &Path, dest: &Path, template: &str) {
    let file = GgufFile::map(source).unwrap();
    let mut writer = GgufWriter::new();
    for (key, value) in file.metadata() {
        writer.set(key, value.clone());
    }
    writer.set(
        "tokenizer.chat_template",
        MetadataValue::String(template.to_owned()),
    );
    for info in file.tensors() {
        writer
            .add_tensor(&info.name, &info.dims, info.ggml_type)
            .unwrap();
    }
    let base = file.data_offset();
    let sources = file.tensors().to_vec();
    writer
        .write(dest, |i, _| {
            let info = &sources[i];
            let start = base + info.offset;
            Ok(file.bytes()[start..start + info.n_bytes].to_vec())
        })
        .unwrap();
}

/// A server on SmolLM2's weights whose file carries `template` as its chat
/// template (a copy, written to a scratch folder), served as `name`.
fn with_template_server(template: &str, name: &str) -> TestServer {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lm-serve-tool-calls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("smollm2-template.gguf");
    with_chat_template(&smollm2_path(), &path, template);
    let lm::GgufModel { decoder, text, .. } = lm::load_gguf(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(text.chat_reads_tools(), "{name}'s template renders tools");
    TestServer::start(
        decoder,
        text,
        ServeConfig {
            model_name: name.into(),
            ..ServeConfig::default()
        },
    )
}

#[test]
#[ignore = "needs SmolLM2 and the openai venv: cargo xtask fetch-model smollm2; .ci/run installs openai and jsonschema"]
fn tool_calls_with_qwen_2_5_s_template_through_the_openai_client() {
    let server = with_template_server(include_str!("qwen2.5_chat_template.jinja"), "qwen-template");
    // Under "auto", a reply pushed (by logit_bias) into `<tool_call>` is a
    // valid call.
    run_script(&server, &["qwen-template", "--marker", "<tool_call>"]);
}

#[test]
#[ignore = "needs SmolLM2 and the openai venv: cargo xtask fetch-model smollm2; .ci/run installs openai and jsonschema"]
fn tool_calls_with_llama_3_1_s_template_through_the_openai_client() {
    let server = with_template_server(
        include_str!("llama3.1_chat_template.jinja"),
        "llama-template",
    );
    run_script(&server, &["llama-template"]);
}
