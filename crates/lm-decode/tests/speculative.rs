//! Speculative decoding: greedy runs give the plain loop's trace token for
//! token (whatever the drafter proposes, wherever a stop rule lands), sampled
//! runs follow the policy's distribution (chi-square against enumeration),
//! and the transformer's state rolls back exactly.

use crate::common::{DraftFn, Pieces, PrefixModel, go_on, smollm2, splitmix};
use std::ops::ControlFlow;

use lm_core::{Detokenize, LanguageModel, Rows, SequenceState, TokenId};
use lm_decode::{
    Draft, DraftLength, DraftMark, Drafter, Generation, GenerationConfig, ModelDrafter,
    PromptLookup, Result, Sampler, SamplingConfig, SpeculationStats, Step, StopReason, generate,
    generate_speculative, generate_streaming,
};
use proptest::prelude::*;

fn speculative<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
    drafter: impl Drafter,
) -> (Generation, SpeculationStats) {
    generate_speculative(model, prompt, config, detokenizer, drafter, go_on).unwrap()
}

/// The trace without the draft marks (which the plain loop never sets).
fn unmarked(run: &Generation) -> Generation {
    let mut run = run.clone();
    for step in &mut run.steps {
        step.draft = DraftMark::NotDrafted;
    }
    run
}

/// Proposes `k` tokens of a known output from where the context is,
/// replacing each with a wrong one when `wrong(position)` says so.
struct Oracle {
    n_prompt: usize,
    output: Vec<TokenId>,
    k: usize,
    vocab_size: u32,
    wrong_every: usize,
    observed: Vec<(usize, usize)>,
}

impl Oracle {
    fn new(
        n_prompt: usize,
        output: &[TokenId],
        k: usize,
        vocab_size: u32,
        wrong_every: usize,
    ) -> Self {
        Self {
            n_prompt,
            output: output.to_vec(),
            k,
            vocab_size,
            wrong_every,
            observed: Vec::new(),
        }
    }
}

impl Drafter for Oracle {
    fn propose(&mut self, context: &[TokenId], max: usize, draft: &mut Draft) -> Result<()> {
        let at = context.len() - self.n_prompt;
        for position in at..(at + self.k.min(max)).min(self.output.len()) {
            let right = self.output[position];
            let wrong = self.wrong_every > 0 && position % self.wrong_every == self.wrong_every - 1;
            draft.push(if wrong {
                (right + 1) % self.vocab_size
            } else {
                right
            });
        }
        Ok(())
    }

    fn observe(&mut self, n_proposed: usize, n_accepted: usize) {
        assert!(n_accepted <= n_proposed);
        self.observed.push((n_proposed, n_accepted));
    }
}

/// Proposes `k` tokens from a hash of the context: a drafter that is
/// mostly wrong, deterministic per context.
fn scattered_drafter(vocab_size: u32, k: usize, salt: u64) -> impl Drafter {
    DraftFn::new(move |context, max_tokens, draft| {
        let mut h = salt;
        for &t in context {
            h = splitmix(h ^ u64::from(t));
        }
        for _ in 0..k.min(max_tokens) {
            h = splitmix(h);
            draft.push((h % u64::from(vocab_size)) as TokenId);
        }
    })
}

/// Draws `k` drafts from `model`'s softmax (a draft model), with its own
/// random stream seeded by `state`, and hands the loop that distribution.
fn sampled(model: PrefixModel, k: usize, mut state: u64) -> impl Drafter {
    DraftFn::new(move |context, max_tokens, draft| {
        let mut prefix = context.to_vec();
        for _ in 0..k.min(max_tokens) {
            let q = lm_core::softmax(&model.logits_for(&prefix), 1.0).unwrap();
            state = splitmix(state);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let token = lm_core::sample_inverse_cdf(&q, u).unwrap();
            draft.push_sampled(token, &q);
            prefix.push(token);
        }
    })
}

const LETTERS: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];

