//! `cargo xtask reference-fixtures`: regenerate the llama.cpp fixtures.
//!
//! llama.cpp is the reference implementation we conform to. This task runs
//! `scripts/reference/llama_cpp_reference.py` with the PyPI package
//! `llama-cpp-python` at a pinned version, which compiles llama.cpp from source on
//! first install (several minutes on two cores). The package lives in a virtual
//! environment under the target folder, `<target>/reference-venv`, so nothing is
//! installed system-wide and nothing from llama.cpp enters the repository: only its
//! outputs (token ids, logits) are committed, as data. A second script,
//! `scripts/reference/exact_forward.py`, recomputes SmolLM2's last logits rows in
//! float64 with numpy and the `gguf` package, to show how far llama.cpp is from
//! exact math, and writes the exact twin of every conformance fixture
//! (`<stem>.exact.json`: exact chosen-token log-probabilities and last rows);
//! `scripts/reference/llama_cpp_envelope.py` then replays each fixture under
//! eight llama.cpp settings that change only rounding (`<stem>.envelope.json`:
//! how far llama.cpp itself strays from exact, the bound the test allows). A third, `scripts/reference/tokenize_reference.py`, writes
//! llama.cpp's ids and detokenized texts for Gemma 3's SentencePiece vocabulary.
//!
//! Three sets of fixtures ([`FixtureSet`]): `fixtures/smollm2/` (SmolLM2 Q4_1:
//! tokenizer, greedy runs, llama.cpp's own variation, exact math, and
//! `conformance.json`),
//! `fixtures/smollm2-requant/<type>.json` (the same model requantized by llama.cpp
//! to each of eight weight mixes) and `fixtures/gemma3/conformance.json` (Gemma 3
//! 270M); the conformance files share one format, which `crates/lm/tests/conformance.rs`
//! reads.
//!
//! This is a maintainer task, never run in CI; the tests only read the committed
//! fixtures.
//!
//! Options: `--python <interpreter>` (or `$LM_REFERENCE_PYTHON`) uses an
//! interpreter that already has `llama-cpp-python` instead of the virtual
//! environment; `--model <gguf>` uses that file instead of fetching SmolLM2 Q4_1
//! (for the `smollm2` set only); `--only <set>` writes one set (`smollm2`,
//! `smollm2-requant` or `gemma3`) instead of all three.
//!
//! `cargo xtask reference-fixtures --arch [--python <interpreter>]` instead
//! regenerates `fixtures/arch/`: `scripts/reference/random_gguf.py` writes small
//! seeded random-weight GGUF files (llama with Llama 3 `rope_freqs`, qwen2, qwen3,
//! gemma3, and the mixtures of experts qwen3moe, Mixtral and OLMoE) and
//! llama.cpp's logits on each; no model is fetched.
//!
//! `cargo xtask reference-fixtures --samplers [--python <interpreter>]`
//! regenerates `fixtures/samplers/`:
//! `scripts/reference/sampler_reference.py` applies llama.cpp's samplers
//! (typical, top-n-sigma, XTC, top-p and min-p with `min_keep`) to fixed logit
//! vectors and SmolLM2's committed logits row, and its stateful modules run
//! DRY (`dry.json`, over SmolLM2 Q8_0's vocabulary: `cargo xtask fetch-model
//! smollm2-q8_0`) and the others; no weights are loaded.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::fetch_model;
use crate::project_root;
use lm_model::catalog::{KnownModel, SMOLLM2_Q8_0};

/// The `llama-cpp-python` release the fixtures were generated with; its bundled
/// llama.cpp revision is recorded in `fixtures/smollm2/README.md`.
pub(crate) const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";

/// The `gguf` release (ggml's GGUF reader and dequantizer) the exact-math reference uses.
pub(crate) const GGUF_VERSION: &str = "0.19.0";

/// The llama.cpp fixture generator, relative to the project root.
const LLAMA_CPP_SCRIPT: &str = "scripts/reference/llama_cpp_reference.py";
/// The float64 forward pass: SmolLM2 Q4_1's greedy rows and every conformance fixture's exact twin.
const EXACT_SCRIPT: &str = "scripts/reference/exact_forward.py";
/// llama.cpp's own variation around each conformance fixture.
const ENVELOPE_SCRIPT: &str = "scripts/reference/llama_cpp_envelope.py";

/// A set of fixtures the task writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FixtureSet {
    /// `fixtures/smollm2/`: SmolLM2 Q4_1 in depth.
    Smollm2,
    /// `fixtures/smollm2-requant/<type>.json`: one conformance fixture per
    /// requantized SmolLM2.
    Smollm2Requant,
    /// `fixtures/gemma3/conformance.json`: Gemma 3 270M.
    Gemma3,
}

