//! `cargo xtask tidy`: keeps the architecture honest. Checks that
//! - the dependency arrows form a star around lm-core (read from `cargo metadata`),
//!   with the facade `lm` above the star and no library below it pointing
//!   back at it, not even for tests, and the server `lm-serve` above the
//!   facade, used only by the binaries (lm-cli, xtask),
//! - every workspace member is named in docs/ARCHITECTURE.md,
//! - every Rust source file opens with a `//!` doc comment,
//! - `unsafe` stays behind its fence: every crate root forbids it but
//!   lm-model's, which denies it, and in lm-model only `kernels/` and the two
//!   operating-system calls allow it.
//!
//! It also runs as an ordinary test, so `cargo test --workspace` covers it.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::project_root;

/// The library crates that must depend on lm-core and on nothing else of ours.
const LEAVES: [&str; 3] = ["lm-decode", "lm-model", "lm-tokenize"];

/// The facade over the libraries: it may use all of them, and none of them
/// (nor lm-core) may use it, even as a dev-dependency: that cycle would
/// build a second copy of the library's types for its tests.
const FACADE: &str = "lm";

/// The HTTP server: a wiring crate over the facade (like lm-cli, but a
/// library); only the binaries may use it, so no library pulls in tokio.
const SERVER: &str = "lm-serve";

/// The packages that may depend on the server.
const SERVER_USERS: [&str; 2] = ["lm-cli", "xtask"];

pub fn run(_args: &[String]) -> anyhow::Result<()> {
    let problems = check(&project_root())?;
    if problems.is_empty() {
        println!("tidy: ok");
        return Ok(());
    }
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    bail!("{} tidy problem(s)", problems.len())
}

/// Every tidy problem found under `root`, one line each.
fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let metadata = cargo_metadata(root)?;
    let mut problems = dependency_arrows(&metadata);
    problems.extend(architecture_names_members(root, &metadata)?);
    problems.extend(files_open_with_module_docs(root)?);
    problems.extend(unsafe_fence(root, &metadata)?);
    Ok(problems)
}

/// The crate whose root denies `unsafe` rather than forbidding it: its
/// kernels and two operating-system calls allow it.
const UNSAFE_HOME: &str = "lm-model";

/// The places in lm-model's `src/` that may hold `unsafe`: the kernels'
/// home, and the files of the two operating-system calls (the model file's
/// mapping, the allocator's threshold).
const UNSAFE_ALLOWED: [&str; 3] = ["kernels/", "gguf/mod.rs", "allocator.rs"];

/// Every library and binary root carries `#![forbid(unsafe_code)]` (lm-model:
/// `#![deny(unsafe_code)]`), and lm-model's `unsafe` stays in
/// [`UNSAFE_ALLOWED`].
fn unsafe_fence(root: &Path, metadata: &Value) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let packages = metadata["packages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default();
        let wanted = if name == UNSAFE_HOME {
            "#![deny(unsafe_code)]"
        } else {
            "#![forbid(unsafe_code)]"
        };
        let targets = package["targets"].as_array().map_or(&[][..], Vec::as_slice);
        for target in targets {
            let kinds = target["kind"].as_array().map_or(&[][..], Vec::as_slice);
            if !kinds.iter().any(|k| k == "lib" || k == "bin") {
                continue;
            }
            let src = Path::new(target["src_path"].as_str().unwrap_or_default());
            let text = std::fs::read_to_string(src)
                .with_context(|| format!("reading {}", src.display()))?;
            if !text.lines().any(|line| line.trim() == wanted) {
                let shown = src.strip_prefix(root).unwrap_or(src);
                problems.push(format!("{} lacks `{wanted}`", shown.display()));
            }
        }
    }
    let home = root.join("crates").join(UNSAFE_HOME).join("src");
    for path in rust_files(&home)? {
        let relative = path.strip_prefix(&home).unwrap_or(&path).to_string_lossy();
        if UNSAFE_ALLOWED
            .iter()
            .any(|allowed| relative.starts_with(allowed))
        {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        if text.lines().any(uses_unsafe) {
            problems.push(format!(
                "crates/{UNSAFE_HOME}/src/{relative} uses `unsafe` outside {}",
                UNSAFE_ALLOWED.join(", ")
            ));
        }
    }
    Ok(problems)
}

/// Whether a line's code (not its comment) has the keyword `unsafe`.
fn uses_unsafe(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or_default();
    code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|word| word == "unsafe")
}

/// The `.rs` files below `dir`.
fn rust_files(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    Ok(files)
}

/// The workspace's packages and their targets (`cargo metadata --no-deps`).
pub(crate) fn cargo_metadata(root: &Path) -> anyhow::Result<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(root)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// One dependency of ours: its name and whether it is a normal one (not a
/// dev- or build-dependency).
struct Arrow {
    dep: String,
    normal: bool,
}

/// Whether a package name is one of ours (`lm` or `lm-*`).
fn is_ours(name: &str) -> bool {
    name == FACADE || name.starts_with("lm-")
}

/// Workspace packages as (name, dependencies that are ours).
fn our_arrows(metadata: &Value) -> Vec<(String, Vec<Arrow>)> {
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or_default().to_string();
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| {
                    let dep = d["name"].as_str().filter(|dep| is_ours(dep))?;
                    Some(Arrow {
                        dep: dep.to_string(),
                        normal: d["kind"].is_null(),
                    })
                })
                .collect();
            (name, deps)
        })
        .collect()
}

