//! One sampling step over 49,152 logits (SmolLM2's vocabulary size): greedy,
//! temperature only, top-k 40, top-p 0.9 and min-p 0.05 on a real row of
//! SmolLM2-135M-Instruct's logits (llama.cpp's, after the chat prompt "What is
//! the capital of France?", the flattest of the fixtures: 49 tokens make 90%
//! of the mass at T = 1), then top-p on a flat synthetic row, where the
//! nucleus is most of the vocabulary. Then the stages of issue 38: typical
//! 0.95, top-nσ 1.5 and XTC (at probability 1, so it always removes, and at
//! 0.5, its coin drawn), typical on the flat row (its worst case: the typical
//! set is most of the vocabulary), and the whole chain with every filter on.
//! The rest of issue 38's stages follow: the epsilon and eta cutoffs,
//! dynamic temperature, mirostat v1 and v2, the raw-logit stages that read
//! the history (DRY and no_repeat_ngram_size over a 2,048-token history with
//! a repeated passage), an order that puts temperature last, and every stage
//! at once. The trace's log-sum-exp is the other per-step cost of the loop.
//! A decode step of that model takes about 10 ms, so 5% is 500 us.

use criterion::{Criterion, criterion_group, criterion_main};
use lm_core::{Detokenize, TokenId};
use lm_decode::{Sampler, SamplingConfig};
use std::hint::black_box;

const VOCAB_SIZE: usize = 49_152;

/// llama.cpp's last-position logits for the chat prompt (fixtures/smollm2).
fn model_logits() -> Vec<f32> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/smollm2/chat_capital_of_france.last_logits.f32le.bin"
    );
    let bytes = std::fs::read(path).expect("the SmolLM2 logits fixture");
    let logits: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(logits.len(), VOCAB_SIZE);
    logits
}

/// Deterministic logits uniform in [-8, 8): far flatter than a model's.
fn flat_logits() -> Vec<f32> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..VOCAB_SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 16.0 - 8.0
        })
        .collect()
}

/// A vocabulary whose every 97th token is a newline (a DRY breaker) and
/// the rest words.
struct Words;

impl Detokenize for Words {
    fn decode(&self, ids: &[TokenId]) -> String {
        ids.iter()
            .map(|&id| {
                if id % 97 == 0 {
                    "\n".to_owned()
                } else {
                    format!(" w{id}")
                }
            })
            .collect()
    }
}

/// 2,048 tokens: varied text with a 64-token passage repeated four times,
/// the last time cut short, so DRY finds a long match to extend.
fn repetitive_history() -> Vec<TokenId> {
    let passage: Vec<TokenId> = (0..64).map(|i| 1_000 + i * 7).collect();
    let mut history: Vec<TokenId> = (0..1_800)
        .map(|i| (i * 7_919 % 49_152) as TokenId)
        .collect();
    for _ in 0..3 {
        history.extend(&passage);
    }
    history.extend(&passage[..56]);
    history
}

/// T = 0.8 with one setting of the new stages.
fn new_stage(set: impl FnOnce(&mut SamplingConfig)) -> SamplingConfig {
    let mut config = SamplingConfig {
        temperature: 0.8,
        ..SamplingConfig::default()
    };
    set(&mut config);
    config
}

fn sampling_step(c: &mut Criterion) {
    let sampled = |temperature, top_k, top_p, min_p| SamplingConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        ..SamplingConfig::default()
    };
    let model = model_logits();
    let flat = flat_logits();
    let every_filter = new_stage(|c| {
        *c = SamplingConfig {
            top_n_sigma: Some(1.5),
            top_k: Some(40),
            typical_p: Some(0.95),
            top_p: Some(0.9),
            min_p: Some(0.05),
            xtc_probability: Some(0.5),
            min_keep: Some(2),
            ..c.clone()
        }
    });
    let cases = [
        ("greedy", SamplingConfig::greedy(), &model),
        ("temperature 1", sampled(1.0, None, None, None), &model),
        ("top-k 40", sampled(0.8, Some(40), None, None), &model),
        ("top-p 0.9", sampled(0.8, None, Some(0.9), None), &model),
        ("min-p 0.05", sampled(0.8, None, None, Some(0.05)), &model),
        (
            "top-p 0.9, flat logits",
            sampled(0.8, None, Some(0.9), None),
            &flat,
        ),
        (
            "typical 0.95",
            new_stage(|c| c.typical_p = Some(0.95)),
            &model,
        ),
        (
            "typical 0.95, flat logits",
            new_stage(|c| c.typical_p = Some(0.95)),
            &flat,
        ),
        (
            "top-n-sigma 1.5",
            new_stage(|c| c.top_n_sigma = Some(1.5)),
            &model,
        ),
        (
            "xtc p 1, threshold 0.1",
            new_stage(|c| c.xtc_probability = Some(1.0)),
            &model,
        ),
        (
            "xtc p 0.5, threshold 0.1",
            new_stage(|c| c.xtc_probability = Some(0.5)),
            &model,
        ),
        ("every filter, min_keep 2", every_filter.clone(), &model),
        (
            "epsilon 3e-4",
            new_stage(|c| c.epsilon_cutoff = Some(3e-4)),
            &model,
        ),
        ("eta 2e-3", new_stage(|c| c.eta_cutoff = Some(2e-3)), &model),
        (
            "dynatemp range 0.5",
            new_stage(|c| c.dynatemp_range = Some(0.5)),
            &model,
        ),
        ("mirostat 1", new_stage(|c| c.mirostat = Some(1)), &model),
        ("mirostat 2", new_stage(|c| c.mirostat = Some(2)), &model),
        (
            "dry 0.8, 2048-token history",
            new_stage(|c| c.dry_multiplier = Some(0.8)),
            &model,
        ),
        (
            "no_repeat_ngram 3, 2048-token history",
            new_stage(|c| c.no_repeat_ngram_size = Some(3)),
            &model,
        ),
        (
            "top-k 40, top-p 0.9, temperature last",
            new_stage(|c| {
                c.top_k = Some(40);
                c.top_p = Some(0.9);
                c.order = Some("top_k;top_p;temperature".parse().expect("an order"));
            }),
            &model,
        ),
        (
            "every stage, 2048-token history",
            SamplingConfig {
                repetition_penalty: Some(1.1),
                dry_multiplier: Some(0.8),
                no_repeat_ngram_size: Some(3),
                dynatemp_range: Some(0.5),
                epsilon_cutoff: Some(3e-4),
                eta_cutoff: Some(2e-3),
                mirostat: Some(2),
                ..every_filter.clone()
            },
            &model,
        ),
    ];
    let history = repetitive_history();
    let mut group = c.benchmark_group("sampling step, 49152 logits");
    for (name, config, logits) in cases {
        let mut sampler = Sampler::with_text(&config, VOCAB_SIZE, &Words).expect("valid config");
        let history: &[TokenId] = if name.contains("history") {
            &history
        } else {
            &[]
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                sampler
                    .select(black_box(logits), history, black_box(0.5))
                    .expect("valid logits")
            });
        });
    }
    // What the trace adds per step: the normaliser for the model's
    // probability of the chosen token.
    group.bench_function("trace normaliser (log-sum-exp)", |b| {
        b.iter(|| lm_core::log_sum_exp(black_box(&model)).expect("valid logits"));
    });
    group.finish();
}

criterion_group!(benches, sampling_step);
criterion_main!(benches);
