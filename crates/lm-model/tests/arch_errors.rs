//! Malformed metadata and tensors of the non-llama architectures end in
//! errors that name the problem: the committed `fixtures/arch/` files
//! (see `arch_conformance`), each rewritten with one thing wrong.

use lm_model::{GgufFile, Llama, MetadataValue, TransformerError};

use crate::common::fixture_path;
use crate::common::gguf_writer::{GgufTensor, gguf_file};

/// A fixture model's metadata and tensors, to edit and write back.
pub(crate) struct Model {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<GgufTensor>,
}

impl Model {
    pub(crate) fn read(arch: &str) -> Self {
        let file = GgufFile::open(fixture_path(&format!("arch/{arch}.gguf"))).unwrap();
        let tensors = file
            .tensors()
            .iter()
            .map(|info| GgufTensor {
                name: info.name.clone(),
                dims: info.dims.iter().map(|&d| d as u64).collect(),
                type_id: info.ggml_type.id(),
                data: file.tensor(&info.name).unwrap().data.to_vec(),
            })
            .collect();
        Self {
            metadata: file.metadata().to_vec(),
            tensors,
        }
    }

    pub(crate) fn set(mut self, key: &str, value: MetadataValue) -> Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    pub(crate) fn remove_key(mut self, key: &str) -> Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    pub(crate) fn remove_tensors(mut self, names: &[&str]) -> Self {
        self.tensors.retain(|t| !names.contains(&t.name.as_str()));
        self
    }

    /// Gives tensor `name` the ggml dims `dims` (the same number of
    /// elements: its bytes are kept).
    pub(crate) fn reshape(mut self, name: &str, dims: &[u64]) -> Self {
        let tensor = self.tensors.iter_mut().find(|t| t.name == name).unwrap();
        tensor.dims = dims.to_vec();
        self
    }

    /// Replaces tensor `name` by an f32 vector of `len` values.
    pub(crate) fn resize_vector(mut self, name: &str, len: usize) -> Self {
        let tensor = self.tensors.iter_mut().find(|t| t.name == name).unwrap();
        *tensor = GgufTensor::f32(name, vec![len as u64], &vec![1.0; len]);
        self
    }

    /// Every quantized tensor replaced by an f32 tensor of its
    /// dequantized values (gpt-oss's MXFP4 experts): products with f32
    /// weights take the activations as they are, as the uncached reference
    /// does, where a quantized product rounds them to 8 bits first.
    pub(crate) fn dequantized(mut self) -> Self {
        use lm_model::{GgmlType, QMatrix};
        for tensor in &mut self.tensors {
            let ty = GgmlType::from_id(tensor.type_id).unwrap();
            if !ty.is_quantized() {
                continue;
            }
            let n_cols = tensor.dims[0] as usize;
            let n_rows = tensor.dims[1..].iter().product::<u64>() as usize;
            let matrix = QMatrix::new(ty, n_rows, n_cols, &tensor.data).unwrap();
            let mut values = vec![0.0f32; n_rows * n_cols];
            for (r, row) in values.chunks_exact_mut(n_cols).enumerate() {
                matrix.dequantize_row(r, row).unwrap();
            }
            *tensor = GgufTensor::f32(&tensor.name, tensor.dims.clone(), &values);
        }
        self
    }

    /// The tensors' names, in file order.
    pub(crate) fn tensor_names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }

    /// Puts `tensor` in place of the tensor of its name.
    pub(crate) fn replace(mut self, tensor: GgufTensor) -> Self {
        let slot = self.tensors.iter_mut().find(|t| t.name == tensor.name);
        *slot.unwrap() = tensor;
        self
    }

    /// The file's bytes, each tensor's data at a multiple of `alignment`
    /// (which `general.alignment` must then name, unless 32).
    pub(crate) fn bytes(&self, alignment: usize) -> Vec<u8> {
        gguf_file(3, alignment, &self.metadata, &self.tensors)
    }

    pub(crate) fn load(&self) -> Result<lm_model::Decoder, TransformerError> {
        Llama::from_file(GgufFile::from_bytes(self.bytes(32)).unwrap())
    }
}

