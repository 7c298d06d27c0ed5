//! Attention of one SmolLM2-shaped layer (9 query heads over 3 key/value
//! heads of 64) with every kernel path this CPU runs: a 2,048-token
//! prompt's prefill in one call (f16 cache, so the SIMD builds fuse their
//! products, f32, and q8_0, widened chunk by chunk), and one decode step
//! over 4,096 positions (f16 and q8_0).
//! Run with `RAYON_NUM_THREADS=1 cargo bench -p lm-model --bench attention`
//! for one thread; `LM_BENCH_KERNELS=avx2,avx512` narrows the paths.

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use lm_model::{AttentionWorkload, Kernel, KvPrecision};
use std::hint::black_box;

/// The kernels this CPU runs that `LM_BENCH_KERNELS` (a comma-separated
/// list of kernel names; unset or empty for all) asks for.
fn kernels() -> impl Iterator<Item = Kernel> {
    let wanted = std::env::var("LM_BENCH_KERNELS").unwrap_or_default();
    Kernel::available().into_iter().filter(move |kernel| {
        wanted.is_empty() || wanted.split(',').any(|w| w.trim() == kernel.name())
    })
}

/// Times `step` on a workload of `n_positions` for each of `precisions`
/// and each kernel, then closes `group`.
fn per_precision_and_kernel<R>(
    mut group: BenchmarkGroup<'_, WallTime>,
    precisions: &[KvPrecision],
    n_positions: usize,
    step: impl Fn(&mut AttentionWorkload) -> R,
) {
    for &precision in precisions {
        for kernel in kernels() {
            let mut workload = AttentionWorkload::new(kernel, precision, n_positions)
                .expect("the kernel runs here");
            group.bench_function(format!("{precision:?} {kernel:?}"), |b| {
                b.iter(|| black_box(step(&mut workload)))
            });
        }
    }
    group.finish();
}

fn prefill(c: &mut Criterion) {
    const N: u64 = 2048;
    let mut group = c.benchmark_group("attention prefill 2048");
    group.sample_size(10);
    // Query-key products, one per query and visible position.
    group.throughput(Throughput::Elements(N * (N + 1) / 2 * 9));
    let precisions = [KvPrecision::F16, KvPrecision::F32, KvPrecision::Q8_0];
    per_precision_and_kernel(group, &precisions, N as usize, AttentionWorkload::prefill);
}

fn decode_step(c: &mut Criterion) {
    const N: u64 = 4096;
    let mut group = c.benchmark_group("attention decode at 4096");
    group.throughput(Throughput::Elements(N * 9));
    let precisions = [KvPrecision::F16, KvPrecision::Q8_0];
    per_precision_and_kernel(
        group,
        &precisions,
        N as usize,
        AttentionWorkload::decode_step,
    );
}

criterion_group!(benches, prefill, decode_step);
criterion_main!(benches);
