//! The Python module `lm` (its native part, `lm._lm`): a thin PyO3 layer
//! over the facade `lm` and lm-decode, with no decoding logic of its own.
//!
//! ```text
//! lm.load(path) ──lm::load──> Model ─┬─ tokenize / detokenize      (the file's tokenizer)
//!                                    ├─ logits(ids) / score(text)  (one forward pass, numpy)
//!                                    ├─ generate / chat            (the facade's stream: lm-decode's loop on its own thread;
//!                                    │                              draft=, num_beams=, a list of prompts: the facade's
//!                                    │                              speculative loop, beam search, batch)
//!                                    └─ create_completion / create_chat_completion (llama-cpp-python's dicts)
//! ```
//!
//! Every Rust error becomes an `lm.LmError` subclass carrying its message
//! (`errors.rs`); the compute runs with the GIL released.

#![forbid(unsafe_code)]

mod errors;
mod model;
mod openai;
mod run;
mod settings;
mod tokenizer;

use pyo3::prelude::*;

/// Loads a GGUF file (or a Hugging Face model directory) as a `Model`.
///
/// `threads` sizes the worker pool of the model's matrix products (default:
/// all cores); the pool is process-wide, so it can be sized once. `mmap`
/// maps a GGUF file instead of copying it ([`lm::map_gguf`]; llama-cpp-python's
/// `use_mmap`): processes loading one file share its pages.
#[pyfunction]
#[pyo3(signature = (path, threads=None, mmap=false))]
fn load(
    py: Python<'_>,
    path: std::path::PathBuf,
    threads: Option<usize>,
    mmap: bool,
) -> PyResult<model::Model> {
    if let Some(threads) = threads {
        configure_threads(threads)?;
    }
    if mmap && path.is_dir() {
        return Err(errors::invalid(format!(
            "mmap=True maps a GGUF file; {} is a directory",
            path.display()
        )));
    }
    let loaded = py
        .detach(|| {
            if mmap {
                lm::map_gguf(&path)
            } else {
                lm::load(&path)
            }
        })
        .map_err(errors::from_lm)?;
    Ok(model::Model::new(loaded, path))
}

/// Sizes rayon's global pool; a second call with another size is refused
/// (the pool cannot change once started), the same size is accepted.
fn configure_threads(threads: usize) -> PyResult<()> {
    if threads == 0 {
        return Err(errors::invalid("threads must be at least 1"));
    }
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
    {
        Ok(()) => Ok(()),
        Err(_) if rayon::current_num_threads() == threads => Ok(()),
        Err(_) => Err(errors::invalid(format!(
            "threads={threads}: the worker pool already runs {} threads (it is sized once per process)",
            rayon::current_num_threads()
        ))),
    }
}

/// The native module; `python/lm/__init__.py` re-exports it as `lm`.
#[pymodule]
fn _lm(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(load, module)?)?;
    module.add_class::<model::Model>()?;
    module.add_class::<run::Completion>()?;
    module.add_class::<run::TextStream>()?;
    module.add_class::<openai::ChunkStream>()?;
    module.add_class::<tokenizer::Tokenizer>()?;
    errors::register(module)?;
    Ok(())
}
