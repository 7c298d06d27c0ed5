//! Hostile Hugging Face directories: each gets a one-line `HfError` naming
//! the file and the field or tensor, never a panic, and no allocation sized
//! by a header (a header claiming 2^64 bytes is refused before anything is
//! read). The directories are `fixtures/hf/qwen2` (F32, tied),
//! `fixtures/hf/qwen3` (two shards) and, for the fields and tensors of the
//! other classes, `phi3`, `gemma2`, `olmo2`, `mixtral`, `qwen3moe`,
//! `olmoe`, `qwen2moe`, `dots1` and `gpt_oss`, copied to a temporary directory and broken one
//! way each.

use std::fs;
use std::path::{Path, PathBuf};

use lm_model::{HfError, open_hf_dir};
use serde_json::json;

use crate::common::fixture_path;

/// A copy of `fixtures/hf/{name}` in a fresh temporary directory.
fn copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join(name);
    fs::create_dir(&dir).unwrap();
    for entry in fs::read_dir(fixture_path("hf").join(name)).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (temp, dir)
}

/// The error of opening `dir`, as one line with its sources.
fn error(dir: &Path) -> (HfError, String) {
    let error = open_hf_dir(dir).expect_err("a hostile directory must not load");
    let line = lm_core::error_chain(&error);
    assert!(!line.contains('\n'), "one line: {line}");
    (error, line)
}

/// Asserts the error names every one of `parts`.
fn assert_names(dir: &Path, parts: &[&str]) -> HfError {
    let (error, line) = error(dir);
    for part in parts {
        assert!(line.contains(part), "{line:?} should name {part:?}");
    }
    error
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    fs::write(path, serde_json::to_string(&value).unwrap()).unwrap();
}

/// A safetensors file: the header's length, the header, the data.
fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn the_fixtures_load() {
    for name in [
        "llama",
        "qwen2",
        "qwen3",
        "gemma3",
        "qwen2-bf16",
        "mistral",
        "gemma2",
        "phi3",
        "olmo2",
        "mixtral",
        "qwen3moe",
        "olmoe",
        "qwen2moe",
        "dots1",
        "gpt_oss",
    ] {
        open_hf_dir(fixture_path("hf").join(name)).unwrap();
    }
}

#[test]
fn config_json_missing_or_malformed() {
    let (_temp, dir) = copy("qwen2");
    fs::remove_file(dir.join("config.json")).unwrap();
    assert!(matches!(
        assert_names(&dir, &["config.json"]),
        HfError::Io { .. }
    ));
    fs::write(dir.join("config.json"), "{\"architectures\": [").unwrap();
    assert!(matches!(
        assert_names(&dir, &["config.json", "line 1"]),
        HfError::Json { .. }
    ));
    fs::write(dir.join("config.json"), "[1, 2]").unwrap();
    assert_names(&dir, &["config.json", "not a JSON object"]);
}

#[test]
fn unknown_or_absent_architecture() {
    let (_temp, dir) = copy("qwen2");
    let config = dir.join("config.json");
    edit_json(&config, |c| {
        c["architectures"] = json!(["MambaForCausalLM"])
    });
    let error = assert_names(
        &dir,
        &[
            "config.json",
            "architectures",
            "MambaForCausalLM",
            "Qwen2ForCausalLM",
        ],
    );
    assert!(matches!(error, HfError::UnsupportedArchitecture { .. }));
    edit_json(&config, |c| c["architectures"] = json!("Qwen2ForCausalLM"));
    assert_names(&dir, &["config.json", "architectures", "list of strings"]);
    edit_json(&config, |c| {
        c.as_object_mut().unwrap().remove("architectures");
    });
    assert_names(&dir, &["config.json", "`architectures` is missing"]);
}

