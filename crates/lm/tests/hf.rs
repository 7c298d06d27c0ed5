//! Hugging Face model directories (`fixtures/hf/`, written by
//! `scripts/reference/hf_checkpoint.py` from the GGUF files of
//! `fixtures/arch/`, undoing what llama.cpp's converter does) load through
//! `lm::load` and run as their GGUF twins do:
//!
//! - llama (F16, Llama 3 `rope_scaling`), qwen2 (F32, tied), qwen3 (F16,
//!   two shards through the index), gemma3 (F16, norms stored without
//!   their `+ 1`): every logit of the 40 ids of `fixtures/arch/manifest.json`
//!   equals the crate's own GGUF loader's on the twin (`fixtures/arch/`)
//!   to 1e-5 relative, and is within the conformance tolerance (1e-2) of
//!   llama.cpp's logits of the twin, committed with it;
//! - mistral, gemma2, phi3 (LongRoPE), olmo2 (as `Olmo3ForCausalLM`; as
//!   `Olmo2ForCausalLM` without its window, on the positions the window
//!   does not reach), mixtral, qwen3moe, olmoe, qwen2moe, dots1 (experts
//!   stacked at load), gpt-oss (MXFP4 experts repacked at load): likewise
//!   against `fixtures/arch/`;
//! - qwen2-bf16 (BF16): equal to the crate's loader on its BF16 GGUF twin,
//!   and within 1e-2 of llama.cpp's logits of that twin;
//! - `tokenizer.json` gives the `tokenizers` Python package's ids
//!   (`fixtures/hf/tokenize.json`), BOS added by its post-processor;
//! - the chat template (a string, or qwen3's list of named templates)
//!   renders as jinja2 renders it (`fixtures/hf/chat.json`);
//! - `generation_config.json`'s end ids and sampling defaults are read.

use std::path::PathBuf;

use lm::lm_core::{LanguageModel, Rows, TokenId};
use lm::lm_model::{Decoder, Llama};
use lm::lm_tokenize::Message;
use lm::{GgufModel, HfGeneration};

use crate::common::{fixture_json, fixture_path, read_f32le};
use crate::conformance::max_abs_difference;

/// llama.cpp's agreement with the crate on these models (see
/// `crates/lm-model/tests/arch_conformance.rs`).
const LLAMA_CPP_TOLERANCE: f32 = 1e-2;

/// With BF16 weights llama.cpp also rounds the activations to BF16 before
/// each product (ggml's `vec_dot_type` for BF16), where the crate keeps
/// them f32: measured 0.134 at most on qwen2-bf16 (logits of about 10).
const BF16_TOLERANCE: f32 = 0.2;

fn hf_dir(name: &str) -> PathBuf {
    fixture_path("hf").join(name)
}

fn ids() -> Vec<TokenId> {
    let json: serde_json::Value = fixture_json("arch/manifest.json");
    json["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as TokenId)
        .collect()
}

fn all_positions(model: &Decoder, ids: &[TokenId]) -> Vec<f32> {
    let mut logits = Vec::new();
    model
        .forward(&mut model.new_state(), ids, Rows::All, &mut logits)
        .unwrap();
    logits
}

fn load(name: &str) -> GgufModel {
    load_dir(&hf_dir(name))
}

fn load_dir(dir: &std::path::Path) -> GgufModel {
    lm::load(dir)
        .unwrap_or_else(|e| panic!("{}: {}", dir.display(), crate::common::error_chain(&e)))
}

/// The HF directory `name` against the GGUF twin at `twin` (the crate's
/// loader, to 1e-5 relative) and llama.cpp's logits of it (within
/// `tolerance`; where llama.cpp's top two are further apart than twice
/// that, the same argmax).
fn check(name: &str, twin: PathBuf, llama_cpp: PathBuf, tolerance: f32) {
    check_positions(&hf_dir(name), twin, llama_cpp, tolerance, ids().len());
}

/// [`check`] of the directory `dir` on the first `n_pos` of the ids.
fn check_positions(
    dir: &std::path::Path,
    twin: PathBuf,
    llama_cpp: PathBuf,
    tolerance: f32,
    n_pos: usize,
) {
    let name = dir.display().to_string();
    let ids = &ids()[..n_pos];
    let hf = all_positions(&load_dir(dir).decoder, ids);
    let gguf = all_positions(&Llama::from_gguf(&twin).unwrap(), ids);
    assert_eq!(hf.len(), gguf.len(), "{name}");
    for (i, (a, b)) in hf.iter().zip(&gguf).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "{name}: logit {i}: {a} from the directory, {b} from the twin"
        );
    }
    let mut theirs = read_f32le(&llama_cpp);
    theirs.truncate(hf.len());
    assert_eq!(theirs.len(), hf.len(), "{name}");
    let (_, largest) = max_abs_difference(&hf, &theirs);
    assert!(largest <= tolerance, "{name}: {largest} from llama.cpp");
    for (pos, (ours, theirs)) in hf
        .chunks_exact(512)
        .zip(theirs.chunks_exact(512))
        .enumerate()
    {
        let mut sorted = theirs.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 2.0 * tolerance {
            assert_eq!(argmax(ours), argmax(theirs), "{name}: position {pos}");
        }
    }
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap()
}

