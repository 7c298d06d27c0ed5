//! The generation loop: forward-call pattern (lesson 001's 25 vs 7), stop
//! reasons, stop strings, truncation, traces checked against the model's
//! logits recomputed from scratch, determinism and streaming.

use crate::common::{LESSON_VOCAB, Pieces, PrefixModel, TableModel, rejects};
use std::ops::ControlFlow;

use lm_core::{Counting, Detokenize, TokenId, Uncached, sample_inverse_cdf, softmax};
use lm_decode::{
    Error, Generation, GenerationConfig, SamplingConfig, Stage, StopReason, Truncation, generate,
    generate_many, generate_streaming,
};

const PROMPT: [TokenId; 3] = [0, 1, 2]; // <start> the cat

fn sampling(max_new_tokens: usize, seed: u64) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        sampling: SamplingConfig {
            seed,
            ..SamplingConfig::default()
        },
        ..GenerationConfig::default()
    }
}

#[test]
fn lesson_001_cached_reads_7_positions_uncached_25() {
    // "Positions read without a cache = 3 + 4 + 5 + 6 + 7 = 25"; with a cache
    // the prompt once and then one new position per step.
    let config = sampling(5, 0);
    let cached = Counting::new(PrefixModel::new(7));
    let fast = generate(&cached, &PROMPT, &config, None).unwrap();
    assert_eq!(cached.calls(), vec![3, 1, 1, 1, 1]);
    assert_eq!(cached.positions(), 7);
    let reference = Uncached(Counting::new(PrefixModel::new(7)));
    let slow = generate(&reference, &PROMPT, &config, None).unwrap();
    assert_eq!(reference.0.calls(), vec![3, 4, 5, 6, 7]);
    assert_eq!(reference.0.positions(), 25);
    assert_eq!(
        fast, slow,
        "the cache changes the cost, not the tokens or their probabilities"
    );
    let prefixes: Vec<usize> = fast.steps.iter().map(|s| s.prefix_len).collect();
    assert_eq!(prefixes, vec![3, 4, 5, 6, 7]);
}

#[test]
fn lesson_001_context_bound_five_stops_after_two_tokens() {
    for max_new_tokens in [2, 5, 100] {
        let model = Counting::new(PrefixModel::new(7).with_context(5));
        let run = generate(&model, &PROMPT, &sampling(max_new_tokens, 0), None).unwrap();
        assert_eq!(run.tokens.len(), 2, "max_new_tokens {max_new_tokens}");
        let expected = if max_new_tokens == 2 {
            StopReason::MaxNewTokens
        } else {
            StopReason::ContextBound
        };
        assert_eq!(run.stop_reason, expected);
        assert!(!run.is_finished(), "a limit truncates");
        assert_eq!(model.calls(), vec![3, 1], "the last token is never fed");
    }
}

/// A table where token t is followed by `next[t]` with logit 5 (others 0).
fn chain(next: &[TokenId]) -> TableModel {
    let v = next.len();
    TableModel {
        table: next
            .iter()
            .map(|&n| {
                (0..v)
                    .map(|i| if i == n as usize { 5.0 } else { 0.0 })
                    .collect()
            })
            .collect(),
        context_length: None,
    }
}

fn greedy(max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    }
}

#[test]
fn any_of_several_end_tokens_stops_and_is_kept_last() {
    // SmolLM2 has three end tokens (0, 2, 4). 1 -> 3 -> 4.
    let model = chain(&[1, 3, 0, 4, 1, 0]);
    let config = GenerationConfig {
        end_tokens: vec![0, 2, 4],
        ..greedy(10)
    };
    let run = generate(&model, &[1], &config, None).unwrap();
    assert_eq!(run.tokens, vec![3, 4]);
    assert_eq!(run.stop_reason, StopReason::EndToken(4));
    assert!(run.is_finished());
    // Without end tokens the same model runs to the limit.
    let run = generate(&model, &[1], &greedy(4), None).unwrap();
    assert_eq!(
        (run.tokens, run.stop_reason),
        (vec![3, 4, 1, 3], StopReason::MaxNewTokens)
    );
}

