//! lm-tokenize's integration tests, one binary with a module per concern, on
//! plain data and committed fixtures (SmolLM2's tokenizer from the real file
//! is tested in the `lm` crate, which loads GGUF).

mod bpe_vocab;
mod chat_template;
mod common;
mod spm_vocab;
mod tokenizer_json;