#[test]
fn config_fields_missing_or_of_the_wrong_kind() {
    let (_temp, dir) = copy("qwen2");
    let config = dir.join("config.json");
    let original = fs::read_to_string(&config).unwrap();
    edit_json(&config, |c| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    assert_names(&dir, &["config.json", "`hidden_size` is missing"]);
    for (field, value, says) in [
        ("num_hidden_layers", json!(-2), "expected a count"),
        ("num_hidden_layers", json!(1e30), "expected a count"),
        ("rms_norm_eps", json!("small"), "expected a number"),
        ("num_attention_heads", json!(0), "head count of 0"),
        ("num_attention_heads", json!(5), "does not divide"),
        ("tie_word_embeddings", json!("yes"), "true or false"),
        (
            "rope_scaling",
            json!({"rope_type": "dynamic", "factor": 4.0}),
            "\"dynamic\" is not supported",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "linear"}),
            "rope_scaling.factor",
        ),
    ] {
        fs::write(&config, &original).unwrap();
        edit_json(&config, |c| c[field] = value);
        assert_names(&dir, &["config.json", field, says]);
    }
}

#[test]
fn a_wrong_hidden_size_is_a_shape_error_naming_the_tensor() {
    let (_temp, dir) = copy("qwen2");
    edit_json(&dir.join("config.json"), |c| {
        c["intermediate_size"] = json!(128)
    });
    let error = assert_names(
        &dir,
        &[
            "model.safetensors",
            "mlp.down_proj.weight",
            "[64, 96]",
            "[64, 128]",
        ],
    );
    assert!(matches!(error, HfError::Tensor { .. }));
}

#[test]
fn shards_missing_misplaced_or_outside_the_directory() {
    let (_temp, dir) = copy("qwen3");
    let index = dir.join("model.safetensors.index.json");
    let original = fs::read_to_string(&index).unwrap();
    fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let error = assert_names(
        &dir,
        &[
            "model.safetensors.index.json",
            "model-00002-of-00002.safetensors",
            "missing",
        ],
    );
    assert!(matches!(error, HfError::Index { .. }));

    let (_temp2, dir) = copy("qwen3");
    let index = dir.join("model.safetensors.index.json");
    edit_json(&index, |i| {
        i["weight_map"]["model.norm.weight"] = json!("model-00002-of-00002.safetensors");
        i["weight_map"]["model.embed_tokens.weight"] = json!("model-00002-of-00002.safetensors");
    });
    assert_names(
        &dir,
        &["model.safetensors.index.json", "weight_map", "model."],
    );
    fs::write(&index, &original).unwrap();
    edit_json(&index, |i| {
        i["weight_map"]["model.norm.weight"] = json!("../config.json")
    });
    assert_names(
        &dir,
        &[
            "model.safetensors.index.json",
            "\"../config.json\" is not a file name",
        ],
    );
    fs::write(&index, &original).unwrap();
    edit_json(&index, |i| {
        i["weight_map"]["model.layers.7.mlp.up_proj.weight"] =
            json!("model-00001-of-00002.safetensors")
    });
    assert_names(
        &dir,
        &[
            "model.safetensors.index.json",
            "model.layers.7.mlp.up_proj.weight",
        ],
    );
    fs::write(&index, "{\"metadata\": {}}").unwrap();
    assert_names(&dir, &["model.safetensors.index.json", "weight_map"]);
}

#[test]
fn safetensors_headers_that_lie() {
    let (_temp, dir) = copy("qwen2");
    let path = dir.join("model.safetensors");
    let norm = |offsets: &str, shape: &str| {
        format!(
            "{{\"model.norm.weight\":{{\"dtype\":\"F32\",\"shape\":{shape},\"data_offsets\":{offsets}}}}}"
        )
    };
    let two = |first: &str, second: &str| {
        format!(
            "{{\"model.norm.weight\":{{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":{first}}},\
             \"model.embed_tokens.weight\":{{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":{second}}}}}"
        )
    };
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    let mut beyond = (1u64 << 20).to_le_bytes().to_vec();
    beyond.extend_from_slice(b"{}");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (huge, "header"),
        (beyond, "header"),
        ((99_000_000u64).to_le_bytes().to_vec(), "header"),
        (vec![1, 2, 3], "header"),
        (Vec::new(), "header"),
        (safetensors("not json", &[]), "header"),
        (safetensors(&norm("[0, 256]", "[64]"), &[0; 100]), "header"),
        (
            safetensors(&norm("[0, 1000000000]", "[64]"), &[0; 256]),
            "header",
        ),
        (
            safetensors(
                &norm("[0, 256]", "[1000000000000, 1000000000000]"),
                &[0; 256],
            ),
            "header",
        ),
        (
            safetensors(&two("[0, 256]", "[128, 384]"), &[0; 384]),
            "model.",
        ),
        (
            safetensors(&two("[0, 256]", "[0, 256]"), &[0; 512]),
            "model.",
        ),
        (safetensors(&norm("[0, 256]", "[64]"), &[0; 300]), "header"),
    ];
    for (bytes, names) in cases {
        fs::write(&path, &bytes).unwrap();
        let error = assert_names(&dir, &["model.safetensors", names]);
        assert!(matches!(error, HfError::Safetensors { .. }), "{error:?}");
    }
}

