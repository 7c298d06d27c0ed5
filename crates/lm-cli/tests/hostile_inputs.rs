//! Hostile files and faults through the command line: every hostile GGUF,
//! ARPA and corpus file of `fixtures/hostile/` ends with exit code 1 and one
//! `error:` line naming the problem (never a panic); Ctrl-C while streaming
//! prints the text so far and exits 130; `train --out` killed mid-write
//! leaves no half-written file; `| head -c 1` ends quietly and stops the
//! generation; a huge `-n` runs until a stop rule.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Cli, Run, check, close_stdout_after, fixture, shell, spawn_shell};

/// Rows of a tab-separated manifest, comments skipped.
fn manifest(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| line.split('\t').map(str::to_owned).collect())
        .collect()
}

/// Checks that `cli` failed with exit code 1 and exactly one stderr line,
/// `error: ...` holding `fragment`, and no panic text.
fn check_refused(cli: &Cli, fragment: &str) {
    let run = cli.run();
    let args = cli.line();
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(run.code, Some(1), "lm-cli {args}: {}", run.stderr);
    assert_eq!(lines.len(), 1, "lm-cli {args}: {}", run.stderr);
    assert!(
        lines[0].starts_with("error: "),
        "lm-cli {args}: {}",
        run.stderr
    );
    assert!(
        lines[0].contains(fragment),
        "lm-cli {args}: {:?} lacks {fragment:?}",
        lines[0]
    );
    for panic_text in ["panicked", "internal error", "RUST_BACKTRACE"] {
        assert!(
            !run.stderr.contains(panic_text),
            "lm-cli {args}: {}",
            run.stderr
        );
    }
    assert!(run.stdout.is_empty(), "lm-cli {args}: {}", run.stdout);
}

#[test]
fn every_hostile_gguf_file_is_refused_in_one_line_naming_the_problem() {
    let dir = fixture("hostile/gguf");
    let rows = manifest(&dir.join("expected.tsv"));
    let mut n_checked = 0;
    for row in rows {
        let [file, stage, fragment] = &row[..] else {
            panic!("malformed manifest row {row:?}");
        };
        let model = dir.join(file).display().to_string();
        let tokenize = Cli::new("tokenize").model(&model).opt("--text", "hi ab");
        let generate = Cli::new("generate")
            .model(&model)
            .opt("--prompt", "hi")
            .n(3);
        match stage.as_str() {
            "valid" => {
                let run = generate.run();
                assert_eq!(run.code, Some(0), "{file}: {}", run.stderr);
                assert!(run.stdout.starts_with("hi"), "{file}: {}", run.stdout);
                let run = tokenize.arg("--json").run();
                assert_eq!(run.code, Some(0), "{file}: {}", run.stderr);
            }
            // The tokenizer reads the metadata only: parse errors show
            // there, except a weight type lm-model cannot read, which only
            // loading the weights meets (the tokenizer skips those tensors).
            "parse" if fragment.contains("; supported: f32") => {
                check_refused(&generate, fragment);
            }
            "parse" => check_refused(&tokenize, fragment),
            // The model loads first when generating.
            "llama" => check_refused(&generate, fragment),
            "tokenizer" => {
                check_refused(&tokenize, fragment);
                check_refused(&generate, fragment);
            }
            other => panic!("unknown stage {other:?} for {file}"),
        }
        n_checked += 1;
    }
    assert!(n_checked >= 45, "only {n_checked} files checked");
}

#[test]
fn fuzz_reproducers_never_panic_the_command_line() {
    let dir = fixture("hostile/fuzz");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let model = entry.unwrap().path().display().to_string();
        for cli in [
            Cli::new("tokenize").model(&model).opt("--text", "hi"),
            Cli::new("generate")
                .model(&model)
                .opt("--prompt", "hi")
                .n(2),
        ] {
            let (run, args) = (cli.run(), cli.line());
            assert!(matches!(run.code, Some(0 | 1)), "{args}: {}", run.stderr);
            assert!(!run.stderr.contains("panicked"), "{args}: {}", run.stderr);
            assert!(!run.stderr.contains("internal error"), "{args}");
        }
    }
}

#[test]
fn every_hostile_arpa_file_and_corpus_is_refused_in_one_line() {
    let dir = fixture("hostile/ngram");
    let out = tempfile::tempdir().unwrap();
    let model_out = out.path().join("model.arpa");
    let model_out = model_out.to_str().unwrap();
    let mut n_checked = 0;
    for row in manifest(&dir.join("expected.tsv")) {
        let [file, fragment] = &row[..] else {
            panic!("malformed manifest row {row:?}");
        };
        let path = dir.join(file).display().to_string();
        let cli = if file.starts_with("corpus-") {
            Cli::new("train")
                .opt("--corpus", &path)
                .opt("--out", model_out)
        } else {
            Cli::new("score")
                .model(format!("count:{path}"))
                .opt("--text", "a a")
        };
        if fragment == "-" {
            let run = cli.run();
            assert_eq!(run.code, Some(0), "{file}: {}", run.stderr);
        } else {
            check_refused(&cli, fragment);
        }
        // A refused corpus never leaves a model file behind.
        assert!(!Path::new(model_out).exists(), "{file} left {model_out}");
        n_checked += 1;
    }
    let n_files = std::fs::read_dir(&dir).unwrap().count() - 1;
    assert_eq!(n_checked, n_files, "every file has a manifest row");
}

