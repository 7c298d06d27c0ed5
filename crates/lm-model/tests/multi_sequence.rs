//! The multi-sequence step (`forward_batch` with one token per sequence, one
//! pass over the weights) against each sequence stepped alone: the logits
//! must be the same bits, on both toy architectures, SmolLM2 and Gemma 3
//! (sliding-window layers), for sequences at different positions.

use lm_core::{Error, LanguageModel, Rows, TokenId};
use lm_model::catalog::GEMMA3_270M;
use lm_model::{Decoder, Llama, Toy, ToyArchitecture};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common::smollm2_path;

/// Reads a random prompt into each of `n_seqs` states (lengths differ), then
/// steps them `n_steps` times together and, on clones, one by one; every
/// step's logits must agree bit for bit, and no sequence's logits buffer may
/// keep room for the batch's rows (a server's waiting sequences would each
/// hold that much).
fn check_steps_equal_solo_steps(model: &Decoder, n_seqs: usize, n_steps: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let vocab = model.vocab_size() as u32;
    let mut together = Vec::new();
    let mut logits = vec![Vec::new(); n_seqs];
    for logits in &mut logits {
        let len = rng.random_range(1..=12);
        let prompt: Vec<TokenId> = (0..len).map(|_| rng.random_range(0..vocab)).collect();
        let mut state = model.new_state();
        model
            .forward(&mut state, &prompt, Rows::Last, logits)
            .unwrap();
        together.push(state);
    }
    let mut alone = together.clone();
    let mut alone_logits = logits.clone();
    for step in 0..n_steps {
        let next: Vec<[TokenId; 1]> = (0..n_seqs).map(|_| [rng.random_range(0..vocab)]).collect();
        let slices: Vec<&[TokenId]> = next.iter().map(|t| t.as_slice()).collect();
        model
            .forward_batch(&mut together, &slices, &mut logits)
            .unwrap();
        for (b, row) in logits.iter().enumerate() {
            assert!(
                row.capacity() < 2 * vocab as usize,
                "sequence {b} of {n_seqs}: its logits buffer has room for {} values",
                row.capacity()
            );
        }
        for (b, (state, out)) in alone.iter_mut().zip(&mut alone_logits).enumerate() {
            model.forward(state, &next[b], Rows::Last, out).unwrap();
            let bits = |row: &[f32]| row.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&logits[b]),
                bits(out),
                "sequence {b} of {n_seqs}, step {step}: batched logits differ from solo ones"
            );
        }
    }
}

#[test]
fn toy_sequences_stepped_together_equal_each_stepped_alone() {
    for arch in [ToyArchitecture::Gpt2, ToyArchitecture::Llama] {
        let model = Toy::with_options(arch, 64, Toy::SEED).unwrap();
        for (n_seqs, seed) in [(2, 1), (3, 2), (7, 3)] {
            check_steps_equal_solo_steps(&model, n_seqs, 10, seed);
        }
    }
}

#[test]
fn a_batch_with_a_bad_row_is_an_error_and_changes_no_state() {
    let model = Toy::with_options(ToyArchitecture::Llama, 16, Toy::SEED).unwrap();
    let mut states = vec![model.new_state(), model.new_state()];
    let mut logits = vec![Vec::new(), Vec::new()];
    model
        .forward_batch(&mut states, &[&[1], &[2]], &mut logits)
        .unwrap();
    let result = model.forward_batch(&mut states, &[&[1], &[99]], &mut logits);
    assert_eq!(
        result,
        Err(Error::TokenOutOfRange {
            id: 99,
            vocab_size: 7
        })
    );
    assert_eq!(
        states
            .iter()
            .map(lm_core::SequenceState::pos)
            .collect::<Vec<_>>(),
        vec![1, 1]
    );
    let result = model.forward_batch(&mut states, &[&[1]], &mut logits);
    assert_eq!(result, Err(Error::LengthMismatch { left: 2, right: 1 }));
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_sequences_stepped_together_equal_each_stepped_alone() {
    let model = Llama::from_gguf(smollm2_path()).unwrap();
    check_steps_equal_solo_steps(&model, 5, 4, 11);
}

#[test]
#[ignore = "needs Gemma 3 270M: cargo xtask fetch-model gemma3-270m"]
fn gemma3_sequences_stepped_together_equal_each_stepped_alone() {
    let path = GEMMA3_270M.path().unwrap_or_else(|err| panic!("{err}"));
    let model = Llama::from_gguf(path).unwrap();
    check_steps_equal_solo_steps(&model, 3, 3, 12);
}
