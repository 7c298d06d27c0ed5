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
    run.assert_exit(1, "config.json");
}

/// generation_config.json's temperature, top-p and top-k (0.7, 0.9, 40 in
/// the fixtures) fill the flags left unset, and the `--json` settings say
/// so; a flag given wins; `--greedy` and another model take none.
#[test]
fn generation_config_gives_the_unset_sampling_defaults() {
    let settings = |model: &Path, extra: &[&str]| {
        let report = Cli::generate("Hello")
            .model(model.display())
            .n(2)
            .seed(1)
            .args(extra)
            .json();
        report["settings"].clone()
    };
    let dir = fixture("hf/qwen2");
    let all = settings(&dir, &[]);
    assert_eq!(
        all["temperature"].as_f64().map(|t| t as f32),
        Some(0.7),
        "{all}"
    );
    assert_eq!(all["top_p"].as_f64().map(|p| p as f32), Some(0.9), "{all}");
    assert_eq!(all["top_k"], 40, "{all}");
    assert_eq!(
        all["defaults"],
        serde_json::json!({"source": "generation_config.json", "fields": ["temperature", "top_p", "top_k"]}),
    );
    let given = settings(&dir, &["--temperature", "0.5", "--top-k", "5"]);
    assert_eq!(
        given["temperature"].as_f64().map(|t| t as f32),
        Some(0.5),
        "{given}"
    );
    assert_eq!(given["top_k"], 5, "{given}");
    assert_eq!(
        given["defaults"]["fields"],
        serde_json::json!(["top_p"]),
        "{given}"
    );
    let greedy = settings(&dir, &["--greedy"]);
    assert!(greedy.get("defaults").is_none(), "{greedy}");
    let toy = Cli::generate("<start> the cat")
        .model("toy")
        .n(2)
        .seed(1)
        .json();
    assert!(toy["settings"].get("defaults").is_none(), "{toy}");
    assert_eq!(toy["settings"]["temperature"], 1.0, "{toy}");
}

/// `--quantize TYPE` quantizes a directory while loading, and gives the
/// greedy ids of the same directory quantized on disk by `quantize DIR OUT
/// TYPE` (the same reference quantizer, here the same matrices); any other
/// model is refused naming the flag.
#[test]
fn quantize_at_load_runs_as_the_quantized_file() {
    let dir = scratch("at-load");
    let file = dir.join("qwen2-q8_0.gguf");
    let run = Cli::new("quantize")
        .arg(fixture("hf/qwen2").display())
        .arg(file.display())
        .arg("q8_0")
        .run();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let greedy = |cli: Cli| cli.n(8).arg("--greedy").json()["ids"].clone();
    let at_load = greedy(
        Cli::generate("Hello world")
            .model(fixture("hf/qwen2").display())
            .opt("--quantize", "q8_0"),
    );
    let on_disk = greedy(Cli::generate("Hello world").model(file.display()));
    assert_eq!(at_load, on_disk);
    let run = Cli::generate("<start> the")
        .model("toy")
        .opt("--quantize", "q8_0")
        .run();
    run.assert_exit(1, "--quantize");
}
