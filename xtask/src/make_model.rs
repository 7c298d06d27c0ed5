//! `cargo xtask make-model SHAPE [--type TYPE]`: a random-weight GGUF file in
//! a real model's shape, for measuring speed at the sizes people run.
//!
//! No public 1B+ model is reachable from this project's registries, but speed
//! does not depend on what the weights mean, only on the shapes and the weight
//! format. So [`SHAPES`] lists real models' hyperparameters (Llama 3.2 1B,
//! Qwen 2.5 1.5B, Llama 3.2 3B, Llama 3.1 8B) and mixture-of-experts shapes
//! at the scale people run (`qwen3moe-16x1024`: sixteen 1B-class experts,
//! top-2; [`Experts`]), and the task:
//!
//! 1. writes an F16 file in that shape with `scripts/reference/make_model.py`
//!    (numpy random weights from a fixed seed, small scale, norms at 1,
//!    written tensor by tensor with the `gguf` package's `GGUFWriter`), with
//!    SmolLM2's tokenizer copied from the fetched SmolLM2 file, so the
//!    vocabulary is SmolLM2's 49,152 rather than the model's own;
//! 2. requantizes it with llama.cpp's `llama_model_quantize` to `TYPE`
//!    (any `LLAMA_FTYPE_MOSTLY_<TYPE>` llama-cpp-python knows), exactly as
//!    `fetch-model` derives SmolLM2's requantized files, in the reference
//!    Python environment (`reference::reference_python`);
//! 3. renames the result into the models folder as
//!    `<shape>-shape-<type>.gguf` and deletes the F16 intermediate unless
//!    `--keep-f16` (which keeps it as `<shape>-shape-f16.gguf` and reuses it
//!    for the next type).
//!
//! A file already present is left alone. Every file is written to a
//! temporary name in the models folder first, so the folder never holds a
//! partial model.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use lm_model::catalog::models_dir;
use serde_json::json;
use tempfile::NamedTempFile;

use crate::{fetch_model, project_root, reference};

/// The F16 writer, relative to the project root.
const WRITER_SCRIPT: &str = "scripts/reference/make_model.py";

/// The catalog model whose tokenizer every shape gets.
const TOKENIZER_MODEL: &str = "smollm2";

/// The vocabulary size of SmolLM2's tokenizer, which every shape gets.
const SMOLLM2_VOCAB: usize = 49_152;

/// The type written when `--type` is not given.
const DEFAULT_TYPE: &str = "Q4_K_M";

/// Prints the suffix of every `LLAMA_FTYPE_MOSTLY_*` constant llama-cpp-python
/// defines, one per line: the types `llama_model_quantize` accepts by name.
const LIST_TYPES_SCRIPT: &str = "\
import llama_cpp
prefix = 'LLAMA_FTYPE_MOSTLY_'
print('\\n'.join(name[len(prefix):] for name in dir(llama_cpp) if name.startswith(prefix)))
";

/// Llama 3's rope scaling (`rope_scaling` of type `llama3` in the model's
/// config), written as `rope_freqs.weight`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RopeScaling {
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_context: usize,
}

/// The mixture of experts of a shape's FFN layers: `count` experts of
/// width `ffn` each (3-d tensors `ffn_{gate,up,down}_exps`), `used` of them
/// per token, chosen by an F32 router (`ffn_gate_inp`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Experts {
    count: usize,
    used: usize,
    ffn: usize,
}

