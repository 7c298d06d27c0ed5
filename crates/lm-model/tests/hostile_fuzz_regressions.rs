//! Every input the fuzzer (`fuzz/`, see docs/reliability.md) found crashing,
//! committed under `fixtures/hostile/fuzz/` and replayed here: first the
//! fuzz target's own walk over the file (nothing may panic), then what each
//! one pins.

use std::path::PathBuf;

use lm_model::GgmlType;
use lm_model::{GgufFile, MetadataValue};

use crate::common::fixture_path;

fn fuzz_dir() -> PathBuf {
    fixture_path("hostile/fuzz")
}

fn open(name: &str) -> GgufFile {
    let bytes = std::fs::read(fuzz_dir().join(name)).unwrap();
    GgufFile::from_bytes(bytes).unwrap()
}

/// What `fuzz/fuzz_targets/gguf_parse.rs` does with a file that parses:
/// every getter on every key, the tensor data validated, every tensor
/// viewed, shaped and, when small on both sides, dequantized and multiplied.
fn walk(file: &GgufFile) {
    fn visit(value: &MetadataValue) {
        let _ = (value.type_name(), value.as_integer(), value.to_string());
        value.as_array().into_iter().flatten().for_each(visit);
    }
    let _ = file.summary().to_string();
    let _ = file.validate_tensor_data().map_err(|e| e.to_string());
    for (key, value) in file.metadata() {
        visit(value);
        let _ = (file.get_u32(key), file.get_u64(key), file.get_i32(key));
        let _ = (file.get_f32(key), file.get_str(key), file.get_bool(key));
        let _ = file.get_string_array(key);
        let _ = (file.get_i32_array(key), file.get_f32_array(key));
    }
    for info in file.tensors() {
        let view = file.tensor(&info.name).unwrap();
        assert_eq!(view.data.len(), info.n_bytes);
        let _ = info.ggml_type.validate(view.data);
        let Ok(matrix) = view.matrix() else { continue };
        if matrix.n_rows().max(matrix.n_cols()) > 1 << 16 {
            continue;
        }
        assert_eq!(matrix.to_f32_vec().len(), matrix.n_rows() * matrix.n_cols());
        let x = vec![0.5; matrix.n_cols()];
        let mut y = vec![0.0; matrix.n_rows()];
        matrix.matvec(&x, &mut y).unwrap();
    }
}

/// The fuzzer's seed of tensors (`fuzz/make_seeds.py`) holds one tensor of
/// every type the reader knows, so mutations start from each block layout,
/// and one Q5_0 tensor whose second scale is NaN, which validation names.
#[test]
fn the_tensor_seed_covers_every_supported_type() {
    let path = fixture_path("../fuzz/corpus/gguf_parse/seed-tensors");
    let file = GgufFile::from_bytes(std::fs::read(path).unwrap()).unwrap();
    walk(&file);
    for ty in lm_model::SUPPORTED_TYPES {
        assert!(
            file.tensors().iter().any(|t| t.ggml_type == ty),
            "the seed lacks a {ty} tensor; run `python3 fuzz/make_seeds.py`"
        );
    }
    assert_eq!(
        file.validate_tensor_data().unwrap_err().to_string(),
        "tensor \"q5_0_nan\": block 1 of q5_0 data has scale d = NaN"
    );
}

#[test]
fn every_fuzz_reproducer_is_read_without_a_panic() {
    let mut names: Vec<String> = std::fs::read_dir(fuzz_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".gguf"))
        .collect();
    names.sort();
    assert!(!names.is_empty());
    for name in names {
        let bytes = std::fs::read(fuzz_dir().join(&name)).unwrap();
        if let Ok(file) = GgufFile::from_bytes(bytes) {
            walk(&file);
        }
    }
}

/// Found by the fuzzer in its first minute: a zero-size tensor in a file
/// that ends before the (padded) start of the data section was listed by
/// `tensors()` but `tensor(name)` said it was missing (fixed in
/// `GgufFile::tensor`: an empty tensor borrows no bytes).
#[test]
fn an_empty_tensor_is_viewable_when_the_file_ends_before_the_data_section() {
    let file = open("gguf_parse-empty-tensor-data-section-past-end.gguf");
    assert_eq!(file.bytes().len(), 189);
    assert_eq!(file.data_offset(), 192);
    let info = &file.tensors()[0];
    assert_eq!((info.name.as_str(), info.dims.as_slice()), ("t", &[0][..]));
    let view = file.tensor("t").unwrap();
    assert!(view.data.is_empty());
    assert!(view.to_f32_vec().unwrap().is_empty());
}

/// Found by the fuzzer: a Q8_0 tensor with no rows and a row length near
/// 2^58 is valid (it holds no bytes). The fuzz target then allocated an
/// input vector of that length; the library itself must give a matrix of
/// zero rows whose dequantized form is empty, without allocating.
#[test]
fn a_tensor_with_no_rows_and_a_huge_row_length_holds_nothing() {
    let file = open("gguf_parse-zero-rows-huge-row-length.gguf");
    let info = file.tensors().iter().find(|t| t.name == "q8_0").unwrap();
    assert_eq!(info.ggml_type, GgmlType::Q8_0);
    assert_eq!(info.dims, [0x0400_0000_0000_f820, 0]);
    assert_eq!(info.n_bytes, 0);
    let matrix = file.tensor("q8_0").unwrap().matrix().unwrap();
    assert_eq!(
        (matrix.n_rows(), matrix.n_cols()),
        (0, 0x0400_0000_0000_f820)
    );
    assert!(matrix.to_f32_vec().is_empty());
    let mut y: Vec<f32> = Vec::new();
    // An input of the wrong length is an error, not a panic or an allocation.
    assert!(matrix.matvec(&[1.0; 32], &mut y).is_err());
}

/// Found by the fuzzer: a tensor whose first dimension is 0 holds no
/// elements and no bytes, so the overflow checks on those counts passed, but
/// its other dimensions multiply past u64 and `n_rows()` overflowed (a
/// panic with overflow checks). The row count is now checked too.
#[test]
fn a_tensor_with_no_elements_whose_row_count_overflows_is_refused() {
    let bytes =
        std::fs::read(fuzz_dir().join("gguf_parse-no-elements-but-rows-overflow.gguf")).unwrap();
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(
        matches!(
            &err,
            lm_model::GgufError::DimsOverflow { dims, .. }
                if dims == &[0, 0xffff_ffff_0000_0000, 0x10ff_ffff, 0xc5_0000_0000]
        ),
        "{err:?}"
    );
}