fn dependency_arrows(metadata: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, arrows) in our_arrows(metadata) {
        let below_the_facade = name == "lm-core" || LEAVES.contains(&name.as_str());
        for Arrow { dep, normal } in arrows {
            if below_the_facade && dep == FACADE {
                problems.push(format!(
                    "{name} depends on {FACADE}{}: the facade sits above the libraries, \
                     and a library's tests that use it build two copies of its types",
                    if normal { "" } else { " (as a dev-dependency)" }
                ));
                continue;
            }
            if dep == SERVER && !SERVER_USERS.contains(&name.as_str()) {
                problems.push(format!(
                    "{name} depends on {SERVER}: the server sits above the facade, \
                     and only {} may use it",
                    SERVER_USERS.join(" and ")
                ));
                continue;
            }
            let allowed = !normal
                || match name.as_str() {
                    "lm-core" => false,
                    leaf if LEAVES.contains(&leaf) => dep == "lm-core",
                    // The facade wires the libraries; lm-cli and xtask wire everything.
                    _ => true,
                };
            if !allowed {
                problems.push(format!(
                    "{name} depends on {dep}: lm-core depends on no lm-* crate, \
                     and {} depend on lm-core only",
                    LEAVES.join(", ")
                ));
            }
        }
    }
    problems
}

fn architecture_names_members(root: &Path, metadata: &Value) -> anyhow::Result<Vec<String>> {
    let path = root.join("docs/ARCHITECTURE.md");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(our_arrows(metadata)
        .into_iter()
        .filter(|(name, _)| {
            !text.contains(&format!("`{name}`")) && !text.contains(&format!("`crates/{name}`"))
        })
        .map(|(name, _)| format!("docs/ARCHITECTURE.md does not name the workspace member {name}"))
        .collect())
}

fn files_open_with_module_docs(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for dir in [root.join("crates"), root.join("xtask")] {
        for path in rust_files(&dir)? {
            let text = std::fs::read_to_string(&path)?;
            if !text.trim_start().starts_with("//!") {
                let shown = path.strip_prefix(root).unwrap_or(&path);
                problems.push(format!(
                    "{} does not open with a `//!` doc comment",
                    shown.display()
                ));
            }
        }
    }
    problems.sort();
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_workspace_is_tidy() {
        let problems = check(&project_root()).unwrap();
        assert!(
            problems.is_empty(),
            "run `cargo xtask tidy`:\n{}",
            problems.join("\n")
        );
    }

    fn package(name: &str, deps: &[(&str, Option<&str>)]) -> Value {
        let deps: Vec<Value> = deps
            .iter()
            .map(|(d, kind)| json!({"name": d, "kind": kind}))
            .collect();
        json!({"name": name, "dependencies": deps})
    }

    /// Asserts that `packages` break the arrows as `expected` says: one
    /// problem per entry, in order, each starting with it.
    fn check_arrows(packages: Value, expected: &[&str]) {
        let problems = dependency_arrows(&json!({ "packages": packages }));
        assert_eq!(problems.len(), expected.len(), "{problems:?}");
        for (problem, start) in problems.iter().zip(expected) {
            assert!(problem.starts_with(start), "{problems:?}");
        }
    }

    #[test]
    fn an_arrow_the_wrong_way_is_caught() {
        let packages = json!([
            package("lm-core", &[]),
            package("lm-decode", &[("lm-core", None), ("lm-model", None)]),
            package("lm-model", &[("lm-core", None), ("lm-decode", Some("dev"))]),
            package("lm-cli", &[("lm-core", None), ("lm-model", None)]),
        ]);
        check_arrows(packages, &["lm-decode depends on lm-model"]);
    }

    #[test]
    fn the_facade_uses_the_libraries_and_none_uses_it() {
        let packages = json!([
            package(
                "lm",
                &[("lm-core", None), ("lm-decode", None), ("lm-model", None)]
            ),
            package("lm-tokenize", &[("lm-core", None), ("lm", Some("dev"))]),
            package("lm-model", &[("lm-core", None), ("lm", None)]),
            package("lm-cli", &[("lm", None), ("lm-core", None)]),
        ]);
        let expected = [
            "lm-tokenize depends on lm (as a dev-dependency)",
            "lm-model depends on lm:",
        ];
        check_arrows(packages, &expected);
    }

    #[test]
    fn only_the_binaries_use_the_server() {
        let packages = json!([
            package(
                "lm-serve",
                &[("lm", None), ("lm-core", None), ("lm-model", Some("dev"))]
            ),
            package("lm-cli", &[("lm-serve", None)]),
            package("lm", &[("lm-core", None), ("lm-serve", Some("dev"))]),
            package("lm-decode", &[("lm-core", None), ("lm-serve", None)]),
        ]);
        let expected = ["lm depends on lm-serve", "lm-decode depends on lm-serve"];
        check_arrows(packages, &expected);
    }

    #[test]
    fn the_unsafe_keyword_is_found_in_code_not_in_comments_or_names() {
        assert!(uses_unsafe("    unsafe { f() }"));
        assert!(uses_unsafe("pub unsafe fn g() {} // the call"));
        assert!(!uses_unsafe("// SAFETY: unsafe in a comment"));
        assert!(!uses_unsafe("#![deny(unsafe_code)]"));
        assert!(!uses_unsafe("let not_unsafe = 1;"));
    }

    #[test]
    fn lm_core_may_depend_on_nothing_of_ours() {
        let metadata = json!({"packages": [package("lm-core", &[("lm-tokenize", None)])]});
        assert_eq!(dependency_arrows(&metadata).len(), 1);
    }
}
