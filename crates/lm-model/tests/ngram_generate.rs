//! The n-gram model through lm-core's trait and lm-decode's loop.

use lm_core::{Detokenize, LanguageModel, Rows, SequenceState, Uncached};
use lm_decode::{GenerationConfig, SamplingConfig, StopReason, generate};
use lm_model::ngram::{LN_10, NgramModel, TrainOptions, embedded_default, train};

use crate::common::fixture_path;

fn tiny_model() -> NgramModel {
    let path = fixture_path("ngram/tiny-kn3.arpa");
    NgramModel::read_arpa(std::fs::read(path).unwrap().as_slice()).unwrap()
}

#[test]
fn logits_are_natural_log_probabilities_with_bos_masked() {
    let model = tiny_model();
    let vocab = model.vocab();
    let the = vocab.id("the").unwrap();
    let cat = vocab.id("cat").unwrap();
    let mut state = model.new_state();
    let mut logits = Vec::new();
    model
        .forward(&mut state, &[the, cat], Rows::All, &mut logits)
        .unwrap();
    assert_eq!(logits.len(), 2 * vocab.len());
    assert_eq!(state.pos(), 2);
    for (row, context) in [
        (0, vec![vocab.bos(), the]),
        (1, vec![vocab.bos(), the, cat]),
    ] {
        let logits_row = &logits[row * vocab.len()..(row + 1) * vocab.len()];
        for w in 0..vocab.len() as u32 {
            if w == vocab.bos() {
                assert_eq!(logits_row[w as usize], f32::NEG_INFINITY);
                continue;
            }
            // The scoring path (one word at a time) agrees with the row path.
            let log10_p = model.log10_prob(&context, w).log10_prob;
            assert!((logits_row[w as usize] - log10_p * LN_10).abs() < 1e-5);
        }
        let total: f32 = logits_row.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-4, "{total}");
    }
    // The cached state equals the uncached reference, and truncation forks.
    let reference = Uncached(model.clone());
    let mut uncached_state = reference.new_state();
    let mut uncached = Vec::new();
    reference
        .forward(&mut uncached_state, &[the, cat], Rows::Last, &mut uncached)
        .unwrap();
    assert_eq!(uncached, logits[vocab.len()..]);
    state.truncate(1);
    assert_eq!(state.tokens(), [the]);
    assert!(
        model
            .forward(&mut state, &[vocab.len() as u32], Rows::Last, &mut logits)
            .is_err()
    );
}

#[test]
fn greedy_generation_matches_a_hand_rolled_argmax() {
    let model = tiny_model();
    let vocab = model.vocab();
    let config = GenerationConfig {
        max_new_tokens: 30,
        sampling: SamplingConfig::greedy(),
        end_tokens: vec![vocab.eos()],
        ..GenerationConfig::default()
    };
    let run = generate(&model, &[vocab.bos()], &config, Some(&model)).unwrap();
    // By hand: at every step take the word with the highest log10 p(w | history)
    // through the scoring path (lowest id on ties), skipping <s>.
    let mut history = vec![vocab.bos()];
    let mut expected = Vec::new();
    for _ in 0..30 {
        let best = (0..vocab.len() as u32)
            .filter(|&w| w != vocab.bos())
            .fold(None, |best: Option<(u32, f32)>, w| {
                let p = model.log10_prob(&history, w).log10_prob;
                match best {
                    Some((_, bp)) if bp >= p => best,
                    _ => Some((w, p)),
                }
            })
            .unwrap()
            .0;
        expected.push(best);
        history.push(best);
        if best == vocab.eos() {
            break;
        }
    }
    assert_eq!(run.tokens, expected);
    assert_eq!(run.stop_reason, StopReason::EndToken(vocab.eos()));
    assert_eq!(model.decode(&run.tokens), "the cat sat on the mat.\n");
}

#[test]
fn embedded_model_writes_english_like_text() {
    let model = embedded_default().unwrap();
    let vocab = model.vocab();
    let prompt: Vec<u32> = ["And", "God", "said"]
        .iter()
        .map(|w| vocab.id(w).unwrap())
        .collect();
    let config = GenerationConfig {
        max_new_tokens: 40,
        sampling: SamplingConfig {
            seed: 7,
            ..SamplingConfig::default()
        },
        end_tokens: vec![vocab.eos()],
        ..GenerationConfig::default()
    };
    let run = generate(&model, &prompt, &config, Some(&model)).unwrap();
    assert!(!run.tokens.is_empty());
    assert!(run.tokens.iter().all(|&t| t != vocab.bos()));
    let text = model.decode(&run.tokens);
    // Every generated word is a KJV word, and the trigram model keeps each
    // step plausible: the mean log-probability per token stays far above
    // that of uniform choice over ~13k words (ln 13000 ≈ 9.5).
    let mean_logprob = run.steps.iter().map(|s| s.logprob).sum::<f64>() / run.steps.len() as f64;
    assert!(mean_logprob > -6.0, "{mean_logprob}: {text}");
    assert!(!text.contains(" ,") && !text.contains(" ."), "{text}");
}

/// `<unk>` keeps its probability in the logits (scoring through the trait
/// agrees with `score`), so plain sampling can write it; banning it in the
/// sampler, as the model's docs say and lm-cli does, never writes it.
#[test]
fn sampling_writes_unk_unless_the_sampler_bans_it() {
    let model = train("a b\nb a\n".as_bytes(), &TrainOptions::default(), |_| {}).unwrap();
    let vocab = model.vocab();
    let unk = vocab.unk();
    let mut state = model.new_state();
    let mut logits = Vec::new();
    model
        .forward(&mut state, &[vocab.bos()], Rows::Last, &mut logits)
        .unwrap();
    let unk_logit = logits[unk as usize];
    assert!(unk_logit.is_finite(), "{unk_logit}");
    let log10_unk = model.score(["zebra"], true, false).words[0].log10_prob;
    assert!((unk_logit - log10_unk * LN_10).abs() < 1e-5);

    let n_unk = |banned_tokens: Vec<u32>| {
        let config = GenerationConfig {
            max_new_tokens: 200,
            sampling: SamplingConfig {
                banned_tokens,
                seed: 3,
                ..SamplingConfig::default()
            },
            ..GenerationConfig::default()
        };
        let run = generate(&model, &[vocab.bos()], &config, None).unwrap();
        assert_eq!(run.tokens.len(), 200);
        run.tokens.iter().filter(|&&t| t == unk).count()
    };
    assert!(n_unk(Vec::new()) > 0, "plain sampling can write <unk>");
    assert_eq!(n_unk(vec![unk]), 0);
}
