//! Beam search and exhaustive enumeration against brute force computed
//! from the model's per-prefix logits alone.

use crate::common::{PrefixModel, rejects};
use lm_core::{Counting, TokenId};
use lm_decode::{
    BeamConfig, Error, GenerationConfig, LogitAdjustments, SamplingConfig, StopReason, beam_search,
    enumerate_best, enumerate_continuations, generate, length_penalized_score,
};

/// ln p(token | prefix) in f64, straight from the definition.
fn logprob(model: &PrefixModel, prefix: &[TokenId], token: TokenId) -> f64 {
    let logits = model.logits_for(prefix);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&z| f64::from(z - max).exp()).sum();
    f64::from(logits[token as usize] - max) - sum.ln()
}

/// Every hypothesis of at most `n` tokens, stopping at an end token.
fn brute_force(
    model: &PrefixModel,
    prompt: &[TokenId],
    n: usize,
    end: &[TokenId],
) -> Vec<(Vec<TokenId>, f64)> {
    let mut out = Vec::new();
    let mut stack = vec![(Vec::new(), 0.0)];
    while let Some((tokens, lp)) = stack.pop() {
        let ended = tokens.last().is_some_and(|t| end.contains(t));
        if ended || tokens.len() == n {
            out.push((tokens, lp));
            continue;
        }
        let prefix: Vec<TokenId> = prompt.iter().chain(&tokens).copied().collect();
        for t in 0..model.vocab_size as TokenId {
            let mut next = tokens.clone();
            next.push(t);
            stack.push((next, lp + logprob(model, &prefix, t)));
        }
    }
    out
}

#[test]
fn gnmt_length_penalty_by_hand() {
    // ((5 + 3) / 6)^0.6 = exp(0.6 ln(4/3)) = 1.188402; -3 / 1.188402 = -2.524399.
    assert_eq!(
        format!("{:.6}", length_penalized_score(-3.0, 3, 0.6)),
        "-2.524399"
    );
    assert_eq!(length_penalized_score(-3.0, 1, 0.6), -3.0);
    assert_eq!(length_penalized_score(-3.0, 10, 0.0), -3.0);
}

#[test]
fn wide_beam_without_penalty_returns_exactly_the_enumerated_ranking() {
    for (v, n) in [(3usize, 3usize), (4, 2), (2, 4)] {
        let model = PrefixModel::new(v).with_salt(v as u64);
        let total = v.pow(n as u32);
        let all = enumerate_continuations(&model, &[1], n, total).unwrap();
        for width in [total, total + 5] {
            let config = BeamConfig {
                num_beams: width,
                length_penalty: 0.0,
                max_new_tokens: n,
                ..BeamConfig::default()
            };
            let beams = beam_search(&model, &[1], &config).unwrap();
            assert_eq!(beams.len(), total);
            for (beam, continuation) in beams.iter().zip(&all.continuations) {
                assert_eq!(beam.tokens, continuation.tokens);
                assert_eq!(beam.logprob, continuation.logprob);
                assert_eq!(beam.stop_reason, StopReason::MaxNewTokens);
            }
        }
    }
}

#[test]
fn wide_beam_with_end_tokens_and_penalty_matches_brute_force_scores() {
    // V = 3, n = 3, end token 0: 1 + 2 + 4 + 8 = 15 hypotheses in all.
    let model = PrefixModel::new(3).with_salt(9);
    let mut expected: Vec<(Vec<TokenId>, f64)> = brute_force(&model, &[2], 3, &[0])
        .into_iter()
        .map(|(tokens, lp)| {
            let score = lp / ((5.0 + tokens.len() as f64) / 6.0).powf(f64::from(0.6f32));
            (tokens, score)
        })
        .collect();
    assert_eq!(expected.len(), 15);
    expected.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let config = BeamConfig {
        num_beams: 15,
        length_penalty: 0.6,
        max_new_tokens: 3,
        end_tokens: vec![0],
        ..BeamConfig::default()
    };
    let beams = beam_search(&model, &[2], &config).unwrap();
    assert_eq!(beams.len(), 15);
    for (beam, (tokens, score)) in beams.iter().zip(&expected) {
        assert_eq!(&beam.tokens, tokens);
        assert!(
            (beam.score - score).abs() < 1e-6,
            "{tokens:?}: {} vs {score}",
            beam.score
        );
        let ended = tokens.last() == Some(&0);
        assert_eq!(beam.stop_reason.is_finished(), ended);
    }
}