/// Loading `model` fails with `message`, and the error is the variant `is`.
pub(crate) fn check(model: Model, message: &str, is: fn(&TransformerError) -> bool) {
    let err = model.load().unwrap_err();
    assert_eq!(err.to_string(), message);
    assert!(is(&err), "{err:?}");
}

#[test]
fn every_fixture_loads_unchanged() {
    for arch in crate::arch_conformance::ALL_FIXTURES {
        Model::read(arch).load().unwrap();
    }
}

#[test]
fn another_architecture_is_named_with_the_supported_ones() {
    check(
        Model::read("qwen2").set("general.architecture", MetadataValue::String("gpt2".into())),
        "architecture `gpt2` is not supported; supported: llama, qwen2, qwen3, gemma3, qwen3moe, \
         olmoe, gemma2, olmo2, phi3, qwen2moe, dots1, gpt-oss",
        |e| matches!(e, TransformerError::UnsupportedArchitecture { found } if found == "gpt2"),
    );
}

#[test]
fn a_sliding_window_of_zero_is_refused_where_it_would_mask_every_key() {
    // gemma2 slides whatever the key says (default 4096): a window of 0
    // would leave a query no key.
    check(
        Model::read("gemma2").set("gemma2.attention.sliding_window", MetadataValue::U32(0)),
        "sliding window of 0 positions every 2 layers: both must be positive",
        |e| matches!(e, TransformerError::InvalidSlidingWindow { window: 0, .. }),
    );
    // gemma3, as llama.cpp 0.3.36 reads it, slides only when the key is
    // above 0: without it every layer is global.
    for model in [
        Model::read("gemma3").set("gemma3.attention.sliding_window", MetadataValue::U32(0)),
        Model::read("gemma3").remove_key("gemma3.attention.sliding_window"),
    ] {
        assert_eq!(model.load().unwrap().config().options.sliding_window, None);
    }
}

#[test]
fn gemma3_reads_a_final_soft_cap_and_a_sliding_rope_base() {
    let model = Model::read("gemma3")
        .set("gemma3.final_logit_softcapping", MetadataValue::F32(2.0))
        .set("gemma3.rope.freq_base_swa", MetadataValue::F32(500.0))
        .load()
        .unwrap();
    let o = &model.config().options;
    assert_eq!(o.final_softcap, Some(2.0));
    assert_eq!(o.attn_softcap, None);
    assert_eq!(o.sliding_window.map(|sw| sw.rope_base), Some(500.0));
    // A cap of 0 is llama.cpp's "none".
    let zero = Model::read("gemma3")
        .set("gemma3.final_logit_softcapping", MetadataValue::F32(0.0))
        .load()
        .unwrap();
    assert_eq!(zero.config().options.final_softcap, None);
}

#[test]
fn a_head_count_that_does_not_divide_the_width_is_refused_where_it_gives_the_head_width() {
    // qwen2 derives the head width from the width: 64 / 5 does not divide.
    check(
        Model::read("qwen2").set("qwen2.attention.head_count", MetadataValue::U32(5)),
        "head count 5 does not divide the embedding size 64",
        |e| {
            matches!(
                e,
                TransformerError::HeadCountDoesNotDivide { n_head: 5, .. }
            )
        },
    );
    // qwen3 gives it as attention.key_length, so 4 heads of 32 over a width
    // of 64 load (the fixture); a key length that disagrees with the
    // tensors is a shape error.
    check(
        Model::read("qwen3").set("qwen3.attention.key_length", MetadataValue::U32(16)),
        "tensor blk.0.attn_q.weight has shape [64, 128], expected [64, 64]",
        |e| matches!(e, TransformerError::TensorShape { .. }),
    );
}

