//! Shared by lm-model's integration tests: where the real model file is, and
//! typed reads of the JSON fixtures. Each read panics with the name of what
//! is missing, so a fixture that drifts from its reader fails with a clear
//! message.

// Each test binary uses a different subset of these reads.
#![allow(dead_code)]

use std::path::PathBuf;

use lm_core::TokenId;
use serde_json::{Map, Value};

/// The real model's file name in the models folder.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The SmolLM2 file under `$LM_MODELS_DIR` (default `$HOME/.cache/lm/models`),
/// or `None` after telling the reader that `test` is skipped and how to get
/// the file.
pub fn smollm2_path(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("LM_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/lm/models"))
        })
        .unwrap_or_default();
    let path = dir.join(SMOLLM2_FILE);
    if path.exists() {
        return Some(path);
    }
    eprintln!(
        "SKIPPED {test}: {} not found; run `cargo xtask fetch-model smollm2`",
        path.display()
    );
    None
}

/// Reads one JSON fixture file (keys keep their file order).
pub fn read_json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("{} is not JSON: {err}", path.display()))
}

/// Reads of a fixture value that panic on a missing key or a wrong type.
pub trait FixtureJson {
    /// The value under `key` (not null).
    fn field(&self, key: &str) -> &Value;
    /// The value under `key`, or `None` when it is absent or null.
    fn field_opt(&self, key: &str) -> Option<&Value>;
    /// An object's fields, in file order.
    fn object(&self) -> &Map<String, Value>;
    /// An array's items.
    fn array(&self) -> &[Value];
    /// A string.
    fn str(&self) -> &str;
    /// A boolean.
    fn bool(&self) -> bool;
    /// Any number, as f64.
    fn f64(&self) -> f64;
    /// A non-negative integer.
    fn u64(&self) -> u64;
    /// An integer.
    fn i64(&self) -> i64;
    /// An array of numbers, as f32.
    fn f32s(&self) -> Vec<f32>;
    /// An array of token ids.
    fn ids(&self) -> Vec<TokenId>;
}

impl FixtureJson for Value {
    fn field(&self, key: &str) -> &Value {
        self.field_opt(key)
            .unwrap_or_else(|| panic!("fixture has no key {key:?}"))
    }
    fn field_opt(&self, key: &str) -> Option<&Value> {
        self.get(key).filter(|v| !v.is_null())
    }
    fn object(&self) -> &Map<String, Value> {
        self.as_object()
            .unwrap_or_else(|| panic!("not an object: {self}"))
    }
    fn array(&self) -> &[Value] {
        self.as_array()
            .unwrap_or_else(|| panic!("not an array: {self}"))
    }
    fn str(&self) -> &str {
        self.as_str()
            .unwrap_or_else(|| panic!("not a string: {self}"))
    }
    fn bool(&self) -> bool {
        self.as_bool()
            .unwrap_or_else(|| panic!("not a bool: {self}"))
    }
    fn f64(&self) -> f64 {
        self.as_f64()
            .unwrap_or_else(|| panic!("not a number: {self}"))
    }
    fn u64(&self) -> u64 {
        self.as_u64()
            .unwrap_or_else(|| panic!("not an unsigned integer: {self}"))
    }
    fn i64(&self) -> i64 {
        self.as_i64()
            .unwrap_or_else(|| panic!("not an integer: {self}"))
    }
    fn f32s(&self) -> Vec<f32> {
        self.array().iter().map(|v| v.f64() as f32).collect()
    }
    fn ids(&self) -> Vec<TokenId> {
        self.array()
            .iter()
            .map(|v| TokenId::try_from(v.u64()).expect("token id fits u32"))
            .collect()
    }
}
