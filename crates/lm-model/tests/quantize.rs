//! `GgmlType::quantize_row` against llama.cpp's quantizer, byte for byte:
//! fixtures/quantize/ holds two small F16 llama GGUFs (seeded random rows
//! with outliers, all-zero rows, a constant row, ties of the largest
//! magnitude; the second with rows of 256) and `llama_model_quantize`'s
//! Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K_S, Q5_K_S and Q6_K files of them
//! (scripts/reference/quantize_reference.py). Each quantized tensor of those
//! files is requantized here from the same f32 rows and compared block by
//! block.

use lm_model::{GgmlType, GgufFile};

use crate::common::{fixture_path, read_json};

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
    let manifest = read_json(&fixture_path("quantize/manifest.json"));
    let mut n_compared = std::collections::BTreeMap::new();
    for (name, output) in manifest["outputs"].as_object().unwrap() {
        let input = output["input"].as_str().unwrap_or("input.f16.gguf");
        let input = GgufFile::map(fixture_path(&format!("quantize/{input}"))).unwrap();
        let file = output["file"].as_str().unwrap();
        let output_file = GgufFile::map(fixture_path(&format!("quantize/{file}"))).unwrap();
        let types = &output["tensor_types"];
        assert_eq!(output_file.tensors().len(), input.tensors().len(), "{name}");
        for info in output_file.tensors() {
            assert_eq!(
                types[&info.name].as_str().unwrap(),
                info.ggml_type.name().to_uppercase(),
                "{name}: {}",
                info.name
            );
            let theirs = output_file.tensor(&info.name).unwrap().data;
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
            *n_compared.entry(info.ggml_type.name()).or_insert(0) += 1;
        }
    }
    // Every type, each in several tensors (Q6_K: the K input's output,
    // embedding and attn_q in the q6_k file, its output in the three others).
    let counts: Vec<(&str, i32)> = n_compared.into_iter().collect();
    assert_eq!(
        counts,
        [
            ("f32", 23),
            ("q4_0", 10),
            ("q4_1", 7),
            ("q4_K", 2),
            ("q5_0", 8),
            ("q5_1", 8),
            ("q5_K", 2),
            ("q6_K", 6),
            ("q8_0", 13)
        ]
    );
}