/// A real model's shape: its hyperparameters as its config gives them.
#[derive(Debug)]
pub(crate) struct Shape {
    /// The name on the command line and in the file name.
    pub(crate) name: &'static str,
    /// The model it copies, for `general.name` and the usage text.
    title: &'static str,
    /// The GGUF architecture (`llama`, `qwen2` or `qwen3moe`).
    arch: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    ffn: usize,
    rope_base: f64,
    rms_eps: f64,
    /// The trained context length (the KV cache grows as it is used).
    context: usize,
    /// Whether the output matrix is the embedding (no `output.weight`).
    tied: bool,
    /// Biases on the query, key and value projections (qwen2).
    qkv_bias: bool,
    rope_scaling: Option<RopeScaling>,
    /// The model's own vocabulary size, to check the shape against its
    /// published parameter count.
    own_vocab: usize,
    /// The experts replacing the dense FFN (`None`: dense; `ffn` is then
    /// the dense width, else written as the FFN length the metadata asks for).
    experts: Option<Experts>,
}

/// Llama 3.1 and 3.2's rope scaling, with their `factor`.
const fn llama3_scaling(factor: f64) -> Option<RopeScaling> {
    Some(RopeScaling {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context: 8192,
    })
}

/// The shapes the task writes.
/// Llama 3.2 1B, which the other Llama 3 shapes vary.
const LLAMA_3_2_1B: Shape = Shape {
    name: "llama-3.2-1b",
    title: "Llama 3.2 1B",
    arch: "llama",
    n_layer: 16,
    n_embd: 2048,
    n_head: 32,
    n_kv_head: 8,
    head_dim: 64,
    ffn: 8192,
    rope_base: 500_000.0,
    rms_eps: 1e-5,
    context: 131_072,
    tied: true,
    qkv_bias: false,
    rope_scaling: llama3_scaling(32.0),
    own_vocab: 128_256,
    experts: None,
};

pub(crate) const SHAPES: &[Shape] = &[
    LLAMA_3_2_1B,
    Shape {
        name: "qwen-2.5-1.5b",
        title: "Qwen 2.5 1.5B",
        arch: "qwen2",
        n_layer: 28,
        n_embd: 1536,
        n_head: 12,
        n_kv_head: 2,
        head_dim: 128,
        ffn: 8960,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        context: 32_768,
        tied: true,
        qkv_bias: true,
        rope_scaling: None,
        own_vocab: 151_936,
        experts: None,
    },
    Shape {
        name: "llama-3.2-3b",
        title: "Llama 3.2 3B",
        n_layer: 28,
        n_embd: 3072,
        n_head: 24,
        head_dim: 128,
        ..LLAMA_3_2_1B
    },
    Shape {
        name: "llama-3.1-8b",
        title: "Llama 3.1 8B",
        n_layer: 32,
        n_embd: 4096,
        head_dim: 128,
        ffn: 14_336,
        tied: false,
        rope_scaling: llama3_scaling(8.0),
        ..LLAMA_3_2_1B
    },
    // No public model: a Qwen3-MoE (Qwen3-30B-A3B's architecture: QK norms,
    // softmax routing renormalised over the top k) with Qwen3 0.6B's
    // attention and width, and 16 experts each as wide as a 1B dense FFN
    // would be at this width, top-2: 1.33B parameters, about 0.2B used per
    // token (issue 36's file for speed against llama.cpp).
    Shape {
        name: "qwen3moe-16x1024",
        title: "Qwen3-MoE 16x1024",
        arch: "qwen3moe",
        n_layer: 12,
        n_embd: 1024,
        n_head: 16,
        n_kv_head: 8,
        head_dim: 128,
        ffn: 2048,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        context: 40_960,
        tied: true,
        qkv_bias: false,
        rope_scaling: None,
        own_vocab: SMOLLM2_VOCAB,
        experts: Some(Experts {
            count: 16,
            used: 2,
            ffn: 2048,
        }),
    },
];