#[test]
fn llama_with_llama3_rope_scaling_runs_as_its_twin() {
    let arch = fixture_path("arch");
    check(
        "llama",
        arch.join("llama.gguf"),
        arch.join("llama.logits.f32le.bin"),
        LLAMA_CPP_TOLERANCE,
    );
}

#[test]
fn qwen2_f32_tied_runs_as_its_twin() {
    let arch = fixture_path("arch");
    check(
        "qwen2",
        arch.join("qwen2.gguf"),
        arch.join("qwen2.logits.f32le.bin"),
        LLAMA_CPP_TOLERANCE,
    );
}

#[test]
fn qwen3_sharded_runs_as_its_twin() {
    let arch = fixture_path("arch");
    check(
        "qwen3",
        arch.join("qwen3.gguf"),
        arch.join("qwen3.logits.f32le.bin"),
        LLAMA_CPP_TOLERANCE,
    );
}

#[test]
fn gemma3_runs_as_its_twin() {
    let arch = fixture_path("arch");
    check(
        "gemma3",
        arch.join("gemma3.gguf"),
        arch.join("gemma3.logits.f32le.bin"),
        LLAMA_CPP_TOLERANCE,
    );
}

/// The directories of the architectures beside the first four, each from
/// its `fixtures/arch` twin: Mistral (its window kept, unapplied as in
/// llama.cpp), Gemma 2 (soft-caps, sliding layers, norms without `+ 1`),
/// Phi-3 (fused `qkv_proj`, `gate_up_proj`; LongRoPE factors and attention
/// factor from `rope_scaling`), OLMo 3 (`Olmo3ForCausalLM`: OLMo 2 with the
/// twin's window on 3 of 4 layers), and the mixtures of experts, whose
/// per-expert matrices are stacked at load: Mixtral (`w1`/`w3`/`w2`, q/k
/// permuted), Qwen3-MoE, OLMoE (QK norms over the whole projection) and
/// Qwen2-MoE (shared expert and its gate) and dots.llm1 (a dense first
/// layer, sigmoid scores with the selection bias, two shared experts).
#[test]
fn the_architectures_beside_run_as_their_twins() {
    let arch = fixture_path("arch");
    for name in [
        "mistral", "gemma2", "phi3", "olmo2", "mixtral", "qwen3moe", "olmoe", "qwen2moe", "dots1",
    ] {
        check(
            name,
            arch.join(format!("{name}.gguf")),
            arch.join(format!("{name}.logits.f32le.bin")),
            LLAMA_CPP_TOLERANCE,
        );
    }
}

