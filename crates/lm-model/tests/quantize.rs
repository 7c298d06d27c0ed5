//! `GgmlType::quantize_row` against llama.cpp's quantizer, byte for byte:
//! fixtures/quantize/ holds three small F16 llama GGUFs (seeded random rows
//! with outliers, all-zero rows, a constant row, ties of the largest
//! magnitude; the second with rows of 256, the third with 16 layers of
//! them) and `llama_model_quantize`'s Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
//! Q3_K_S/M/L, Q4_K_S, Q5_K_S, Q6_K, IQ4_NL and IQ4_XS files of them
//! (scripts/reference/quantize_reference.py). Each quantized tensor of those
//! files is requantized here from the same f32 rows and compared block by
//! block. Q2_K, Q3_K, IQ4_NL and IQ4_XS are checked, on f32 rows of varied
//! data (fixtures/quantize/rows.*, scripts/reference/quantize_rows_reference.py),
//! against ggml's own `ggml_quantize_chunk`, with the round-trip RMSE that
//! gguf-py's dequantizer measures on ggml's blocks.

use lm_model::{GgmlType, GgufFile, QMatrix};

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
    // embedding and attn_q in the q6_k file, its output in the five others,
    // the mix input's output in its six files; Q2_K, Q3_K, IQ4_NL and
    // IQ4_XS mostly from the mix input's 16 layers).
    let counts: Vec<(&str, i32)> = n_compared.into_iter().collect();
    assert_eq!(
        counts,
        [
            ("f32", 33),
            ("iq4_nl", 96),
            ("iq4_xs", 97),
            ("q2_K", 67),
            ("q3_K", 275),
            ("q4_0", 11),
            ("q4_1", 7),
            ("q4_K", 63),
            ("q5_0", 8),
            ("q5_1", 8),
            ("q5_K", 89),
            ("q6_K", 14),
            ("q8_0", 13)
        ]
    );
}

/// Q2_K, Q3_K, IQ4_NL and IQ4_XS on 33 rows of 512 f32 values of 16 kinds (normal, outliers,
/// all of one sign, heavy tails, huge, tiny, below and near ggml's
/// GROUP_MAX_EPS, few levels, ties, one value, zero and rescaled groups,
/// constant): the blocks are ggml's byte for byte, and dequantized by this
/// crate they give the RMSE, row by row, that gguf-py measured on ggml's.
#[test]
fn rows_equal_ggml_and_round_trip_alike() {
    let reference = read_json(&fixture_path("quantize/rows.json"));
    let (n_rows, n_cols) = (
        reference["n_rows"].as_u64().unwrap() as usize,
        reference["n_cols"].as_u64().unwrap() as usize,
    );
    let rows: Vec<f32> = std::fs::read(fixture_path("quantize/rows.f32le.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(rows.len(), n_rows * n_cols);
    let kinds = reference["kinds"].as_array().unwrap();
    let types = [
        ("q2_K", GgmlType::Q2_K),
        ("q3_K", GgmlType::Q3_K),
        ("iq4_nl", GgmlType::IQ4_NL),
        ("iq4_xs", GgmlType::IQ4_XS),
    ];
    assert_eq!(reference["types"].as_object().unwrap().len(), types.len());
    for (name, ty) in types {
        let expected = &reference["types"][name];
        let theirs = std::fs::read(fixture_path(&format!(
            "quantize/{}",
            expected["file"].as_str().unwrap()
        )))
        .unwrap();
        let row_bytes = ty.row_bytes(n_cols).unwrap();
        let mut ours = vec![0u8; row_bytes * n_rows];
        for (x, dst) in rows
            .chunks_exact(n_cols)
            .zip(ours.chunks_exact_mut(row_bytes))
        {
            ty.quantize_row(x, dst).unwrap();
        }
        for (idx, (a, b)) in ours
            .chunks_exact(row_bytes)
            .zip(theirs.chunks_exact(row_bytes))
            .enumerate()
        {
            assert!(
                a == b,
                "{name}: row {idx} ({}) differs from ggml's",
                kinds[idx]
            );
        }
        assert_eq!(ours.len(), theirs.len());
        let matrix = QMatrix::new(ty, n_rows, n_cols, &ours).unwrap();
        let mut back = vec![0f32; n_cols];
        let mut total = 0.0f64;
        for (idx, x) in rows.chunks_exact(n_cols).enumerate() {
            matrix.dequantize_row(idx, &mut back).unwrap();
            let sum: f64 = x
                .iter()
                .zip(&back)
                .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                .sum();
            total += sum;
            let rmse = (sum / n_cols as f64).sqrt();
            let theirs = expected["row_rmse"][idx].as_f64().unwrap();
            assert!(
                (rmse - theirs).abs() <= 1e-9 * theirs,
                "{name}: row {idx} ({}) rmse {rmse}, ggml's {theirs}",
                kinds[idx]
            );
        }
        let rmse = (total / rows.len() as f64).sqrt();
        let theirs = expected["rmse"].as_f64().unwrap();
        assert!(
            (rmse - theirs).abs() <= 1e-9 * theirs,
            "{name}: {rmse} vs {theirs}"
        );
        eprintln!(
            "{name}: {n_rows} rows byte for byte; rmse {rmse:.6e} (ggml's by gguf-py {theirs:.6e})"
        );
    }
}
