//! Structured output: the constraint mask is one more stage of the policy.
//! Checked against brute force over lm-core's `SequenceChoice` (one of a
//! list of token sequences): constrained greedy is the argmax over the
//! allowed tokens, sampling renormalises over them, end tokens come only
//! when the output is complete, and speculative decoding agrees.

use crate::common::{DraftFn, PrefixModel, TableModel, go_on};

use lm_core::{SequenceChoice, TokenId};
use lm_decode::{
    BeamConfig, Drafter, Error, GenerationConfig, OutputConstraint, SamplingConfig, Stage,
    StopReason, beam_search, generate, generate_many, generate_speculative,
};

/// Sixteen sequences of 1 to 6 tokens over a 12-token vocabulary, sharing
/// prefixes (so the mask has several tokens at most steps).
fn sequences() -> Vec<Vec<TokenId>> {
    let mut sequences = Vec::new();
    let mut h = 0x1234_5678_u64;
    for _ in 0..16 {
        let mut next = || {
            h = h.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (h >> 33) as u32
        };
        let len = 1 + (next() % 6) as usize;
        sequences.push((0..len).map(|_| 1 + next() % 4).collect());
    }
    sequences
}

fn constrained(sampling: SamplingConfig, end_tokens: Vec<TokenId>) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 10,
        sampling,
        end_tokens,
        constraint: Some(OutputConstraint::new(
            SequenceChoice::new(12, sequences()).unwrap(),
        )),
        ..GenerationConfig::default()
    }
}

/// The tokens that may follow `read` (end token 0 when `read` is complete).
fn allowed_after(read: &[TokenId], end: Option<TokenId>) -> Vec<TokenId> {
    let mut allowed: Vec<TokenId> = sequences()
        .iter()
        .filter(|s| s.len() > read.len() && s.starts_with(read))
        .map(|s| s[read.len()])
        .collect();
    if let Some(end) = end
        && sequences().iter().any(|s| s == read)
    {
        allowed.push(end);
    }
    allowed.sort_unstable();
    allowed.dedup();
    allowed
}

#[test]
fn constrained_greedy_is_the_argmax_over_the_allowed_tokens() {
    for salt in 0..20 {
        let model = PrefixModel::new(12).with_salt(salt);
        let prompt = [5, 6];
        let run = generate(
            &model,
            &prompt,
            &constrained(SamplingConfig::greedy(), vec![0]),
            None,
        )
        .unwrap();
        let mut prefix = prompt.to_vec();
        for (index, step) in run.steps.iter().enumerate() {
            let read = &run.tokens[..index];
            let allowed = allowed_after(read, Some(0));
            let logits = model.logits_for(&prefix);
            let best = *allowed
                .iter()
                .max_by(|&&a, &&b| {
                    logits[a as usize]
                        .total_cmp(&logits[b as usize])
                        .then(b.cmp(&a))
                })
                .unwrap();
            assert_eq!(step.token, best, "salt {salt}, step {index}");
            assert_eq!(
                step.n_candidates.get(Stage::Constraint),
                Some(allowed.len())
            );
            // Wherever the unconstrained argmax is allowed, it is the choice.
            let free = lm_core::argmax(&logits).unwrap();
            if allowed.contains(&free) {
                assert_eq!(step.token, free);
            }
            prefix.push(step.token);
        }
        let generated: Vec<TokenId> = run.tokens.iter().copied().filter(|&t| t != 0).collect();
        assert!(
            sequences().contains(&generated),
            "salt {salt}: {generated:?}"
        );
        assert!(run.is_finished(), "salt {salt}: {:?}", run.stop_reason);
    }
}