/// gpt-oss (`GptOssForCausalLM`): sinks, q/k/v/o biases, a router with a
/// bias, every other layer sliding (`layer_types`), and the experts in
/// OpenAI's MXFP4 layout (`gate_up_proj_{blocks,scales,bias}` with gate and
/// up rows interleaved, `down_proj_*`), repacked at load into the GGML
/// blocks of the twin: the same logits as the twin, and within llama.cpp's
/// tolerance of its logits.
#[test]
fn gpt_oss_with_mxfp4_experts_runs_as_its_twin() {
    let arch = fixture_path("arch");
    check(
        "gpt_oss",
        arch.join("gpt_oss.gguf"),
        arch.join("gpt_oss.logits.f32le.bin"),
        LLAMA_CPP_TOLERANCE,
    );
}

/// `Olmo2ForCausalLM` has no window: the OLMo 3 directory relabelled (and
/// its `sliding_window`, `layer_types` dropped) is the twin on the first 12
/// positions, where the window of 12 hides nothing, and differs after.
#[test]
fn olmo2_without_a_window_is_the_twin_until_the_window_bites() {
    let (_temp, dir) = copy("olmo2");
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["architectures"] = serde_json::json!(["Olmo2ForCausalLM"]);
    let map = config.as_object_mut().unwrap();
    map.remove("sliding_window");
    map.remove("layer_types");
    std::fs::write(&path, config.to_string()).unwrap();
    let arch = fixture_path("arch");
    let (twin, logits) = (arch.join("olmo2.gguf"), arch.join("olmo2.logits.f32le.bin"));
    check_positions(&dir, twin.clone(), logits, LLAMA_CPP_TOLERANCE, 12);
    let ids = ids();
    let ours = all_positions(&load_dir(&dir).decoder, &ids);
    let windowed = all_positions(&Llama::from_gguf(&twin).unwrap(), &ids);
    let (_, largest) = max_abs_difference(&ours[12 * 512..], &windowed[12 * 512..]);
    assert!(
        largest > 0.01,
        "global attention after position 12: {largest}"
    );
}

/// transformers 5 saves `rope_parameters` in place of `rope_theta` and
/// `rope_scaling` (and of Phi-3's `original_max_position_embeddings`, of
/// Gemma 3's `rope_local_base_freq`, as one object per attention type):
/// the directories rewritten so run as their twins (each would fail with
/// the defaults: llama's base and Llama 3 factors, phi3's short factors,
/// gemma3's base of 1e6).
#[test]
fn transformers_5_rope_parameters_read_as_the_older_fields() {
    use serde_json::{Value, json};
    type Edit = fn(&mut serde_json::Map<String, Value>);
    let cases: [(&str, Edit); 3] = [
        ("llama", |c| {
            let mut params = c.remove("rope_scaling").unwrap();
            params["rope_theta"] = c.remove("rope_theta").unwrap();
            c.insert("rope_parameters".into(), params);
        }),
        ("phi3", |c| {
            let mut params = c.remove("rope_scaling").unwrap();
            let kind = params.as_object_mut().unwrap().remove("type").unwrap();
            params["rope_type"] = kind;
            params["rope_theta"] = c.remove("rope_theta").unwrap();
            params["original_max_position_embeddings"] =
                c.remove("original_max_position_embeddings").unwrap();
            c.insert("rope_parameters".into(), params);
        }),
        ("gemma3", |c| {
            let full = c.remove("rope_theta").unwrap();
            let sliding = c.remove("rope_local_base_freq").unwrap();
            c.insert(
                "rope_parameters".into(),
                json!({
                    "full_attention": {"rope_type": "default", "rope_theta": full},
                    "sliding_attention": {"rope_type": "default", "rope_theta": sliding},
                }),
            );
        }),
    ];
    let arch = fixture_path("arch");
    for (name, edit) in cases {
        let (_temp, dir) = copy(name);
        let path = dir.join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(config.as_object_mut().unwrap());
        std::fs::write(&path, config.to_string()).unwrap();
        check_positions(
            &dir,
            arch.join(format!("{name}.gguf")),
            arch.join(format!("{name}.logits.f32le.bin")),
            LLAMA_CPP_TOLERANCE,
            ids().len(),
        );
    }
}

