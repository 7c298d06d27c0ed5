//! `--model DIR` and `quantize DIR OUT TYPE` on the Hugging Face directories
//! of `fixtures/hf/` (see its README): the directory tokenizes as the
//! `tokenizers` package does (`fixtures/hf/tokenize.json`), generates, and
//! quantizes to the same tensors as its GGUF twin in `fixtures/arch/`.

use std::path::{Path, PathBuf};

use lm_model::GgufFile;

use crate::common::{Cli, fixture};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf-dir-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_directory_tokenizes_and_generates() {
    let run = Cli::new("tokenize")
        .model(fixture("hf/qwen2").display())
        .opt("--text", "Hello world")
        .run();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // tokenize.json's first line: [0, 307, 359].
    let ids: Vec<&str> = run
        .stdout
        .lines()
        .skip(2) // "3 tokens", the column heads
        .filter_map(|line| line.split_whitespace().next())
        .filter(|word| word.parse::<u32>().is_ok())
        .collect();
    assert_eq!(ids, ["0", "307", "359"], "{}", run.stdout);
    let run = Cli::generate("Hello")
        .model(fixture("hf/gemma3").display())
        .n(3)
        .seed(1)
        .run();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

/// The directory and its twin quantize to the same tensors, byte for byte.
#[test]
fn quantize_takes_a_directory() {
    let dir = scratch("quantize");
    for (name, ty) in [("qwen2", "q8_0"), ("llama", "q4_0")] {
        let ours = dir.join(format!("{name}-dir.gguf"));
        let twin = dir.join(format!("{name}-twin.gguf"));
        for (input, output) in [
            (fixture(&format!("hf/{name}")), &ours),
            (fixture(&format!("arch/{name}.gguf")), &twin),
        ] {
            let run = Cli::new("quantize")
                .arg(input.display())
                .arg(output.display())
                .arg(ty)
                .run();
            assert_eq!(run.code, Some(0), "{}", run.stderr);
        }
        let (ours, twin) = (GgufFile::map(&ours).unwrap(), GgufFile::map(&twin).unwrap());
        assert_eq!(ours.tensors().len(), twin.tensors().len(), "{name}");
        for info in twin.tensors() {
            let a = ours.tensor(&info.name).unwrap();
            let b = twin.tensor(&info.name).unwrap();
            assert_eq!(a.info.ggml_type, b.info.ggml_type, "{name} {}", info.name);
            assert_eq!(a.info.dims, b.info.dims, "{name} {}", info.name);
            assert!(a.data == b.data, "{name} {}", info.name);
        }
    }
    let run = Cli::new("quantize")
        .arg(fixture("hf").display())
        .arg(dir.join("none.gguf").display())
        .arg("q8_0")
        .run();
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("config.json"), "{}", run.stderr);
}
