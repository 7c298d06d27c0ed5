//! lm-decode's integration tests, one binary with a module per topic (it links
//! the crate once instead of once per file).

mod batch;
mod common;
mod constraint;
mod examples;
mod generate;
mod prefill;
mod prefix_cache;
mod properties;
mod sampler;
mod sampler_cutoffs;
mod sampler_mirostat;
mod sampler_reference;
mod score;
mod search;
mod speculative;
mod stop_search;