impl Shape {
    /// Looks a shape up by name; the error lists the shapes.
    fn find(name: &str) -> Result<&'static Self> {
        SHAPES
            .iter()
            .find(|shape| shape.name == name)
            .with_context(|| format!("unknown shape `{name}`; shapes: {}", shape_names()))
    }

    /// The number of parameters with a vocabulary of `vocab` tokens (the
    /// tensors `make_model.py` writes).
    fn n_params(&self, vocab: usize) -> usize {
        let (d, q_dim, kv_dim) = (
            self.n_embd,
            self.n_head * self.head_dim,
            self.n_kv_head * self.head_dim,
        );
        let attention = d * q_dim * 2 + d * kv_dim * 2;
        let biases = if self.qkv_bias { q_dim + 2 * kv_dim } else { 0 };
        let ffn = match self.experts {
            // The router, the experts and the query and key norms.
            Some(e) => e.count * d + e.count * 3 * d * e.ffn + 2 * self.head_dim,
            None => 3 * d * self.ffn,
        };
        let layer = attention + biases + ffn + 2 * d;
        let outputs = if self.tied { 1 } else { 2 };
        let rope_freqs = self.rope_scaling.map_or(0, |_| self.head_dim / 2);
        self.n_layer * layer + outputs * vocab * d + d + rope_freqs
    }

    /// The shape as the JSON object `make_model.py --spec` reads.
    fn spec(&self) -> String {
        let rope_scaling = self.rope_scaling.map(|scaling| {
            json!({
                "factor": scaling.factor,
                "low_freq_factor": scaling.low_freq_factor,
                "high_freq_factor": scaling.high_freq_factor,
                "original_context": scaling.original_context,
            })
        });
        json!({
            "name": format!("{} shape (random weights, SmolLM2 vocabulary)", self.title),
            "arch": self.arch,
            "n_layer": self.n_layer,
            "n_embd": self.n_embd,
            "n_head": self.n_head,
            "n_kv_head": self.n_kv_head,
            "head_dim": self.head_dim,
            "ffn": self.ffn,
            "rope_base": self.rope_base,
            "rms_eps": self.rms_eps,
            "context": self.context,
            "tied": self.tied,
            "qkv_bias": self.qkv_bias,
            "rope_scaling": rope_scaling,
            "n_expert": self.experts.map_or(0, |e| e.count),
            "n_expert_used": self.experts.map_or(0, |e| e.used),
            "expert_ffn": self.experts.map_or(0, |e| e.ffn),
        })
        .to_string()
    }

    /// The file name of this shape in `ftype` (upper case, as llama.cpp
    /// names it): `llama-3.2-1b-shape-q4_k_m.gguf`.
    fn file_name(&self, ftype: &str) -> String {
        format!("{}-shape-{}.gguf", self.name, ftype.to_lowercase())
    }
}

