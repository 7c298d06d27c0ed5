//! Files the user names: `train --out` writes through a device or FIFO,
//! follows a symlink, keeps the mode of the file it replaces, refuses its
//! own corpus and a directory before training, and `-` is stdout; a device,
//! a FIFO or a directory given as a model or corpus is refused by name
//! before anything is read (so `/dev/zero` cannot eat the memory).
//!
//! Device nodes are made with `mknod` inside a temporary folder (as root);
//! the machine's own devices are only ever read.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{BOUNDED, Cli, Run, assert_contains, fixture};

/// `lm-cli train` on the tiny corpus, writing `out`.
fn train(corpus: &Path, out: &Path) -> Cli {
    Cli::new("train")
        .opt("--corpus", corpus.display())
        .opt("--out", out.display())
        .arg("--discount-fallback")
}

/// The model `train` writes for the tiny corpus, to a fresh regular file.
fn reference_model() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model.arpa");
    train(&fixture("ngram/tiny.txt"), &out).ok();
    let model = fs::read(&out).unwrap();
    assert!(model.starts_with(b"\\data\\\n") && model.ends_with(b"\\end\\\n"));
    model
}

/// Runs `cli` under a 20-second timeout and a 1 GB address-space limit, so
/// a run that reads an endless input fails instead of eating the machine.
fn run_bounded(cli: &Cli) -> Run {
    cli.run_wrapped(&BOUNDED, "")
}

/// Checks a run ended with exit code `code` and one `error:` line holding
/// `fragment`.
fn check_error(run: &Run, code: i32, fragment: &str) {
    assert_eq!(run.code, Some(code), "{}", run.stderr);
    let first = run.stderr.lines().next().unwrap_or("");
    assert!(first.starts_with("error: "), "{}", run.stderr);
    assert!(first.contains(fragment), "{first:?} lacks {fragment:?}");
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

#[test]
fn train_out_onto_a_device_node_writes_through_and_leaves_the_node() {
    // A node of the null device (1, 3) in a temporary folder: writes to it
    // are discarded, and the test checks that it is still that node after.
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("null");
    let made = Command::new("mknod")
        .arg(&node)
        .args(["c", "1", "3"])
        .status()
        .unwrap();
    assert!(
        made.success(),
        "this test makes a device node: run it as root"
    );
    let before = fs::metadata(&node).unwrap();
    train(&fixture("ngram/tiny.txt"), &node).ok();
    let after = fs::symlink_metadata(&node).unwrap();
    assert!(after.file_type().is_char_device(), "{after:?}");
    assert_eq!(
        (after.rdev(), after.ino(), after.mode()),
        (before.rdev(), before.ino(), before.mode())
    );
    let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "no temporary file is left: {left:?}");
}

#[test]
fn train_out_onto_a_fifo_writes_the_model_to_its_reader() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.fifo");
    mkfifo(&fifo);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || fs::read(fifo).unwrap())
    };
    let mut child = train(&fixture("ngram/tiny.txt"), &fifo)
        .command()
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("train --out FIFO did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    // Checked first: had the FIFO been replaced, its reader would wait forever.
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(reader.join().unwrap(), reference_model());
}

#[test]
fn train_out_through_a_symlink_replaces_the_target_and_keeps_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    fs::create_dir(&models).unwrap();
    fs::write(models.join("model.arpa"), "old").unwrap();
    // A relative link, as `ln -s models/model.arpa latest.arpa` makes; then
    // a link to a file not written yet: the file is made, the link stays.
    for (link_name, target) in [("latest.arpa", "model.arpa"), ("next.arpa", "next.arpa")] {
        let link = dir.path().join(link_name);
        std::os::unix::fs::symlink(format!("models/{target}"), &link).unwrap();
        train(&fixture("ngram/tiny.txt"), &link).ok();
        assert!(
            fs::symlink_metadata(&link).unwrap().is_symlink(),
            "{link_name}"
        );
        let written = fs::read(models.join(target)).unwrap();
        assert_eq!(written, reference_model(), "{link_name}");
    }
}

#[test]
fn train_out_keeps_the_mode_of_the_file_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [0o600, 0o640, 0o755] {
        let out = dir.path().join(format!("model-{mode:o}.arpa"));
        fs::write(&out, "old").unwrap();
        fs::set_permissions(&out, fs::Permissions::from_mode(mode)).unwrap();
        train(&fixture("ngram/tiny.txt"), &out).ok();
        assert_eq!(fs::read(&out).unwrap(), reference_model());
        let kept = fs::metadata(&out).unwrap().permissions().mode() & 0o7777;
        assert_eq!(kept, mode, "mode of {}", out.display());
    }
}

#[test]
fn train_refuses_to_write_over_its_own_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    let text = fs::read(fixture("ngram/tiny.txt")).unwrap();
    fs::write(&corpus, &text).unwrap();
    let symlink = dir.path().join("symlink.arpa");
    std::os::unix::fs::symlink(&corpus, &symlink).unwrap();
    let hard_link = dir.path().join("hard-link.arpa");
    fs::hard_link(&corpus, &hard_link).unwrap();
    for out in [&corpus, &symlink, &hard_link] {
        let run = train(&corpus, out).run();
        check_error(&run, 1, "writing it would destroy the input");
        assert!(run.stderr.contains(&out.display().to_string()));
        assert_eq!(fs::read(&corpus).unwrap(), text, "--out {}", out.display());
    }
    assert!(fs::symlink_metadata(&symlink).unwrap().is_symlink());
}