#[test]
fn tensors_of_the_wrong_dtype_name_or_shape() {
    let (_temp, dir) = copy("qwen2");
    let path = dir.join("model.safetensors");
    let one = |name: &str, dtype: &str, shape: &str, n: usize| {
        safetensors(
            &format!(
                "{{\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape},\"data_offsets\":[0,{n}]}}}}"
            ),
            &vec![0; n],
        )
    };
    for (bytes, says) in [
        (one("model.norm.weight", "I32", "[64]", 256), "dtype I32"),
        (one("model.norm.weight", "F64", "[64]", 512), "dtype F64"),
        (one("model.norm.weight", "F32", "[63]", 252), "shape [63]"),
        (
            one("model.norm.weight", "F32", "[64, 1]", 256),
            "shape [64, 1]",
        ),
        (
            one(
                "model.layers.2.mlp.up_proj.weight",
                "F32",
                "[96, 64]",
                24576,
            ),
            "layer 2 of a model of 2 layers",
        ),
        (
            one(
                "model.layers.01.mlp.up_proj.weight",
                "F32",
                "[96, 64]",
                24576,
            ),
            "model.layers.01",
        ),
        (
            one(
                "model.layers.0.mlp.experts.weight",
                "F32",
                "[96, 64]",
                24576,
            ),
            "not a tensor of Qwen2ForCausalLM",
        ),
        (
            one("vision_tower.weight", "F32", "[4]", 16),
            "not a tensor of Qwen2ForCausalLM",
        ),
        (
            one("model.norm.weight", "F32", "[64]", 256),
            "model.embed_tokens.weight`: missing",
        ),
    ] {
        fs::write(&path, &bytes).unwrap();
        let error = assert_names(&dir, &[says]);
        assert!(matches!(error, HfError::Tensor { .. }), "{error:?}");
    }
    // Untied, with no lm_head.weight.
    let (_temp2, dir) = copy("qwen2");
    edit_json(&dir.join("config.json"), |c| {
        c["tie_word_embeddings"] = json!(false)
    });
    assert_names(&dir, &["lm_head.weight", "missing"]);
}

/// A NaN or an infinity in a matrix used from the map (checked by reading
/// the file) or in a norm made F32 (checked in its copy) names the tensor.
#[test]
fn non_finite_values_name_the_tensor() {
    for (tensor, value, says) in [
        ("model.layers.1.mlp.up_proj.weight", f32::NAN, "NaN"),
        (
            "model.layers.0.self_attn.q_proj.weight",
            f32::INFINITY,
            "inf",
        ),
        ("model.norm.weight", f32::NEG_INFINITY, "inf"),
    ] {
        let (_temp, dir) = copy("qwen2");
        let path = dir.join("model.safetensors");
        let mut bytes = fs::read(&path).unwrap();
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
        let start = header[tensor]["data_offsets"][0].as_u64().unwrap() as usize;
        // The third value of the tensor.
        let at = 8 + header_len + start + 8;
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        fs::write(&path, &bytes).unwrap();
        assert_names(&dir, &[tensor, says]);
    }
}

/// `dir/model.safetensors` with its header edited (the data kept; offsets
/// are relative to it, so renaming a tensor moves nothing).
fn edit_header(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    edit(header.as_object_mut().unwrap());
    let mut text = serde_json::to_string(&header).unwrap();
    text.push_str(&" ".repeat((8 - text.len() % 8) % 8));
    fs::write(&path, safetensors(&text, &bytes[8 + header_len..])).unwrap();
}