/// The shape names, comma-separated.
fn shape_names() -> String {
    SHAPES
        .iter()
        .map(|shape| shape.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The usage text, with the shapes.
pub(crate) fn usage() -> String {
    let shapes: String = SHAPES
        .iter()
        .map(|shape| {
            format!(
                "\n  {:<15} {:<14} {:.2}B parameters here ({:.2}B with its own vocabulary)",
                shape.name,
                shape.title,
                shape.n_params(SMOLLM2_VOCAB) as f64 / 1e9,
                shape.n_params(shape.own_vocab) as f64 / 1e9,
            )
        })
        .collect();
    format!(
        "usage: cargo xtask make-model SHAPE [--type TYPE] [--keep-f16] [--python <interpreter>]\n\
         \n\
         Writes a random-weight GGUF file in a real model's shape into the models folder\n\
         ($LM_MODELS_DIR, default $HOME/.cache/lm/models) as SHAPE-shape-TYPE.gguf: an F16\n\
         file from scripts/reference/make_model.py, requantized by llama.cpp's\n\
         llama_model_quantize to TYPE (default {DEFAULT_TYPE}; any LLAMA_FTYPE_MOSTLY_* name:\n\
         Q4_K_M, Q4_0, Q8_0, ...). The vocabulary is SmolLM2's 49,152 tokens, not the\n\
         model's own: speed does not depend on what the weights mean, so these files\n\
         measure speed and conformance, never quality. A file already present is left\n\
         alone. --keep-f16 keeps the F16 intermediate (SHAPE-shape-f16.gguf) and reuses it.\n\
         \n\
         shapes:{shapes}"
    )
}

/// Command-line options.
#[derive(Debug)]
struct Options {
    shape: &'static Shape,
    /// The type, upper case (`Q4_K_M`).
    ftype: String,
    keep_f16: bool,
    /// An interpreter with llama-cpp-python and gguf (`--python`).
    python: Option<PathBuf>,
}

impl Options {
    /// Parses `SHAPE [--type TYPE] [--keep-f16] [--python <interpreter>]`.
    fn parse(args: &[String]) -> Result<Self> {
        let mut shape = None;
        let mut ftype = DEFAULT_TYPE.to_owned();
        let mut keep_f16 = false;
        let mut python = None;
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || {
                args.next()
                    .with_context(|| format!("option `{arg}` needs a value\n\n{}", usage()))
            };
            match arg.as_str() {
                "--type" => ftype = value()?.to_uppercase(),
                "--python" => python = Some(PathBuf::from(value()?)),
                "--keep-f16" => keep_f16 = true,
                flag if flag.starts_with('-') => {
                    bail!("unknown option `{flag}`\n\n{}", usage())
                }
                name if shape.is_none() => shape = Some(Shape::find(name)?),
                extra => bail!("unexpected argument `{extra}`\n\n{}", usage()),
            }
        }
        let Some(shape) = shape else {
            bail!("{}", usage());
        };
        Ok(Self {
            shape,
            ftype,
            keep_f16,
            python,
        })
    }
}

/// Runs the task.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let options = Options::parse(args)?;
    let shape = options.shape;
    let dir = models_dir()?;
    let destination = dir.join(shape.file_name(&options.ftype));
    if destination.is_file() {
        println!(
            "{} is already present; nothing to do (delete it to make it again)",
            destination.display()
        );
        return print_written(&destination);
    }
    let python = reference::reference_python(options.python.as_deref())?;
    check_type(&python, &options.ftype)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let kept_f16 = dir.join(shape.file_name("F16"));
    if options.ftype == "F16" {
        let f16 = write_f16(&python, shape, &dir)?;
        persist(f16, &destination)?;
    } else if kept_f16.is_file() {
        println!("using the kept F16 file {}", kept_f16.display());
        quantize(&python, &kept_f16, &options.ftype, &destination)?;
    } else {
        let f16 = write_f16(&python, shape, &dir)?;
        quantize(&python, f16.path(), &options.ftype, &destination)?;
        if options.keep_f16 {
            persist(f16, &kept_f16)?;
            println!("kept the F16 file {}", kept_f16.display());
        }
    }
    print_written(&destination)
}

/// Fails unless llama-cpp-python in `python` defines `LLAMA_FTYPE_MOSTLY_<ftype>`;
/// the error lists the types it does define.
fn check_type(python: &Path, ftype: &str) -> Result<()> {
    let output = Command::new(python)
        .args(["-c", LIST_TYPES_SCRIPT])
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !output.status.success() {
        bail!(
            "{} cannot list llama.cpp's types: {}",
            python.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let listed = String::from_utf8_lossy(&output.stdout);
    let types: Vec<&str> = listed.lines().collect();
    if !types.contains(&ftype) {
        bail!(
            "unknown type `{ftype}`; llama_model_quantize accepts: {}",
            types.join(", ")
        );
    }
    Ok(())
}

/// Writes `shape`'s F16 file to a temporary file in `dir` with SmolLM2's
/// tokenizer (fetched first if needed).
fn write_f16(python: &Path, shape: &Shape, dir: &Path) -> Result<NamedTempFile> {
    let tokenizer =
        fetch_model::ensure_model(fetch_model::find_known(TOKENIZER_MODEL)?, Some(python))?;
    let partial = partial_file(dir)?;
    let status = Command::new(python)
        .arg(project_root().join(WRITER_SCRIPT))
        .arg("--spec")
        .arg(shape.spec())
        .arg("--tokenizer-from")
        .arg(&tokenizer)
        .arg("--out")
        .arg(partial.path())
        .status()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !status.success() {
        bail!(
            "{WRITER_SCRIPT} could not write the {} shape ({status})",
            shape.name
        );
    }
    Ok(partial)
}

/// Requantizes `source` to `ftype` with llama.cpp (`fetch-model`'s script)
/// and renames the result to `destination`.
fn quantize(python: &Path, source: &Path, ftype: &str, destination: &Path) -> Result<()> {
    let dir = destination
        .parent()
        .context("the destination has no folder")?;
    let partial = partial_file(dir)?;
    println!("quantizing to {ftype} with llama.cpp");
    let status = fetch_model::llama_quantize(python, source, partial.path(), ftype)?;
    if !status.success() {
        bail!(
            "llama.cpp could not quantize {} to {ftype} ({status}); is there room in {}?",
            source.display(),
            dir.display()
        );
    }
    persist(partial, destination)
}

/// A temporary file in `dir`, deleted unless persisted.
fn partial_file(dir: &Path) -> Result<NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))
}