fn greedy(max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        sampling: SamplingConfig::greedy(),
        n_top_candidates: 2,
        ..GenerationConfig::default()
    }
}

/// The greedy config of `max_new_tokens` and the plain loop's run under it.
fn plain_greedy<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    max_new_tokens: usize,
) -> (GenerationConfig, Generation) {
    let config = greedy(max_new_tokens);
    let plain = generate(model, prompt, &config, None).unwrap();
    (config, plain)
}

#[test]
fn an_oracle_draft_is_accepted_whole_and_the_trace_is_the_plain_one() {
    let model = PrefixModel::new(8);
    let prompt = [1, 2, 3];
    let (config, plain) = plain_greedy(&model, &prompt, 20);
    let oracle = Oracle::new(prompt.len(), &plain.tokens, 4, 8, 0);
    let (run, stats) = speculative(&model, &prompt, &config, None, oracle);
    assert_eq!(unmarked(&run), plain);
    // 1 token from the prompt's logits, then 19 in rounds of 4 drafts + 1:
    // 4 passes (5 + 5 + 5 + 4 tokens, the last round drafting 3).
    assert_eq!(
        stats,
        SpeculationStats {
            drafted_tokens: 15,
            accepted_tokens: 15,
            target_passes: 4
        }
    );
    let marks: Vec<DraftMark> = run.steps.iter().map(|step| step.draft).collect();
    assert_eq!(marks[0], DraftMark::NotDrafted);
    assert_eq!(marks[1..5], [DraftMark::Accepted; 4]);
    assert_eq!(marks[5], DraftMark::NotDrafted, "the bonus token");
}

#[test]
fn a_wrong_draft_is_replaced_by_the_targets_token() {
    let model = PrefixModel::new(8);
    let prompt = [4, 4];
    let (config, plain) = plain_greedy(&model, &prompt, 12);
    let mut oracle = Oracle::new(prompt.len(), &plain.tokens, 3, 8, 3);
    let (run, stats) = speculative(&model, &prompt, &config, None, &mut oracle);
    assert_eq!(unmarked(&run), plain);
    // Position 2 is drafted wrong: drafts 1 and 2 (positions 1, 2) give one
    // acceptance and a replacement.
    assert_eq!(run.steps[1].draft, DraftMark::Accepted);
    assert_eq!(
        run.steps[2].draft,
        DraftMark::Replaced {
            draft: (plain.tokens[2] + 1) % 8
        }
    );
    assert_eq!(oracle.observed[0], (3, 1));
    assert!(stats.accepted_tokens < stats.drafted_tokens);
}