#[test]
fn stop_strings_match_across_tokens_and_cut_the_text() {
    // 1 -> 2 -> 3 -> 4 -> 5 -> 5 ...; pieces: "ab" + "c" + "d!" + "e".
    let model = chain(&[0, 2, 3, 4, 5, 5]);
    let pieces = Pieces(vec!["", "x", "ab", "c", "d!", "e"]);
    let check =
        |stops: &[&str], expected_tokens: &[TokenId], expected_text: &str, expected: StopReason| {
            let config = GenerationConfig {
                stop_strings: stops.iter().map(|s| s.to_string()).collect(),
                ..greedy(6)
            };
            let run = generate(&model, &[1], &config, Some(&pieces)).unwrap();
            assert_eq!(run.tokens, expected_tokens, "{stops:?}");
            assert_eq!(run.text.as_deref(), Some(expected_text), "{stops:?}");
            assert_eq!(run.stop_reason, expected, "{stops:?}");
        };
    check(&["bc"], &[2, 3], "a", StopReason::StopString("bc".into()));
    check(
        &["!"],
        &[2, 3, 4],
        "abcd",
        StopReason::StopString("!".into()),
    );
    check(
        &["zzz", "cd"],
        &[2, 3, 4],
        "ab",
        StopReason::StopString("cd".into()),
    );
    check(
        &["e", "!e"],
        &[2, 3, 4, 5],
        "abcd",
        StopReason::StopString("!e".into()),
    );
    check(&["abc"], &[2, 3], "", StopReason::StopString("abc".into()));
    check(
        &["q"],
        &[2, 3, 4, 5, 5, 5],
        "abcd!eee",
        StopReason::MaxNewTokens,
    );
    assert!(StopReason::StopString("x".into()).is_finished());
}

/// Words joined by spaces, as a SentencePiece decoder joins pieces: a
/// word's leading space shows only after another word.
struct Words(&'static [&'static str]);

impl Detokenize for Words {
    fn decode(&self, ids: &[TokenId]) -> String {
        let words: Vec<&str> = ids.iter().map(|&id| self.0[id as usize]).collect();
        words.join(" ")
    }
}

#[test]
fn text_is_what_the_steps_hand_out_and_is_cut_at_a_stop_string_that_spans_the_prompt_boundary() {
    // 1 -> 2 -> 3 -> 4; decoded after the prompt "go", the text grows by
    // " the cat sat": the first word's space exists only in context.
    let model = chain(&[0, 2, 3, 4, 4]);
    let words = Words(&["", "go", "the", "cat", "sat"]);
    let run = generate(&model, &[1], &greedy(3), Some(&words)).unwrap();
    let streamed: String = run.steps.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(run.text.as_deref(), Some(" the cat sat"));
    assert_eq!(streamed + &run.held_back_text, " the cat sat");
    // A stop string that starts with that space stops the run and is cut
    // from the text, as from the stream.
    let config = GenerationConfig {
        stop_strings: vec![" the".into()],
        ..greedy(3)
    };
    let run = generate(&model, &[1], &config, Some(&words)).unwrap();
    assert_eq!(run.stop_reason, StopReason::StopString(" the".into()));
    assert_eq!((run.tokens, run.text.as_deref()), (vec![2], Some("")));
}

#[test]
fn text_leaves_out_a_final_end_token() {
    let model = chain(&[0, 2, 3, 6, 0, 0, 0]);
    let vocab = Pieces(LESSON_VOCAB.to_vec());
    let config = GenerationConfig {
        end_tokens: vec![6],
        ..greedy(10)
    };
    let run = generate(&model, &[1], &config, Some(&vocab)).unwrap();
    assert_eq!(run.tokens, vec![2, 3, 6]);
    assert_eq!(run.text.as_deref(), Some("catdog"));
    assert_eq!(generate(&model, &[1], &config, None).unwrap().text, None);
}

