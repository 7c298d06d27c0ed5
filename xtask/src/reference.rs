//! `cargo xtask reference-fixtures`: regenerate `fixtures/smollm2/` and
//! `fixtures/gemma3/tokenize.json` from llama.cpp.
//!
//! llama.cpp is the reference implementation we conform to. This task runs
//! `scripts/reference/llama_cpp_reference.py` with the PyPI package
//! `llama-cpp-python` at a pinned version, which compiles llama.cpp from source on
//! first install (several minutes on two cores). The package lives in a virtual
//! environment under the target folder, `<target>/reference-venv`, so nothing is
//! installed system-wide and nothing from llama.cpp enters the repository: only its
//! outputs (token ids, logits) are committed, as data. A second script,
//! `scripts/reference/exact_forward.py`, recomputes the last logits rows in float64
//! with numpy and the `gguf` package, to show how far llama.cpp is from exact math.
//! A third, `scripts/reference/tokenize_reference.py`, writes llama.cpp's ids
//! and detokenized texts for Gemma 3's SentencePiece vocabulary (reading only
//! the vocabulary of the file in the models folder).
//!
//! This is a maintainer task, never run in CI; the tests only read the committed
//! fixtures.
//!
//! Options: `--python <interpreter>` uses an interpreter that already has
//! `llama-cpp-python` installed instead of the virtual environment; `--model <gguf>`
//! uses that file instead of fetching SmolLM2 into the models folder.
//!
//! `cargo xtask reference-fixtures --arch [--python <interpreter>]` instead
//! regenerates `fixtures/arch/`: `scripts/reference/random_gguf.py` writes small
//! seeded random-weight GGUF files (llama with Llama 3 `rope_freqs`, qwen2, qwen3,
//! gemma3) and llama.cpp's logits on each; no model is fetched.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::fetch_model;
use crate::project_root;

/// The `llama-cpp-python` release the fixtures were generated with; its bundled
/// llama.cpp revision is recorded in `fixtures/smollm2/README.md`.
pub(crate) const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";

/// The `gguf` release (ggml's GGUF reader and dequantizer) the exact-math reference uses.
pub(crate) const GGUF_VERSION: &str = "0.19.0";

/// The generator scripts, relative to the project root, in the order they run: the
/// llama.cpp outputs, then the float64 forward pass that reads them.
const SCRIPTS: [&str; 2] = [
    "scripts/reference/llama_cpp_reference.py",
    "scripts/reference/exact_forward.py",
];

/// Where the fixtures go, relative to the project root.
const FIXTURES_DIR: &str = "fixtures/smollm2";

/// Runs the task.
pub(crate) fn run(args: &[String]) -> Result<()> {
    if args.first().is_some_and(|arg| arg == ARCH_FLAG) {
        return run_arch(&args[1..]);
    }
    let options = Options::parse(args)?;
    let python = match options.python {
        Some(python) => {
            if !imports_llama_cpp(&python, FIXTURE_MODULES) {
                bail!(
                    "{} cannot import llama_cpp {LLAMA_CPP_PYTHON_VERSION} and gguf; install them with `{} -m pip install llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} gguf=={GGUF_VERSION}`",
                    python.display(),
                    python.display()
                );
            }
            python
        }
        None => venv_python_with_llama_cpp()?,
    };
    let model = match options.model {
        Some(model) => model,
        None => fetch_model::ensure_model(fetch_model::find_known("smollm2")?)?,
    };
    let root = project_root();
    for script in SCRIPTS {
        let status = Command::new(&python)
            .arg(root.join(script))
            .arg("--model")
            .arg(&model)
            .arg("--out")
            .arg(root.join(FIXTURES_DIR))
            .status()
            .with_context(|| format!("cannot run {}", python.display()))?;
        if !status.success() {
            bail!("{script} failed ({status})");
        }
    }
    println!("fixtures written to {FIXTURES_DIR}; review with `git diff --stat {FIXTURES_DIR}`");
    gemma3_tokenize_fixture(&python)
}

/// The SentencePiece tokenizer fixture, from Gemma 3's vocabulary.
const GEMMA3_TOKENIZE_SCRIPT: &str = "scripts/reference/tokenize_reference.py";

/// Where the SentencePiece tokenizer fixture goes, relative to the root.
const GEMMA3_FIXTURES_DIR: &str = "fixtures/gemma3";

/// Writes `fixtures/gemma3/tokenize.json` with `python` (llama-cpp-python
/// at the pinned version) from the Gemma 3 file in the models folder.
fn gemma3_tokenize_fixture(python: &Path) -> Result<()> {
    let model = lm_model::catalog::GEMMA3_270M.path()?;
    let root = project_root();
    let status = Command::new(python)
        .arg(root.join(GEMMA3_TOKENIZE_SCRIPT))
        .arg("--model")
        .arg(&model)
        .arg("--out")
        .arg(root.join(GEMMA3_FIXTURES_DIR))
        .status()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !status.success() {
        bail!("{GEMMA3_TOKENIZE_SCRIPT} failed ({status})");
    }
    println!("fixture written to {GEMMA3_FIXTURES_DIR}/tokenize.json");
    Ok(())
}