/// Renames tensor `from` to `to` in `dir/model.safetensors`.
fn rename_tensor(dir: &Path, from: &str, to: &str) {
    edit_header(dir, |header| {
        let entry = header.remove(from).unwrap();
        header.insert(to.to_owned(), entry);
    });
}

/// A layer's experts are stacked from one matrix each: one missing, one
/// beyond the count, or one of another dtype is named by its HF name.
#[test]
fn experts_missing_beyond_the_count_or_of_another_dtype() {
    let expert = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
    let (_temp, dir) = copy("mixtral");
    // Out of the way under a name the loader skips (RoPE's inv_freq).
    rename_tensor(&dir, expert, "model.layers.1.self_attn.rotary_emb.inv_freq");
    let error = assert_names(&dir, &[expert, "missing"]);
    assert!(matches!(error, HfError::Tensor { .. }), "{error:?}");
    let (_temp, dir) = copy("mixtral");
    let beyond = "model.layers.1.block_sparse_moe.experts.8.w2.weight";
    rename_tensor(&dir, expert, beyond);
    assert_names(&dir, &[beyond, "expert 8 of 8"]);
    // Expert 5's first half read as F16 (the second half under a name
    // the loader skips, so that the offsets still tile the data).
    let (_temp, dir) = copy("qwen3moe");
    let gate = "model.layers.0.mlp.experts.5.gate_proj.weight";
    edit_header(&dir, |header| {
        let entry = header.get_mut(gate).unwrap();
        let [start, end] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().unwrap());
        let middle = start + (end - start) / 2;
        entry["dtype"] = json!("F16");
        entry["data_offsets"] = json!([start, middle]);
        header.insert(
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            json!({"dtype": "U8", "shape": [end - middle], "data_offsets": [middle, end]}),
        );
    });
    assert_names(&dir, &[gate, "dtype F16", "other experts F32"]);
}

/// config.json fields of the other classes that the GGUF path cannot
/// follow: each refused naming the field.
#[test]
fn fields_the_gguf_architecture_cannot_follow() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &[&str]); 17] = [
        (
            "gemma2",
            |c| c["rope_parameters"] = json!({"full_attention": 10000.0}),
            &["rope_parameters.full_attention", "expected an object"],
        ),
        (
            "gemma2",
            |c| c["query_pre_attn_scalar"] = json!(16),
            &[
                "query_pre_attn_scalar",
                "16, where the GGUF architecture scales queries by 1/sqrt(32)",
            ],
        ),
        (
            "phi3",
            |c| c["rope_scaling"]["type"] = json!("dynamic"),
            &[
                "rope_scaling.rope_type",
                "\"dynamic\" is not supported for Phi3ForCausalLM",
            ],
        ),
        (
            "phi3",
            |c| c["rope_scaling"]["long_factor"] = json!([1.0, 2.0]),
            &["rope_scaling.long_factor", "expected 8 numbers"],
        ),
        (
            "phi3",
            |c| {
                c["rope_scaling"]
                    .as_object_mut()
                    .unwrap()
                    .remove("short_factor");
            },
            &["`rope_scaling.short_factor` is missing"],
        ),
        (
            "phi3",
            |c| c["rope_scaling"]["short_factor"][3] = json!(-1.0),
            &["rope_scaling.short_factor", "not finite and positive"],
        ),
        (
            "phi3",
            |c| c["partial_rotary_factor"] = json!(1.5),
            &[
                "partial_rotary_factor",
                "1.5 gives a rotated width of 24 of a head of 16",
            ],
        ),
        (
            "gemma2",
            |c| c["attn_logit_softcapping"] = json!(null),
            &[
                "attn_logit_softcapping",
                "null, where the GGUF architecture needs a value",
            ],
        ),
        (
            "olmo2",
            |c| c["layer_types"] = json!(["sliding_attention", "full_attention"]),
            &["layer_types", "expected 4 of"],
        ),
        (
            "qwen3moe",
            |c| c["norm_topk_prob"] = json!(false),
            &[
                "norm_topk_prob",
                "false is not supported for Qwen3MoeForCausalLM",
            ],
        ),
        (
            "qwen3moe",
            |c| {
                c.as_object_mut().unwrap().remove("norm_topk_prob");
            },
            &["norm_topk_prob", "absent (default Bool(false))"],
        ),
        (
            "qwen2moe",
            |c| c["mlp_only_layers"] = json!([1]),
            &[
                "mlp_only_layers",
                "every layer must be a mixture of experts",
            ],
        ),
        (
            "qwen2moe",
            |c| c["decoder_sparse_step"] = json!(2),
            &[
                "decoder_sparse_step",
                "every layer must be a mixture of experts",
            ],
        ),
        (
            "olmoe",
            |c| c["num_experts_per_tok"] = json!(9),
            &["num_experts_per_tok", "must be 1 to the 8 experts"],
        ),
        (
            "dots1",
            |c| c["scoring_func"] = json!("softmax"),
            &[
                "scoring_func",
                "\"softmax\" is not supported for Dots1ForCausalLM",
            ],
        ),
        (
            "dots1",
            |c| c["norm_topk_prob"] = json!(1),
            &["norm_topk_prob", "expected true or false"],
        ),
        (
            "olmoe",
            |c| c["clip_qkv"] = json!(8.0),
            &["clip_qkv", "does not clip"],
        ),
    ];
    for (name, edit, parts) in cases {
        let (_temp, dir) = copy(name);
        edit_json(&dir.join("config.json"), edit);
        let error = assert_names(&dir, &[&["config.json"], parts].concat());
        assert!(
            matches!(
                error,
                HfError::BadField { .. } | HfError::MissingField { .. }
            ),
            "{name}: {error:?}"
        );
    }
}