#[test]
fn steps_record_policy_and_model_probabilities_against_a_recomputation() {
    // Lesson 001: at T = 0.5 the selected token's share differs from T = 1.
    let model = PrefixModel::new(7);
    let config = GenerationConfig {
        max_new_tokens: 6,
        sampling: SamplingConfig {
            temperature: 0.5,
            top_k: Some(3),
            seed: 3,
            ..SamplingConfig::default()
        },
        n_top_candidates: 4,
        ..GenerationConfig::default()
    };
    let run = generate(&model, &PROMPT, &config, None).unwrap();
    assert_eq!(run.steps.len(), 6);
    let mut total_ln = 0.0f64;
    let mut policy_ln = 0.0f64;
    for (i, step) in run.steps.iter().enumerate() {
        let (prompt, generated) = run.prefix(i).unwrap();
        let prefix: Vec<TokenId> = prompt.iter().chain(generated).copied().collect();
        assert_eq!(
            (step.index, step.prefix_len, prefix.len()),
            (i, 3 + i, 3 + i)
        );
        let logits = model.logits_for(&prefix);
        let model_probs: Vec<f64> = softmax(&logits, 1.0)
            .unwrap()
            .iter()
            .map(|&p| f64::from(p))
            .collect();
        // Policy by hand: softmax at T = 0.5 over the three best, renormalised.
        let mut order: Vec<usize> = (0..7).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let kept_weight: f64 = order[..3]
            .iter()
            .map(|&j| (f64::from(logits[j]) / 0.5).exp())
            .sum();
        let t = step.token as usize;
        assert!(order[..3].contains(&t));
        let policy = (f64::from(logits[t]) / 0.5).exp() / kept_weight;
        assert!((f64::from(step.policy_prob) - policy).abs() < 1e-6);
        assert!((f64::from(step.model_prob) - model_probs[t]).abs() < 1e-6);
        assert!((step.logprob - model_probs[t].ln()).abs() < 1e-6);
        assert!((step.policy_logprob - policy.ln()).abs() < 1e-5);
        assert!(
            (step.policy_prob - step.model_prob).abs() > 1e-3,
            "the policy is not the model"
        );
        total_ln += step.logprob;
        policy_ln += step.policy_logprob;
        assert!((step.running_logprob.ln() - total_ln).abs() < 1e-12);
        assert_eq!(step.running_logprob.n_tokens(), i + 1);
        assert!((step.running_policy_logprob.ln() - policy_ln).abs() < 1e-12);
        // Top candidates: model's four best by probability; the policy's three survivors.
        let model_top: Vec<usize> = step.model_top.iter().map(|c| c.token as usize).collect();
        assert_eq!(model_top, order[..4].to_vec());
        for c in &step.model_top {
            assert!((f64::from(c.prob) - model_probs[c.token as usize]).abs() < 1e-6);
            assert!((c.logprob - model_probs[c.token as usize].ln()).abs() < 1e-6);
            assert_eq!(c.logit, logits[c.token as usize]);
        }
        let policy_top: Vec<usize> = step.policy_top.iter().map(|c| c.token as usize).collect();
        assert_eq!(policy_top, order[..3].to_vec());
        // One computation, one type: the chosen token's entries in both
        // lists are its step's log-probabilities bit for bit (issue 42).
        let entry =
            |list: &[lm_decode::Candidate]| *list.iter().find(|c| c.token == step.token).unwrap();
        assert_eq!(entry(&step.model_top).logprob, step.logprob);
        assert_eq!(entry(&step.policy_top).logprob, step.policy_logprob);
        let mass: f32 = step.policy_top.iter().map(|c| c.prob).sum();
        assert!((mass - 1.0).abs() < 1e-6);
    }
    assert!((run.logprob().ln() - total_ln).abs() < 1e-12);
    assert!((run.policy_logprob().ln() - policy_ln).abs() < 1e-12);
    assert_eq!(run.prefix(6), None);
}