impl FixtureSet {
    const ALL: [Self; 3] = [Self::Smollm2, Self::Smollm2Requant, Self::Gemma3];

    fn name(self) -> &'static str {
        match self {
            Self::Smollm2 => "smollm2",
            Self::Smollm2Requant => "smollm2-requant",
            Self::Gemma3 => "gemma3",
        }
    }

    /// The folder it is written to, relative to the project root.
    fn dir(self) -> &'static str {
        match self {
            Self::Smollm2 => "fixtures/smollm2",
            Self::Smollm2Requant => "fixtures/smollm2-requant",
            Self::Gemma3 => "fixtures/gemma3",
        }
    }
}

/// The requantized SmolLM2 models of `fixtures/smollm2-requant/`, each
/// written to `<name without "smollm2-">.json`.
const REQUANTIZED_SMOLLM2: [&str; 8] = [
    "smollm2-q4_k_m",
    "smollm2-q5_k_m",
    "smollm2-q6_k",
    "smollm2-q3_k_m",
    "smollm2-q2_k",
    "smollm2-q5_0",
    "smollm2-q8_0",
    "smollm2-iq4_xs",
];

/// Runs the task.
pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(script) = args
        .first()
        .and_then(|flag| SCRIPT_FIXTURES.iter().find(|script| script.flag == flag))
    {
        return run_script_fixtures(script, &args[1..]);
    }
    let options = Options::parse(args)?;
    let python = reference_python(options.python.as_deref())?;
    let root = project_root();
    let sets = match options.only {
        Some(set) => vec![set],
        None => FixtureSet::ALL.to_vec(),
    };
    for set in sets {
        let out = root.join(set.dir());
        match set {
            FixtureSet::Smollm2 => {
                let model = match &options.model {
                    Some(model) => model.clone(),
                    None => fetch_model::ensure_model(
                        fetch_model::find_known("smollm2")?,
                        Some(&python),
                    )?,
                };
                for script in [LLAMA_CPP_SCRIPT, EXACT_SCRIPT] {
                    run_script(&python, script, &model, &out, &[])?;
                }
                conformance_fixture(&python, "smollm2", &model, &out, "conformance")?;
            }
            FixtureSet::Smollm2Requant => {
                for name in REQUANTIZED_SMOLLM2 {
                    let model =
                        fetch_model::ensure_model(fetch_model::find_known(name)?, Some(&python))?;
                    let stem = name.trim_start_matches("smollm2-");
                    conformance_fixture(&python, "smollm2", &model, &out, stem)?;
                }
            }
            FixtureSet::Gemma3 => {
                let model = fetch_model::ensure_model(
                    fetch_model::find_known("gemma3-270m")?,
                    Some(&python),
                )?;
                conformance_fixture(&python, "gemma3", &model, &out, "conformance")?;
                run_script(&python, GEMMA3_TOKENIZE_SCRIPT, &model, &out, &[])?;
            }
        }
        println!(
            "fixtures written to {}; review with `git diff --stat {}`",
            set.dir(),
            set.dir()
        );
    }
    Ok(())
}

/// Writes one conformance fixture, `<out>/<stem>.json` (llama.cpp's outputs
/// on `family`'s prompts), its exact float64 twin, `<stem>.exact.json`, and
/// llama.cpp's own variation around it, `<stem>.envelope.json`.
fn conformance_fixture(
    python: &Path,
    family: &str,
    model: &Path,
    out: &Path,
    stem: &str,
) -> Result<()> {
    let extra = ["--conformance", family, "--name", stem];
    run_script(python, LLAMA_CPP_SCRIPT, model, out, &extra)?;
    run_script(python, EXACT_SCRIPT, model, out, &["--conformance", stem])?;
    run_script(python, ENVELOPE_SCRIPT, model, out, &["--name", stem])
}

/// Runs one generator script on `model`, writing into `out`.
fn run_script(python: &Path, script: &str, model: &Path, out: &Path, extra: &[&str]) -> Result<()> {
    let status = Command::new(python)
        .arg(project_root().join(script))
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(extra)
        .status()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !status.success() {
        bail!("{script} failed on {} ({status})", model.display());
    }
    Ok(())
}

/// The usage lines of `--arch` and `--samplers`.
pub(crate) const ARCH_USAGE: &str = "usage: cargo xtask reference-fixtures --arch [--python <interpreter>]\n\
     usage: cargo xtask reference-fixtures --samplers [--python <interpreter>]";