#[test]
fn sampling_renormalises_the_policy_over_the_allowed_tokens() {
    let model = PrefixModel::new(12).with_salt(3);
    let sampling = SamplingConfig {
        temperature: 0.8,
        top_k: Some(3),
        ..SamplingConfig::default()
    };
    let config = GenerationConfig {
        num_return_sequences: 10,
        ..constrained(sampling, vec![0])
    };
    for run in generate_many(&model, &[1], &config, None).unwrap() {
        let mut prefix = vec![1];
        for (index, step) in run.steps.iter().enumerate() {
            let allowed = allowed_after(&run.tokens[..index], Some(0));
            // Brute force: softmax at T = 0.8 over the allowed tokens, then
            // the top 3 of them renormalised.
            let logits = model.logits_for(&prefix);
            let mut kept: Vec<(TokenId, f64)> = allowed
                .iter()
                .map(|&t| (t, (f64::from(logits[t as usize]) / 0.8).exp()))
                .collect();
            kept.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            kept.truncate(3);
            let total: f64 = kept.iter().map(|&(_, w)| w).sum();
            let (_, w) = kept
                .iter()
                .find(|&&(t, _)| t == step.token)
                .expect("the token is among the kept allowed ones");
            assert!((f64::from(step.policy_prob) - w / total).abs() < 1e-5);
            prefix.push(step.token);
        }
        assert!(run.is_finished());
    }
}

#[test]
fn an_end_token_comes_only_once_the_output_is_complete() {
    // The model always prefers the end token 0, then token 3.
    let row: Vec<f32> = (0..12)
        .map(|t| match t {
            0 => 5.0,
            3 => 1.0,
            _ => 0.0,
        })
        .collect();
    let model = TableModel {
        table: vec![row; 12],
        context_length: None,
    };
    let choice = SequenceChoice::new(12, vec![vec![3, 3], vec![3, 3, 3, 3]]).unwrap();
    let config = GenerationConfig {
        max_new_tokens: 10,
        sampling: SamplingConfig::greedy(),
        end_tokens: vec![0],
        constraint: Some(OutputConstraint::new(choice)),
        ..GenerationConfig::default()
    };
    let run = generate(&model, &[1], &config, None).unwrap();
    assert_eq!(run.tokens, vec![3, 3, 0], "the end token waits for [3, 3]");
    assert_eq!(run.stop_reason, StopReason::EndToken(0));
    // Without an end token to choose, the run goes on to the longer one,
    // where nothing more can follow.
    let run = generate(
        &model,
        &[1],
        &GenerationConfig {
            end_tokens: vec![],
            ..config.clone()
        },
        None,
    )
    .unwrap();
    assert_eq!(run.tokens, vec![3, 3, 3, 3]);
    assert_eq!(run.stop_reason, StopReason::ConstraintComplete);
    assert!(run.is_finished());
    let message = StopReason::ConstraintComplete.to_string();
    assert_eq!(message, "the constrained output is complete");
}

#[test]
fn an_unconstrained_run_is_unchanged_by_the_stage() {
    let model = PrefixModel::new(12);
    let sampling = SamplingConfig {
        temperature: 0.9,
        top_p: Some(0.9),
        seed: 11,
        ..SamplingConfig::default()
    };
    let free = GenerationConfig {
        max_new_tokens: 12,
        sampling,
        ..GenerationConfig::default()
    };
    // A constraint that allows every token at each of 3 steps: the same
    // tokens, draws and probabilities as no constraint.
    let mut all = Vec::new();
    fn extend(prefix: Vec<TokenId>, depth: usize, out: &mut Vec<Vec<TokenId>>) {
        if depth == 0 {
            out.push(prefix);
            return;
        }
        for t in 0..12 {
            let mut next = prefix.clone();
            next.push(t);
            extend(next, depth - 1, out);
        }
    }
    extend(Vec::new(), 3, &mut all);
    let allow_all = GenerationConfig {
        max_new_tokens: 3,
        constraint: Some(OutputConstraint::new(SequenceChoice::new(12, all).unwrap())),
        ..free.clone()
    };
    let a = generate(
        &model,
        &[2],
        &GenerationConfig {
            max_new_tokens: 3,
            ..free
        },
        None,
    )
    .unwrap();
    let b = generate(&model, &[2], &allow_all, None).unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(b.stop_reason, StopReason::ConstraintComplete);
    for (x, y) in a.steps.iter().zip(&b.steps) {
        assert_eq!(x.policy_prob, y.policy_prob);
        assert_eq!(x.u, y.u);
    }
}

