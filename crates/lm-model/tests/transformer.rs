//! The cached forward pass against the uncached paths, on both toy
//! architectures (GPT-2 style, and llama style with RoPE, grouped-query
//! attention and SwiGLU): random prefixes, batched prefill, editing a
//! token, forking, and typed errors.

use lm_core::{Error, LanguageModel, Rows, SequenceState, TokenId, Uncached, argmax};
use lm_model::{
    Decoder, DecoderWeights, KV_CHUNK_LEN as CHUNK_LEN, Linear, PositionKind, SlidingWindow, Toy,
    ToyArchitecture, TransformerConfig, TransformerError,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common::fresh_logits;

const TOLERANCE: f32 = 1e-5;

fn toys(context_length: usize) -> Vec<Decoder> {
    [ToyArchitecture::Gpt2, ToyArchitecture::Llama]
        .into_iter()
        .map(|arch| Toy::with_options(arch, context_length, Toy::SEED).unwrap())
        .collect()
}

fn assert_close(actual: &[f32], expected: &[f32], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!((a - e).abs() <= TOLERANCE, "{what}: logit {i}: {a} vs {e}");
    }
}

fn random_tokens(rng: &mut ChaCha8Rng, len: usize) -> Vec<TokenId> {
    (0..len).map(|_| rng.random_range(0..7)).collect()
}

#[test]
fn cached_logits_equal_the_reference_and_the_uncached_adapter_on_random_prefixes() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for (arch, toy) in [ToyArchitecture::Gpt2, ToyArchitecture::Llama]
        .into_iter()
        .zip(toys(40))
    {
        let uncached = Uncached(Toy::with_options(arch, 40, Toy::SEED).unwrap());
        for case in 0..60 {
            let len = rng.random_range(1..=40);
            let tokens = random_tokens(&mut rng, len);
            let reference = toy.reference_logits(&tokens).unwrap();
            // Prefill a random-length block, then one token at a time.
            let prefill = rng.random_range(1..=len);
            let mut state = toy.new_state();
            let mut uncached_state = uncached.new_state();
            let mut logits = Vec::new();
            let mut uncached_logits = Vec::new();
            toy.forward(&mut state, &tokens[..prefill], Rows::All, &mut logits)
                .unwrap();
            for (row, expected) in logits.chunks_exact(7).zip(reference.rows()) {
                assert_close(row, expected.as_slice().unwrap(), "prefill row");
            }
            uncached
                .forward(
                    &mut uncached_state,
                    &tokens[..prefill],
                    Rows::Last,
                    &mut uncached_logits,
                )
                .unwrap();
            for (pos, &token) in tokens.iter().enumerate().skip(prefill) {
                toy.forward(&mut state, &[token], Rows::Last, &mut logits)
                    .unwrap();
                uncached
                    .forward(
                        &mut uncached_state,
                        &[token],
                        Rows::Last,
                        &mut uncached_logits,
                    )
                    .unwrap();
                let expected = reference.row(pos);
                let what = format!("{arch:?} case {case} pos {pos}");
                assert_close(&logits, expected.as_slice().unwrap(), &what);
                assert_close(&uncached_logits, expected.as_slice().unwrap(), &what);
                assert_eq!(
                    argmax(&logits),
                    argmax(expected.as_slice().unwrap()),
                    "{what}"
                );
                assert_eq!(argmax(&logits), argmax(&uncached_logits), "{what}");
            }
            assert_eq!(state.pos(), len);
        }
    }
}

#[test]
fn all_rows_and_last_row_agree() {
    for toy in toys(16) {
        let tokens = [0, 1, 2, 3, 4, 5, 6, 0, 1];
        let all = fresh_logits(&toy, &tokens, Rows::All);
        let last = fresh_logits(&toy, &tokens, Rows::Last);
        assert_eq!(all.len(), 9 * 7);
        assert_close(&last, &all[8 * 7..], "last row");
    }
}

#[test]
fn editing_a_token_then_truncating_equals_a_fresh_run() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for toy in toys(60) {
        for _ in 0..20 {
            let len = rng.random_range(2..=60);
            let mut tokens = random_tokens(&mut rng, len);
            let mut state = toy.new_state();
            let mut logits = Vec::new();
            toy.forward(&mut state, &tokens, Rows::Last, &mut logits)
                .unwrap();
            // Edit the token at `edit`: everything from there is stale.
            let edit = rng.random_range(0..len);
            tokens[edit] = (tokens[edit] + 1) % 7;
            state.truncate(edit);
            assert_eq!(state.pos(), edit);
            toy.forward(&mut state, &tokens[edit..], Rows::All, &mut logits)
                .unwrap();
            let reference = toy.reference_logits(&tokens).unwrap();
            for (row, pos) in logits.chunks_exact(7).zip(edit..) {
                assert_close(row, reference.row(pos).as_slice().unwrap(), "after edit");
            }
        }
    }
}