/// `score --json` on the valid ARPA fixture written as `bytes` (into a file named `name`).
fn score_count_file(name: &str, bytes: &[u8]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    Cli::new("score")
        .model(format!("count:{}", path.display()))
        .opt("--text", "a a")
        .arg("--json")
        .run()
}

#[test]
fn an_arpa_file_with_leading_text_or_gzipped_is_read_as_arpa_not_trained_on() {
    let arpa = std::fs::read(fixture("hostile/ngram/arpa-valid.arpa")).unwrap();
    let plain = score_count_file("m.arpa", &arpa);
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    assert!(plain.stderr.is_empty(), "{}", plain.stderr);
    let mut commented = b"# built by hand\nsome notes before the header\n\n".to_vec();
    commented.extend_from_slice(&arpa);
    let mut gzipped = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gzipped, &arpa).unwrap();
    let gzipped = gzipped.finish().unwrap();
    for (name, bytes) in [("m.arpa", commented), ("m.arpa.gz", gzipped)] {
        let run = score_count_file(name, &bytes);
        assert_eq!(run.code, Some(0), "{name}: {}", run.stderr);
        // Trained on as a corpus, the scores would differ and a note would say so.
        assert!(run.stderr.is_empty(), "{name}: {}", run.stderr);
        assert_eq!(run.stdout, plain.stdout, "{name}");
    }
}

#[test]
fn a_binary_count_file_or_a_broken_arpa_file_is_refused_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let arpa = std::fs::read_to_string(fixture("hostile/ngram/arpa-valid.arpa")).unwrap();
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "nul.bin",
            b"the cat\0\x01\x02 sat\n".to_vec(),
            "is binary (a NUL byte at offset 7)",
        ),
        (
            "noise.bin",
            vec![0xff; 64],
            "is binary (64 invalid utf-8 sequences in its first 64 bytes)",
        ),
        // Leading text, then an ARPA body that does not parse.
        (
            "broken.arpa",
            format!("# notes\n{}", arpa.replace("-0.4\ta </s>", "-0.4x\ta </s>")).into_bytes(),
            "arpa line 14: bad number \"-0.4x\"",
        ),
        // ARPA sections without the header are not a corpus either.
        (
            "sections.txt",
            arpa.replace("\\data\\\n", "").into_bytes(),
            "arpa: no \\data\\ header",
        ),
        (
            "gz-of-nul.gz",
            {
                let mut gz =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                std::io::Write::write_all(&mut gz, b"\0").unwrap();
                gz.finish().unwrap()
            },
            "is binary (a NUL byte at offset 0)",
        ),
    ];
    for (name, bytes, fragment) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let cli = Cli::new("score")
            .model(format!("count:{}", path.display()))
            .opt("--text", "a a");
        check_refused(&cli, fragment);
    }
}

#[test]
fn a_corpus_that_is_not_utf8_names_the_byte_offset_when_training() {
    // "the cat sat\nthe dog " is 20 bytes; byte 20 is 0xff.
    let corpus = fixture("hostile/ngram/corpus-invalid-utf8.txt");
    let bytes = std::fs::read(&corpus).unwrap();
    assert_eq!(bytes[20], 0xff);
    assert!(std::str::from_utf8(&bytes[..20]).is_ok());
    let out = tempfile::tempdir().unwrap();
    let train = Cli::new("train")
        .opt("--corpus", corpus.display())
        .opt("--out", out.path().join("m.arpa").display());
    check_refused(&train, "invalid utf-8 at byte offset 20 of the corpus");
}

#[test]
fn ctrl_c_while_streaming_prints_the_text_so_far_and_exits_130() {
    // The embedded model has no context bound: this run would take minutes.
    let mut child = Cli::generate("In the beginning")
        .n(100_000_000)
        .args(["--no-end-token", "--stream"])
        .seed(7)
        .spawn();
    let mut stdout = child.stdout.take().unwrap();
    // Wait until streaming has visibly started.
    let mut seen = vec![0u8; 300];
    stdout.read_exact(&mut seen).unwrap();
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let started = Instant::now();
    let output = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("note: interrupted after ") && lines[0].ends_with(" generated tokens"),
        "{stderr}"
    );
    seen.extend(rest);
    let text = String::from_utf8(seen).expect("whole characters only");
    assert!(text.starts_with("In the beginning"), "{text}");
    assert!(text.ends_with('\n'), "the text so far ends its line");
    // Stopped long before the 100 million tokens asked for.
    let n_tokens: usize = lines[0]
        .trim_start_matches("note: interrupted after ")
        .trim_end_matches(" generated tokens")
        .parse()
        .unwrap();
    assert!((1..100_000_000).contains(&n_tokens), "{n_tokens}");
}