/// The usage line printed with option errors.
pub(crate) const USAGE: &str = "usage: cargo xtask reference-fixtures [--python <interpreter>] [--model <gguf>] [--only smollm2|smollm2-requant|gemma3]";

/// Command-line options of the task.
#[derive(Debug, Default)]
struct Options {
    /// An interpreter that already has `llama-cpp-python`.
    python: Option<PathBuf>,
    /// A GGUF file to use instead of the fetched SmolLM2 Q4_1.
    model: Option<PathBuf>,
    /// The one set to write (all when `None`).
    only: Option<FixtureSet>,
}

impl Options {
    /// Parses `--python <path>`, `--model <path>` and `--only <set>`.
    fn parse(args: &[String]) -> Result<Self> {
        let mut options = Self::default();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let Some(value) = args.next() else {
                bail!("option `{flag}` needs a value; {USAGE}");
            };
            match flag.as_str() {
                "--python" => options.python = Some(PathBuf::from(value)),
                "--model" => options.model = Some(PathBuf::from(value)),
                "--only" => {
                    let set = FixtureSet::ALL
                        .into_iter()
                        .find(|set| set.name() == value)
                        .with_context(|| format!("unknown fixture set `{value}`; {USAGE}"))?;
                    options.only = Some(set);
                }
                other => bail!("unknown option `{other}`; {USAGE}"),
            }
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

/// Environment variable naming an interpreter that already has
/// llama-cpp-python (and gguf) at the pinned versions, so that neither a
/// maintainer nor CI builds the virtual environment again.
pub(crate) const REFERENCE_PYTHON_VAR: &str = "LM_REFERENCE_PYTHON";

/// The interpreter that runs llama.cpp: `explicit` (a `--python` option), else
/// `$LM_REFERENCE_PYTHON`, else `<target>/reference-venv` (created when needed).
/// A given interpreter must import llama-cpp-python at the pinned version.
pub(crate) fn reference_python(explicit: Option<&Path>) -> Result<PathBuf> {
    let from_env = std::env::var_os(REFERENCE_PYTHON_VAR)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from);
    let Some(python) = explicit.map(Path::to_path_buf).or(from_env) else {
        return venv_python_with_llama_cpp();
    };
    if !imports_llama_cpp(&python, FIXTURE_MODULES) {
        bail!(
            "{} cannot import llama_cpp {LLAMA_CPP_PYTHON_VERSION} and gguf; install them with `{} -m pip install llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} gguf=={GGUF_VERSION}`, or unset {REFERENCE_PYTHON_VAR}",
            python.display(),
            python.display()
        );
    }
    Ok(python)
}

/// The interpreter of `<target>/reference-venv`, creating the environment and
/// installing `llama-cpp-python` into it when needed.
///
/// pip compiles llama.cpp from source with [`cmake_args`] (never a cached wheel,
/// which may have been built for other instruction sets), printing the compiler's
/// progress.
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
    let cmake_args = std::env::var("CMAKE_ARGS")
        .ok()
        .filter(|value| !value.is_empty())
        .unwrap_or_else(|| cmake_args(&cpu_flags()));
    println!(
        "installing llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} and gguf=={GGUF_VERSION} into {}; it compiles llama.cpp with CMAKE_ARGS=\"{cmake_args}\", which takes several minutes",
        venv.display()
    );
    run_checked(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-cache-dir",
                "--verbose",
            ])
            .arg(format!("llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"))
            .arg(format!("gguf=={GGUF_VERSION}"))
            .env("CMAKE_ARGS", &cmake_args),
    )?;
    if !imports_llama_cpp(&python, FIXTURE_MODULES) {
        bail!(
            "{} still cannot import llama_cpp {LLAMA_CPP_PYTHON_VERSION} after installing it",
            python.display()
        );
    }
    Ok(python)
}

/// ggml's CMake switches for each x86 instruction set, by the name
/// `/proc/cpuinfo` lists it under.
const GGML_ISA_OPTIONS: &[(&str, &str)] = &[
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("bmi2", "GGML_BMI2"),
    ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
];

/// The CMake arguments llama.cpp is built with: no `-march=native` (a native
/// build has died with SIGILL on VMs whose CPU model differs from the flags
/// they report), each instruction set `flags` lists switched on explicitly,
/// AMX off, and without llama-cpp-python's multimodal library (`mtmd`, which
/// no reference script loads; about a quarter of the compile).
pub(crate) fn cmake_args(flags: &[String]) -> String {
    let mut args = vec!["-DGGML_NATIVE=OFF".to_owned()];
    for (flag, option) in GGML_ISA_OPTIONS {
        let on = flags.iter().any(|listed| listed == flag);
        args.push(format!("-D{option}={}", if on { "ON" } else { "OFF" }));
    }
    args.extend(
        [
            "GGML_AMX_TILE",
            "GGML_AMX_INT8",
            "GGML_AMX_BF16",
            "LLAVA_BUILD",
        ]
        .map(|option| format!("-D{option}=OFF")),
    );
    args.join(" ")
}