/// Proposes the tokens of a hash of the context, mostly forbidden ones.
fn scattered() -> impl Drafter {
    DraftFn::new(|context, max_tokens, draft| {
        let mut h = context.iter().fold(7u64, |h, &t| h * 31 + u64::from(t));
        for _ in 0..3.min(max_tokens) {
            h = h.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            draft.push(((h >> 33) % 12) as TokenId);
        }
    })
}

#[test]
fn speculative_decoding_rejects_forbidden_drafts_and_agrees_with_the_plain_loop() {
    for salt in 0..10 {
        let model = PrefixModel::new(12).with_salt(salt);
        let config = constrained(SamplingConfig::greedy(), vec![0]);
        let plain = generate(&model, &[4], &config, None).unwrap();
        let (fast, _) =
            generate_speculative(&model, &[4], &config, None, scattered(), go_on).unwrap();
        assert_eq!(fast.tokens, plain.tokens, "salt {salt}");
        assert_eq!(fast.stop_reason, plain.stop_reason);
        // Sampled: every token is allowed where it was chosen.
        let config = constrained(
            SamplingConfig {
                seed: salt,
                ..SamplingConfig::default()
            },
            vec![0],
        );
        let (run, _) =
            generate_speculative(&model, &[4], &config, None, scattered(), go_on).unwrap();
        for (index, &token) in run.tokens.iter().enumerate() {
            assert!(allowed_after(&run.tokens[..index], Some(0)).contains(&token));
        }
    }
}

#[test]
fn a_constraint_for_another_vocabulary_is_refused() {
    let config = GenerationConfig {
        constraint: Some(OutputConstraint::new(
            SequenceChoice::new(5, vec![vec![1]]).unwrap(),
        )),
        ..GenerationConfig::default()
    };
    assert_eq!(
        generate(&PrefixModel::new(12), &[1], &config, None).err(),
        Some(Error::ConstraintVocabulary {
            constraint: 5,
            model: 12
        })
    );
}

#[test]
fn a_wide_beam_search_finds_the_most_probable_allowed_output() {
    for salt in 0..10 {
        let model = PrefixModel::new(12).with_salt(salt);
        let prompt = [9];
        let config = BeamConfig {
            num_beams: 40,
            length_penalty: 0.0,
            max_new_tokens: 10,
            end_tokens: vec![0],
            constraint: Some(OutputConstraint::new(
                SequenceChoice::new(12, sequences()).unwrap(),
            )),
            ..BeamConfig::default()
        };
        let beams = beam_search(&model, &prompt, &config).unwrap();
        // Brute force: every allowed output, ended by the end token where
        // a longer sequence could have gone on, scored by the model.
        let logprob = |tokens: &[TokenId]| -> f64 {
            let mut prefix = prompt.to_vec();
            let mut total = 0.0;
            for &t in tokens {
                let lp = lm_core::log_softmax(&model.logits_for(&prefix), 1.0).unwrap();
                total += f64::from(lp[t as usize]);
                prefix.push(t);
            }
            total
        };
        let outputs: Vec<Vec<TokenId>> = sequences()
            .into_iter()
            .map(|s| {
                let extended = sequences()
                    .iter()
                    .any(|other| other.len() > s.len() && other.starts_with(&s));
                if extended { [s, vec![0]].concat() } else { s }
            })
            .collect();
        let best = outputs
            .iter()
            .max_by(|a, b| logprob(a).total_cmp(&logprob(b)))
            .unwrap();
        assert_eq!(&beams[0].tokens, best, "salt {salt}");
        assert!((beams[0].logprob - logprob(best)).abs() < 1e-4);
        for beam in &beams {
            assert!(outputs.contains(&beam.tokens), "{:?}", beam.tokens);
            let expected = if beam.tokens.last() == Some(&0) {
                StopReason::EndToken(0)
            } else {
                StopReason::ConstraintComplete
            };
            assert_eq!(beam.stop_reason, expected);
        }
    }
}
