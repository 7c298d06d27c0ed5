//! `GgmlType::quantize_row` against llama.cpp's quantizer, byte for byte:
//! fixtures/quantize/ holds a small F16 llama GGUF (seeded random rows with
//! outliers, an all-zero row, a constant row, ties of the largest magnitude)
//! and `llama_model_quantize`'s Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 files of it
//! (scripts/reference/quantize_reference.py). Each quantized tensor of those
//! files is requantized here from the same f32 rows and compared block by
//! block.

use lm_model::{GgmlType, GgufFile};

use crate::common::{fixture_path, read_json};

/// The five llama.cpp outputs the fixture script writes.
const TYPES: [(&str, GgmlType); 5] = [
    ("q8_0", GgmlType::Q8_0),
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
    ("q5_0", GgmlType::Q5_0),
    ("q5_1", GgmlType::Q5_1),
];

/// Quantizes `input`'s tensor `name` to `ty`, row by row.
fn quantize_tensor(input: &GgufFile, name: &str, ty: GgmlType) -> Vec<u8> {
    let matrix = input.tensor(name).unwrap().matrix().unwrap();
    let row_bytes = ty.row_bytes(matrix.n_cols()).unwrap();
    let mut out = vec![0u8; row_bytes * matrix.n_rows()];
    let mut row = vec![0f32; matrix.n_cols()];
    for (idx, dst) in out.chunks_exact_mut(row_bytes).enumerate() {
        matrix.dequantize_row(idx, &mut row).unwrap();
        ty.quantize_row(&row, dst).unwrap();
    }
    out
}

#[test]
fn blocks_equal_llama_quantize() {
    let input = GgufFile::map(fixture_path("quantize/input.f16.gguf")).unwrap();
    let manifest = read_json(&fixture_path("quantize/manifest.json"));
    let mut n_compared = 0;
    for (name, file_type) in TYPES {
        let output = GgufFile::map(fixture_path(&format!("quantize/{name}.gguf"))).unwrap();
        let types = &manifest["outputs"][name]["tensor_types"];
        assert_eq!(output.tensors().len(), input.tensors().len(), "{name}");
        for info in output.tensors() {
            assert_eq!(
                types[&info.name].as_str().unwrap(),
                info.ggml_type.name().to_uppercase(),
                "{name}: {}",
                info.name
            );
            let theirs = output.tensor(&info.name).unwrap().data;
            let ours = quantize_tensor(&input, &info.name, info.ggml_type);
            let block = info.ggml_type.block_bytes();
            if let Some(idx) = (0..theirs.len() / block)
                .find(|&i| theirs[i * block..(i + 1) * block] != ours[i * block..(i + 1) * block])
            {
                panic!(
                    "{name} file, {} ({}): block {idx} differs\n llama.cpp {:?}\n ours      {:?}",
                    info.name,
                    info.ggml_type,
                    &theirs[idx * block..(idx + 1) * block],
                    &ours[idx * block..(idx + 1) * block],
                );
            }
            assert_eq!(theirs.len(), ours.len());
            if info.ggml_type == file_type {
                n_compared += 1;
            }
        }
    }
    // Eight weight matrices of the file's own type in each of the five files.
    assert_eq!(
        n_compared,
        5 * 7 + 1,
        "the q8_0 file's embedding is q8_0 too"
    );
}
