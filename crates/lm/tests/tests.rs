//! The `lm` crate's integration tests, one binary with a module per concern:
//! the loader on the tiny GGUF fixture and on hostile files, and on the real
//! SmolLM2 file and Gemma 3's tokenizer (`#[ignore]`d with the command that
//! fetches it; `cargo test -- --include-ignored` runs them, as CI does), and
//! the conformance with llama.cpp of every real model file we test with,
//! and the one-call API (`facade`, `facade_modes`).

mod common;
mod conformance;
mod dry;
mod facade;
mod facade_modes;
mod gemma3_tokenizer;
mod hf;
mod kv_q8_0;
mod loader;
mod smollm2;
mod smollm2_hf;
mod smollm2_tokenizer;
mod structured;