#[test]
fn missing_architecture_tensors_are_all_listed() {
    let cases = [
        (
            Model::read("qwen2").remove_tensors(&["blk.1.attn_k.bias", "blk.0.attn_v.bias"]),
            "missing tensors: blk.0.attn_v.bias, blk.1.attn_k.bias",
        ),
        (
            Model::read("gemma3")
                .remove_tensors(&["blk.5.post_ffw_norm.weight", "blk.2.attn_q_norm.weight"]),
            "missing tensors: blk.2.attn_q_norm.weight, blk.5.post_ffw_norm.weight",
        ),
    ];
    for (model, message) in cases {
        check(model, message, |e| {
            matches!(e, TransformerError::MissingTensors { .. })
        });
    }
}

#[test]
fn norm_and_bias_sizes_that_do_not_match_are_named() {
    let cases = [
        (
            "qwen3",
            "blk.1.attn_k_norm.weight",
            16,
            "[16], expected [32]",
        ),
        (
            "gemma3",
            "blk.0.post_attention_norm.weight",
            63,
            "[63], expected [64]",
        ),
        ("qwen2", "blk.0.attn_q.bias", 32, "[32], expected [64]"),
    ];
    for (arch, tensor, len, shapes) in cases {
        check(
            Model::read(arch).resize_vector(tensor, len),
            &format!("tensor {tensor} has shape {shapes}"),
            |e| matches!(e, TransformerError::TensorShape { .. }),
        );
    }
}

#[test]
fn rope_freqs_of_the_wrong_length_and_unsupported_scaling_are_refused() {
    check(
        Model::read("llama").resize_vector("rope_freqs.weight", 5),
        "5 rope frequency factors for 8 rotated pairs",
        |e| {
            matches!(
                e,
                TransformerError::RopeFreqFactorsLength {
                    expected: 8,
                    found: 5
                }
            )
        },
    );
    check(
        Model::read("llama").set(
            "llama.rope.scaling.type",
            MetadataValue::String("longrope".into()),
        ),
        "rope scaling `longrope` is not supported; supported: none, linear, yarn",
        |e| matches!(e, TransformerError::UnsupportedRopeScaling { .. }),
    );
}

#[test]
fn gemma2_olmo2_and_phi3_parts_missing_or_misshapen_are_named() {
    let missing = [
        (
            Model::read("gemma2").remove_tensors(&["blk.1.post_ffw_norm.weight"]),
            "missing tensors: blk.1.post_ffw_norm.weight",
        ),
        (
            Model::read("olmo2").remove_tensors(&[
                "blk.0.attn_k_norm.weight",
                "blk.3.post_attention_norm.weight",
            ]),
            "missing tensors: blk.0.attn_k_norm.weight, blk.3.post_attention_norm.weight",
        ),
        // Without the fused tensor, the separate ones are asked for.
        (
            Model::read("phi3").remove_tensors(&["blk.2.attn_qkv.weight", "blk.0.ffn_up.weight"]),
            "missing tensors: blk.0.ffn_up.weight, blk.2.attn_q.weight, blk.2.attn_k.weight, \
             blk.2.attn_v.weight",
        ),
    ];
    for (model, message) in missing {
        check(model, message, |e| {
            matches!(e, TransformerError::MissingTensors { .. })
        });
    }
    // The fused tensors hold q_dim + 2 kv_dim = 128 and 2 ffn_dim = 192 rows.
    let misshapen = [
        (
            "blk.1.attn_qkv.weight",
            [128, 64],
            "[128, 64], expected [64, 128]",
        ),
        (
            "blk.0.ffn_up.weight",
            [128, 96],
            "[128, 96], expected [64, 192]",
        ),
    ];
    for (tensor, dims, shapes) in misshapen {
        check(
            Model::read("phi3").reshape(tensor, &dims),
            &format!("tensor {tensor} has shape {shapes}"),
            |e| matches!(e, TransformerError::TensorShape { .. }),
        );
    }
    check(
        Model::read("phi3").resize_vector("rope_factors_long.weight", 3),
        "3 rope frequency factors for 8 rotated pairs",
        |e| matches!(e, TransformerError::RopeFreqFactorsLength { .. }),
    );
    check(
        Model::read("gemma2").remove_key("gemma2.attention.layer_norm_rms_epsilon"),
        "missing metadata keys: gemma2.attention.layer_norm_rms_epsilon",
        |e| matches!(e, TransformerError::MissingMetadata { .. }),
    );
    check(
        Model::read("gemma2").set("gemma2.attn_logit_softcapping", MetadataValue::F32(0.0)),
        "attention logit soft-cap (attn_logit_softcapping) must be finite and positive, got 0",
        |e| matches!(e, TransformerError::InvalidScale { .. }),
    );
    check(
        Model::read("phi3").set(
            "phi3.rope.scaling.attn_factor",
            MetadataValue::F32(f32::NAN),
        ),
        "rope attention factor (rope.scaling.attn_factor) must be finite and positive, got NaN",
        |e| matches!(e, TransformerError::InvalidScale { .. }),
    );
}

