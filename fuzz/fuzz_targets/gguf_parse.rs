//! Fuzz target: `GgufFile::from_bytes` on arbitrary bytes; for a file that
//! parses, every metadata value is read through every typed getter, every
//! tensor is viewed, validated (NaN scales), shaped as a matrix, dequantized
//! and multiplied, one input and a batch of three.
//!
//! A crash is a bug: the reader must turn every malformed file into a
//! `GgufError` and never allocate more than a small multiple of the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lm_model::{GgufFile, MetadataValue};

/// Tensors with more elements than this are shaped but not dequantized, so
/// one iteration stays fast (the input is at most a few KB anyway).
const MAX_DEQUANTIZED_ELEMENTS: usize = 1 << 16;

fuzz_target!(|bytes: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(bytes.to_vec()) else {
        return;
    };
    let _ = format!("{file:?} {}", file.summary());
    let _ = file.validate_tensor_data().map_err(|e| e.to_string());
    for (key, value) in file.metadata() {
        walk(value);
        let _ = file.get_u32(key);
        let _ = file.get_u64(key);
        let _ = file.get_i32(key);
        let _ = file.get_f32(key);
        let _ = file.get_str(key);
        let _ = file.get_bool(key);
        let _ = file.get_string_array(key);
        let _ = file.get_i32_array(key);
        let _ = file.get_f32_array(key);
    }
    for info in file.tensors() {
        let _ = info.to_string();
        let Ok(view) = file.tensor(&info.name) else {
            panic!("listed tensor {:?} cannot be viewed", info.name);
        };
        assert_eq!(view.data.len(), info.n_bytes);
        let _ = info.ggml_type.validate(view.data).map_err(|e| e.to_string());
        let Ok(matrix) = view.matrix() else {
            continue;
        };
        // A tensor with no rows may have any row length: bound each side,
        // not only the (possibly zero) product.
        let n_elements = matrix.n_rows().saturating_mul(matrix.n_cols());
        let largest_side = matrix.n_rows().max(matrix.n_cols());
        if n_elements > MAX_DEQUANTIZED_ELEMENTS || largest_side > MAX_DEQUANTIZED_ELEMENTS {
            continue;
        }
        let values = matrix.to_f32_vec();
        assert_eq!(values.len(), n_elements);
        let x = vec![0.5f32; matrix.n_cols()];
        let mut y = vec![0.0f32; matrix.n_rows()];
        let _ = matrix.matvec(&x, &mut y);
        let _ = matrix.matvec_exact(&x, &mut y);
        let xs = vec![0.25f32; 3 * matrix.n_cols()];
        let mut ys = vec![0.0f32; 3 * matrix.n_rows()];
        let _ = matrix.matmul(&xs, 3, &mut ys);
        let mut row = vec![0.0f32; matrix.n_cols()];
        let _ = matrix.dequantize_row(0, &mut row);
        let _ = matrix.dequantize_row(matrix.n_rows(), &mut row);
    }
});

/// Visits every nested value, formatting each one.
fn walk(value: &MetadataValue) {
    let _ = (value.type_name(), value.type_id(), value.as_integer());
    let _ = (value.as_float(), value.as_str(), value.to_string());
    if let Some(items) = value.as_array() {
        items.iter().for_each(walk);
    }
}