#[test]
fn a_hook_that_stops_inside_an_accepted_draft_cancels_there() {
    let model = PrefixModel::new(8);
    let prompt = [1, 2];
    let (config, plain) = plain_greedy(&model, &prompt, 30);
    let stop_at_3 = |step: &Step| {
        Ok::<_, lm_decode::Error>(if step.index == 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    };
    let expected = generate_streaming(&model, &prompt, &config, None, stop_at_3).unwrap();
    let oracle = Oracle::new(prompt.len(), &plain.tokens, 6, 8, 0);
    let (run, _) = generate_speculative(&model, &prompt, &config, None, oracle, stop_at_3).unwrap();
    assert_eq!(run.stop_reason, StopReason::Cancelled);
    assert_eq!(run.tokens.len(), 4);
    assert_eq!(unmarked(&run), expected);
}

#[test]
fn prompt_lookup_proposes_what_followed_the_longest_earlier_match() {
    let any = PromptLookup::new(4).with_ngram_range(1, 32);
    // The end [7, 8] occurred at 1..3, followed by 9, 5, 7, 8.
    assert_eq!(any.lookup(&[1, 7, 8, 9, 5, 7, 8], 4), [9, 5, 7, 8]);
    assert_eq!(any.lookup(&[1, 7, 8, 9, 5, 7, 8], 2), [9, 5]);
    // [2, 7, 8] agrees over 3 tokens at 0..3, the later [1, 7, 8] over 2.
    assert_eq!(any.lookup(&[2, 7, 8, 1, 7, 8, 3, 2, 7, 8], 2), [1, 7]);
    // Only one token agrees anywhere: the latest occurrence.
    assert_eq!(any.lookup(&[5, 1, 5, 2, 6, 5], 3), [2, 6, 5]);
    assert_eq!(any.lookup(&[1, 2, 3], 3), [] as [TokenId; 0]);
    // Inside a repeated run the copy goes on past the context's end.
    assert_eq!(any.lookup(&[9, 5, 5, 5, 5, 5], 3), [5, 5, 5]);
    assert_eq!(any.lookup(&[3, 1, 2, 1, 2], 5), [1, 2, 1, 2, 1]);
    // The default drafts from 3 agreeing tokens or more.
    let default = PromptLookup::new(4);
    assert_eq!(default.lookup(&[2, 7, 8, 1, 7, 8, 3, 2, 7, 8], 2), [1, 7]);
    assert_eq!(
        default.lookup(&[1, 7, 8, 9, 5, 7, 8], 4),
        [] as [TokenId; 0]
    );
    let bigrams = PromptLookup::new(4).with_ngram_range(2, 2);
    assert_eq!(bigrams.lookup(&[5, 1, 5, 2, 6, 5], 3), [] as [TokenId; 0]);
    assert_eq!(bigrams.lookup(&[2, 7, 8, 1, 7, 8, 3, 2, 7, 8], 2), [3, 2]);
}

/// Brute force: the longest agreement of `context`'s end with the tokens
/// before each earlier position, the latest of equals, and what follows.
fn brute_force_lookup(context: &[TokenId], max_match: usize, n: usize) -> (usize, Vec<TokenId>) {
    let len = context.len();
    let mut best = (0, 0);
    for follow in 1..len {
        let mut agree = 0;
        while agree < max_match.min(follow)
            && context[follow - 1 - agree] == context[len - 1 - agree]
        {
            agree += 1;
        }
        if agree > 0 && agree >= best.0 {
            best = (agree, follow);
        }
    }
    let mut extended = context.to_vec();
    for j in 0..n {
        extended.push(extended[best.1 + j]);
    }
    (best.0, extended[len..].to_vec())
}

proptest! {
    #[test]
    fn prompt_lookup_equals_a_brute_force_search(
        context in proptest::collection::vec(0u32..4, 1..40),
        min in 1usize..4,
        n in 1usize..9,
    ) {
        let lookup = PromptLookup::new(8).with_ngram_range(min, 6);
        let (agree, follow) = brute_force_lookup(&context, 6, n);
        let expected = if agree >= min { follow } else { Vec::new() };
        prop_assert_eq!(lookup.lookup(&context, n), expected);
    }
}

#[test]
fn prompt_lookup_raises_its_bar_after_rejected_drafts() {
    let mut lookup = PromptLookup::new(8);
    let mut draft = Draft::default();
    // The end [2, 3, 4] agrees over 3 tokens with 0..4, [1, 2, 3, 4] over 4.
    let three = [1, 2, 3, 4, 5, 6, 0, 2, 3, 4];
    let four = [9, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4];
    let proposed = |lookup: &mut PromptLookup, context: &[TokenId], draft: &mut Draft| {
        draft.clear();
        lookup.propose(context, 8, draft).unwrap();
        draft.tokens().collect::<Vec<_>>()
    };
    assert_eq!(lookup.bar(), 3);
    assert_eq!(proposed(&mut lookup, &three, &mut draft), [5]);
    // Rejected at its first token: 4 tokens must agree now, and k is 0, so
    // the next confident steps rest (MIN_REST then doubled: 16).
    lookup.observe(1, 0);
    assert_eq!(lookup.bar(), 4);
    for _ in 0..40 {
        assert_eq!(
            proposed(&mut lookup, &three, &mut draft),
            [] as [TokenId; 0]
        );
    }
    for _ in 0..15 {
        assert_eq!(proposed(&mut lookup, &four, &mut draft), [] as [TokenId; 0]);
    }
    assert_eq!(proposed(&mut lookup, &four, &mut draft), [5]);
    // Accepted whole: the bar is 3 again and k doubles.
    lookup.observe(1, 1);
    assert_eq!((lookup.bar(), lookup.n_draft()), (3, 2));
    assert_eq!(proposed(&mut lookup, &three, &mut draft), [5, 6]);
    // A partial acceptance keeps the bar, a whole one lowers it to 3.
    lookup.observe(2, 0);
    assert_eq!(lookup.bar(), 4);
    lookup.observe(4, 2);
    assert_eq!(lookup.bar(), 4);
    lookup.observe(2, 2);
    assert_eq!(lookup.bar(), 3);
    // Rejections raise it to MAX_BAR and no further.
    for _ in 0..20 {
        lookup.observe(2, 0);
    }
    assert_eq!(lookup.bar(), PromptLookup::MAX_BAR);
}

#[test]
fn draft_length_backs_off_when_rejected_and_probes_again() {
    let mut length = DraftLength::new(8);
    // Starts at one token and doubles while accepted, up to 8.
    assert_eq!(length.current(), 1);
    for (n, expected) in [(1, 2), (2, 4), (4, 8), (8, 8)] {
        length.observe(n, n);
        assert_eq!(length.current(), expected);
    }
    // A draft rejected after its third token halves k too.
    length.observe(8, 3);
    assert_eq!(length.current(), 4);
    length.observe(4, 4);
    assert_eq!(length.current(), 8);
    for expected in [4, 2, 1, 0] {
        length.observe(8, 0);
        assert_eq!(length.current(), expected);
    }
    // The last rejection was of one token: the rest doubles to 16 steps,
    // then to 32 after a rejected probe.
    let probe_after = |n_steps: usize, length: &mut DraftLength| {
        for _ in 0..n_steps - 1 {
            assert_eq!(length.next_length(), 0);
        }
        assert_eq!(length.next_length(), 1);
    };
    probe_after(16, &mut length);
    length.observe(1, 0);
    probe_after(32, &mut length);
    length.observe(1, 1);
    assert_eq!(length.current(), 2);
    length.observe(2, 1);
    assert_eq!(length.current(), 1, "a partial acceptance halves k");
    length.observe(1, 0);
    assert_eq!(length.current(), 0);
    // An acceptance reset the rest: 8 steps, doubled once by the last
    // one-token rejection.
    probe_after(16, &mut length);
}

#[test]
fn bad_drafts_are_refused_by_name() {
    struct Bad(Draft);
    impl Drafter for Bad {
        fn propose(&mut self, _: &[TokenId], _: usize, draft: &mut Draft) -> Result<()> {
            *draft = self.0.clone();
            Ok(())
        }
        fn observe(&mut self, _: usize, _: usize) {}
    }
    let model = PrefixModel::new(4);
    let config = greedy(5);
    let run = |draft: Draft| {
        generate_speculative(&model, &[1], &config, None, Bad(draft), go_on).map(|_| ())
    };
    let mut out_of_range = Draft::default();
    out_of_range.push(9);
    assert_eq!(
        run(out_of_range),
        Err(lm_decode::Error::Core(lm_core::Error::TokenOutOfRange {
            id: 9,
            vocab_size: 4
        }))
    );
    let mut short = Draft::default();
    short.push_sampled(1, &[0.5, 0.5]);
    assert_eq!(
        run(short),
        Err(lm_decode::Error::DraftDistributionLength {
            len: 2,
            vocab_size: 4
        })
    );
    let mut improbable = Draft::default();
    improbable.push_sampled(1, &[1.0, 0.0, 0.0, 0.0]);
    assert_eq!(
        run(improbable),
        Err(lm_decode::Error::DraftTokenNotInDistribution {
            token: 1,
            prob: 0.0
        })
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Greedy speculative decoding is the plain greedy loop, trace for trace,
    /// for any drafter, wherever an end token, a stop string, the new-token
    /// limit or the context bound lands.
    #[test]
    fn greedy_speculative_is_greedy_plain(
        vocab_size in 2usize..8,
        salt in any::<u64>(),
        prompt in prop::collection::vec(0u32..2, 1..6),
        max_new_tokens in 0usize..30,
        end_token in prop::option::of(0u32..8),
        stop in prop::option::of("[a-h]{1,2}"),
        context in prop::option::of(8usize..40),
        repetition_penalty in prop::option::of(1.0f32..2.0),
        k in 1usize..7,
        wrong_every in 0usize..5,
        scattered in any::<bool>(),
    ) {
        let mut model = PrefixModel::new(vocab_size).with_salt(salt);
        model.context_length = context;
        let detokenizer = Pieces(LETTERS[..vocab_size].to_vec());
        let config = GenerationConfig {
            end_tokens: end_token.filter(|&t| (t as usize) < vocab_size).into_iter().collect(),
            stop_strings: stop.into_iter().collect(),
            sampling: SamplingConfig { repetition_penalty, ..SamplingConfig::greedy() },
            ..greedy(max_new_tokens)
        };
        let plain = generate(&model, &prompt, &config, Some(&detokenizer)).unwrap();
        let (run, stats) = if scattered {
            let drafter = scattered_drafter(vocab_size as u32, k, salt ^ 1);
            speculative(&model, &prompt, &config, Some(&detokenizer), drafter)
        } else {
            let drafter = Oracle::new(plain.prompt.len(), &plain.tokens, k, vocab_size as u32, wrong_every);
            speculative(&model, &prompt, &config, Some(&detokenizer), drafter)
        };
        prop_assert_eq!(unmarked(&run), plain.clone());
        let n_accepted = run.steps.iter().filter(|s| s.draft == DraftMark::Accepted).count();
        prop_assert!(n_accepted <= stats.accepted_tokens);
        prop_assert!(stats.accepted_tokens <= stats.drafted_tokens);
        prop_assert!(stats.target_passes <= plain.tokens.len().saturating_sub(1));
    }

    /// Sampled speculative decoding with point-mass drafts (prompt lookup,
    /// any drafter without a distribution) is the plain sampled loop, trace
    /// for trace, for the same seed: each verified row chooses with the
    /// plain loop's draw and the draft is accepted when it is the choice.
    #[test]
    fn point_mass_drafts_give_the_plain_sampled_run(
        vocab_size in 2usize..8,
        salt in any::<u64>(),
        seed in any::<u64>(),
        prompt in prop::collection::vec(0u32..2, 1..6),
        max_new_tokens in 0usize..30,
        temperature in 0.3f32..2.0,
        top_k in prop::option::of(1usize..6),
        k in 1usize..7,
    ) {
        let model = PrefixModel::new(vocab_size).with_salt(salt);
        let mut config = GenerationConfig { max_new_tokens, ..GenerationConfig::default() };
        config.sampling.temperature = temperature;
        config.sampling.top_k = top_k;
        config.sampling.seed = seed;
        let plain = generate(&model, &prompt, &config, None).unwrap();
        let drafter = scattered_drafter(vocab_size as u32, k, salt ^ 1);
        let (run, stats) = speculative(&model, &prompt, &config, None, drafter);
        prop_assert_eq!(unmarked(&run), plain.clone());
        prop_assert!(stats.accepted_tokens <= stats.drafted_tokens);
        let lookup = PromptLookup::new(k).with_ngram_range(1, 32);
        let (run, _) = speculative(&model, &prompt, &config, None, lookup);
        prop_assert_eq!(unmarked(&run), plain);
    }
}

/// The exact probability of each 3-token continuation under the policy,
/// by enumeration, then the chi-square statistic of `counts` against it.
fn chi_square(
    model: &PrefixModel,
    sampling: &SamplingConfig,
    prompt: &[TokenId],
    counts: &[usize],
    n_runs: usize,
) -> f64 {
    let v = model.vocab_size;
    let mut sampler = Sampler::new(sampling).unwrap();
    let mut statistic = 0.0;
    for (cell, &count) in counts.iter().enumerate() {
        let tokens = [cell / (v * v), cell / v % v, cell % v];
        let mut prefix = prompt.to_vec();
        let mut prob = 1.0f64;
        for &t in &tokens {
            let policy = sampler.policy(&model.logits_for(&prefix), &prefix).unwrap();
            prob *= f64::from(policy[t]);
            prefix.push(t as TokenId);
        }
        let expected = prob * n_runs as f64;
        if expected > 0.0 {
            statistic += (count as f64 - expected).powi(2) / expected;
        } else {
            assert_eq!(count, 0, "an impossible continuation {tokens:?} was drawn");
        }
    }
    statistic
}

/// Sampled speculative runs over many seeds against the policy's exact
/// distribution of the first three tokens (27 cells, 26 degrees of freedom:
/// the 0.1% critical value is 54.05), for a point-mass drafter and a draft
/// model, at T = 1 and with top-k 2 and T = 0.7.
#[test]
fn sampled_speculative_follows_the_policy_distribution() {
    const N_RUNS: usize = 6000;
    const CRITICAL: f64 = 54.05;
    let model = PrefixModel::new(3).with_salt(3);
    let prompt = [0, 1];
    let samplings = [
        SamplingConfig::default(),
        SamplingConfig {
            temperature: 0.7,
            top_k: Some(2),
            ..SamplingConfig::default()
        },
    ];
    for sampling in samplings {
        for drafter_kind in ["scattered", "sampled", "model"] {
            let mut counts = vec![0usize; 27];
            let mut n_accepted = 0;
            for seed in 0..N_RUNS as u64 {
                // A fourth token leaves room to draft the second and third.
                let config = GenerationConfig {
                    max_new_tokens: 4,
                    sampling: SamplingConfig {
                        seed,
                        ..sampling.clone()
                    },
                    ..GenerationConfig::default()
                };
                let (run, stats) = match drafter_kind {
                    "scattered" => {
                        let drafter = scattered_drafter(3, 2, seed);
                        speculative(&model, &prompt, &config, None, drafter)
                    }
                    "model" => {
                        // The target's own raw argmax, as a point mass.
                        let drafter = ModelDrafter::new(model.clone(), 2);
                        speculative(&model, &prompt, &config, None, drafter)
                    }
                    _ => {
                        let drafter = sampled(PrefixModel::new(3).with_salt(11), 2, seed);
                        speculative(&model, &prompt, &config, None, drafter)
                    }
                };
                n_accepted += stats.accepted_tokens;
                let t = &run.tokens;
                counts[t[0] as usize * 9 + t[1] as usize * 3 + t[2] as usize] += 1;
            }
            assert!(
                n_accepted > N_RUNS / 20,
                "{drafter_kind} {sampling:?}: {n_accepted} drafts accepted"
            );
            let statistic = chi_square(&model, &sampling, &prompt, &counts, N_RUNS);
            assert!(
                statistic < CRITICAL,
                "{drafter_kind} {sampling:?}: chi-square {statistic:.1} >= {CRITICAL}"
            );
        }
    }
}

/// A drafter whose acceptance rule were wrong (always accept) is caught by
/// the same statistic: the check can fail.
#[test]
fn the_chi_square_check_rejects_an_always_accepted_draft() {
    const N_RUNS: usize = 6000;
    let model = PrefixModel::new(3).with_salt(3);
    let prompt = [0, 1];
    let sampling = SamplingConfig::default();
    let mut counts = vec![0usize; 27];
    for seed in 0..N_RUNS as u64 {
        // What a loop that trusted the drafter would emit: its tokens.
        let mut draft = Draft::default();
        let mut drafter = scattered_drafter(3, 3, seed);
        drafter.propose(&prompt, 3, &mut draft).unwrap();
        let t: Vec<TokenId> = draft.tokens().collect();
        counts[t[0] as usize * 9 + t[1] as usize * 3 + t[2] as usize] += 1;
    }
    assert!(chi_square(&model, &sampling, &prompt, &counts, N_RUNS) > 54.05);
}

#[test]
fn a_seed_gives_the_same_sampled_speculative_run() {
    let model = PrefixModel::new(6);
    let mut config = GenerationConfig {
        max_new_tokens: 25,
        ..GenerationConfig::default()
    };
    config.sampling.seed = 42;
    // Drafting from any one-token match, so drafts are verified.
    let lookup = PromptLookup::new(4).with_ngram_range(1, 32);
    let first = speculative(&model, &[1, 2], &config, None, lookup.clone());
    let second = speculative(&model, &[1, 2], &config, None, lookup);
    assert_eq!(first, second);
    assert_eq!(first.0.tokens.len(), 25);
    assert!(first.1.drafted_tokens > 0, "{:?}", first.1);
}

/// The logits `model` gives for `tokens` read after `state`.
fn logits_of<M: LanguageModel>(
    model: &M,
    state: &mut M::State,
    tokens: &[TokenId],
    rows: Rows,
) -> Vec<f32> {
    let mut logits = Vec::new();
    model.forward(state, tokens, rows, &mut logits).unwrap();
    logits
}

/// Feeds `first`, then `drafts`, truncates back and feeds `then`: the
/// logits must be those of a state that never saw the drafts, bit for bit.
fn check_rollback<M: LanguageModel>(
    model: &M,
    first: &[TokenId],
    drafts: &[TokenId],
    then: &[TokenId],
) {
    let mut rolled_back = model.new_state();
    logits_of(model, &mut rolled_back, first, Rows::Last);
    logits_of(model, &mut rolled_back, drafts, Rows::All);
    rolled_back.truncate(first.len());
    assert_eq!(rolled_back.pos(), first.len());
    let got = logits_of(model, &mut rolled_back, then, Rows::All);
    let mut clean = model.new_state();
    logits_of(model, &mut clean, first, Rows::Last);
    let expected = logits_of(model, &mut clean, then, Rows::All);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&expected));
}

