//! A human-readable overview of a GGUF file, for `lm-cli` and debugging.

use std::fmt;

use super::GgufFile;
use crate::quant::SUPPORTED_TYPES;

/// Arrays show this many elements in a summary.
const SUMMARY_MAX_ITEMS: usize = 8;

/// Strings show this many characters in a summary.
const SUMMARY_MAX_CHARS: usize = 60;

/// Displays a [`GgufFile`]: one `key = value` line per metadata pair (arrays
/// cut to 8 items, strings to 60 characters) and the tensor count per type.
///
/// ```text
/// gguf v3, 33 metadata pairs, 272 tensors, alignment 32
/// general.architecture = "llama"
/// tokenizer.ggml.tokens = ["<|endoftext|>", ..., ... (49152 items)]
/// tensors: 61 f32, 210 q4_1, 1 q8_0
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Summary<'a> {
    file: &'a GgufFile,
}

impl<'a> Summary<'a> {
    pub(crate) fn new(file: &'a GgufFile) -> Summary<'a> {
        Summary { file }
    }
}

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file;
        writeln!(
            f,
            "gguf v{}, {} metadata pairs, {} tensors, alignment {}",
            file.version(),
            file.metadata().len(),
            file.tensors().len(),
            file.alignment()
        )?;
        for (key, value) in file.metadata() {
            write!(f, "{key} = ")?;
            value.write_shortened(f, Some(SUMMARY_MAX_ITEMS), Some(SUMMARY_MAX_CHARS))?;
            writeln!(f)?;
        }
        let counts: Vec<String> = SUPPORTED_TYPES
            .iter()
            .filter_map(|&ty| {
                let n = file.tensors().iter().filter(|t| t.ggml_type == ty).count();
                (n > 0).then(|| format!("{n} {ty}"))
            })
            .collect();
        write!(f, "tensors: {}", counts.join(", "))
    }
}
