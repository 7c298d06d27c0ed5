//! `cargo xtask examples`: runs every example target of the workspace, as CI
//! does after the tests.
//!
//! The examples are listed from `cargo metadata` (every target of kind
//! `example`), so a new one runs without being named here. Each runs as
//! `cargo run -q -p PACKAGE --example NAME` and must exit 0; an example that
//! needs a model file it cannot find says "skipped: ..." on stderr and exits
//! 0, so it shows as skipped rather than failing or passing silently.

use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::project_root;
use crate::tidy::cargo_metadata;

/// One example target: its package and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Example {
    package: String,
    name: String,
}

pub fn run(_args: &[String]) -> anyhow::Result<()> {
    let root = project_root();
    let examples = example_targets(&cargo_metadata(&root)?);
    if examples.is_empty() {
        bail!("cargo metadata lists no example targets");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut failed = Vec::new();
    for Example { package, name } in &examples {
        println!("examples: running {package} --example {name}");
        let status = Command::new(&cargo)
            .current_dir(&root)
            .args(["run", "-q", "-p", package, "--example", name])
            .stdin(Stdio::null())
            .status()
            .with_context(|| format!("running cargo for the example {package}/{name}"))?;
        if !status.success() {
            eprintln!("examples: {package}/{name} failed ({status})");
            failed.push(format!("{package}/{name}"));
        }
    }
    let ran: Vec<String> = examples
        .iter()
        .map(|e| format!("{}/{}", e.package, e.name))
        .collect();
    println!("examples: ran {}: {}", ran.len(), ran.join(", "));
    if !failed.is_empty() {
        bail!("{} example(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

/// Every example target of the workspace's packages, sorted.
fn example_targets(metadata: &Value) -> Vec<Example> {
    let packages = metadata["packages"].as_array().map(Vec::as_slice);
    let mut examples: Vec<Example> = packages
        .unwrap_or_default()
        .iter()
        .flat_map(|package| {
            let package_name = package["name"].as_str().unwrap_or_default();
            package["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|target| {
                    target["kind"]
                        .as_array()
                        .is_some_and(|kinds| kinds.iter().any(|k| k == "example"))
                })
                .filter_map(move |target| {
                    Some(Example {
                        package: package_name.to_string(),
                        name: target["name"].as_str()?.to_string(),
                    })
                })
        })
        .collect();
    examples.sort_by(|a, b| (&a.package, &a.name).cmp(&(&b.package, &b.name)));
    examples
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn example(package: &str, name: &str) -> Example {
        Example {
            package: package.into(),
            name: name.into(),
        }
    }

    #[test]
    fn examples_are_the_targets_of_kind_example() {
        let metadata = json!({"packages": [
            {"name": "b", "targets": [
                {"name": "b", "kind": ["lib"]},
                {"name": "two", "kind": ["example"]},
                {"name": "one", "kind": ["example"]},
                {"name": "tests", "kind": ["test"]},
            ]},
            {"name": "a", "targets": [{"name": "x", "kind": ["example"]}]},
            {"name": "c", "targets": []},
        ]});
        assert_eq!(
            example_targets(&metadata),
            [example("a", "x"), example("b", "one"), example("b", "two")]
        );
    }

    #[test]
    fn the_workspace_lists_the_gguf_example() {
        let examples = example_targets(&cargo_metadata(&project_root()).unwrap());
        assert!(
            examples.contains(&example("lm", "chat_gguf")),
            "{examples:?}"
        );
    }
}
