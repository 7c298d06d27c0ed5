//! `cargo xtask tidy`: keeps the architecture honest. Checks that
//! - the dependency arrows form a star around lm-core (read from `cargo metadata`),
//! - every workspace member is named in docs/ARCHITECTURE.md,
//! - every Rust source file opens with a `//!` doc comment.
//!
//! It also runs as an ordinary test, so `cargo test --workspace` covers it.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::project_root;

/// The library crates that must depend on lm-core and on nothing else of ours.
const LEAVES: [&str; 3] = ["lm-decode", "lm-model", "lm-tokenize"];

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
    Ok(problems)
}

fn cargo_metadata(root: &Path) -> anyhow::Result<Value> {
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

/// Workspace packages as (name, normal dependencies that are ours).
fn our_arrows(metadata: &Value) -> Vec<(String, Vec<String>)> {
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or_default().to_string();
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["kind"].is_null()) // normal dependencies only
                .filter_map(|d| d["name"].as_str())
                .filter(|d| d.starts_with("lm-"))
                .map(String::from)
                .collect();
            (name, deps)
        })
        .collect()
}

fn dependency_arrows(metadata: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, deps) in our_arrows(metadata) {
        for dep in deps {
            let allowed = match name.as_str() {
                "lm-core" => false,
                leaf if LEAVES.contains(&leaf) => dep == "lm-core",
                _ => true, // lm-cli and xtask wire everything together
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
            !text.contains(&format!("`{name}`")) && !text.contains(&format!("crates/{name}"))
        })
        .map(|(name, _)| format!("docs/ARCHITECTURE.md does not name the workspace member {name}"))
        .collect())
}

fn files_open_with_module_docs(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut dirs = vec![root.join("crates"), root.join("xtask")];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
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

    #[test]
    fn an_arrow_the_wrong_way_is_caught() {
        let metadata = json!({"packages": [
            package("lm-core", &[]),
            package("lm-decode", &[("lm-core", None), ("lm-model", None)]),
            package("lm-model", &[("lm-core", None), ("lm-decode", Some("dev"))]),
            package("lm-cli", &[("lm-core", None), ("lm-model", None)]),
        ]});
        let problems = dependency_arrows(&metadata);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("lm-decode depends on lm-model"));
    }

    #[test]
    fn lm_core_may_depend_on_nothing_of_ours() {
        let metadata = json!({"packages": [package("lm-core", &[("lm-tokenize", None)])]});
        assert_eq!(dependency_arrows(&metadata).len(), 1);
    }
}
