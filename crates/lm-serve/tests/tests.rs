//! lm-serve's integration tests, one module per file, linked into one
//! binary: a real server on a loopback port, driven over HTTP. The toy
//! decoder needs no download; the SmolLM2 tests are ignored without it.

mod common;

mod api;
mod batching;
mod echo;
mod embeddings;
mod fuzz;
mod guided_gbnf;
mod hostile;
mod multi_model;
mod openai_client;
mod persist;
mod reasoning;
mod response_format;
mod samplers;
mod smollm2;
mod speculative;
mod tool_calls;
mod trace;
mod webui;
