//! The official `openai` Python client against the server on SmolLM2
//! (`openai_client.py`: completions, chat, streaming, logprobs, `n`, stop,
//! seeded reproducibility, `response_format`). The client comes from PyPI into
//! `<target>/openai-venv` (`.ci/run` installs it), or `LM_OPENAI_PYTHON`
//! names an interpreter that has it.

use lm_serve::ServeConfig;

use crate::common::{TestServer, run_checks, smollm2_path, venv_python};

#[test]
#[ignore = "needs SmolLM2 and the openai package: cargo xtask fetch-model smollm2; .ci/run installs openai"]
fn the_openai_python_client_works_against_the_server() {
    let python = venv_python("LM_OPENAI_PYTHON", "openai-venv", &["openai"]);
    let s = TestServer::named(smollm2_path(), "smollm2", ServeConfig::default());
    run_checks(
        &python,
        "openai_client.py",
        &[format!("http://{}/v1", s.addr)],
    );
}