/// Phi-4 mini rotates part of each head: `partial_rotary_factor` becomes
/// `rope.dimension_count` (`int(f * hidden_size) / heads`, as the converter
/// writes it) and the LongRoPE factors are one per rotated pair.
#[test]
fn a_partial_rotary_factor_sets_the_rotated_width() {
    let (_temp, dir) = copy("phi3");
    edit_json(&dir.join("config.json"), |c| {
        c["partial_rotary_factor"] = json!(0.5);
        for key in ["long_factor", "short_factor"] {
            c["rope_scaling"][key].as_array_mut().unwrap().truncate(4);
        }
    });
    let file = open_hf_dir(&dir).unwrap();
    assert_eq!(file.get_u32("phi3.rope.dimension_count").unwrap(), 8);
    let long = file.tensor("rope_factors_long.weight").unwrap();
    assert_eq!(long.info.dims, [4]);
    // The GGUF path builds it (a rotary width it could not take is an error).
    lm_model::Llama::from_file(file).unwrap();
    // Eight factors for four rotated pairs are refused.
    let (_temp, dir) = copy("phi3");
    edit_json(&dir.join("config.json"), |c| {
        c["partial_rotary_factor"] = json!(0.5)
    });
    assert_names(&dir, &["rope_scaling.long_factor", "expected 4 numbers"]);
}

