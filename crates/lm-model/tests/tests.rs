//! lm-model's integration tests, one module per file, linked into one binary
//! (nineteen binaries each linked the crate and its dependencies). Run one
//! file's tests with `cargo test -p lm-model --test tests MODULE::`.

mod common;

mod arch_conformance;
mod arch_errors;
mod moe_errors;
mod moe_memory;
mod moe_panels;

mod gguf_parse;
mod gguf_real_model;
mod hf_hostile;
mod hostile_alloc;
mod hostile_fuzz_regressions;
mod hostile_gguf;
mod hostile_ngram;
mod kquant_kernels;
mod llama;
mod llama_conformance;
mod llama_gguf;
mod multi_sequence;
mod ngram_arpa;
mod ngram_counts;
mod ngram_embedded;
mod ngram_example;
mod ngram_generate;
mod ngram_kneser_ney;
mod ngram_score;
mod quant_kernels;
mod quantize;
mod state_file;
mod toy;
mod transformer;
