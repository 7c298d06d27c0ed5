//! Batch generation with a finished mask: lesson 001's three-round example,
//! and every row equal to the same prompt generated alone on its stream.

use crate::common::{PrefixModel, TableModel};
use lm_core::{Counting, TokenId};
use lm_decode::{
    FinishedMask, GenerationConfig, SamplingConfig, StopReason, generate, generate_batch,
};

fn check(rounds: &[&[TokenId]], end_tokens: &[TokenId], lengths: &[usize], finished: &[bool]) {
    let mut mask = FinishedMask::new(lengths.len());
    for chosen in rounds {
        mask.record_round(chosen, end_tokens).unwrap();
    }
    assert_eq!(mask.lengths(), lengths, "{rounds:?}");
    assert_eq!(mask.finished(), finished, "{rounds:?}");
}

#[test]
fn lesson_001_finished_mask_example() {
    // "Token zero is the end marker": [2, 1], [0, 3], [4, 0] -> [2, 3], [True, True].
    check(&[&[2, 1], &[0, 3], &[4, 0]], &[0], &[2, 3], &[true, true]);
    // One round at a time: the first row stops growing after its second token.
    check(&[&[2, 1]], &[0], &[1, 1], &[false, false]);
    check(&[&[2, 1], &[0, 3]], &[0], &[2, 2], &[true, false]);
    check(&[&[0, 0, 5]], &[0], &[1, 1, 1], &[true, true, false]);
    check(&[&[1, 2], &[3, 4]], &[0], &[2, 2], &[false, false]);
    check(&[&[2, 4], &[9, 9]], &[2, 4], &[1, 1], &[true, true]);
}

#[test]
fn mask_rejects_a_round_of_the_wrong_width() {
    let mut mask = FinishedMask::new(2);
    assert!(mask.record_round(&[0], &[0]).is_err());
    mask.finish(1);
    mask.finish(7);
    assert_eq!(mask.finished(), &[false, true]);
    assert!(!mask.all_finished());
}

#[test]
fn every_row_equals_its_prompt_generated_alone() {
    let model = PrefixModel::new(11).with_context(16);
    let prompts: Vec<Vec<TokenId>> =
        vec![vec![1], vec![2, 3, 4], vec![5, 6], vec![7, 8, 9, 10, 1, 2]];
    let slices: Vec<&[TokenId]> = prompts.iter().map(Vec::as_slice).collect();
    let config = GenerationConfig {
        max_new_tokens: 12,
        end_tokens: vec![0],
        n_top_candidates: 2,
        sampling: SamplingConfig {
            temperature: 0.9,
            top_p: Some(0.95),
            seed: 42,
            ..SamplingConfig::default()
        },
        ..GenerationConfig::default()
    };
    let rows = generate_batch(&model, &slices, &config, None).unwrap();
    assert_eq!(rows.len(), 4);
    for (i, (row, prompt)) in rows.iter().zip(&prompts).enumerate() {
        let alone = GenerationConfig {
            rng_stream: i as u64,
            ..config.clone()
        };
        assert_eq!(
            row,
            &generate(&model, prompt, &alone, None).unwrap(),
            "row {i}"
        );
    }
    let lengths: Vec<usize> = rows.iter().map(|r| r.tokens.len()).collect();
    assert!(
        lengths.windows(2).any(|w| w[0] != w[1]),
        "rows finish at different times: {lengths:?}"
    );
}

#[test]
fn finished_rows_are_no_longer_fed() {
    // Row 0: 1 -> 0 (end) at once; row 1: 2 -> 3 -> 2 ... to the limit.
    let mut table = vec![vec![0.0f32; 4]; 4];
    table[1][0] = 5.0;
    table[2][3] = 5.0;
    table[3][2] = 5.0;
    let model = Counting::new(TableModel {
        table,
        context_length: None,
    });
    let config = GenerationConfig {
        max_new_tokens: 4,
        end_tokens: vec![0],
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    let rows = generate_batch(&model, &[&[1], &[2]], &config, None).unwrap();
    assert_eq!(
        (rows[0].tokens.clone(), rows[0].stop_reason.clone()),
        (vec![0], StopReason::EndToken(0))
    );
    assert_eq!(
        (rows[1].tokens.clone(), rows[1].stop_reason.clone()),
        (vec![3, 2, 3, 2], StopReason::MaxNewTokens)
    );
    assert!(rows[0].is_finished() && !rows[1].is_finished());
    // Prefill both, then only row 1: three more single-token rounds.
    assert_eq!(model.batches(), vec![2, 1, 1, 1]);
    assert_eq!(model.calls(), vec![1, 1, 1, 1, 1]);
}
