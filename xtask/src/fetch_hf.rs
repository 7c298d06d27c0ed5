//! `cargo xtask fetch-model smollm2-hf`: SmolLM2 as Hugging Face model
//! directories (F32 and BF16) in the models folder, made from its Q4_1 GGUF
//! (fetched first) by `scripts/reference/hf_smollm2.py` in the reference
//! Python environment, with each directory's GGUF twin and llama.cpp's
//! conformance run of the twin (what the `lm` crate's `smollm2_hf` tests
//! compare against).
//!
//! The script writes each directory under a `.partial` name and renames it,
//! and each file the same way, so a present output is a finished one.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;
use lm_model::catalog::models_dir;

use crate::fetch_model::{ensure_model, find_known};
use crate::reference::{reference_python, run_checked};

/// The name `fetch-model` knows these directories by.
pub(crate) const NAME: &str = "smollm2-hf";

/// The file stem of every output (`<stem>-f32/`, `<stem>-bf16.gguf`, ...).
pub(crate) const STEM: &str = "SmolLM2-135M-Instruct-hf";

/// The `tokenizers` package the script builds tokenizer.json with.
const TOKENIZERS_VERSION: &str = "0.23.3";

/// Every output the script writes, relative to the models folder.
fn outputs() -> Vec<String> {
    ["f32", "bf16"]
        .iter()
        .flat_map(|kind| {
            [
                format!("{STEM}-{kind}/model.safetensors"),
                format!("{STEM}-{kind}/tokenizer.json"),
                format!("{STEM}-{kind}.gguf"),
                format!("{STEM}-{kind}.llama_cpp.json"),
            ]
        })
        .collect()
}

/// Makes the directories unless every output is present.
pub(crate) fn run() -> Result<()> {
    let dir = models_dir()?;
    if outputs().iter().all(|file| dir.join(file).is_file()) {
        println!(
            "{STEM}-f32 and -bf16 are already in {}; nothing to do",
            dir.display()
        );
        return Ok(());
    }
    let gguf = ensure_model(find_known("smollm2")?, None)?;
    let python = reference_python(None)?;
    let imports = |modules: &str| {
        Command::new(&python)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|output| output.status.success())
    };
    if !imports("tokenizers, jinja2") {
        println!("installing tokenizers=={TOKENIZERS_VERSION} and jinja2 into the reference venv");
        run_checked(
            Command::new(&python)
                .args(["-m", "pip", "install", "--disable-pip-version-check"])
                .arg(format!("tokenizers=={TOKENIZERS_VERSION}"))
                .arg("jinja2"),
        )?;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    println!(
        "writing {STEM}-f32 and -bf16 (safetensors, tokenizer.json, GGUF twins, llama.cpp's runs) into {}",
        dir.display()
    );
    run_checked(
        Command::new(&python)
            .arg(root.join("scripts/reference/hf_smollm2.py"))
            .arg("--gguf")
            .arg(&gguf)
            .arg("--out")
            .arg(&dir)
            .arg("--root")
            .arg(&root),
    )
}