#[test]
fn no_top_candidates_when_n_is_zero() {
    let run = generate(&PrefixModel::new(5), &[1], &sampling(3, 0), None).unwrap();
    assert!(
        run.steps
            .iter()
            .all(|s| s.model_top.is_empty() && s.policy_top.is_empty())
    );
}

#[test]
fn same_seed_same_tokens_different_seeds_differ() {
    let model = PrefixModel::new(16);
    let first = generate(&model, &[3], &sampling(30, 11), None).unwrap();
    let again = generate(&model, &[3], &sampling(30, 11), None).unwrap();
    assert_eq!(first, again);
    // A uniform model: every token equally likely, so only the seed decides.
    let uniform = TableModel {
        table: vec![vec![0.0; 16]; 16],
        context_length: None,
    };
    let a = generate(&uniform, &[0], &sampling(20, 1), None).unwrap();
    let b = generate(&uniform, &[0], &sampling(20, 2), None).unwrap();
    assert_ne!(a.tokens, b.tokens);
    let distinct: std::collections::BTreeSet<_> = a.tokens.iter().collect();
    assert!(
        distinct.len() > 5,
        "20 uniform draws over 16 tokens: {:?}",
        a.tokens
    );
}

#[test]
fn greedy_ignores_the_seed() {
    let model = PrefixModel::new(9);
    let runs: Vec<Vec<TokenId>> = [0, 1, 99]
        .into_iter()
        .map(|seed| {
            let config = GenerationConfig {
                sampling: SamplingConfig {
                    temperature: 0.0,
                    seed,
                    ..SamplingConfig::default()
                },
                ..greedy(8)
            };
            generate(&model, &PROMPT, &config, None).unwrap().tokens
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
    // And greedy is the argmax of the recomputed logits at every step.
    let mut prefix = PROMPT.to_vec();
    for &token in &runs[0] {
        assert_eq!(token, lm_core::argmax(&model.logits_for(&prefix)).unwrap());
        prefix.push(token);
    }
}

#[test]
fn stop_reasons_read_as_sentences_that_say_when_the_text_was_cut() {
    for (reason, sentence) in [
        (StopReason::EndToken(2), "the end token (id 2) was chosen"),
        (
            StopReason::StopString("\n\n".into()),
            r#"the text reached the stop string "\n\n""#,
        ),
        (
            StopReason::MaxNewTokens,
            "the new-token limit was reached (truncated)",
        ),
        (
            StopReason::ContextBound,
            "prompt and new tokens filled the context (truncated)",
        ),
        (StopReason::Cancelled, "the run was interrupted (truncated)"),
    ] {
        assert_eq!(reason.to_string(), sentence);
        assert_eq!(
            sentence.ends_with("(truncated)"),
            !reason.is_finished(),
            "{reason:?}"
        );
    }
}

#[test]
fn the_streaming_hook_sees_every_step_in_order() {
    let mut seen = Vec::new();
    let model = PrefixModel::new(7);
    let run = generate_streaming(&model, &PROMPT, &sampling(5, 4), None, |step| {
        seen.push(step.clone());
        Ok::<_, Error>(ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(seen, run.steps);
}

#[test]
fn the_hook_can_cancel_the_run_after_a_step() {
    let model = Counting::new(PrefixModel::new(7));
    let config = GenerationConfig {
        end_tokens: Vec::new(),
        ..sampling(5, 0)
    };
    let full = generate(&PrefixModel::new(7), &PROMPT, &config, None).unwrap();
    let run = generate_streaming(&model, &PROMPT, &config, None, |step| {
        Ok::<_, Error>(if step.index == 1 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    })
    .unwrap();
    assert_eq!(run.stop_reason, StopReason::Cancelled);
    assert!(!run.is_finished(), "a cancelled run is truncated");
    assert_eq!(
        run.tokens,
        full.tokens[..2],
        "the same tokens up to the cancel"
    );
    // The prompt and the first token were fed; the second (last) never was.
    assert_eq!(model.calls(), vec![3, 1]);
}

/// What a caller's hook fails with: its own error, or the loop's.
#[derive(Debug, PartialEq)]
enum HookError {
    Unshowable { index: usize },
    Decode(Error),
}

impl From<Error> for HookError {
    fn from(error: Error) -> Self {
        Self::Decode(error)
    }
}

#[test]
fn a_failing_hook_ends_the_run_with_its_error() {
    let model = Counting::new(PrefixModel::new(7));
    let run = generate_streaming(&model, &PROMPT, &sampling(5, 0), None, |step| {
        if step.index == 1 {
            Err(HookError::Unshowable { index: step.index })
        } else {
            Ok(ControlFlow::Continue(()))
        }
    });
    assert_eq!(run, Err(HookError::Unshowable { index: 1 }));
    // The run stopped at the failing step, as a cancel does: the prompt and
    // the first token were fed, the second never was.
    assert_eq!(model.calls(), vec![3, 1]);
}

#[test]
fn the_loops_own_errors_reach_a_fallible_hooks_caller() {
    let config = GenerationConfig {
        num_return_sequences: 0,
        ..sampling(5, 0)
    };
    let run = generate_streaming(&PrefixModel::new(7), &PROMPT, &config, None, |_| {
        Err(HookError::Unshowable { index: 0 })
    });
    assert_eq!(
        run,
        Err(HookError::Decode(Error::InvalidNumReturnSequences {
            value: 0
        }))
    );
}

#[test]
fn several_outputs_read_the_prompt_once_and_use_one_stream_each() {
    let model = Counting::new(PrefixModel::new(12));
    let config = GenerationConfig {
        num_return_sequences: 3,
        ..sampling(6, 5)
    };
    let outputs = generate_many(&model, &PROMPT, &config, None).unwrap();
    assert_eq!(
        model.calls().iter().filter(|&&n| n == 3).count(),
        1,
        "one prefill"
    );
    assert_eq!(model.positions(), 3 + 3 * 5);
    // After the prefill, the three outputs read their tokens together: one
    // batch of 3 rows for each of the 5 tokens each feeds.
    assert_eq!(model.batches(), vec![3; 5]);
    for (j, output) in outputs.iter().enumerate() {
        let alone = GenerationConfig {
            rng_stream: j as u64,
            ..sampling(6, 5)
        };
        assert_eq!(
            output,
            &generate(&model.inner, &PROMPT, &alone, None).unwrap(),
            "stream {j}"
        );
        assert_eq!(output.rng_stream, j as u64);
    }
    assert_ne!(outputs[0].tokens, outputs[1].tokens);
    assert_ne!(outputs[1].tokens, outputs[2].tokens);
}

#[test]
fn a_long_prompt_is_refused_or_truncated_by_policy() {
    let model = PrefixModel::new(7).with_context(5);
    let long: Vec<TokenId> = vec![0, 1, 2, 3, 4, 5];
    assert_eq!(
        generate(&model, &long, &sampling(3, 0), None),
        Err(Error::PromptExceedsContext { len: 6, max: 5 })
    );
    assert_eq!(
        generate(&model, &long[..5], &sampling(3, 0), None),
        Err(Error::PromptExceedsContext { len: 5, max: 5 }),
        "a prompt that fills the context leaves no room"
    );
    let config = GenerationConfig {
        truncation: Truncation::KeepHead { n_head: 1 },
        ..sampling(3, 0)
    };
    // Room for the 3 new tokens asked for, at most half of what the head
    // leaves (2 of 4): the head and the 2 most recent tokens.
    let run = generate(&model, &long, &config, None).unwrap();
    assert_eq!(run.prompt, vec![0, 4, 5]);
    assert_eq!(run.n_prompt_dropped, 3);
    assert_eq!(
        (run.tokens.len(), run.stop_reason),
        (2, StopReason::ContextBound)
    );
    let expected = generate(&model, &[0, 4, 5], &sampling(3, 0), None).unwrap();
    assert_eq!(run.tokens, expected.tokens);
}

#[test]
fn bad_generation_inputs_are_typed_errors() {
    let model = PrefixModel::new(7);
    let check = rejects(GenerationConfig::default(), |config| {
        generate(&model, &PROMPT, config, None).err()
    });
    let overflow = Error::MaxNewTokensOverflow {
        prompt_len: 3,
        max_new_tokens: usize::MAX,
    };
    check(|c| c.max_new_tokens = usize::MAX, overflow);
    let no_detokenizer = Error::StopStringsNeedDetokenizer { n_strings: 1 };
    check(|c| c.stop_strings = vec!["x".into()], no_detokenizer);
    let empty_stop = Error::EmptyStopString { index: 1 };
    check(
        |c| c.stop_strings = vec!["x".into(), String::new()],
        empty_stop,
    );
    let out_of_range = |id| Error::Core(lm_core::Error::TokenOutOfRange { id, vocab_size: 7 });
    check(|c| c.end_tokens = vec![7], out_of_range(7));
    check(
        |c| c.sampling.top_k = Some(0),
        Error::InvalidTopK { value: 0 },
    );
    let err =
        |prompt: &[TokenId]| generate(&model, prompt, &GenerationConfig::default(), None).err();
    assert_eq!(err(&[]), Some(Error::EmptyPrompt));
    assert_eq!(err(&[9]), Some(out_of_range(9)));
    assert_eq!(
        generate_many(
            &model,
            &PROMPT,
            &GenerationConfig {
                num_return_sequences: 0,
                ..GenerationConfig::default()
            },
            None
        )
        .err(),
        Some(Error::InvalidNumReturnSequences { value: 0 })
    );
    let nan = TableModel {
        table: vec![vec![0.0, f32::NAN]; 2],
        context_length: None,
    };
    assert!(matches!(
        generate(&nan, &[0], &GenerationConfig::default(), None),
        Err(Error::Core(lm_core::Error::InvalidLogit { index: 1, .. }))
    ));
}

#[test]
fn zero_new_tokens_reads_nothing() {
    let model = Counting::new(PrefixModel::new(7));
    let run: Generation = generate(&model, &PROMPT, &sampling(0, 0), None).unwrap();
    assert!(run.tokens.is_empty() && run.steps.is_empty());
    assert_eq!(run.stop_reason, StopReason::MaxNewTokens);
    assert!(model.calls().is_empty());
}

#[test]
fn penalties_count_the_prompt_and_the_generated_tokens() {
    // A uniform model with a huge presence penalty can never repeat a token
    // of the prompt or of its own output: 6 tokens, 2 in the prompt, 4 new.
    let uniform = TableModel {
        table: vec![vec![0.0; 6]; 6],
        context_length: None,
    };
    let config = GenerationConfig {
        sampling: SamplingConfig {
            presence_penalty: Some(100.0),
            seed: 8,
            ..SamplingConfig::default()
        },
        ..sampling(4, 8)
    };
    let run = generate(&uniform, &[0, 1], &config, None).unwrap();
    let mut all: Vec<TokenId> = [0, 1]
        .into_iter()
        .chain(run.tokens.iter().copied())
        .collect();
    all.sort_unstable();
    assert_eq!(all, vec![0, 1, 2, 3, 4, 5]);
}

/// The candidates each stage leaves, by brute force over the whole row:
/// bans mask, temperature keeps all, top-k by a full sort, top-p by the
/// cumulative mass, min-p by the ratio to the best.
fn stage_counts_by_brute_force(
    adjusted: &[f32],
    t: f64,
    k: usize,
    p: f32,
    ratio: f64,
) -> Vec<(Stage, usize)> {
    let mut kept: Vec<(usize, f32)> = adjusted
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, z)| z != f32::NEG_INFINITY)
        .collect();
    let mut counts = vec![
        (Stage::Vocabulary, adjusted.len()),
        (Stage::Penalties, kept.len()),
    ];
    counts.push((Stage::Temperature, kept.len()));
    kept.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    kept.truncate(k);
    counts.push((Stage::TopK, kept.len()));
    let weights: Vec<f64> = kept
        .iter()
        .map(|&(_, z)| (f64::from(z) / t).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut mass = 0.0;
    let n_nucleus = 1 + weights
        .iter()
        .position(|w| {
            mass += w;
            (mass / total) as f32 >= p
        })
        .unwrap_or(weights.len() - 1);
    kept.truncate(n_nucleus);
    counts.push((Stage::TopP, kept.len()));
    let best = f64::from(kept[0].1);
    kept.retain(|&(_, z)| ((f64::from(z) - best) / t).exp() >= ratio);
    counts.push((Stage::MinP, kept.len()));
    counts
}

#[test]
fn a_sampled_step_replays_from_its_draw_and_policy_candidates_by_the_inverse_cdf() {
    // Lesson 000's walk: the printed u and the printed candidate
    // probabilities give back the chosen token; each stage's count is what
    // that stage leaves by brute force.
    let model = PrefixModel::new(40);
    let banned = [3, 7, 11];
    let sampling = SamplingConfig {
        temperature: 0.9,
        top_k: Some(20),
        top_p: Some(0.8),
        min_p: Some(0.3),
        presence_penalty: Some(0.5),
        banned_tokens: banned.to_vec(),
        seed: 5,
        ..SamplingConfig::default()
    };
    let config = GenerationConfig {
        max_new_tokens: 12,
        sampling,
        n_top_candidates: 40,
        ..GenerationConfig::default()
    };
    let run = generate(&model, &PROMPT, &config, None).unwrap();
    let mut min_p_cut = false;
    for (i, step) in run.steps.iter().enumerate() {
        let u = step.u.expect("a sampled step has its draw");
        let mut probs = vec![0.0f32; 40];
        for c in &step.policy_top {
            probs[c.token as usize] = c.prob;
        }
        assert_eq!(
            sample_inverse_cdf(&probs, u).unwrap(),
            step.token,
            "step {i}"
        );
        let (prompt, generated) = run.prefix(i).unwrap();
        let history: Vec<TokenId> = prompt.iter().chain(generated).copied().collect();
        let mut adjusted = model.logits_for(&history);
        for (id, z) in adjusted.iter_mut().enumerate() {
            if history.contains(&(id as TokenId)) {
                *z -= 0.5; // the presence penalty: once per distinct token
            }
        }
        for &token in &banned {
            adjusted[token as usize] = f32::NEG_INFINITY;
        }
        let expected = stage_counts_by_brute_force(&adjusted, 0.9, 20, 0.8, 0.3);
        assert_eq!(
            step.n_candidates.iter().collect::<Vec<_>>(),
            expected,
            "step {i}"
        );
        assert_eq!(step.n_candidates.last(), Some(step.policy_top.len()));
        min_p_cut |= expected[5].1 < expected[4].1;
    }
    assert!(min_p_cut, "some step's min-p removes a candidate");
}

#[test]
fn a_greedy_step_has_no_draw_and_temperature_keeps_one_candidate() {
    let run = generate(&PrefixModel::new(9), &PROMPT, &greedy(3), None).unwrap();
    for step in &run.steps {
        assert_eq!(step.u, None);
        assert_eq!(
            step.n_candidates.iter().collect::<Vec<_>>(),
            vec![
                (Stage::Vocabulary, 9),
                (Stage::Penalties, 9),
                (Stage::Temperature, 1)
            ]
        );
    }
}
