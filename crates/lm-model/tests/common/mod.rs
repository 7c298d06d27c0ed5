//! Shared by lm-model's integration tests: where the fixtures and the real
//! model file are, logits from a fresh state, greedy decoding by hand, how
//! far two sets of logits are apart, which quantized kernels this CPU runs,
//! typed reads of the JSON fixtures (each panics with the name of what is
//! missing, so a fixture that drifts from its reader fails with a clear
//! message), and a GGUF writer for files built in memory.

pub mod gguf_writer;

use std::path::{Path, PathBuf};

use lm_core::{LanguageModel, Rows, TokenId, argmax, softmax};
use lm_model::Kernel;
use serde_json::{Map, Value};

/// `fixtures/RELATIVE` at the workspace root.
pub fn fixture_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(relative)
}

/// The SmolLM2 file from the models folder. Panics with the catalog's
/// message, which names `cargo xtask fetch-model smollm2`, when the file is
/// missing: the tests that call this are `#[ignore]`d with that reason, so
/// without the model they show as ignored, and run with `--include-ignored`
/// they fail instead of passing unchecked.
pub fn smollm2_path() -> PathBuf {
    lm_model::catalog::SMOLLM2
        .path()
        .unwrap_or_else(|err| panic!("{err}"))
}

/// The logits `model` gives for `tokens` from a fresh state.
pub fn fresh_logits<M: LanguageModel + ?Sized>(
    model: &M,
    tokens: &[TokenId],
    rows: Rows,
) -> Vec<f32> {
    let mut logits = Vec::new();
    model
        .forward(&mut model.new_state(), tokens, rows, &mut logits)
        .unwrap();
    logits
}

/// Greedy decoding by hand: `n_steps` times the most likely token, each fed
/// back alone (the cached way). Returns the tokens and their probabilities.
pub fn greedy_by_hand<M: LanguageModel + ?Sized>(
    model: &M,
    prefix: &[TokenId],
    n_steps: usize,
) -> (Vec<TokenId>, Vec<f32>) {
    let mut state = model.new_state();
    let mut logits = Vec::new();
    let (mut tokens, mut probs) = (Vec::new(), Vec::new());
    let mut input = prefix.to_vec();
    for _ in 0..n_steps {
        model
            .forward(&mut state, &input, Rows::Last, &mut logits)
            .unwrap();
        let token = argmax(&logits).unwrap();
        tokens.push(token);
        probs.push(softmax(&logits, 1.0).unwrap()[token as usize]);
        input = vec![token];
    }
    (tokens, probs)
}

/// The largest absolute difference between two logit vectors of one length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "logit vectors of different lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Whether this CPU has what lm-model's AVX2 kernel needs (AVX2, FMA and
/// F16C), detected here apart from lm-model's own check.
pub fn cpu_has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has what lm-model's AVX-512 kernel needs (the AVX2
/// kernel's features and AVX-512 F, BW, VL and VNNI), and what its AVX-VNNI
/// kernel needs (the AVX2 kernel's features and AVX-VNNI), detected here
/// apart from lm-model's own check.
fn cpu_has_avx512_and_avxvnni() -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
        (cpu_has_avx2() && avx512, cpu_has_avx2() && has!("avxvnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (false, false)
    }
}

/// The kernels this CPU runs, slowest first: the portable one always, and
/// each SIMD kernel whose features the CPU has. Asserts that lm-model agrees
/// with the features detected here, so a wrong availability check fails
/// instead of quietly leaving a SIMD path untested; says on stderr which
/// paths the CPU lacks.
pub fn kernels_of_this_cpu() -> Vec<Kernel> {
    let has_avx2 = cpu_has_avx2();
    let (has_avx512, has_avxvnni) = cpu_has_avx512_and_avxvnni();
    let expected = [
        (Kernel::Portable, true),
        (Kernel::Avx2, has_avx2),
        (Kernel::AvxVnni, has_avxvnni),
        (Kernel::Avx512, has_avx512),
    ];
    let mut kernels = Vec::new();
    for (kernel, available) in expected {
        assert_eq!(
            kernel.is_available(),
            available,
            "lm-model's check for the {kernel} kernel disagrees with the CPU's features"
        );
        if available {
            kernels.push(kernel);
        } else {
            eprintln!("this cpu cannot run the {kernel} kernel: it is not checked");
        }
    }
    assert_eq!(kernels, Kernel::available());
    kernels
}

/// The SIMD kernels this CPU runs (all but the portable one).
pub fn simd_kernels_of_this_cpu() -> Vec<Kernel> {
    let mut kernels = kernels_of_this_cpu();
    kernels.retain(|&k| k != Kernel::Portable);
    kernels
}

/// Reads one JSON fixture file (keys keep their file order).
pub fn read_json(path: &Path) -> Value {
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
        typed(self.as_object(), "an object", self)
    }
    fn array(&self) -> &[Value] {
        typed(self.as_array().map(Vec::as_slice), "an array", self)
    }
    fn str(&self) -> &str {
        typed(self.as_str(), "a string", self)
    }
    fn bool(&self) -> bool {
        typed(self.as_bool(), "a bool", self)
    }
    fn f64(&self) -> f64 {
        typed(self.as_f64(), "a number", self)
    }
    fn u64(&self) -> u64 {
        typed(self.as_u64(), "an unsigned integer", self)
    }
    fn i64(&self) -> i64 {
        typed(self.as_i64(), "an integer", self)
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

/// `value` read as `what`, or a panic that shows the value.
fn typed<T>(value: Option<T>, what: &str, json: &Value) -> T {
    value.unwrap_or_else(|| panic!("not {what}: {json}"))
}