#[test]
fn forked_states_continue_independently_and_equal_fresh_runs() {
    for toy in toys(100) {
        let prefix: Vec<TokenId> = (0..CHUNK_LEN as TokenId + 5).map(|i| i % 7).collect();
        let mut parent = toy.new_state();
        let mut logits = Vec::new();
        toy.forward(&mut parent, &prefix, Rows::Last, &mut logits)
            .unwrap();
        let mut forks: Vec<_> = (0..3).map(|_| parent.clone()).collect();
        for fork in &forks {
            assert_eq!(fork.cache().shared_positions(parent.cache()), prefix.len());
        }
        // Each fork continues with its own tokens, the parent with none.
        let continuations: [&[TokenId]; 3] = [&[1, 2, 3], &[6], &[4, 4, 4, 4, 4]];
        for (fork, continuation) in forks.iter_mut().zip(continuations) {
            for &token in continuation {
                toy.forward(fork, &[token], Rows::Last, &mut logits)
                    .unwrap();
            }
            let mut full = prefix.clone();
            full.extend_from_slice(continuation);
            let reference = toy.reference_logits(&full).unwrap();
            assert_close(
                &logits,
                reference.row(full.len() - 1).as_slice().unwrap(),
                "fork",
            );
            // The first, full chunk is still shared; only the chunk they
            // write to was copied.
            assert_eq!(fork.cache().shared_positions(parent.cache()), CHUNK_LEN);
        }
        toy.forward(&mut parent, &[5], Rows::Last, &mut logits)
            .unwrap();
        let mut full = prefix.clone();
        full.push(5);
        let reference = toy.reference_logits(&full).unwrap();
        assert_close(
            &logits,
            reference.row(full.len() - 1).as_slice().unwrap(),
            "parent",
        );
    }
}

#[test]
fn bad_input_is_a_typed_error_and_leaves_the_state_alone() {
    for toy in toys(8) {
        let mut state = toy.new_state();
        let mut logits = Vec::new();
        toy.forward(&mut state, &[0, 1], Rows::Last, &mut logits)
            .unwrap();
        let refused: [(&[TokenId], Rows, Error); 3] = [
            (&[], Rows::Last, Error::EmptyInput),
            (
                &[1, 7],
                Rows::Last,
                Error::TokenOutOfRange {
                    id: 7,
                    vocab_size: 7,
                },
            ),
            (
                &[1; 7],
                Rows::All,
                Error::ContextExceeded { len: 9, max: 8 },
            ),
        ];
        for (tokens, rows, expected) in refused {
            let got = toy.forward(&mut state, tokens, rows, &mut logits);
            assert_eq!(got, Err(expected), "{tokens:?}");
        }
        assert_eq!(state.pos(), 2);
        assert!(matches!(
            toy.reference_logits(&[0; 9]),
            Err(Error::ContextExceeded { len: 9, max: 8 })
        ));
    }
}

/// A one-layer config of the toy llama's kinds (RMSNorm with eps 1e-5, RoPE
/// of base 10000 over 4 dimensions, SwiGLU, an f32 cache) at smaller sizes,
/// with a tied unembedding.
fn tiny_config() -> TransformerConfig {
    let toy_llama = Toy::with_options(ToyArchitecture::Llama, 4, Toy::SEED).unwrap();
    TransformerConfig {
        vocab_size: 5,
        n_embd: 8,
        n_layer: 1,
        n_head: 2,
        n_kv_head: 1,
        head_dim: 4,
        ffn_dim: 6,
        context_length: 4,
        tied_output: true,
        ..toy_llama.config().clone()
    }
}

#[test]
fn inconsistent_configurations_name_the_problem() {
    let check = |edit: fn(&mut TransformerConfig), expected: &str| {
        let mut config = tiny_config();
        edit(&mut config);
        let err = config.validate().unwrap_err();
        assert_eq!(err.to_string(), expected);
    };
    // The head width need not be n_embd / n_head (qwen3, gemma3); the
    // GGUF mapping checks that division where it derives the width.
    let mut wider_heads = tiny_config();
    (wider_heads.n_head, wider_heads.head_dim) = (3, 8);
    assert!(wider_heads.validate().is_ok());
    check(
        |c| {
            c.options.sliding_window = Some(SlidingWindow {
                window: 0,
                period: 6,
                rope_base: 10000.0,
            })
        },
        "sliding window of 0 positions every 6 layers: both must be positive",
    );
    check(
        |c| c.options.rope.freq_factors = Some(vec![1.0]),
        "1 rope frequency factors for 2 rotated pairs",
    );
    check(
        |c| c.options.embedding_scale = Some(f32::NAN),
        "embedding scale must be finite and positive, got NaN",
    );
    check(
        |c| (c.n_head, c.head_dim, c.n_kv_head) = (4, 2, 3),
        "key/value head count 3 does not divide the head count 4",
    );
    check(
        |c| {
            c.position = PositionKind::Rope {
                base: 10000.0,
                dim: 3,
            }
        },
        "rotary embedding of dimension 3 and base 10000 does not fit heads of 4",
    );
    check(|c| c.n_layer = 0, "n_layer must be positive");
    assert!(tiny_config().validate().is_ok());
}

#[test]
fn a_weight_of_the_wrong_shape_is_named() {
    let c = tiny_config();
    let zeros = |rows, cols| Linear::dense(ndarray::Array2::zeros((rows, cols)));
    let weights = DecoderWeights {
        token_embedding: zeros(5, 8),
        position_embedding: None,
        layers: Vec::new(),
        final_norm: lm_model::Norm::rms_norm(vec![1.0; 8], 1e-5),
        output: Some(zeros(5, 7)),
    };
    let err = Decoder::new(c, weights).unwrap_err();
    assert!(
        matches!(&err, TransformerError::TensorShape { name, expected, found }
            if name == "output" && expected == &[5, 8] && found == &[5, 7]),
        "{err}"
    );
}
