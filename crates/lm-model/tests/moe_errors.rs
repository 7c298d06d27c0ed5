//! A mixture of experts that does not fit its own metadata ends in a
//! one-line error naming the key or tensor: the committed `fixtures/arch/`
//! qwen3moe (8 experts of width 32 over a width of 64, top-2, 4 layers) and
//! Mixtral (llama with 8 experts of width 48) files, OLMoE's QK norms,
//! qwen2moe's gated shared expert (width 48) and dots1's sigmoid routing
//! (selection bias, two shared experts of width 32, layer 0 dense) and
//! gpt-oss's sinks, biases and MXFP4 experts, each rewritten with one
//! thing wrong.

use lm_model::{MetadataValue, TransformerError};

use crate::arch_errors::{Model, check};

fn invalid_experts(e: &TransformerError) -> bool {
    matches!(e, TransformerError::InvalidExperts { .. })
}

fn shape(e: &TransformerError) -> bool {
    matches!(e, TransformerError::TensorShape { .. })
}

#[test]
fn an_expert_count_of_zero_or_beyond_llama_cpp_s_limit_is_refused() {
    for count in [0, 513, u32::MAX] {
        check(
            Model::read("qwen3moe").set("qwen3moe.expert_count", MetadataValue::U32(count)),
            &format!("qwen3moe.expert_count = {count}: a mixture of experts has 1 to 512 experts"),
            invalid_experts,
        );
    }
}

#[test]
fn a_top_k_of_zero_or_above_the_expert_count_is_refused() {
    for used in [0, 9] {
        check(
            Model::read("qwen3moe").set("qwen3moe.expert_used_count", MetadataValue::U32(used)),
            &format!("qwen3moe.expert_used_count = {used}: between 1 and the 8 experts are used"),
            invalid_experts,
        );
    }
    check(
        Model::read("mixtral").set("llama.expert_used_count", MetadataValue::U32(100)),
        "llama.expert_used_count = 100: between 1 and the 8 experts are used",
        invalid_experts,
    );
}

#[test]
fn missing_expert_counts_are_named() {
    check(
        Model::read("qwen3moe")
            .remove_key("qwen3moe.expert_count")
            .remove_key("qwen3moe.expert_used_count"),
        "missing metadata keys: qwen3moe.expert_count, qwen3moe.expert_used_count",
        |e| matches!(e, TransformerError::MissingMetadata { .. }),
    );
    // Mixtral's experts are asked for by llama.expert_count; its top-k is
    // then required.
    check(
        Model::read("mixtral").remove_key("llama.expert_used_count"),
        "missing metadata keys: llama.expert_used_count",
        |e| matches!(e, TransformerError::MissingMetadata { .. }),
    );
    check(
        Model::read("qwen3moe").set("qwen3moe.expert_feed_forward_length", MetadataValue::U32(0)),
        "qwen3moe.expert_feed_forward_length = 0: an expert's width must be positive",
        invalid_experts,
    );
}

#[test]
fn a_missing_router_or_expert_tensor_is_named() {
    check(
        Model::read("qwen3moe").remove_tensors(&["blk.1.ffn_gate_inp.weight"]),
        "missing tensors: blk.1.ffn_gate_inp.weight",
        |e| matches!(e, TransformerError::MissingTensors { .. }),
    );
    check(
        Model::read("mixtral")
            .remove_tensors(&["blk.3.ffn_down_exps.weight", "blk.0.ffn_gate_inp.weight"]),
        "missing tensors: blk.0.ffn_gate_inp.weight, blk.3.ffn_down_exps.weight",
        |e| matches!(e, TransformerError::MissingTensors { .. }),
    );
    // A dense llama file that claims experts has none of their tensors.
    check(
        Model::read("llama").set("llama.expert_count", MetadataValue::U32(8)),
        "missing metadata keys: llama.expert_used_count",
        |e| matches!(e, TransformerError::MissingMetadata { .. }),
    );
    let err = Model::read("llama")
        .set("llama.expert_count", MetadataValue::U32(8))
        .set("llama.expert_used_count", MetadataValue::U32(2))
        .load()
        .unwrap_err();
    assert!(
        err.to_string().starts_with(
            "missing tensors: blk.0.ffn_gate_inp.weight, blk.0.ffn_gate_exps.weight, \
             blk.0.ffn_up_exps.weight, blk.0.ffn_down_exps.weight, blk.1.ffn_gate_inp.weight"
        ),
        "{err}"
    );
}