/// The CPU flags of the first processor in `/proc/cpuinfo` (empty elsewhere,
/// which builds llama.cpp for the baseline x86-64).
pub(crate) fn cpu_flags() -> Vec<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "flags").then(|| value.split_whitespace().map(str::to_owned).collect())
        })
        .unwrap_or_default()
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
pub(crate) fn run_checked(command: &mut Command) -> Result<()> {
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
pub(crate) fn target_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR").filter(|dir| !dir.is_empty());
    // `join` keeps an absolute directory as it is.
    project_root().join(dir.map_or_else(|| PathBuf::from("target"), PathBuf::from))
}

/// The SentencePiece tokenizer fixture's generator, from Gemma 3's vocabulary
/// (`fixtures/gemma3/tokenize.json`).
const GEMMA3_TOKENIZE_SCRIPT: &str = "scripts/reference/tokenize_reference.py";

/// Fixtures that one seeded script writes whole: the flag that selects
/// it, the script, the folder it writes, and its other arguments (each a
/// flag and a file). A rerun writes the same bytes.
struct ScriptFixtures {
    flag: &'static str,
    script: &'static str,
    out_dir: &'static str,
    extra: &'static [(&'static str, ScriptFile)],
}

/// A file a fixture script reads.
enum ScriptFile {
    /// A path relative to the project root (a committed fixture).
    Root(&'static str),
    /// A known model's file in the models folder.
    Model(&'static KnownModel),
}

impl ScriptFile {
    /// Its path; a model that is not fetched is an error naming the
    /// command that fetches it.
    fn path(&self, root: &Path) -> Result<PathBuf> {
        Ok(match self {
            Self::Root(path) => root.join(path),
            Self::Model(model) => model.path()?,
        })
    }
}

const SCRIPT_FIXTURES: [ScriptFixtures; 2] = [
    // One random-weight GGUF per architecture, with llama.cpp's logits.
    ScriptFixtures {
        flag: "--arch",
        script: "scripts/reference/random_gguf.py",
        out_dir: "fixtures/arch",
        extra: &[],
    },
    // llama.cpp's samplers on fixed logit vectors and SmolLM2's row.
    ScriptFixtures {
        flag: "--samplers",
        script: "scripts/reference/sampler_reference.py",
        out_dir: "fixtures/samplers",
        extra: &[
            (
                "--row",
                ScriptFile::Root("fixtures/smollm2/chat_capital_of_france.last_logits.f32le.bin"),
            ),
            // DRY's sequence breakers are compiled over SmolLM2's vocabulary.
            ("--model", ScriptFile::Model(&SMOLLM2_Q8_0)),
        ],
    },
];

/// `reference-fixtures <flag> [--python <interpreter>]`: runs the script of
/// `fixtures` into its folder.
fn run_script_fixtures(fixtures: &ScriptFixtures, args: &[String]) -> Result<()> {
    let python = match args {
        [] => reference_python(None)?,
        [flag, python] if flag == "--python" => reference_python(Some(Path::new(python)))?,
        _ => bail!("{ARCH_USAGE}"),
    };
    let root = project_root();
    let mut command = Command::new(&python);
    command
        .arg(root.join(fixtures.script))
        .arg("--out")
        .arg(root.join(fixtures.out_dir));
    for (flag, file) in fixtures.extra {
        command.arg(flag).arg(file.path(&root)?);
    }
    run_checked(&mut command)?;
    let dir = fixtures.out_dir;
    println!("fixtures written to {dir}; review with `git diff --stat {dir}`");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmake_args_switch_on_the_listed_sets_and_amx_off() {
        let flags: Vec<String> = [
            "fpu", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "amx_tile",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            cmake_args(&flags),
            "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
             -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=OFF \
             -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF \
             -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF"
        );
    }

    #[test]
    fn every_requantized_fixture_names_a_requantized_model() {
        for name in REQUANTIZED_SMOLLM2 {
            let source = fetch_model::find_known(name).unwrap();
            assert!(
                matches!(source.origin, fetch_model::Origin::Requantized { .. }),
                "{name}"
            );
        }
    }
}
