//! The real SmolLM2-135M-Instruct Q4_1 file against values the Python `gguf`
//! package read from it (fixtures/gguf/smollm2_reference.json, written by
//! scripts/gguf/make_fixture.py). Ignored when the model is not fetched
//! (`cargo xtask fetch-model smollm2`).

use crate::common::{FixtureJson, fixture_path, kernels_of_this_cpu, read_json, smollm2_path};
use serde_json::Value;

use lm_model::{GgufFile, MetadataValue, QMatrix};

/// The model file, parsed.
fn model() -> GgufFile {
    GgufFile::open(smollm2_path()).unwrap()
}

fn fixture() -> Value {
    read_json(&fixture_path("gguf/smollm2_reference.json"))
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn header_and_architecture_metadata_match_smollm2_notes() {
    let file = model();
    assert_eq!(file.version(), 3);
    assert_eq!(file.tensors().len(), 272);
    assert_eq!(file.metadata().len(), 33);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(file.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(file.get_u32("llama.context_length").unwrap(), 8192);
    assert_eq!(file.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(file.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(file.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(file.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(file.get_u32("llama.rope.dimension_count").unwrap(), 64);
    assert_eq!(file.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        file.get_f32("llama.attention.layer_norm_rms_epsilon")
            .unwrap(),
        1e-5
    );
    assert_eq!(file.get_u32("llama.vocab_size").unwrap(), 49152);
    assert_eq!(file.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(file.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert!(!file.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert_eq!(file.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(file.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert_eq!(file.get_u32("tokenizer.ggml.unknown_token_id").unwrap(), 0);
    assert_eq!(file.get_u32("tokenizer.ggml.padding_token_id").unwrap(), 2);
    let tokens = file.get_string_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        &tokens[..3],
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    );
    assert_eq!(
        file.get_string_array("tokenizer.ggml.merges")
            .unwrap()
            .len(),
        48900
    );
    assert_eq!(
        file.get_i32_array("tokenizer.ggml.token_type")
            .unwrap()
            .len(),
        49152
    );
    assert!(
        file.get_str("tokenizer.chat_template")
            .unwrap()
            .contains("<|im_start|>")
    );
    assert!(
        file.tensor("output.weight").is_err(),
        "tied embeddings: no output.weight"
    );

    let summary = file.summary().to_string();
    assert!(summary.starts_with("gguf v3, 33 metadata pairs, 272 tensors, alignment 32\n"));
    assert!(summary.contains("\nllama.block_count = 30\n"));
    assert!(summary.contains(", ... (49152 items)]\n"));
    assert!(summary.ends_with("tensors: 61 f32, 210 q4_1, 1 q8_0"));
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn every_metadata_pair_matches_python_reader() {
    let file = model();
    let fixture = fixture();
    assert_eq!(file.bytes().len() as u64, fixture.field("file_size").u64());
    let expected = fixture.field("metadata").object();
    let keys: Vec<&str> = file.metadata().iter().map(|(k, _)| k.as_str()).collect();
    let expected_keys: Vec<&str> = expected.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, expected_keys);
    for (key, entry) in expected {
        let value = file.get(key).unwrap();
        assert_eq!(value.type_name(), entry.field("type").str(), "{key}");
        match value {
            MetadataValue::Array(items) => {
                assert_eq!(items.len() as u64, entry.field("len").u64(), "{key}");
                let first = entry.field("first").array();
                let last = entry.field("last").array();
                let tail = &items[items.len() - last.len()..];
                for (item, want) in items.iter().zip(first).chain(tail.iter().zip(last)) {
                    assert_eq!(item.type_name(), entry.field("element_type").str(), "{key}");
                    check_scalar(key, item, want);
                }
            }
            scalar => check_scalar(key, scalar, entry.field("value")),
        }
    }
}

fn check_scalar(key: &str, value: &MetadataValue, want: &Value) {
    match value {
        MetadataValue::String(s) => assert_eq!(s, want.str(), "{key}"),
        MetadataValue::Bool(b) => assert_eq!(*b, want.bool(), "{key}"),
        MetadataValue::F32(v) => assert_eq!(*v, want.f64() as f32, "{key}"),
        other => assert_eq!(other.as_integer().unwrap(), i128::from(want.i64()), "{key}"),
    }
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn every_tensor_info_matches_python_reader() {
    let file = model();
    let fixture = fixture();
    assert_eq!(
        file.data_offset() as u64,
        fixture.field("data_offset").u64()
    );
    let expected = fixture.field("tensors").array();
    assert_eq!(file.tensors().len(), expected.len());
    for (info, want) in file.tensors().iter().zip(expected) {
        assert_eq!(info.name, want.field("name").str());
        let dims: Vec<u64> = want.field("dims").array().iter().map(|v| v.u64()).collect();
        assert_eq!(
            info.dims.iter().map(|&d| d as u64).collect::<Vec<_>>(),
            dims,
            "{}",
            info.name
        );
        assert_eq!(
            info.ggml_type.name(),
            want.field("type").str(),
            "{}",
            info.name
        );
        assert_eq!(
            info.offset as u64,
            want.field("offset").u64(),
            "{}",
            info.name
        );
        assert_eq!(
            info.n_bytes as u64,
            want.field("n_bytes").u64(),
            "{}",
            info.name
        );
    }
    let count = |name: &str| {
        file.tensors()
            .iter()
            .filter(|t| t.ggml_type.name() == name)
            .count()
    };
    assert_eq!((count("q4_1"), count("q8_0"), count("f32")), (210, 1, 61));
    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.info.dims, [576, 49152]);
    assert_eq!(embd.data.len(), 49152 * 612);
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn dequantized_rows_match_python_dequantize_bit_for_bit() {
    for_each_fixture_tensor("rows", |want, name, matrix| {
        let row_idx = want.field("row").u64() as usize;
        let mut row = vec![0.0f32; matrix.n_cols()];
        matrix.dequantize_row(row_idx, &mut row).unwrap();
        let first = want.field("first_bits").array();
        for (j, (value, bits)) in row.iter().zip(first).enumerate() {
            assert_eq!(
                u64::from(value.to_bits()),
                bits.u64(),
                "{name} row {row_idx} col {j}"
            );
        }
        let sum: f64 = row.iter().map(|&v| f64::from(v)).sum();
        let magnitude: f64 = row.iter().map(|&v| f64::from(v).abs()).sum();
        let want_sum = want.field("sum").f64();
        assert!(
            (sum - want_sum).abs() <= 1e-12 * magnitude.max(1.0),
            "{name} row {row_idx}: {sum} vs {want_sum}"
        );
    });
}

/// Runs `check` on each entry of the fixture's list `key` with the name of
/// the real tensor the entry names and that tensor as a matrix.
fn for_each_fixture_tensor(key: &str, mut check: impl FnMut(&Value, &str, QMatrix<'_>)) {
    let file = model();
    for want in fixture().field(key).array() {
        let name = want.field("tensor").str();
        check(want, name, file.tensor(name).unwrap().matrix().unwrap());
    }
}

/// The fixture's input: `x[j] = ((37 j) mod 101 - 50) / 50`, exact in f32.
fn fixture_input(n: usize) -> Vec<f32> {
    (0..n)
        .map(|j| ((37 * j) % 101) as f32 - 50.0)
        .map(|v| v / 50.0)
        .collect()
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn matvec_on_real_weights_matches_numpy_reference() {
    for_each_fixture_tensor("matvec", |want, name, full| {
        let n_rows = want.field("rows").u64() as usize;
        let row_bytes = full.data().len() / full.n_rows();
        let head = QMatrix::new(
            full.ty(),
            n_rows,
            full.n_cols(),
            &full.data()[..n_rows * row_bytes],
        )
        .unwrap();
        let x = fixture_input(full.n_cols());
        let reference: Vec<f64> = want.field("y").array().iter().map(|v| v.f64()).collect();
        // Σ_j |W_rj x_j| per row, the scale the tolerances are relative to.
        let mut row = vec![0.0; full.n_cols()];
        let magnitude: Vec<f64> = (0..n_rows)
            .map(|r| {
                head.dequantize_row(r, &mut row).unwrap();
                row.iter()
                    .zip(&x)
                    .map(|(&w, &v)| (f64::from(w) * f64::from(v)).abs())
                    .sum()
            })
            .collect();
        let mut y = vec![0.0; n_rows];
        head.matvec_exact(&x, &mut y).unwrap();
        for r in 0..n_rows {
            assert!(
                (f64::from(y[r]) - reference[r]).abs() <= 1e-5 * magnitude[r],
                "{name} exact row {r}"
            );
        }
        for kernel in kernels_of_this_cpu() {
            head.with_kernel(kernel)
                .unwrap()
                .matvec(&x, &mut y)
                .unwrap();
            let worst = (0..n_rows)
                .map(|r| (f64::from(y[r]) - reference[r]).abs() / magnitude[r])
                .fold(0.0, f64::max);
            eprintln!("{name} {kernel:?}: quantized-activation error {worst:.2e} of sum |w x|");
            assert!(worst < 5e-3, "{name} {kernel:?}: {worst:e}");
        }
    });
}
