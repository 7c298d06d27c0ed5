//! lm-cli's integration tests: one binary that runs the built `lm-cli`,
//! with a module per concern. Tests on the real SmolLM2 and Gemma 3 files are
//! `#[ignore]`d with the command that fetches it; `cargo test --
//! --include-ignored` runs them (CI does).

mod chat;
mod chat_session;
mod cluster;
mod common;
mod embed;
mod errors;
mod flags;
mod gemma3;
mod generate;
mod hf_dir;
mod hostile_inputs;
mod interrupt;
mod kernel_paths;
mod kv_type;
mod mmap;
mod output_files;
mod probs;
mod quantize;
mod readme;
mod run_behaviour;
mod score;
mod serve;
mod serve_draft;
mod serve_models;
mod smollm2;
mod structured;
mod toy_reference;
