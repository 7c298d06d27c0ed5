//! `cargo xtask examples`: runs every example target of the workspace, as CI
//! does after the tests.
//!
//! The examples are listed from `cargo metadata` (every target of kind
//! `example`), so a new one runs without being named here. They are built
//! in one `cargo build --workspace --examples`, whose features are those
//! `cargo test --workspace` unified, so after the tests nothing but the
//! examples themselves is compiled (a `cargo run -p PACKAGE` each resolved
//! each package's features apart and built the dependencies again). Each
//! then runs from the workspace root and must exit 0; an example that
//! needs a model file it cannot find says "skipped: ..." on stderr and
//! exits 0, so it shows as skipped (with that reason, in the summary line
//! `examples: skipped N: ...`) rather than failing or passing silently.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::project_root;
use crate::tidy::cargo_metadata;

/// One example target: its package, its name and its source file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Example {
    package: String,
    name: String,
    src_path: String,
}

pub fn run(_args: &[String]) -> anyhow::Result<()> {
    let root = project_root();
    let examples = example_targets(&cargo_metadata(&root)?);
    if examples.is_empty() {
        bail!("cargo metadata lists no example targets");
    }
    // Every example in one cargo call.
    let messages = crate::cargo_build(&["--workspace", "--examples"])?;
    let executables = example_executables(&messages);
    let (mut ran, mut skipped, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for Example {
        package,
        name,
        src_path,
    } in &examples
    {
        println!("examples: running {package} --example {name}");
        let executable = executables
            .get(src_path)
            .with_context(|| format!("cargo built no executable for the example {src_path}"))?;
        // stderr is read (and passed on) to tell a skip from a run.
        let output = Command::new(executable)
            .current_dir(&root)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("running the example {package}/{name}"))?;
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

/// The executables of the example artifacts among cargo's JSON `messages`
/// (one per line), by source file.
fn example_executables(messages: &str) -> HashMap<String, PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| {
            message["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "example"))
        })
        .filter_map(|message| {
            let src_path = message["target"]["src_path"].as_str()?;
            let executable = message["executable"].as_str()?;
            Some((src_path.to_owned(), PathBuf::from(executable)))
        })
        .collect()
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
                        src_path: target["src_path"].as_str()?.to_string(),
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
            src_path: format!("/{package}/examples/{name}.rs"),
        }
    }

    #[test]
    fn examples_are_the_targets_of_kind_example() {
        let target = |name: &str, kind: &str, src_path: &str| json!({"name": name, "kind": [kind], "src_path": src_path});
        let metadata = json!({"packages": [
            {"name": "b", "targets": [
                target("b", "lib", "/b/src/lib.rs"),
                target("two", "example", "/b/examples/two.rs"),
                target("one", "example", "/b/examples/one.rs"),
                target("tests", "test", "/b/tests/tests.rs"),
            ]},
            {"name": "a", "targets": [target("x", "example", "/a/examples/x.rs")]},
            {"name": "c", "targets": []},
        ]});
        assert_eq!(
            example_targets(&metadata),
            [example("a", "x"), example("b", "one"), example("b", "two")]
        );
    }

    #[test]
    fn executables_are_read_from_the_example_artifacts() {
        let artifact = |kind: &str, src_path: &str, executable: Option<&str>| {
            json!({"reason": "compiler-artifact", "executable": executable,
                   "target": {"kind": [kind], "src_path": src_path}})
        };
        let messages = [
            artifact("lib", "/a/src/lib.rs", None),
            artifact(
                "example",
                "/a/examples/x.rs",
                Some("/t/debug/examples/x-1f2e"),
            ),
            json!({"reason": "build-finished", "success": true}),
        ]
        .map(|message| message.to_string())
        .join("\n");
        assert_eq!(
            example_executables(&format!("{messages}\nnot json\n")),
            HashMap::from([(
                "/a/examples/x.rs".to_owned(),
                PathBuf::from("/t/debug/examples/x-1f2e")
            )])
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
            examples
                .iter()
                .any(|e| (e.package.as_str(), e.name.as_str()) == ("lm", "chat_gguf")),
            "{examples:?}"
        );
    }
}