/// gpt-oss's MXFP4 experts (`*_blocks` and `*_scales`, U8): blocks without
/// their scales, scales of the wrong shape, an odd count of gate/up rows,
/// a dtype other than U8 and experts not in MXFP4 are each named by tensor
/// and file.
#[test]
fn gpt_oss_mxfp4_experts_that_do_not_fit() {
    let prefix = "model.layers.1.mlp.experts.";
    let blocks = format!("{prefix}gate_up_proj_blocks");
    let scales = format!("{prefix}gate_up_proj_scales");
    // Blocks without scales: the scales out of the way under a skipped name.
    let (_temp, dir) = copy("gpt_oss");
    rename_tensor(
        &dir,
        &scales,
        "model.layers.1.self_attn.rotary_emb.inv_freq",
    );
    let error = assert_names(&dir, &[&scales, "missing"]);
    assert!(matches!(error, HfError::Tensor { .. }), "{error:?}");
    // Scales of the wrong shape (the same bytes).
    let (_temp, dir) = copy("gpt_oss");
    edit_header(&dir, |header| {
        header.get_mut(&scales).unwrap()["shape"] = json!([8, 128, 1]);
    });
    assert_names(
        &dir,
        &[
            "model.safetensors",
            &scales,
            "shape [8, 128, 1]",
            "[8, 64, 2]",
        ],
    );
    // 63 gate/up rows: the blocks cut short, the rest under a skipped name.
    let (_temp, dir) = copy("gpt_oss");
    edit_header(&dir, |header| {
        let entry = header.get_mut(&blocks).unwrap();
        let [start, end] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().unwrap());
        let cut = start + 8 * 63 * 2 * 16;
        entry["shape"] = json!([8, 63, 2, 16]);
        entry["data_offsets"] = json!([start, cut]);
        header.insert(
            "model.layers.1.self_attn.rotary_emb.inv_freq".into(),
            json!({"dtype": "U8", "shape": [end - cut], "data_offsets": [cut, end]}),
        );
    });
    assert_names(&dir, &[&blocks, "shape [8, 63, 2, 16]", "[8, 64, 2, 16]"]);
    // Another dtype of the same size, for the blocks and for the scales.
    for name in [&blocks, &scales] {
        let (_temp, dir) = copy("gpt_oss");
        edit_header(&dir, |header| {
            header.get_mut(name.as_str()).unwrap()["dtype"] = json!("I8");
        });
        let error = assert_names(&dir, &["model.safetensors", name, "dtype I8", "U8"]);
        assert!(matches!(error, HfError::Tensor { .. }), "{error:?}");
    }
    // A dequantized checkpoint's experts (no `_blocks`) are refused by name.
    let (_temp, dir) = copy("gpt_oss");
    let dense = format!("{prefix}gate_up_proj");
    rename_tensor(&dir, &blocks, &dense);
    assert_names(&dir, &[&dense, "not in MXFP4"]);
    // The biases are floats: U8 ones are refused too.
    let (_temp, dir) = copy("gpt_oss");
    let bias = format!("{prefix}down_proj_bias");
    edit_header(&dir, |header| {
        let entry = header.get_mut(&bias).unwrap();
        entry["dtype"] = json!("U8");
        entry["shape"] = json!([8, 256]);
    });
    assert_names(&dir, &[&bias, "shape [8, 256]"]);
}

/// gpt-oss's config.json: what the GGUF path computes with is checked
/// (`swiglu_limit`, `attention_bias`, YaRN's bounds, a `rope_scaling` the
/// class would default to YaRN), and YaRN maps to GGUF's keys.
#[test]
fn gpt_oss_config_fields() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(Edit, &[&str]); 6] = [
        (
            |c| c["swiglu_limit"] = json!(10.0),
            &["swiglu_limit", "10.0"],
        ),
        (
            |c| c["attention_bias"] = json!(false),
            &["attention_bias", "false"],
        ),
        (
            |c| {
                c.as_object_mut().unwrap().remove("rope_scaling");
            },
            &["rope_scaling", "missing"],
        ),
        (
            |c| c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0}),
            &["rope_scaling.beta_fast", "16"],
        ),
        (
            |c| c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "mscale": 0.7}),
            &["rope_scaling.mscale", "not supported"],
        ),
        (
            |c| c["hidden_size"] = json!(48),
            &["hidden_size", "blocks of 32"],
        ),
    ];
    for (edit, says) in cases {
        let (_temp, dir) = copy("gpt_oss");
        edit_json(&dir.join("config.json"), edit);
        let error = assert_names(&dir, says);
        assert!(
            matches!(
                error,
                HfError::BadField { .. } | HfError::MissingField { .. }
            ),
            "{error:?}"
        );
    }
    let (_temp, dir) = copy("gpt_oss");
    edit_json(&dir.join("config.json"), |c| {
        c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 64});
    });
    let file = open_hf_dir(&dir).unwrap();
    assert_eq!(file.get_str("gpt-oss.rope.scaling.type").unwrap(), "yarn");
    assert_eq!(file.get_f32("gpt-oss.rope.scaling.factor").unwrap(), 4.0);
    assert_eq!(
        file.get_u32("gpt-oss.rope.scaling.original_context_length")
            .unwrap(),
        64
    );
    lm_model::Llama::from_file(file).unwrap();
}