#[test]
fn expert_tensors_that_disagree_with_the_metadata_are_named_with_both_shapes() {
    let cases = [
        // Fewer experts in the metadata than in the file: the router is
        // checked first.
        (
            Model::read("qwen3moe").set("qwen3moe.expert_count", MetadataValue::U32(4)),
            "tensor blk.0.ffn_gate_inp.weight has shape [64, 8], expected [64, 4]",
        ),
        // Another expert width.
        (
            Model::read("qwen3moe").set(
                "qwen3moe.expert_feed_forward_length",
                MetadataValue::U32(48),
            ),
            "tensor blk.0.ffn_gate_exps.weight has shape [64, 32, 8], expected [64, 48, 8]",
        ),
        // The down projection's dims swapped (the same bytes).
        (
            Model::read("qwen3moe").reshape("blk.2.ffn_down_exps.weight", &[64, 32, 8]),
            "tensor blk.2.ffn_down_exps.weight has shape [64, 32, 8], expected [32, 64, 8]",
        ),
        // Experts folded into a 2-d tensor.
        (
            Model::read("mixtral").reshape("blk.1.ffn_up_exps.weight", &[64, 384]),
            "tensor blk.1.ffn_up_exps.weight has shape [64, 384], expected [64, 48, 8]",
        ),
        // A 3-d router.
        (
            Model::read("mixtral").reshape("blk.0.ffn_gate_inp.weight", &[64, 4, 2]),
            "tensor blk.0.ffn_gate_inp.weight has dimensions [64, 4, 2], expected a matrix",
        ),
    ];
    for (model, message) in cases {
        check(model, message, |e| {
            shape(e) || matches!(e, TransformerError::TensorRank { .. })
        });
    }
}

#[test]
fn olmoe_qk_norms_of_one_head_are_refused() {
    // OLMoE's QK norms span all 4 heads of 16; a per-head gain is refused.
    check(
        Model::read("olmoe").resize_vector("blk.3.attn_k_norm.weight", 16),
        "tensor blk.3.attn_k_norm.weight has shape [16], expected [64]",
        shape,
    );
}

#[test]
fn a_shared_expert_of_the_wrong_shape_is_named_with_both_shapes() {
    let cases = [
        // Its dims swapped (the same bytes).
        (
            Model::read("qwen2moe").reshape("blk.1.ffn_up_shexp.weight", &[48, 64]),
            "tensor blk.1.ffn_up_shexp.weight has shape [48, 64], expected [64, 48]",
        ),
        // Another width in the metadata.
        (
            Model::read("qwen2moe").set(
                "qwen2moe.expert_shared_feed_forward_length",
                MetadataValue::U32(40),
            ),
            "tensor blk.0.ffn_gate_shexp.weight has shape [64, 48], expected [64, 40]",
        ),
        // dots1's width is the shared count times the expert width.
        (
            Model::read("dots1").set("dots1.expert_shared_count", MetadataValue::U32(3)),
            "tensor blk.1.ffn_gate_shexp.weight has shape [64, 64], expected [64, 96]",
        ),
        // The shared gate is one vector, not a matrix.
        (
            Model::read("qwen2moe").reshape("blk.3.ffn_gate_inp_shexp.weight", &[32, 2]),
            "tensor blk.3.ffn_gate_inp_shexp.weight has shape [32, 2], expected [64]",
        ),
    ];
    for (model, message) in cases {
        check(model, message, shape);
    }
    check(
        Model::read("dots1").set("dots1.expert_shared_count", MetadataValue::U32(0)),
        "dots1.expert_shared_count = 0: a shared expert's width must be positive",
        invalid_experts,
    );
}

#[test]
fn a_missing_shared_expert_tensor_is_named() {
    check(
        Model::read("qwen2moe").remove_tensors(&["blk.2.ffn_gate_inp_shexp.weight"]),
        "missing tensors: blk.2.ffn_gate_inp_shexp.weight",
        |e| matches!(e, TransformerError::MissingTensors { .. }),
    );
    check(
        Model::read("dots1").remove_tensors(&["blk.3.ffn_down_shexp.weight"]),
        "missing tensors: blk.3.ffn_down_shexp.weight",
        |e| matches!(e, TransformerError::MissingTensors { .. }),
    );
    // Two leading dense layers: layer 1 has experts, not a dense block.
    check(
        Model::read("dots1").set("dots1.leading_dense_block_count", MetadataValue::U32(2)),
        "missing tensors: blk.1.ffn_gate.weight, blk.1.ffn_up.weight, blk.1.ffn_down.weight",
        |e| matches!(e, TransformerError::MissingTensors { .. }),
    );
}

