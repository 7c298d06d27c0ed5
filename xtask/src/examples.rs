//! `cargo xtask examples`: runs every example target of the workspace, as CI
//! does after the tests.
//!
//! The examples are listed from `cargo metadata` (every target of kind
//! `example`), so a new one runs without being named here. Each runs as
//! `cargo run -q -p PACKAGE --example NAME` and must exit 0; an example that
//! needs a model file it cannot find says "skipped: ..." on stderr and exits
//! 0, so it shows as skipped (with that reason, in the summary line
//! `examples: skipped N: ...`) rather than failing or passing silently.

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
    let (mut ran, mut skipped, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for Example { package, name } in &examples {
        println!("examples: running {package} --example {name}");
        // stderr is read (and passed on) to tell a skip from a run.
        let output = Command::new(&cargo)
            .current_dir(&root)
            .args(["run", "-q", "-p", package, "--example", name])
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("running cargo for the example {package}/{name}"))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprint!("{stderr}");
        let example = format!("{package}/{name}");
        if !output.status.success() {
            eprintln!("examples: {example} failed ({})", output.status);
            failed.push(example);
        } else if let Some(reason) = skip_reason(&stderr) {
            skipped.push(format!("{example} ({reason})"));
        } else {
            ran.push(example);
        }
    }
    println!("examples: ran {}: {}", ran.len(), ran.join(", "));
    if !skipped.is_empty() {
        println!(
            "examples: skipped {}: {}",
            skipped.len(),
            skipped.join(", ")
        );
    }
    if !failed.is_empty() {
        bail!("{} example(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

/// What an example that exited 0 without running said on stderr: the rest
/// of its first line that starts with `skipped:`.
fn skip_reason(stderr: &str) -> Option<&str> {
    stderr
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("skipped:"))
        .map(str::trim)
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
    fn a_skip_is_told_by_its_stderr_line() {
        assert_eq!(
            skip_reason("loading\nskipped: no model; run `cargo xtask fetch-model smollm2`\n"),
            Some("no model; run `cargo xtask fetch-model smollm2`")
        );
        assert_eq!(skip_reason("ran fine\n"), None);
        assert_eq!(skip_reason(""), None);
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
