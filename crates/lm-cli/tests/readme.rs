//! The README's examples print what the README shows: its first command's
//! output, and every `$ lm-cli ...` line of a `text` block followed by the
//! output it prints, run here and compared byte for byte.

use crate::common::{Cli, Run};

/// The workspace README.
fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    std::fs::read_to_string(path).expect("the workspace README")
}

/// Splits a shell command line on spaces, keeping double-quoted words whole
/// (enough for the README's examples, which quote with `"` only).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut in_word = false;
    for c in line.chars() {
        match c {
            '"' => (quoted, in_word) = (!quoted, true),
            ' ' if !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                }
                in_word = false;
            }
            _ => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Each `$ lm-cli ARGS` line of the README and the lines shown after it, up
/// to the end of its block.
fn shown_examples(readme: &str) -> Vec<(String, String)> {
    let mut examples = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if let Some(args) = line.strip_prefix("$ lm-cli ") {
            let shown: String = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .map(|l| format!("{l}\n"))
                .collect();
            examples.push((args.to_owned(), shown));
        }
    }
    examples
}

fn run(args: &str) -> Run {
    let words = shell_words(args);
    let (subcommand, rest) = words.split_first().expect("a subcommand");
    Cli::new(subcommand).args(rest).ok()
}

#[test]
fn every_shown_example_prints_what_the_readme_shows() {
    let examples = shown_examples(&readme());
    assert!(examples.len() >= 3, "{examples:?}");
    for (args, shown) in examples {
        assert_eq!(run(&args).stdout, shown, "lm-cli {args}");
    }
}

#[test]
fn the_first_command_prints_the_verse_the_readme_shows() {
    let readme = readme();
    let command = r#"cargo run --release -p lm-cli -- generate --prompt "And God said" --seed 0"#;
    assert!(
        readme.contains(command),
        "the README's first command changed"
    );
    // The first `text` block shows what the first command prints.
    let block = readme
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a text block");
    let args = command.split(" -- ").nth(1).unwrap();
    assert_eq!(run(args).stdout, block);
}

#[test]
fn shell_words_keep_quoted_words_whole() {
    assert_eq!(
        shell_words(r#"generate --prompt "<start> the cat" -n 5"#),
        ["generate", "--prompt", "<start> the cat", "-n", "5"]
    );
    assert_eq!(shell_words(r#"a "" b"#), ["a", "", "b"]);
}