#[test]
fn lesson_002_beam_four_alpha_point_six() {
    let model = PrefixModel::new(7);
    let config = BeamConfig {
        max_new_tokens: 5,
        end_tokens: vec![6],
        ..BeamConfig::default()
    };
    assert_eq!((config.num_beams, config.length_penalty), (4, 0.6));
    let beams = beam_search(&model, &[0, 1, 2], &config).unwrap();
    assert_eq!(beams.len(), 4);
    for (i, beam) in beams.iter().enumerate() {
        // Per-step log-probabilities from scratch, summing to the total.
        let mut prefix = vec![0, 1, 2];
        for (&token, &step) in beam.tokens.iter().zip(&beam.step_logprobs) {
            assert!((step - logprob(&model, &prefix, token)).abs() < 1e-5);
            prefix.push(token);
        }
        assert_eq!(beam.step_logprobs.len(), beam.tokens.len());
        let sum: f64 = beam.step_logprobs.iter().sum();
        assert!((sum - beam.logprob).abs() < 1e-12);
        assert_eq!(
            beam.score,
            length_penalized_score(beam.logprob, beam.tokens.len(), 0.6)
        );
        if let Some(next) = beams.get(i + 1) {
            assert!(beam.score >= next.score);
        }
        let ended = beam.tokens.last() == Some(&6);
        assert_eq!(
            beam.stop_reason,
            if ended {
                StopReason::EndToken(6)
            } else {
                StopReason::MaxNewTokens
            }
        );
        assert!(
            !beam.tokens[..beam.tokens.len() - 1].contains(&6),
            "a finished beam is not extended"
        );
    }
}

