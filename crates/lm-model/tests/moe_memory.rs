//! A mixture of experts opened with `GgufFile::open` keeps its experts in a
//! map of the file (its other tensors are copied), and loading it reads
//! none of its experts: the resident pages of the map (its `Rss` in
//! `/proc/self/smaps`, which counts this mapping alone, whatever other
//! tests do) grow with the experts the tokens choose,
//! not with the file.

use lm_core::{LanguageModel, Rows, TokenId};
use lm_model::{GgufFile, Llama, MetadataValue};

use crate::arch_errors::Model;
use crate::common::gguf_writer::GgufTensor;

/// Experts in the layer, and each expert's width: its gate, up and down
/// matrices are 64 x 8192 f32, 2 MiB each, and the file aligns every tensor
/// to 2 MiB, so each expert matrix is whole pages of its own whether the
/// page cache holds the file in 4 KiB pages or in 2 MiB folios (as this
/// kernel's ext4 does), and a page brought in for one expert maps no
/// other's.
const N_EXPERT: usize = 16;
const EXPERT_WIDTH: usize = 8192;
const ALIGN: usize = 2 << 20;

/// The qwen3moe fixture cut to its first layer and widened to 16 experts
/// of width 8192 (96 MiB of experts, top-2), written to `path`.
fn write_wide_mixture(path: &std::path::Path) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut values = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    };
    let (d, f, e) = (64u64, EXPERT_WIDTH as u64, N_EXPERT as u64);
    let n = (d * f * e) as usize;
    let other_layers: Vec<String> = Model::read("qwen3moe")
        .tensor_names()
        .into_iter()
        .filter(|name| name.starts_with("blk.") && !name.starts_with("blk.0."))
        .collect();
    let other_layers: Vec<&str> = other_layers.iter().map(String::as_str).collect();
    let model = Model::read("qwen3moe")
        .set("general.alignment", MetadataValue::U32(ALIGN as u32))
        .set("qwen3moe.block_count", MetadataValue::U32(1))
        .set("qwen3moe.expert_count", MetadataValue::U32(e as u32))
        .set(
            "qwen3moe.expert_feed_forward_length",
            MetadataValue::U32(f as u32),
        )
        .remove_tensors(&other_layers)
        .replace(GgufTensor::f32(
            "blk.0.ffn_gate_inp.weight",
            vec![d, e],
            &values((d * e) as usize, 1.0),
        ))
        .replace(GgufTensor::f32(
            "blk.0.ffn_gate_exps.weight",
            vec![d, f, e],
            &values(n, 0.25),
        ))
        .replace(GgufTensor::f32(
            "blk.0.ffn_up_exps.weight",
            vec![d, f, e],
            &values(n, 0.25),
        ))
        .replace(GgufTensor::f32(
            "blk.0.ffn_down_exps.weight",
            vec![f, d, e],
            &values(n, 0.02),
        ));
    std::fs::write(path, model.bytes(ALIGN)).unwrap();
}

/// The resident bytes of this process's mapping of `path`.
fn resident_bytes_of(path: &std::path::Path) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let path = path.to_str().unwrap();
    let mut in_mapping = false;
    let mut rss_kib = 0;
    for line in smaps.lines() {
        // A mapping's first line: "start-end perms offset dev inode [path]".
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 5 && fields[0].contains('-') && fields[1].len() == 4 {
            in_mapping = fields.get(5) == Some(&path);
        } else if in_mapping && let Some(rest) = line.strip_prefix("Rss:") {
            let kib = rest.trim().trim_end_matches("kB").trim();
            rss_kib += kib.parse::<usize>().unwrap();
        }
    }
    rss_kib * 1024
}

#[cfg(target_os = "linux")]
#[test]
fn a_mapped_mixture_makes_resident_only_the_experts_its_tokens_choose() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("wide-qwen3moe.gguf");
    write_wide_mixture(&path);
    let file_len = std::fs::metadata(&path).unwrap().len() as usize;
    let file = GgufFile::open(&path).unwrap();
    assert!(file.is_mapped(), "a mixture of experts stays mapped");
    let model = Llama::from_file(file).unwrap();
    // Loaded: the header's page alone; the other tensors were read from
    // the file into huge pages of their own (not through the map), and no
    // expert was read.
    let expert_matrix = 64 * EXPERT_WIDTH * 4;
    let loaded = resident_bytes_of(&path);
    assert!(
        loaded <= ALIGN,
        "{loaded} of {file_len} bytes after loading"
    );
    // One token: its 2 experts' 3 matrices, 12 MiB of the 96.
    let mut state = model.new_state();
    let mut logits = Vec::new();
    model
        .forward(&mut state, &[7], Rows::Last, &mut logits)
        .unwrap();
    let one_token = resident_bytes_of(&path);
    assert_eq!(
        one_token - loaded,
        2 * 3 * expert_matrix,
        "{loaded} then {one_token} of {file_len} bytes"
    );
    // Forty more tokens choose more experts (4 of the 16 in all, with this
    // router): the map grows by whole expert matrices.
    let prompt: Vec<TokenId> = (0..40).map(|i| (i * 37 + 11) % 512).collect();
    model
        .forward(&mut state, &prompt, Rows::Last, &mut logits)
        .unwrap();
    let many = resident_bytes_of(&path);
    assert!(
        many > one_token,
        "{many} of {file_len} bytes after 41 tokens"
    );
    assert_eq!(
        (many - loaded) % expert_matrix,
        0,
        "{many} bytes after 41 tokens"
    );
}

/// A dense file is still read into memory (huge pages), and a mixture's
/// blocks are still validated when its bytes are the process's own.
#[test]
fn a_dense_file_is_read_and_an_owned_mixture_is_validated() {
    let dense = GgufFile::open(crate::common::fixture_path("arch/qwen3.gguf")).unwrap();
    assert!(!dense.is_mapped());
    let mapped = GgufFile::open(crate::common::fixture_path("arch/olmoe.gguf")).unwrap();
    assert!(mapped.is_mapped());
    let nan = Model::read("olmoe").replace(GgufTensor::f32(
        "blk.0.ffn_up_exps.weight",
        vec![64, 32, 8],
        &[f32::NAN; 64 * 32 * 8],
    ));
    let err = nan.load().unwrap_err().to_string();
    assert!(err.contains("blk.0.ffn_up_exps.weight"), "{err}");
}
