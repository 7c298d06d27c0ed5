//! The official `openai` Python client against the server on SmolLM2
//! (`openai_client.py`: completions, chat, streaming, logprobs, `n`, stop,
//! seeded reproducibility, `response_format`). The client comes from PyPI into
//! `<target>/openai-venv` (`.ci/run` installs it), or `LM_OPENAI_PYTHON`
//! names an interpreter that has it.

use std::path::PathBuf;
use std::process::Command;

use lm_serve::ServeConfig;

use crate::common::{TestServer, smollm2_path};

/// The interpreter with `openai`; panics saying how to install it.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("LM_OPENAI_PYTHON") {
        return PathBuf::from(python);
    }
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target folder")
        .to_owned();
    let python = target.join("openai-venv/bin/python");
    assert!(
        python.exists(),
        "no {}: run `python3 -m venv {1}/openai-venv && {1}/openai-venv/bin/pip install openai` \
         (as .ci/run does), or set LM_OPENAI_PYTHON",
        python.display(),
        target.display()
    );
    python
}

#[test]
#[ignore = "needs SmolLM2 and the openai package: cargo xtask fetch-model smollm2; .ci/run installs openai"]
fn the_openai_python_client_works_against_the_server() {
    let python = python();
    let lm::GgufModel { decoder, text, .. } = lm::load_gguf(smollm2_path()).unwrap();
    let s = TestServer::start(
        decoder,
        text,
        ServeConfig {
            model_name: "smollm2".into(),
            ..ServeConfig::default()
        },
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output = Command::new(&python)
        .arg(script)
        .arg(format!("http://{}/v1", s.addr))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
