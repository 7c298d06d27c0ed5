//! The llama loader on tiny GGUF files built in memory: a model written with
//! F32, F16 and BF16 tensors gives the logits of the same weights run as a
//! dense decoder; tied and untied outputs; every bad file is a typed error
//! that names the problem.

use half::{bf16, f16};
use lm_core::{Rows, TokenId};
use lm_model::{
    Decoder, DecoderWeights, KvPrecision, LayerWeights, Linear, Llama, PositionKind,
    TransformerError,
};
use lm_model::{FeedForward, GgufFile, MetadataValue, Norm};
use ndarray::Array2;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common::fresh_logits;
use crate::common::gguf_writer::{BF16, F16, F32, GgufTensor, gguf_file};

const N_EMBD: usize = 8;
const N_HEAD: u32 = 4;
const N_KV_HEAD: u32 = 2;
const FFN_DIM: usize = 12;
const VOCAB: usize = 11;
const N_LAYER: usize = 2;
const CONTEXT: u32 = 16;

/// A tensor to write: name, `[n_rows][n_cols]` values, GGML type.
struct Tensor {
    name: String,
    values: Array2<f32>,
    ty: u32,
}

impl Tensor {
    /// The tensor as GGUF stores it: dims in ggml order (`[n_cols, n_rows]`,
    /// or `[n]` for a vector), values in its type.
    fn to_gguf(&self) -> GgufTensor {
        let (n_rows, n_cols) = self.values.dim();
        let dims = if n_rows == 1 {
            vec![n_cols as u64]
        } else {
            vec![n_cols as u64, n_rows as u64]
        };
        let data = self
            .values
            .iter()
            .flat_map(|&v| match self.ty {
                F16 => f16::from_f32(v).to_le_bytes().to_vec(),
                BF16 => bf16::from_f32(v).to_le_bytes().to_vec(),
                _ => v.to_le_bytes().to_vec(),
            })
            .collect();
        GgufTensor {
            name: self.name.clone(),
            dims,
            type_id: self.ty,
            data,
        }
    }
}

fn metadata() -> Vec<(&'static str, MetadataValue)> {
    vec![
        (
            "general.architecture",
            MetadataValue::String("llama".into()),
        ),
        ("llama.block_count", MetadataValue::U32(N_LAYER as u32)),
        ("llama.context_length", MetadataValue::U32(CONTEXT)),
        ("llama.embedding_length", MetadataValue::U32(N_EMBD as u32)),
        (
            "llama.feed_forward_length",
            MetadataValue::U32(FFN_DIM as u32),
        ),
        ("llama.attention.head_count", MetadataValue::U32(N_HEAD)),
        (
            "llama.attention.head_count_kv",
            MetadataValue::U32(N_KV_HEAD),
        ),
        ("llama.rope.freq_base", MetadataValue::F32(500.0)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetadataValue::F32(1e-5),
        ),
    ]
}

/// Random weights, rounded so that their type stores them exactly.
fn random(rng: &mut ChaCha8Rng, n_rows: usize, n_cols: usize, ty: u32) -> Array2<f32> {
    Array2::from_shape_simple_fn((n_rows, n_cols), || {
        let v: f32 = rng.random_range(-0.6..0.6);
        match ty {
            F16 => f16::from_f32(v).to_f32(),
            BF16 => bf16::from_f32(v).to_f32(),
            _ => v,
        }
    })
}

/// Every tensor of a tiny llama (with `output.weight` when `untied`), the
/// matrices spread over F32, F16 and BF16.
fn tensors(untied: bool) -> Vec<Tensor> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let kv = N_EMBD / N_HEAD as usize * N_KV_HEAD as usize;
    let mut out = Vec::new();
    let mut push = |name: String, n_rows, n_cols, ty| {
        let values = if n_rows == 1 {
            // Norm gains near 1.
            random(&mut rng, 1, n_cols, F32).mapv(|v| 1.0 + v / 2.0)
        } else {
            random(&mut rng, n_rows, n_cols, ty)
        };
        out.push(Tensor { name, values, ty });
    };
    push("token_embd.weight".into(), VOCAB, N_EMBD, F16);
    for i in 0..N_LAYER {
        let name = |part: &str| format!("blk.{i}.{part}.weight");
        push(name("attn_norm"), 1, N_EMBD, F32);
        push(name("attn_q"), N_EMBD, N_EMBD, F32);
        push(name("attn_k"), kv, N_EMBD, F16);
        push(name("attn_v"), kv, N_EMBD, BF16);
        push(name("attn_output"), N_EMBD, N_EMBD, F32);
        push(name("ffn_norm"), 1, N_EMBD, F32);
        push(name("ffn_gate"), FFN_DIM, N_EMBD, BF16);
        push(name("ffn_up"), FFN_DIM, N_EMBD, F16);
        push(name("ffn_down"), N_EMBD, FFN_DIM, F32);
    }
    push("output_norm.weight".into(), 1, N_EMBD, F32);
    if untied {
        push("output.weight".into(), VOCAB, N_EMBD, BF16);
    }
    out
}