#[test]
fn a_sliding_window_pattern_is_read_as_llama_cpp_reads_it() {
    use lm_model::AttentionKind;
    let flags = |flags: &[bool]| {
        MetadataValue::Array(flags.iter().map(|&f| MetadataValue::Bool(f)).collect())
    };
    let key = "olmo2.attention.sliding_window_pattern";
    // OLMo 3's converter writes one flag per layer: the fixture's period 4.
    let flagged = Model::read("olmo2")
        .set(key, flags(&[true, true, true, false]))
        .load()
        .unwrap();
    let c = flagged.config();
    let sliding = AttentionKind::Sliding { window: 12 };
    let kinds: Vec<AttentionKind> = (0..4).map(|i| c.attention_kind(i)).collect();
    assert_eq!(kinds, [sliding, sliding, sliding, AttentionKind::Global]);
    // A period of 2, or 0 (every layer slides, as llama.cpp's set_swa_pattern).
    for (period, global) in [(2, vec![1, 3]), (0, vec![])] {
        let model = Model::read("olmo2")
            .set(key, MetadataValue::U32(period))
            .load()
            .unwrap();
        let c = model.config();
        let found: Vec<usize> = (0..4)
            .filter(|&i| c.attention_kind(i) == AttentionKind::Global)
            .collect();
        assert_eq!(found, global, "pattern {period}");
    }
    // Flags in no repeating pattern, or of the wrong count, are refused.
    for pattern in [
        flags(&[true, false, true, true]),
        flags(&[true, true, true]),
        MetadataValue::Array(vec![MetadataValue::U32(1); 4]),
    ] {
        check(
            Model::read("olmo2").set(key, pattern),
            "olmo2.attention.sliding_window_pattern: only a repeating pattern is supported \
             (layer i slides when i % p < p - 1, one flag per layer or the period p)",
            |e| matches!(e, TransformerError::UnsupportedSlidingWindowPattern { .. }),
        );
    }
}

#[test]
fn gemma2_reads_no_output_matrix_as_llama_cpp() {
    // llama.cpp's gemma2 loader takes token_embd.weight as the output
    // whatever the file holds: an output.weight of zeros changes nothing.
    let zeros = GgufTensor::f32("output.weight", vec![64, 512], &vec![0.0; 64 * 512]);
    let mut model = Model::read("gemma2");
    model.tensors.push(zeros);
    let with_output = model.load().unwrap();
    assert!(with_output.config().tied_output);
    let plain = Model::read("gemma2").load().unwrap();
    let ids = [3, 141, 59, 265];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    use lm_core::{LanguageModel, Rows};
    with_output
        .forward(&mut with_output.new_state(), &ids, Rows::All, &mut a)
        .unwrap();
    plain
        .forward(&mut plain.new_state(), &ids, Rows::All, &mut b)
        .unwrap();
    assert_eq!(a, b);
}
