//! One sampling step over 49,152 logits (SmolLM2's vocabulary size): greedy,
//! temperature only, top-k 40 and top-p 0.9. Top-k and top-p select
//! partially, so they should cost about as much as the softmax, not a sort.

use criterion::{Criterion, criterion_group, criterion_main};
use lm_decode::{Sampler, SamplingConfig};
use std::hint::black_box;

const VOCAB_SIZE: usize = 49_152;

/// Deterministic logits in [-8, 8), spread like a model's.
fn logits() -> Vec<f32> {
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

fn sampling_step(c: &mut Criterion) {
    let logits = logits();
    let policies = [
        ("greedy", SamplingConfig::greedy()),
        (
            "temperature 0.8",
            SamplingConfig {
                temperature: 0.8,
                ..SamplingConfig::default()
            },
        ),
        (
            "top-k 40",
            SamplingConfig {
                temperature: 0.8,
                top_k: Some(40),
                ..SamplingConfig::default()
            },
        ),
        (
            "top-p 0.9",
            SamplingConfig {
                temperature: 0.8,
                top_p: Some(0.9),
                ..SamplingConfig::default()
            },
        ),
    ];
    let mut group = c.benchmark_group("sampling step, 49152 logits");
    for (name, config) in policies {
        let mut sampler = Sampler::new(&config).expect("valid config");
        group.bench_function(name, |b| {
            b.iter(|| {
                sampler
                    .select(black_box(&logits), &[], black_box(0.5))
                    .expect("valid logits")
            });
        });
    }
    group.finish();
}

criterion_group!(benches, sampling_step);
criterion_main!(benches);