#[test]
fn beam_of_one_is_greedy() {
    let model = PrefixModel::new(9);
    let config = BeamConfig {
        num_beams: 1,
        max_new_tokens: 7,
        ..BeamConfig::default()
    };
    let beam = beam_search(&model, &[4], &config).unwrap();
    let greedy = GenerationConfig {
        max_new_tokens: 7,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    assert_eq!(
        beam[0].tokens,
        generate(&model, &[4], &greedy, None).unwrap().tokens
    );
}

#[test]
fn beam_search_stops_at_the_context_bound_and_never_feeds_the_last_token() {
    let model = Counting::new(PrefixModel::new(3).with_context(4));
    let config = BeamConfig {
        num_beams: 2,
        max_new_tokens: 10,
        ..BeamConfig::default()
    };
    let beams = beam_search(&model, &[0, 1], &config).unwrap();
    assert!(
        beams
            .iter()
            .all(|b| b.tokens.len() == 2 && b.stop_reason == StopReason::ContextBound)
    );
    // Prefill, then the two beams of step 1 each fed once; step 2 feeds nothing.
    assert_eq!(model.calls(), vec![2, 1, 1]);
}

#[test]
fn beam_parameters_are_checked() {
    let model = PrefixModel::new(3);
    let check = rejects(BeamConfig::default(), |config| {
        beam_search(&model, &[0], config).err()
    });
    check(|c| c.num_beams = 0, Error::InvalidNumBeams { value: 0 });
    let nan_alpha = Error::InvalidLengthPenalty { value: f32::NAN };
    check(|c| c.length_penalty = f32::NAN, nan_alpha);
    let out_of_range = Error::Core(lm_core::Error::TokenOutOfRange {
        id: 3,
        vocab_size: 3,
    });
    check(|c| c.end_tokens = vec![3], out_of_range);
    let overflow = Error::MaxNewTokensOverflow {
        prompt_len: 1,
        max_new_tokens: usize::MAX,
    };
    check(|c| c.max_new_tokens = usize::MAX, overflow);
}

#[test]
fn lesson_001_seven_to_the_fourth_continuations() {
    // "Seven candidates at each of four steps make 2,401 possible continuations."
    let model = Counting::new(PrefixModel::new(7));
    let all = enumerate_continuations(&model, &[0, 1, 2], 4, 2_401).unwrap();
    assert_eq!(all.continuations.len(), 2_401);
    // One forward per internal tree node: the prompt, then 7 + 49 + 343 single tokens.
    let calls = model.calls();
    assert_eq!(calls.len(), 1 + 7 + 49 + 343);
    assert_eq!(model.positions(), 3 + 7 + 49 + 343);
    // The chain rule makes the probabilities of all continuations sum to 1.
    let total: f64 = all.continuations.iter().map(|c| c.logprob.exp()).sum();
    assert!((total - 1.0).abs() < 1e-5, "{total}");
    // Each continuation's log-probability from scratch.
    for c in all.continuations.iter().step_by(97) {
        let mut prefix = vec![0, 1, 2];
        let mut lp = 0.0;
        for &t in &c.tokens {
            lp += logprob(&model.inner, &prefix, t);
            prefix.push(t);
        }
        assert!((lp - c.logprob).abs() < 1e-5);
    }
    // The greedy continuation is greedy decoding's, ranked by brute force.
    let greedy = GenerationConfig {
        max_new_tokens: 4,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    assert_eq!(
        all.greedy,
        generate(&model.inner, &[0, 1, 2], &greedy, None)
            .unwrap()
            .tokens
    );
    let greedy_lp = all.continuations[all.greedy_rank - 1].logprob;
    assert_eq!(all.continuations[all.greedy_rank - 1].tokens, all.greedy);
    let n_better = all
        .continuations
        .iter()
        .filter(|c| c.logprob > greedy_lp)
        .count();
    assert_eq!(all.greedy_rank, n_better + 1);
    assert!(
        all.continuations
            .windows(2)
            .all(|w| w[0].logprob >= w[1].logprob)
    );
}

#[test]
fn enumerate_best_keeps_the_best_few_and_ranks_greedy_among_all() {
    // Regression (issue 33): `--top 5 --limit 10000000000` reserved room for
    // every continuation (77 GB for SmolLM2's 49,152^2) and aborted. The best
    // few are kept in a heap; the greedy rank and the count cover them all.
    for salt in 0..40u64 {
        let model = PrefixModel::new(7).with_salt(salt);
        let all = enumerate_continuations(&model, &[0, 1, 2], 4, 2_401).unwrap();
        for n_best in [1, 3, 10, 2_401, 5_000] {
            let best = enumerate_best(&model, &[0, 1, 2], 4, 2_401, Some(n_best)).unwrap();
            assert_eq!(best.n_total, 2_401);
            assert_eq!(
                best.continuations[..],
                all.continuations[..n_best.min(2_401)]
            );
            assert_eq!(
                (&best.greedy, best.greedy_rank, best.greedy_logprob),
                (&all.greedy, all.greedy_rank, all.greedy_logprob)
            );
        }
        assert_eq!(
            all.continuations[all.greedy_rank - 1].logprob,
            all.greedy_logprob
        );
    }
    let model = PrefixModel::new(7);
    let none = enumerate_best(&model, &[0], 3, 343, Some(0)).unwrap();
    assert!(none.continuations.is_empty());
    assert_eq!(none.n_total, 343);
}

#[test]
fn greedy_can_be_overtaken_at_a_later_length() {
    // Lesson 001, "Where the greedy run is overtaken": greedy is the most
    // probable continuation at two and three tokens but not at four. Some
    // small per-prefix model shows the same; find one, then check it.
    let found = (0..200u64).find_map(|salt| {
        let model = PrefixModel::new(7).with_salt(salt);
        let ranks: Vec<usize> = (2..=4)
            .map(|n| {
                enumerate_continuations(&model, &[0, 1, 2], n, 2_401)
                    .unwrap()
                    .greedy_rank
            })
            .collect();
        (ranks[0] == 1 && ranks[1] == 1 && ranks[2] > 1).then_some((model, ranks[2]))
    });
    let (model, rank) = found.expect("a model where greedy is overtaken at four tokens");
    let all = enumerate_continuations(&model, &[0, 1, 2], 4, 2_401).unwrap();
    let best = &all.continuations[0];
    assert_ne!(best.tokens, all.greedy);
    assert!(best.logprob > all.continuations[rank - 1].logprob);
}

#[test]
fn enumeration_refuses_past_the_limit() {
    let model = PrefixModel::new(7);
    assert_eq!(
        enumerate_continuations(&model, &[0], 4, 2_400).err(),
        Some(Error::TooManyContinuations {
            vocab_size: 7,
            n_steps: 4,
            limit: 2_400
        })
    );
    assert!(matches!(
        enumerate_continuations(&model, &[0], 1_000, usize::MAX),
        Err(Error::TooManyContinuations { n_steps: 1_000, .. })
    ));
    let zero = enumerate_continuations(&model, &[0], 0, 1).unwrap();
    assert_eq!((zero.continuations.len(), zero.greedy_rank), (1, 1));
}

#[test]
fn a_cancelled_beam_search_returns_what_a_shorter_search_returns() {
    // Stopping after step k (0-based) leaves the hypotheses of a search
    // limited to k + 1 tokens: the same tokens, log-probabilities, scores and
    // order; the live ones say Cancelled instead of MaxNewTokens.
    let model = PrefixModel::new(6).with_salt(5);
    for stop_after in 0..4 {
        let config = BeamConfig {
            num_beams: 3,
            max_new_tokens: 8,
            end_tokens: vec![0],
            ..BeamConfig::default()
        };
        let mut steps = Vec::new();
        let cancelled = lm_decode::beam_search_streaming(&model, &[2], &config, |step| {
            steps.push(*step);
            Ok::<_, lm_decode::Error>(if step.index == stop_after {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            })
        })
        .unwrap();
        assert_eq!(
            steps.iter().map(|s| s.index).collect::<Vec<_>>(),
            (0..=stop_after).collect::<Vec<_>>()
        );
        let shorter = beam_search(
            &model,
            &[2],
            &BeamConfig {
                max_new_tokens: stop_after + 1,
                ..config.clone()
            },
        )
        .unwrap();
        assert_eq!(cancelled.len(), shorter.len());
        for (got, want) in cancelled.iter().zip(&shorter) {
            assert_eq!(
                (&got.tokens, got.logprob, got.score),
                (&want.tokens, want.logprob, want.score)
            );
            let expected_reason = match want.stop_reason {
                StopReason::MaxNewTokens => StopReason::Cancelled,
                ref other => other.clone(),
            };
            assert_eq!(got.stop_reason, expected_reason);
        }
        let last = steps.last().unwrap();
        let n_cancelled = cancelled
            .iter()
            .filter(|h| h.stop_reason == StopReason::Cancelled)
            .count();
        // Live beams outranked by finished ones may fall off the list.
        assert!(n_cancelled >= 1 && n_cancelled <= last.n_live);
    }
}

#[test]
fn a_failing_beam_hook_ends_the_search_with_its_error() {
    #[derive(Debug, PartialEq)]
    enum HookError {
        Failed { index: usize },
        Decode(Error),
    }
    impl From<Error> for HookError {
        fn from(error: Error) -> Self {
            Self::Decode(error)
        }
    }
    let model = Counting::new(PrefixModel::new(6));
    let config = BeamConfig {
        num_beams: 2,
        max_new_tokens: 8,
        ..BeamConfig::default()
    };
    let mut n_steps = 0;
    let result = lm_decode::beam_search_streaming(&model, &[2], &config, |step| {
        n_steps += 1;
        if step.index == 1 {
            Err(HookError::Failed { index: step.index })
        } else {
            Ok(std::ops::ControlFlow::Continue(()))
        }
    });
    assert_eq!(result, Err(HookError::Failed { index: 1 }));
    assert_eq!(n_steps, 2, "no step after the failing one");
    // The prompt, then two beams per step for two steps: the search stopped there.
    assert_eq!(model.calls(), vec![1, 1, 1, 1, 1]);
    let bad = BeamConfig {
        num_beams: 0,
        ..config
    };
    assert_eq!(
        lm_decode::beam_search_streaming(&model, &[2], &bad, |_| Ok(
            std::ops::ControlFlow::Continue(())
        )),
        Err(HookError::Decode(Error::InvalidNumBeams { value: 0 }))
    );
}

/// ln p'(token | prefix) where p' is the softmax of the logits after a
/// presence penalty on every token of `prefix` and a bias, by hand in f64.
fn adjusted_logprob(
    model: &PrefixModel,
    prefix: &[TokenId],
    token: TokenId,
    presence: f32,
    bias: &[(TokenId, f32)],
) -> f64 {
    let mut logits: Vec<f64> = model
        .logits_for(prefix)
        .iter()
        .map(|&z| f64::from(z))
        .collect();
    for (id, z) in logits.iter_mut().enumerate() {
        if prefix.contains(&(id as TokenId)) {
            *z -= f64::from(presence);
        }
    }
    for &(id, b) in bias {
        logits[id as usize] += f64::from(b);
    }
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|&z| (z - max).exp()).sum();
    logits[token as usize] - max - sum.ln()
}

#[test]
fn beam_search_ranks_by_adjusted_logprobs_and_reports_the_models() {
    let model = PrefixModel::new(3).with_salt(4);
    let (prompt, presence, bias) = ([2, 1], 3.0, vec![(1, 0.5)]);
    let config = BeamConfig {
        num_beams: 27,
        length_penalty: 0.0,
        max_new_tokens: 3,
        adjustments: LogitAdjustments {
            presence_penalty: Some(presence),
            logit_bias: bias.clone(),
            ..LogitAdjustments::default()
        },
        n_top_candidates: 2,
        ..BeamConfig::default()
    };
    let beams = beam_search(&model, &prompt, &config).unwrap();
    // Brute force over all 27 continuations, by the adjusted sums.
    let mut expected: Vec<(Vec<TokenId>, f64, f64)> = brute_force(&model, &prompt, 3, &[])
        .into_iter()
        .map(|(tokens, raw)| {
            let adjusted = (0..tokens.len())
                .map(|i| {
                    let prefix = [&prompt[..], &tokens[..i]].concat();
                    adjusted_logprob(&model, &prefix, tokens[i], presence, &bias)
                })
                .sum();
            (tokens, adjusted, raw)
        })
        .collect();
    expected.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    assert_eq!(beams.len(), 27);
    for (beam, (tokens, adjusted, raw)) in beams.iter().zip(&expected) {
        assert_eq!(&beam.tokens, tokens);
        assert!((beam.score - adjusted).abs() < 1e-5, "{tokens:?}");
        assert!((beam.logprob - raw).abs() < 1e-5, "{tokens:?}");
        let sum: f64 = beam.adjusted_step_logprobs.iter().sum();
        assert!((sum - adjusted).abs() < 1e-5);
        // Each step's two most probable tokens under the model.
        assert_eq!(beam.top_candidates.len(), 3);
        for (i, top) in beam.top_candidates.iter().enumerate() {
            let prefix = [&prompt[..], &tokens[..i]].concat();
            let mut ranked: Vec<(TokenId, f64)> =
                (0..3).map(|t| (t, logprob(&model, &prefix, t))).collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let got: Vec<TokenId> = top.iter().map(|c| c.token).collect();
            assert_eq!(got, [ranked[0].0, ranked[1].0], "{tokens:?} step {i}");
            assert!((top[0].logprob - ranked[0].1).abs() < 1e-5);
        }
    }
    // Without adjustments the ranking is the model's: adjusted equals raw.
    let plain = beam_search(
        &model,
        &prompt,
        &BeamConfig {
            adjustments: LogitAdjustments::default(),
            ..config
        },
    )
    .unwrap();
    for beam in &plain {
        assert_eq!(beam.adjusted_step_logprobs, beam.step_logprobs);
    }
    assert_ne!(
        plain[0].tokens, beams[0].tokens,
        "the adjustments change the best"
    );
}
