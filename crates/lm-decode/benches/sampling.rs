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
#[path = "../tests/common/words.rs"]
mod words;

use lm_core::TokenId;
use lm_decode::{Sampler, SamplingConfig};
use std::hint::black_box;
use words::Words;

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

/// What a case changes in T = 0.8 with every other stage off.
type Setting = fn(&mut SamplingConfig);

/// Every filter on, with min_keep 2.
fn every_filter(c: &mut SamplingConfig) {
    c.top_n_sigma = Some(1.5);
    c.top_k = Some(40);
    c.typical_p = Some(0.95);
    c.top_p = Some(0.9);
    c.min_p = Some(0.05);
    c.xtc_probability = Some(0.5);
    c.min_keep = Some(2);
}

/// Every stage on: every filter and every stage that reads the history.
fn every_stage(c: &mut SamplingConfig) {
    every_filter(c);
    c.repetition_penalty = Some(1.1);
    c.dry_multiplier = Some(0.8);
    c.no_repeat_ngram_size = Some(3);
    c.dynatemp_range = Some(0.5);
    c.epsilon_cutoff = Some(3e-4);
    c.eta_cutoff = Some(2e-3);
    c.mirostat = Some(2);
}

fn sampling_step(c: &mut Criterion) {
    let model = model_logits();
    let flat = flat_logits();
    // A case's name says what it reads besides the model's row: the flat
    // row ("flat logits") and the repetitive history ("history").
    let cases: [(&str, Setting); 21] = [
        ("greedy", |c| *c = SamplingConfig::greedy()),
        ("temperature 1", |c| c.temperature = 1.0),
        ("top-k 40", |c| c.top_k = Some(40)),
        ("top-p 0.9", |c| c.top_p = Some(0.9)),
        ("min-p 0.05", |c| c.min_p = Some(0.05)),
        ("top-p 0.9, flat logits", |c| c.top_p = Some(0.9)),
        ("typical 0.95", |c| c.typical_p = Some(0.95)),
        ("typical 0.95, flat logits", |c| c.typical_p = Some(0.95)),
        ("top-n-sigma 1.5", |c| c.top_n_sigma = Some(1.5)),
        ("xtc p 1, threshold 0.1", |c| c.xtc_probability = Some(1.0)),
        ("xtc p 0.5, threshold 0.1", |c| {
            c.xtc_probability = Some(0.5)
        }),
        ("every filter, min_keep 2", every_filter),
        ("epsilon 3e-4", |c| c.epsilon_cutoff = Some(3e-4)),
        ("eta 2e-3", |c| c.eta_cutoff = Some(2e-3)),
        ("dynatemp range 0.5", |c| c.dynatemp_range = Some(0.5)),
        ("mirostat 1", |c| c.mirostat = Some(1)),
        ("mirostat 2", |c| c.mirostat = Some(2)),
        ("dry 0.8, 2048-token history", |c| {
            c.dry_multiplier = Some(0.8)
        }),
        ("no_repeat_ngram 3, 2048-token history", |c| {
            c.no_repeat_ngram_size = Some(3)
        }),
        ("top-k 40, top-p 0.9, temperature last", |c| {
            c.top_k = Some(40);
            c.top_p = Some(0.9);
            c.order = Some("top_k;top_p;temperature".parse().expect("an order"));
        }),
        ("every stage, 2048-token history", every_stage),
    ];
    let history = repetitive_history();
    let mut group = c.benchmark_group("sampling step, 49152 logits");
    for (name, setting) in cases {
        let logits = if name.contains("flat logits") {
            &flat
        } else {
            &model
        };
        let mut config = SamplingConfig {
            temperature: 0.8,
            ..SamplingConfig::default()
        };
        setting(&mut config);
        let mut sampler =
            Sampler::with_text(&config, VOCAB_SIZE, &Words(97)).expect("valid config");
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