/// Gives a finished temporary file the usual mode and renames it to `destination`.
fn persist(partial: NamedTempFile, destination: &Path) -> Result<()> {
    fetch_model::make_world_readable(partial.as_file())?;
    partial
        .persist(destination)
        .with_context(|| format!("cannot rename the new file to {}", destination.display()))?;
    Ok(())
}

/// Prints the model's path and size.
fn print_written(path: &Path) -> Result<()> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    let gb = size as f64 / 1e9;
    println!("{}: {size} bytes ({gb:.2} GB)", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn each_shape_with_its_own_vocabulary_has_the_published_parameter_count() {
        // The counts the models' safetensors hold (their model cards: 1.24B,
        // 1.54B, 3.21B, 8.03B), without rope_freqs, which the checkpoints
        // compute rather than store.
        let published = [
            ("llama-3.2-1b", 1_235_814_400),
            ("qwen-2.5-1.5b", 1_543_714_304),
            ("llama-3.2-3b", 3_212_749_824),
            ("llama-3.1-8b", 8_030_261_248),
        ];
        let dense = SHAPES.iter().filter(|shape| shape.experts.is_none());
        assert_eq!(dense.count(), published.len());
        for (name, count) in published {
            let shape = Shape::find(name).unwrap();
            let rope_freqs = shape.rope_scaling.map_or(0, |_| shape.head_dim / 2);
            assert_eq!(
                shape.n_params(shape.own_vocab) - rope_freqs,
                count,
                "{name}"
            );
        }
    }

    #[test]
    fn the_1b_shape_with_smollm2_vocabulary_is_smaller_by_the_embedding_rows() {
        let shape = Shape::find("llama-3.2-1b").unwrap();
        let removed = (128_256 - SMOLLM2_VOCAB) * 2048;
        assert_eq!(
            shape.n_params(128_256) - shape.n_params(SMOLLM2_VOCAB),
            removed
        );
        assert_eq!(shape.n_params(SMOLLM2_VOCAB), 1_235_814_400 + 32 - removed);
    }

    #[test]
    fn the_moe_shape_has_sixteen_1b_class_experts_and_its_parameter_count() {
        let shape = Shape::find("qwen3moe-16x1024").unwrap();
        let experts = shape.experts.unwrap();
        assert_eq!((experts.count, experts.used, experts.ffn), (16, 2, 2048));
        // Per layer: q and o 1024 x 2048, k and v 1024 x 1024 (6,291,456),
        // router 16 x 1024 (16,384), experts 16 x 3 x 1024 x 2048
        // (100,663,296), QK norms 2 x 128, two norms of 1024: 106,973,440.
        // Twelve layers, the tied embedding 49,152 x 1024, the output norm.
        let expected = 12 * 106_973_440 + 49_152 * 1024 + 1024;
        assert_eq!(shape.n_params(SMOLLM2_VOCAB), expected);
        assert_eq!(expected, 1_334_013_952);
        let spec: serde_json::Value = serde_json::from_str(&shape.spec()).unwrap();
        assert_eq!(spec["arch"], "qwen3moe");
        assert_eq!(
            (
                &spec["n_expert"],
                &spec["n_expert_used"],
                &spec["expert_ffn"]
            ),
            (&json!(16), &json!(2), &json!(2048))
        );
    }

    #[test]
    fn file_names_are_lower_case_with_the_shape_and_type() {
        let shape = Shape::find("llama-3.2-1b").unwrap();
        assert_eq!(shape.file_name("Q4_K_M"), "llama-3.2-1b-shape-q4_k_m.gguf");
        assert_eq!(shape.file_name("F16"), "llama-3.2-1b-shape-f16.gguf");
    }

    #[test]
    fn an_unknown_shape_lists_the_shapes() {
        let message = Options::parse(&args(&["gpt-5"])).unwrap_err().to_string();
        assert_eq!(
            message,
            "unknown shape `gpt-5`; shapes: llama-3.2-1b, qwen-2.5-1.5b, llama-3.2-3b, llama-3.1-8b, \
             qwen3moe-16x1024"
        );
    }

    #[test]
    fn options_take_a_shape_a_type_in_any_case_and_flags() {
        let options =
            Options::parse(&args(&["qwen-2.5-1.5b", "--type", "q8_0", "--keep-f16"])).unwrap();
        assert_eq!(options.shape.name, "qwen-2.5-1.5b");
        assert_eq!(options.ftype, "Q8_0");
        assert!(options.keep_f16);
        let options = Options::parse(&args(&["llama-3.2-3b"])).unwrap();
        assert_eq!(options.ftype, "Q4_K_M");
        assert!(!options.keep_f16 && options.python.is_none());
        for bad in [
            &["--type", "Q4_0"][..],
            &["llama-3.2-1b", "--type"],
            &["llama-3.2-1b", "--fast"],
        ] {
            let message = Options::parse(&args(bad)).unwrap_err().to_string();
            assert!(
                message.contains("usage: cargo xtask make-model"),
                "{message}"
            );
        }
    }

    #[test]
    fn the_script_reads_every_key_of_the_spec() {
        let spec: serde_json::Value =
            serde_json::from_str(&Shape::find("qwen-2.5-1.5b").unwrap().spec()).unwrap();
        assert_eq!(spec["arch"], "qwen2");
        assert_eq!(spec["n_layer"], 28);
        assert_eq!(spec["head_dim"], 128);
        assert_eq!(spec["qkv_bias"], true);
        assert_eq!(spec["rope_base"], 1_000_000.0);
        assert!(spec["rope_scaling"].is_null());
        let spec: serde_json::Value =
            serde_json::from_str(&Shape::find("llama-3.2-1b").unwrap().spec()).unwrap();
        assert_eq!(spec["rope_scaling"]["factor"], 32.0);
        assert_eq!(spec["rope_scaling"]["original_context"], 8192);
        let script = std::fs::read_to_string(project_root().join(WRITER_SCRIPT)).unwrap();
        for key in spec.as_object().unwrap().keys() {
            assert!(script.contains(&format!("\"{key}\"")), "{key}");
        }
    }

    #[test]
    fn every_shape_divides_into_k_quant_blocks() {
        // llama.cpp's K-quants need rows of a multiple of 256 weights; the
        // heads must split the width evenly.
        for shape in SHAPES {
            assert_eq!(shape.n_embd % 256, 0, "{}", shape.name);
            assert_eq!(shape.ffn % 256, 0, "{}", shape.name);
            assert_eq!(shape.n_head % shape.n_kv_head, 0, "{}", shape.name);
            assert_eq!(shape.n_head * shape.head_dim % 256, 0, "{}", shape.name);
        }
    }
}