#[test]
fn a_truncated_toy_decoder_state_equals_one_that_never_saw_the_drafts() {
    let model = lm_model::Toy::decoder();
    let ids = |text: &str| lm_model::Toy::encode(text).unwrap();
    check_rollback(
        &model,
        &ids("<start> the"),
        &ids("dog slept"),
        &ids("cat sat"),
    );
    check_rollback(
        &model,
        &ids("<start>"),
        &ids("the dog sat <end>"),
        &ids("the"),
    );
}

#[test]
fn greedy_speculative_on_the_toy_decoder_is_greedy_plain() {
    let model = lm_model::Toy::decoder();
    let prompt = lm_model::Toy::encode("<start> the cat sat the cat").unwrap();
    let mut drafted = 0;
    for max_new_tokens in [1, 2, 5, 9] {
        let config = greedy(max_new_tokens);
        let plain = generate(&model, &prompt, &config, Some(&lm_model::Toy)).unwrap();
        // "the cat" repeats: drafting from 2-token matches.
        let (run, stats) = speculative(
            &model,
            &prompt,
            &config,
            Some(&lm_model::Toy),
            PromptLookup::new(4).with_ngram_range(2, 32),
        );
        assert_eq!(unmarked(&run), plain);
        drafted += stats.drafted_tokens;
    }
    assert!(drafted > 0);
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn a_truncated_smollm2_state_equals_one_that_never_saw_the_drafts() {
    let model = smollm2();
    // "The capital of France is" then " Paris of France is".
    check_rollback(
        &model,
        &[504, 3575, 282, 4649, 314],
        &[7042, 282],
        &[4649, 314],
    );
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn greedy_prompt_lookup_on_smollm2_is_greedy_plain() {
    let model = smollm2();
    // A prompt that repeats itself, so prompt lookup drafts and is accepted.
    let sentence = [504, 3575, 282, 4649, 314, 7042, 30];
    let prompt: Vec<TokenId> = sentence
        .iter()
        .chain(&sentence)
        .chain(&sentence[..3])
        .copied()
        .collect();
    let (config, plain) = plain_greedy(&model, &prompt, 40);
    let (run, stats) = speculative(&model, &prompt, &config, None, PromptLookup::default());
    assert_eq!(run.tokens, plain.tokens);
    assert_eq!(unmarked(&run).steps.len(), plain.steps.len());
    assert!(stats.accepted_tokens > 0, "{stats:?}");
}

/// Whether a pass over several tokens gives each row the bits one-token
/// passes give it: greedy speculative decoding equals plain greedy decoding
/// exactly when it does (otherwise only up to near-ties).
fn batched_rows_equal_single_rows<M: LanguageModel>(
    model: &M,
    prompt: &[TokenId],
    then: &[TokenId],
) -> bool {
    let mut batched = model.new_state();
    logits_of(model, &mut batched, prompt, Rows::Last);
    let rows = logits_of(model, &mut batched, then, Rows::All);
    let mut single = model.new_state();
    logits_of(model, &mut single, prompt, Rows::Last);
    let mut singles = Vec::new();
    for &t in then {
        singles.extend(logits_of(model, &mut single, &[t], Rows::Last));
    }
    rows.iter()
        .zip(&singles)
        .all(|(a, b)| a.to_bits() == b.to_bits())
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_verification_rows_have_the_bits_of_one_token_passes() {
    let model = smollm2();
    assert!(batched_rows_equal_single_rows(
        &model,
        &[504, 3575, 282, 4649, 314],
        &[7042, 282, 4649, 314]
    ));
}

/// A draft model proposes its greedy continuation: the target's own model
/// as the draft is accepted whole, another model is often rejected, and
/// either way the ids are the plain run's.
#[test]
fn a_draft_model_gives_the_plain_greedy_ids() {
    let target = PrefixModel::new(5).with_salt(7);
    let prompt = [1, 2, 3];
    let (config, plain) = plain_greedy(&target, &prompt, 30);
    let (run, stats) = speculative(
        &target,
        &prompt,
        &config,
        None,
        ModelDrafter::new(target.clone(), 4),
    );
    assert_eq!(unmarked(&run), plain);
    assert_eq!(stats.accepted_tokens, stats.drafted_tokens, "{stats:?}");
    assert!(stats.target_passes < 15, "{stats:?}");
    for salt in 0..20 {
        let draft_model = PrefixModel::new(5).with_salt(salt);
        let (run, _) = speculative(
            &target,
            &prompt,
            &config,
            None,
            ModelDrafter::new(draft_model, 4),
        );
        assert_eq!(unmarked(&run), plain, "draft salt {salt}");
    }
    // The toy decoder drafting for itself, within its context bound.
    let toy = lm_model::Toy::decoder();
    let prompt = lm_model::Toy::encode("<start> the").unwrap();
    let config = GenerationConfig {
        end_tokens: Vec::new(),
        ..greedy(100)
    };
    let plain = generate(&toy, &prompt, &config, None).unwrap();
    let (run, stats) = speculative(&toy, &prompt, &config, None, ModelDrafter::new(&toy, 3));
    assert_eq!(unmarked(&run), plain);
    assert_eq!(run.stop_reason, StopReason::ContextBound);
    assert_eq!(stats.accepted_tokens, stats.drafted_tokens, "{stats:?}");
}