#[test]
fn qwen2_bf16_runs_as_its_twin() {
    let hf = fixture_path("hf");
    check(
        "qwen2-bf16",
        hf.join("qwen2-bf16.gguf"),
        hf.join("qwen2-bf16.logits.f32le.bin"),
        BF16_TOLERANCE,
    );
}

/// `lm::load` of a file is `load_gguf`'s (fixtures/arch's files have no
/// vocabulary, so both stop at the text side).
#[test]
fn load_takes_a_gguf_file_too() {
    let path = fixture_path("arch/qwen2.gguf");
    let ours = lm::load(&path).unwrap_err();
    let theirs = lm::load_gguf(&path).unwrap_err();
    assert!(matches!(ours, lm::Error::Text { .. }), "{ours:?}");
    assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
}

#[test]
fn tokenizer_json_gives_the_tokenizers_package_ids() {
    let json: serde_json::Value = fixture_json("hf/tokenize.json");
    let model = load("qwen2");
    let tokenizer = &model.text.tokenizer;
    let lines = json["lines"].as_array().unwrap();
    let expected = json["ids"].as_array().unwrap();
    assert_eq!(lines.len(), 31);
    for (line, ids) in lines.iter().zip(expected) {
        let line = line.as_str().unwrap();
        let ids: Vec<TokenId> = ids
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as TokenId)
            .collect();
        assert_eq!(tokenizer.encode(line).unwrap(), ids, "{line:?}");
        // Decoding without the special tokens gives the line back.
        let plain = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            .iter()
            .fold(line.to_owned(), |text, special| text.replace(special, ""));
        assert_eq!(tokenizer.decode_skipping_special(&ids).unwrap(), plain);
    }
    assert_eq!(tokenizer.bos_id(), Some(0));
    assert!(tokenizer.add_bos(), "the post-processor adds BOS");
    assert_eq!(tokenizer.eos_id(), Some(2));
}

#[test]
fn chat_templates_render_as_jinja2_does() {
    let json: serde_json::Value = fixture_json("hf/chat.json");
    let conversations: Vec<Vec<Message>> =
        serde_json::from_value(json["conversations"].clone()).unwrap();
    for (arch, rendered) in json["rendered"].as_object().unwrap() {
        let text = lm::GgufText::from_hf_dir(hf_dir(arch)).unwrap();
        for (messages, expected) in conversations.iter().zip(rendered.as_array().unwrap()) {
            assert_eq!(
                text.chat_prompt(messages).unwrap(),
                expected.as_str().unwrap(),
                "{arch}"
            );
        }
    }
}

#[test]
fn generation_config_gives_end_ids_and_sampling_defaults() {
    let generation = HfGeneration::read(hf_dir("llama")).unwrap();
    assert_eq!(
        generation,
        HfGeneration {
            temperature: Some(0.7),
            top_p: Some(0.9),
            top_k: Some(40),
            end_ids: vec![0, 2],
        }
    );
    let text = lm::GgufText::from_hf_dir(hf_dir("llama")).unwrap();
    // <|endoftext|> (generation_config and the known end texts), <|im_end|>
    // (eos_token, generation_config and the known end texts).
    assert_eq!(text.end_ids, [0, 2]);
}