#[test]
fn an_unknown_or_missing_gating_function_is_refused() {
    // llama.cpp's 3 (softmax of the chosen weights) and 4 (sqrt-softplus)
    // are not implemented here; 0 (none) aborts llama.cpp.
    for value in [0, 3, 4, 99] {
        check(
            Model::read("dots1").set("dots1.expert_gating_func", MetadataValue::U32(value)),
            &format!(
                "dots1.expert_gating_func = {value}: the gating function is 1 (softmax) or 2 (sigmoid)"
            ),
            invalid_experts,
        );
    }
    check(
        Model::read("dots1").remove_key("dots1.expert_gating_func"),
        "missing metadata keys: dots1.expert_gating_func",
        |e| matches!(e, TransformerError::MissingMetadata { .. }),
    );
}

#[test]
fn a_selection_bias_of_the_wrong_length_or_a_bad_scale_is_refused() {
    check(
        Model::read("dots1").resize_vector("blk.2.exp_probs_b.bias", 7),
        "tensor blk.2.exp_probs_b.bias has shape [7], expected [8]",
        shape,
    );
    for scale in [f32::NAN, f32::INFINITY, -1.0] {
        check(
            Model::read("dots1").set("dots1.expert_weights_scale", MetadataValue::F32(scale)),
            &format!(
                "expert weights scale (expert_weights_scale) must be finite and positive, got {scale}"
            ),
            |e| matches!(e, TransformerError::InvalidScale { .. }),
        );
    }
}

/// gpt-oss (`fixtures/arch/gpt_oss.gguf`: 4 heads, 8 MXFP4 experts of
/// width 32 over a width of 64): a sinks tensor missing or of the wrong
/// length, a missing router bias, a misshapen expert bias, a missing
/// window: each a one-line error naming it.
#[test]
fn gpt_oss_sinks_biases_and_window_that_do_not_fit_are_named() {
    let missing = |e: &TransformerError| matches!(e, TransformerError::MissingTensors { .. });
    check(
        Model::read("gpt_oss").remove_tensors(&["blk.1.attn_sinks.weight"]),
        "missing tensors: blk.1.attn_sinks.weight",
        missing,
    );
    check(
        Model::read("gpt_oss").resize_vector("blk.0.attn_sinks.weight", 3),
        "tensor blk.0.attn_sinks.weight has shape [3], expected [4]",
        shape,
    );
    check(
        Model::read("gpt_oss")
            .remove_tensors(&["blk.3.ffn_gate_inp.bias", "blk.0.attn_output.bias"]),
        "missing tensors: blk.0.attn_output.bias, blk.3.ffn_gate_inp.bias",
        missing,
    );
    check(
        Model::read("gpt_oss").reshape("blk.2.ffn_up_exps.bias", &[64, 4]),
        "tensor blk.2.ffn_up_exps.bias has shape [64, 4], expected [32, 8]",
        shape,
    );
    check(
        Model::read("gpt_oss").remove_key("gpt-oss.attention.sliding_window"),
        "missing metadata keys: gpt-oss.attention.sliding_window",
        |e| matches!(e, TransformerError::MissingMetadata { .. }),
    );
}

/// An MXFP4 expert tensor whose size does not fit: transposed dims (the
/// same bytes) are refused naming both shapes; a row length that is not a
/// whole number of 32-weight blocks is refused when the file is read.
#[test]
fn gpt_oss_mxfp4_experts_that_do_not_fit_are_named() {
    check(
        Model::read("gpt_oss").reshape("blk.0.ffn_down_exps.weight", &[64, 32, 8]),
        "tensor blk.0.ffn_down_exps.weight has shape [64, 32, 8], expected [32, 64, 8]",
        shape,
    );
    let bytes = Model::read("gpt_oss")
        .reshape("blk.1.ffn_gate_exps.weight", &[80, 32, 8])
        .bytes(32);
    let err = lm_model::GgufFile::from_bytes(bytes).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"blk.1.ffn_gate_exps.weight\" of type mxfp4 has rows of 80 elements, not a multiple of 32"
    );
}