#[test]
fn train_out_a_directory_is_refused_before_training() {
    // The corpus is empty, which training would refuse: the directory is
    // named first, so nothing was trained.
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("empty.txt");
    fs::write(&corpus, "").unwrap();
    let run = train(&corpus, dir.path()).run();
    check_error(&run, 1, "is a directory");
    assert!(!run.stderr.contains("training"), "{}", run.stderr);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn train_out_dash_writes_the_model_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let output = train(&fixture("ngram/tiny.txt"), Path::new("-"))
        .command()
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.stdout == reference_model(),
        "stdout is not the model: {:?}",
        &stdout[..stdout.len().min(80)]
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_contains(&stderr, "wrote the model to stdout");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "no file `-`");
}

#[test]
fn train_reads_a_corpus_from_a_pipe() {
    // A pipe (`--corpus /dev/stdin`, `<(...)`) is read once, as before.
    let text = fs::read_to_string(fixture("ngram/tiny.txt")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model.arpa");
    let run = train(Path::new("/dev/stdin"), &out).run_with_stdin(&text);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(fs::read(&out).unwrap(), reference_model());
}

#[test]
fn dev_zero_as_a_corpus_or_a_count_model_is_refused_before_it_is_read() {
    // Reading /dev/zero is harmless; holding it is the attack (7.4 GB in
    // 20 s before the fix). Bounded by a timeout and a 1 GB address space.
    let dir = tempfile::tempdir().unwrap();
    let run = run_bounded(&train(Path::new("/dev/zero"), &dir.path().join("m.arpa")));
    check_error(
        &run,
        1,
        "/dev/zero is not a regular file (it is a character device)",
    );
    let run = run_bounded(&Cli::generate("the").model("count:/dev/zero").n(1));
    check_error(
        &run,
        1,
        "/dev/zero is not a regular file (it is a character device)",
    );
    assert!(run.stdout.is_empty());
    // A regular file of zeros is refused by its first bytes.
    let zeros = dir.path().join("zeros.txt");
    fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let run = run_bounded(&train(&zeros, &dir.path().join("m.arpa")));
    check_error(&run, 1, "is binary (a NUL byte at offset 0)");
    let run = run_bounded(
        &Cli::generate("the")
            .model(format!("count:{}", zeros.display()))
            .n(1),
    );
    check_error(&run, 1, "is binary (a NUL byte at offset 0)");
}

#[test]
fn a_directory_or_a_fifo_as_a_model_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    mkfifo(&fifo);
    let folder = dir.path().join("folder.gguf");
    fs::create_dir(&folder).unwrap();
    let plain_fifo = dir.path().join("model");
    mkfifo(&plain_fifo);
    let plain_folder = dir.path().join("models");
    fs::create_dir(&plain_folder).unwrap();
    // No writer ever opens the FIFOs: a run that waits on one times out.
    let cases = [
        (
            fifo.display().to_string(),
            1,
            "is not a regular file (it is a fifo)",
        ),
        (folder.display().to_string(), 1, "is a directory"),
        (
            format!("count:{}", fifo.display()),
            1,
            "is not a regular file (it is a fifo)",
        ),
        (format!("count:{}", folder.display()), 1, "is a directory"),
        (
            plain_fifo.display().to_string(),
            2,
            "is a fifo, not a model file",
        ),
        (
            plain_folder.display().to_string(),
            2,
            "is a directory, not a model file",
        ),
    ];
    for (spec, code, fragment) in cases {
        for command in ["generate", "tokenize"] {
            let cli = Cli::new(command).model(&spec).opt("--prompt", "hi");
            let cli = if command == "tokenize" {
                Cli::new(command).model(&spec).opt("--text", "hi")
            } else {
                cli
            };
            let run = run_bounded(&cli);
            check_error(&run, code, fragment);
            assert!(!run.stderr.contains("not found"), "{spec}: {}", run.stderr);
        }
    }
}

#[test]
fn text_inputs_are_refused_by_kind_or_cut_off_by_length() {
    // `generate -f /dev/zero` read until memory ran out; each text input
    // (a prompt file, a text to score, a schema, a grammar) is a regular
    // file or a pipe of at most 256 MiB. Bounded as above.
    let zero = "/dev/zero is not a regular file (it is a character device)";
    let cases = [
        Cli::new("generate").opt("--file", "/dev/zero").n(1),
        Cli::new("score").model("toy").opt("--file", "/dev/zero"),
        Cli::generate("the").opt("--json-schema", "/dev/zero").n(1),
        Cli::generate("the").opt("--grammar", "/dev/zero").n(1),
    ];
    for cli in &cases {
        let run = run_bounded(cli);
        check_error(&run, 1, zero);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
    // An endless stream on stdin is cut off at the cap.
    let endless_stdin = [
        "sh",
        "-c",
        "ulimit -v 1000000; exec timeout 20 \"$@\" < /dev/zero",
        "sh",
    ];
    let run = Cli::new("generate").n(1).run_wrapped(&endless_stdin, "");
    check_error(
        &run,
        1,
        "stdin goes on past the 268435456 bytes read at most",
    );
}
