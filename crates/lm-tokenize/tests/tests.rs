//! lm-tokenize's integration tests, one binary with a module per concern.
//! Tests on the real SmolLM2 file are `#[ignore]`d with the command that
//! fetches it; `cargo test -- --include-ignored` runs them (CI does).

mod bpe_vocab;
mod chat_template;
mod common;
mod smollm2_conformance;
mod tokenizer_json;
