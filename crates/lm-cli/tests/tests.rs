//! lm-cli's integration tests: one binary that runs the built `lm-cli`,
//! with a module per concern. Tests on the real SmolLM2 file are
//! `#[ignore]`d with the command that fetches it; `cargo test --
//! --include-ignored` runs them (CI does).

mod common;
mod errors;
mod flags;
mod generate;
mod hostile_inputs;
mod interrupt;
mod probs;
mod readme;
mod score;
mod smollm2;
mod toy_reference;
