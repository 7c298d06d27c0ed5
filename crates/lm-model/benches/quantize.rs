//! Quantizing f32 rows with ggml's reference algorithms
//! (`GgmlType::quantize_row`): one row of 2,048 normal-looking weights (Llama
//! 3.2 1B's width) per type, single-threaded, in weights per second. The
//! K-quants' scale searches dominate `--quantize q4_k` and `lm-cli quantize`
//! (issue 37). Run with `cargo bench -p lm-model --bench quantize`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lm_model::GgmlType;
use std::hint::black_box;

/// `n` deterministic weights spread like a trained matrix's: the sum of
/// four uniform 16-bit draws of an xorshift generator (roughly normal),
/// scaled to a standard deviation of about 0.02, every 97th value ten
/// times larger (an outlier).
fn weights(n: usize) -> Vec<f32> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..n)
        .map(|i| {
            let mut sum = 0.0f32;
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                sum += f32::from((state >> 48) as u16) / 65_536.0;
            }
            let v = (sum - 2.0) / 0.577 * 0.02;
            if i % 97 == 3 { v * 10.0 } else { v }
        })
        .collect()
}

fn quantize_row(c: &mut Criterion) {
    const N: usize = 2048;
    let x = weights(N);
    let mut group = c.benchmark_group("quantize_row 2048");
    group.throughput(Throughput::Elements(N as u64));
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let mut out = vec![0u8; ty.row_bytes(N).unwrap()];
        group.bench_function(ty.name(), |b| {
            b.iter(|| ty.quantize_row(black_box(&x), &mut out).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, quantize_row);
criterion_main!(benches);