/// A copy of `fixtures/hf/{name}` in a fresh temporary directory.
fn copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(hf_dir(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (temp, dir)
}

/// Broken text files: each a one-line error naming the file and field.
#[test]
fn broken_tokenizer_files_name_the_file_and_field() {
    let (_temp, dir) = copy("qwen2");
    let write = |file: &str, text: &str| std::fs::write(dir.join(file), text).unwrap();
    let config = std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap();
    let cases: Vec<(&str, String, &[&str])> = vec![
        (
            "tokenizer.json",
            "{\"model\": 3".into(),
            &["tokenizer.json", "invalid tokenizer.json"],
        ),
        (
            "tokenizer_config.json",
            "{,}".into(),
            &["tokenizer_config.json", "invalid JSON"],
        ),
        (
            "tokenizer_config.json",
            config.replace("\"bos_token\": \"<|endoftext|>\"", "\"bos_token\": \"<s>\""),
            &[
                "tokenizer_config.json",
                "bos_token",
                "\"<s>\" is not in tokenizer.json",
            ],
        ),
        (
            "tokenizer_config.json",
            config.replace("\"bos_token\": \"<|endoftext|>\"", "\"bos_token\": 7"),
            &["tokenizer_config.json", "bos_token", "expected a token"],
        ),
        (
            "tokenizer_config.json",
            config.replace(
                "\"chat_template\": \"{%",
                "\"chat_template\": 3, \"unused\": \"{%",
            ),
            &["tokenizer_config.json", "chat_template"],
        ),
        (
            "tokenizer_config.json",
            config.replace("\"0\": {", "\"99999\": {"),
            &["tokenizer_config.json", "added_tokens_decoder.99999"],
        ),
        (
            "generation_config.json",
            "{\"eos_token_id\": [2, -1]}".into(),
            &["generation_config.json", "eos_token_id"],
        ),
        (
            "generation_config.json",
            "{\"top_k\": \"many\"}".into(),
            &["generation_config.json", "top_k"],
        ),
    ];
    for (file, text, parts) in cases {
        let original = std::fs::read_to_string(dir.join(file)).unwrap();
        write(file, &text);
        let Err(error) = lm::load(&dir) else {
            panic!("{file} as {text:?} loaded");
        };
        let line = crate::common::error_chain(&error);
        assert!(!line.contains('\n'), "{line}");
        for part in parts {
            assert!(line.contains(part), "{line:?} should name {part:?}");
        }
        write(file, &original);
    }
    lm::load(&dir).unwrap();
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let line = crate::common::error_chain(&lm::load(&dir).unwrap_err());
    assert!(line.contains("tokenizer.json"), "{line}");
}

/// `--quantize` at load (`open_hf_dir_quantized`): every matrix whose rows
/// split into the type's blocks holds exactly the blocks ggml's reference
/// quantizer makes of the GGUF twin's rows (llama: q/k rows permuted before
/// quantizing, F16 source; qwen2: F32; mixtral: experts stacked), the rest as `open_hf_dir` keeps
/// them; the model runs; a float target is refused.
#[test]
fn quantizing_at_load_gives_the_twins_rows_quantized() {
    use lm::lm_model::{GgmlType, GgufFile, open_hf_dir, open_hf_dir_quantized};
    for (name, ty) in [
        ("llama", GgmlType::Q8_0),
        ("qwen2", GgmlType::Q4_0),
        ("mixtral", GgmlType::Q8_0),
    ] {
        let file = open_hf_dir_quantized(hf_dir(name), ty).unwrap();
        let plain = open_hf_dir(hf_dir(name)).unwrap();
        let twin = GgufFile::open(fixture_path(&format!("arch/{name}.gguf"))).unwrap();
        let mut n_quantized = 0;
        for info in file.tensors() {
            let ours = file.tensor(&info.name).unwrap();
            if info.ggml_type != ty {
                assert!(
                    ours.data == plain.tensor(&info.name).unwrap().data,
                    "{name} {}",
                    info.name
                );
                continue;
            }
            n_quantized += 1;
            let values = twin.tensor(&info.name).unwrap().to_f32_vec().unwrap();
            let mut expected = vec![0; info.n_bytes];
            let row_bytes = info.n_bytes / info.n_rows();
            for (dst, src) in expected
                .chunks_mut(row_bytes)
                .zip(values.chunks(info.dims[0]))
            {
                ty.quantize_row(src, dst).unwrap();
            }
            assert!(ours.data == expected, "{name} {}", info.name);
        }
        assert!(n_quantized >= 7, "{name}: {n_quantized} matrices quantized");
        let decoder = Llama::from_file(file).unwrap();
        let logits = all_positions(&decoder, &ids()[..4]);
        assert!(logits.iter().all(|v| v.is_finite()), "{name}");
    }
    let error = open_hf_dir_quantized(hf_dir("qwen2"), GgmlType::F16).unwrap_err();
    assert!(
        error.to_string().contains("cannot quantize at load"),
        "{error}"
    );
}