/// Command-line options of the task.
#[derive(Debug, Default)]
struct Options {
    /// An interpreter that already has `llama-cpp-python`.
    python: Option<PathBuf>,
    /// A GGUF file to use instead of the fetched SmolLM2.
    model: Option<PathBuf>,
}

impl Options {
    /// Parses `--python <path>` and `--model <path>`.
    fn parse(args: &[String]) -> Result<Self> {
        let mut options = Self::default();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let slot = match flag.as_str() {
                "--python" => &mut options.python,
                "--model" => &mut options.model,
                other => bail!(
                    "unknown option `{other}`; usage: cargo xtask reference-fixtures [--python <interpreter>] [--model <gguf>]"
                ),
            };
            let Some(value) = args.next() else {
                bail!("option `{flag}` needs a value");
            };
            *slot = Some(PathBuf::from(value));
        }
        Ok(options)
    }
}

/// The interpreter of `<target>/reference-venv`, where
/// [`venv_python_with_llama_cpp`] installs llama-cpp-python (it may not
/// exist yet).
pub(crate) fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

fn venv_dir() -> PathBuf {
    target_dir().join("reference-venv")
}

/// The interpreter of `<target>/reference-venv`, creating the environment and
/// installing `llama-cpp-python` into it when needed.
pub(crate) fn venv_python_with_llama_cpp() -> Result<PathBuf> {
    let venv = venv_dir();
    let python = venv_python();
    if imports_llama_cpp(&python, FIXTURE_MODULES) {
        return Ok(python);
    }
    if !python.is_file() {
        println!("creating a virtual environment in {}", venv.display());
        run_checked(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    println!(
        "installing llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} and gguf=={GGUF_VERSION} into {}; it compiles llama.cpp, which takes several minutes",
        venv.display()
    );
    run_checked(
        Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check"])
            .arg(format!("llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"))
            .arg(format!("gguf=={GGUF_VERSION}")),
    )?;
    if !imports_llama_cpp(&python, FIXTURE_MODULES) {
        bail!(
            "{} still cannot import llama_cpp {LLAMA_CPP_PYTHON_VERSION} after installing it",
            python.display()
        );
    }
    Ok(python)
}

/// The modules the fixture scripts need besides `llama_cpp`.
const FIXTURE_MODULES: &[&str] = &["gguf"];

/// Whether `python` imports `llama_cpp` at the pinned version, and each of
/// `other_modules`.
pub(crate) fn imports_llama_cpp(python: &Path, other_modules: &[&str]) -> bool {
    let modules = ["sys", "llama_cpp"]
        .iter()
        .chain(other_modules)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    let check = format!(
        "import {modules}; sys.exit(llama_cpp.__version__ != '{LLAMA_CPP_PYTHON_VERSION}')"
    );
    Command::new(python)
        .args(["-c", &check])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Runs a command, failing with the command line when it does not succeed.
fn run_checked(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// `$CARGO_TARGET_DIR` (relative to the root unless absolute), else
/// `<root>/target`.
fn target_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR").filter(|dir| !dir.is_empty());
    // `join` keeps an absolute directory as it is.
    project_root().join(dir.map_or_else(|| PathBuf::from("target"), PathBuf::from))
}

/// The flag that selects the per-architecture fixtures.
const ARCH_FLAG: &str = "--arch";

/// Where the per-architecture fixtures go, relative to the project root.
const ARCH_FIXTURES_DIR: &str = "fixtures/arch";

/// `reference-fixtures --arch [--python <interpreter>]`: runs
/// `scripts/reference/random_gguf.py` into [`ARCH_FIXTURES_DIR`]. The script is
/// seeded, so a rerun writes the same bytes.
fn run_arch(args: &[String]) -> Result<()> {
    let python = match args {
        [] => venv_python_with_llama_cpp()?,
        [flag, python] if flag == "--python" => {
            let python = PathBuf::from(python);
            if !imports_llama_cpp(&python, FIXTURE_MODULES) {
                bail!(
                    "{} cannot import llama_cpp {LLAMA_CPP_PYTHON_VERSION} and gguf",
                    python.display()
                );
            }
            python
        }
        _ => bail!("usage: cargo xtask reference-fixtures --arch [--python <interpreter>]"),
    };
    let root = project_root();
    run_checked(
        Command::new(&python)
            .arg(root.join("scripts/reference/random_gguf.py"))
            .arg("--out")
            .arg(root.join(ARCH_FIXTURES_DIR)),
    )?;
    println!(
        "fixtures written to {ARCH_FIXTURES_DIR}; review with `git diff --stat {ARCH_FIXTURES_DIR}`"
    );
    Ok(())
}
