//! A mixture of experts that does not fit its own metadata ends in a
//! one-line error naming the key or tensor: the committed `fixtures/arch/`
//! qwen3moe (8 experts of width 32 over a width of 64, top-2, 4 layers) and
//! Mixtral (llama with 8 experts of width 48) files, and OLMoE's QK norms,
//! each rewritten with one thing wrong.

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