/// The same weights as a dense decoder, built by hand from the tensors.
fn dense_decoder(tensors: &[Tensor], config: lm_model::TransformerConfig) -> Decoder {
    let get = |name: &str| {
        tensors
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .values
            .clone()
    };
    let linear = |name: &str| Linear::dense(get(name));
    let norm = |name: &str| Norm::rms_norm(get(name).into_raw_vec_and_offset().0, 1e-5);
    let layers = (0..N_LAYER)
        .map(|i| {
            let name = |part: &str| format!("blk.{i}.{part}.weight");
            LayerWeights::plain(
                norm(&name("attn_norm")),
                [
                    linear(&name("attn_q")),
                    linear(&name("attn_k")),
                    linear(&name("attn_v")),
                    linear(&name("attn_output")),
                ],
                norm(&name("ffn_norm")),
                FeedForward::SwiGlu {
                    gate: linear(&name("ffn_gate")),
                    up: linear(&name("ffn_up")),
                    down: linear(&name("ffn_down")),
                },
            )
        })
        .collect();
    let output = tensors
        .iter()
        .any(|t| t.name == "output.weight")
        .then(|| linear("output.weight"));
    let weights = DecoderWeights {
        token_embedding: linear("token_embd.weight"),
        position_embedding: None,
        layers,
        final_norm: norm("output_norm.weight"),
        output,
    };
    Decoder::new(config, weights).unwrap()
}

fn load(
    metadata: &[(&str, MetadataValue)],
    tensors: &[Tensor],
) -> Result<Decoder, TransformerError> {
    let tensors: Vec<GgufTensor> = tensors.iter().map(Tensor::to_gguf).collect();
    Llama::from_file(GgufFile::from_bytes(gguf_file(3, 32, metadata, &tensors)).unwrap())
}

#[test]
fn a_tiny_llama_file_runs_like_the_same_weights_in_memory() {
    let tokens: Vec<TokenId> = (0..CONTEXT).map(|i| (i * 7 + 3) % VOCAB as u32).collect();
    for untied in [false, true] {
        let tensors = tensors(untied);
        let llama = load(&metadata(), &tensors).unwrap();
        let c = llama.config().clone();
        assert_eq!(c.tied_output, !untied);
        assert_eq!((c.vocab_size, c.head_dim, c.n_kv_head), (VOCAB, 2, 2));
        assert_eq!(
            c.position,
            PositionKind::Rope {
                base: 500.0,
                dim: 2
            }
        );
        assert_eq!(c.kv_precision, KvPrecision::F16, "llama.cpp's default");
        let reference = llama.reference_logits(&tokens).unwrap();
        for precision in [KvPrecision::F16, KvPrecision::F32] {
            let llama = load(&metadata(), &tensors)
                .unwrap()
                .with_kv_precision(precision);
            let dense = dense_decoder(&tensors, llama.config().clone());
            let from_file = fresh_logits(&llama, &tokens, Rows::All);
            let in_memory = fresh_logits(&dense, &tokens, Rows::All);
            // The reference attends in f32; an f16 cache moves logits by
            // about f16's precision.
            let reference_tolerance = match precision {
                KvPrecision::F32 => 1e-5,
                _ => 1e-2,
            };
            for ((a, b), r) in from_file.iter().zip(&in_memory).zip(reference.iter()) {
                assert!((a - b).abs() < 1e-5, "{precision:?}: {a} vs {b}");
                assert!(
                    (a - r).abs() < reference_tolerance,
                    "{precision:?}: {a} vs reference {r}"
                );
            }
        }
    }
}

#[test]
fn every_missing_metadata_key_is_named() {
    let mut meta = metadata();
    meta.retain(|(key, _)| {
        ![
            "llama.block_count",
            "llama.attention.layer_norm_rms_epsilon",
        ]
        .contains(key)
    });
    let err = load(&meta, &tensors(false)).unwrap_err();
    assert!(
        matches!(&err, TransformerError::MissingMetadata { keys }
            if keys == &["llama.block_count", "llama.attention.layer_norm_rms_epsilon"]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "missing metadata keys: llama.block_count, llama.attention.layer_norm_rms_epsilon"
    );
}

#[test]
fn a_head_count_that_does_not_divide_the_embedding_is_refused() {
    let mut meta = metadata();
    for (key, value) in &mut meta {
        if *key == "llama.attention.head_count" {
            *value = MetadataValue::U32(3);
        }
    }
    let err = load(&meta, &tensors(false)).unwrap_err();
    assert!(
        matches!(
            err,
            TransformerError::HeadCountDoesNotDivide {
                n_embd: 8,
                n_head: 3
            }
        ),
        "{err:?}"
    );
}

#[test]
fn another_architecture_is_refused() {
    let mut meta = metadata();
    meta[0].1 = MetadataValue::String("gpt2".into());
    let err = load(&meta, &tensors(false)).unwrap_err();
    assert!(
        matches!(&err, TransformerError::UnsupportedArchitecture { found } if found == "gpt2"),
        "{err:?}"
    );
}

#[test]
fn every_missing_tensor_is_named() {
    let mut tensors = tensors(false);
    tensors.retain(|t| t.name != "blk.1.ffn_up.weight" && t.name != "output_norm.weight");
    let err = load(&metadata(), &tensors).unwrap_err();
    assert!(
        matches!(&err, TransformerError::MissingTensors { names }
            if names == &["output_norm.weight", "blk.1.ffn_up.weight"]),
        "{err:?}"
    );
}

#[test]
fn a_tensor_of_the_wrong_shape_is_named() {
    let mut tensors = tensors(false);
    let wk = tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.attn_k.weight")
        .unwrap();
    wk.values = Array2::zeros((N_EMBD, N_EMBD));
    let err = load(&metadata(), &tensors).unwrap_err();
    assert!(
        matches!(&err, TransformerError::TensorShape { name, expected, found }
            if name == "blk.0.attn_k.weight" && expected == &[8, 4] && found == &[8, 8]),
        "{err:?}"
    );
}