#[test]
fn output_to_a_closed_shell_pipe_ends_quietly() {
    let output = shell("\"$LM_CLI\" generate --prompt 'And God said' -n 2000 --stream | head -c 1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.stdout, b"A");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

#[test]
fn a_closed_pipe_stops_the_generation_at_its_first_failed_write() {
    // As `| head -c 10`: the reader closes the pipe after ten bytes of a run
    // asked for 100 million tokens (about an hour). The shell's CPU limit
    // (`ulimit -t 20`) kills a run that keeps generating (no exit code); a
    // run that stops at its first failed write exits 0, quietly, within a
    // few steps of the close.
    let child = spawn_shell(
        "ulimit -t 20; exec \"$LM_CLI\" generate --prompt 'And God said' \
         -n 100000000 --no-end-token --stream --seed 0",
    );
    assert_eq!(close_stdout_after(child, 10), b"And God sa");
}

#[test]
fn a_huge_max_new_tokens_runs_until_a_stop_rule() {
    // Nothing is reserved for 2^64 - 2 tokens: a stop string ends the run
    // on the embedded model (no context bound), the context on the toy.
    let huge = "18446744073709551614";
    let embedded = |mode: &str| {
        Cli::generate("And")
            .opt("-n", huge)
            .args(["--no-end-token", "--stop", "LORD", mode])
            .seed(1)
    };
    let text = embedded("--no-stream").ok().stdout;
    assert!(text.starts_with("And") && !text.contains("LORD"), "{text}");
    assert_eq!(embedded("--stream").ok().stdout, text);
    let report = embedded("--json").ok().json();
    assert_eq!(report["stop_reason"], "stop_string");
    assert_eq!(
        report["settings"]["max_new_tokens"],
        18446744073709551614u64
    );
    let toy = Cli::toy("generate")
        .opt("-n", huge)
        .arg("--greedy")
        .arg("--json");
    let report = toy.ok().json();
    assert_eq!(report["stop_reason"], "context_bound");
}

/// Trains on `corpus` writing `out` with the shell's file-size limit set to
/// `limit_blocks` blocks of 512 bytes (`ulimit -f`): a write past the limit
/// kills the process (SIGXFSZ) in the middle of writing the model.
fn train_with_file_size_limit(corpus: &Path, out: &Path, limit_blocks: u32) -> Option<i32> {
    let binary = env!("CARGO_BIN_EXE_lm-cli");
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f {limit_blocks} && exec '{binary}' train --corpus '{}' --out '{}' --discount-fallback",
            corpus.display(),
            out.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .code()
}

#[test]
fn train_killed_while_writing_leaves_no_half_written_file() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = fixture("ngram/tiny.txt");
    let out: PathBuf = dir.path().join("model.arpa");
    // A complete run: the model is far larger than 512 bytes.
    assert_eq!(train_with_file_size_limit(&corpus, &out, 1 << 20), Some(0));
    let complete = std::fs::read(&out).unwrap();
    assert!(complete.len() > 2048, "{} bytes", complete.len());
    assert!(complete.ends_with(b"\\end\\\n"));
    // A second run dies after 512 bytes: the first file is untouched.
    let killed = train_with_file_size_limit(&corpus, &out, 1);
    assert_ne!(killed, Some(0));
    assert_eq!(std::fs::read(&out).unwrap(), complete);
    // And with no earlier file, the killed run leaves no file of that name.
    std::fs::remove_file(&out).unwrap();
    assert_ne!(train_with_file_size_limit(&corpus, &out, 1), Some(0));
    assert!(!out.exists());
}

#[test]
fn a_gguf_model_gives_the_same_json_bytes_across_runs_and_thread_counts() {
    let model = fixture("hostile/gguf/valid-tiny-llama.gguf");
    let generate = Cli::new("generate")
        .model(model.display())
        .opt("--prompt", "hi ab")
        .n(8)
        .seed(3)
        .opt("--temperature", 1.5)
        .args(["--json", "--no-timing"]);
    let run = |threads: usize| generate.clone().opt("--threads", threads).ok();
    let one = run(1);
    let report = one.json();
    assert_eq!(report["prompt_ids"], serde_json::json!([3, 4, 7]));
    assert_eq!(one.stdout, run(1).stdout);
    assert_eq!(one.stdout, run(2).stdout);
    check("generate_tiny_gguf_json", &generate);
}
