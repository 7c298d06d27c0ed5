//! The quantized kernels on SmolLM2's shapes: one decode product (`matvec`)
//! and one prefill product of 128 inputs (`matmul`), for Q4_1 (every layer
//! matrix), Q8_0 (the tied output projection), Q4_0, Q5_0 (most of the
//! requantized "Q4_K_M" file), Q5_1, IQ4_NL, and the K-quants of the
//! Q4_K_M / Q5_K_M / Q6_K files (ffn_down, the one matrix whose width is a
//! multiple of 256), with every kernel this CPU runs (portable, AVX2,
//! AVX-VNNI, AVX-512); and one-input products over 96 MB of such matrices,
//! streamed from 2 MB pages as decode reads them; and Llama 3.2 1B's FFN
//! shapes in Q4_0 and Q4_K, in cache and streamed, and in Q4_0, Q8_0, Q4_K
//! and Q6_K row-major against packed in panels, streamed over 1 GiB
//! (issue 35); and gpt-oss's MXFP4
//! expert shape, one input and several (issue 36). Run with
//! `cargo bench -p lm-model --bench quant`; rayon uses all cores unless
//! `RAYON_NUM_THREADS` says otherwise.

mod common;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use lm_model::{GgmlType, Kernel, QMatrix, panels_for_bench};
use std::hint::black_box;

use common::{activations, kernels, matrix_data};

/// `data` as an `n_rows x n_cols` matrix of `ty` multiplied by `kernel`.
fn matrix_on(
    kernel: Kernel,
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    data: &[u8],
) -> QMatrix<'_> {
    QMatrix::new(ty, n_rows, n_cols, data)
        .unwrap()
        .with_kernel(kernel)
        .unwrap()
}

/// A benchmarked matrix: its label, type, rows and columns.
type Shape = (&'static str, GgmlType, usize, usize);

/// Times `product` on `data` as the `shape` matrix once per kernel this CPU
/// runs (`LM_BENCH_KERNELS=avx2,avx512` narrows the list), each as
/// `"{label} {kernel:?}{suffix}"`.
fn bench_per_kernel(
    group: &mut BenchmarkGroup<'_, WallTime>,
    (label, ty, n_rows, n_cols): Shape,
    suffix: &str,
    data: &[u8],
    mut product: impl FnMut(&QMatrix<'_>),
) {
    for kernel in kernels() {
        let m = matrix_on(kernel, ty, n_rows, n_cols, data);
        group.bench_function(format!("{label} {kernel:?}{suffix}"), |b| {
            b.iter(|| product(&m))
        });
    }
}

/// `data`, back-to-back copies of one `shape` matrix of `one_len` bytes, as
/// row-major matrices for `kernel`.
fn row_major_copies(
    kernel: Kernel,
    (_, ty, n_rows, n_cols): Shape,
    data: &[u8],
    one_len: usize,
) -> Vec<QMatrix<'_>> {
    data.chunks_exact(one_len)
        .map(|bytes| matrix_on(kernel, ty, n_rows, n_cols, bytes))
        .collect()
}

/// One input through every matrix in turn, as a forward pass reads its
/// layers.
fn matvec_each(matrices: &[QMatrix<'_>], x: &[f32], y: &mut [f32]) {
    for m in matrices {
        m.matvec(black_box(x), y).unwrap();
    }
}

fn matvec(c: &mut Criterion) {
    let shapes = [
        ("q4_1 1536x576 (ffn_up)", GgmlType::Q4_1, 1536, 576),
        ("q4_1 576x1536 (ffn_down)", GgmlType::Q4_1, 576, 1536),
        ("q8_0 49152x576 (output)", GgmlType::Q8_0, 49152, 576),
        ("q4_0 1536x576", GgmlType::Q4_0, 1536, 576),
        ("q4_K 576x1536 (ffn_down)", GgmlType::Q4_K, 576, 1536),
        ("q5_K 576x1536 (ffn_down)", GgmlType::Q5_K, 576, 1536),
        ("q6_K 576x1536 (ffn_down)", GgmlType::Q6_K, 576, 1536),
        ("q5_0 1536x576", GgmlType::Q5_0, 1536, 576),
        ("q5_1 1536x576", GgmlType::Q5_1, 1536, 576),
        ("iq4_nl 1536x576", GgmlType::IQ4_NL, 1536, 576),
        // Llama 3.2 1B's FFN shapes: Q4_0 against Q4_K (issue 35).
        ("q4_0 8192x2048 (1B ffn_up)", GgmlType::Q4_0, 8192, 2048),
        ("q4_K 8192x2048 (1B ffn_up)", GgmlType::Q4_K, 8192, 2048),
        ("q4_0 2048x8192 (1B ffn_down)", GgmlType::Q4_0, 2048, 8192),
        ("q4_K 2048x8192 (1B ffn_down)", GgmlType::Q4_K, 2048, 8192),
        // gpt-oss 20B's experts (issue 36).
        (
            "mxfp4 2880x2880 (gpt-oss expert)",
            GgmlType::MXFP4,
            2880,
            2880,
        ),
    ];
    let mut group = c.benchmark_group("matvec");
    for shape @ (_, ty, n_rows, n_cols) in shapes {
        let data = matrix_data(ty, n_rows, n_cols);
        let x = activations(n_cols);
        let mut y = vec![0.0; n_rows];
        group.throughput(Throughput::Bytes(data.len() as u64));
        bench_per_kernel(&mut group, shape, "", &data, |m| {
            m.matvec(black_box(&x), &mut y).unwrap()
        });
    }
    group.finish();
}

fn matmul(c: &mut Criterion) {
    const N: usize = 128;
    let shapes = [
        ("q4_1 1536x576 (ffn_up)", GgmlType::Q4_1, 1536, 576),
        ("q8_0 576x576", GgmlType::Q8_0, 576, 576),
        ("q4_K 576x1536 (ffn_down)", GgmlType::Q4_K, 576, 1536),
        ("q5_0 1536x576", GgmlType::Q5_0, 1536, 576),
    ];
    let mut group = c.benchmark_group("matmul 128");
    group.sample_size(20);
    for shape @ (_, ty, n_rows, n_cols) in shapes {
        let data = matrix_data(ty, n_rows, n_cols);
        let xs = activations(N * n_cols);
        let mut ys = vec![0.0; N * n_rows];
        group.throughput(Throughput::Elements((N * n_rows * n_cols) as u64));
        bench_per_kernel(&mut group, shape, "", &data, |m| {
            m.matmul(black_box(&xs), N, &mut ys).unwrap()
        });
    }
    group.finish();
}

/// The cost of each extra input: `matmul` of n = 1, 2, 3, 4, 8 and 16 inputs
/// (a speculative verification pass has 2-5, a server step up to 16) on
/// SmolLM2-sized matrices. alpha(n) = (t(n) / t(1) - 1) / (n - 1), the
/// fraction of a one-input product each further input costs; run with
/// `RAYON_NUM_THREADS=1` for the one-thread figure.
fn matmul_small_batches(c: &mut Criterion) {
    let shapes = [
        ("q4_1 1536x576", GgmlType::Q4_1, 1536, 576),
        ("q8_0 1536x576", GgmlType::Q8_0, 1536, 576),
        ("q5_0 1536x576", GgmlType::Q5_0, 1536, 576),
        ("q4_K 576x1536", GgmlType::Q4_K, 576, 1536),
        ("mxfp4 2880x2880", GgmlType::MXFP4, 2880, 2880),
    ];
    let mut group = c.benchmark_group("matmul n");
    group.sample_size(20);
    group.warm_up_time(std::time::Duration::from_millis(300));
    group.measurement_time(std::time::Duration::from_secs(1));
    for shape @ (_, ty, n_rows, n_cols) in shapes {
        let data = matrix_data(ty, n_rows, n_cols);
        for n in [1, 2, 3, 4, 8, 16] {
            let xs = activations(n * n_cols);
            let mut ys = vec![0.0; n * n_rows];
            bench_per_kernel(&mut group, shape, &format!(" n={n}"), &data, |m| {
                m.matmul(black_box(&xs), n, &mut ys).unwrap()
            });
        }
    }
    group.finish();
}

/// Back-to-back copies of `one` filling at least `total` bytes, in
/// anonymous memory advised for 2 MB pages as a model load's copy of its
/// file is (`GgufFile::open`). From a `Vec`'s 4 KB pages the streamed
/// products ran about 30% slower (Q4_K panels, 8192 x 2048, one thread,
/// Xeon: 9.3 against 13.4 GiB/s), which is not what decode meets.
fn streamed_copies(one: &[u8], total: usize) -> memmap2::MmapMut {
    let copies = total.div_ceil(one.len());
    let mut map = memmap2::MmapOptions::new()
        .len(copies * one.len())
        .map_anon()
        .expect("anonymous memory for the copies");
    // A hint, refused (harmlessly) where transparent huge pages are off.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    for copy in map.chunks_exact_mut(one.len()) {
        copy.copy_from_slice(one);
    }
    map
}

/// One decode step's worth of weights streamed from memory: `matvec` over
/// enough copies of a layer matrix to fill about 96 MB (SmolLM2's weights)
/// in 2 MB pages ([`streamed_copies`]), one after the other, as a forward
/// pass reads its layers. `matvec` above keeps one matrix in cache and
/// times the arithmetic; this times what decode meets, the arithmetic
/// overlapped with reads from memory or, where the last-level cache holds
/// 96 MB, from it (docs/performance-log.md, "Scales by a scalar load").
/// Run with `RAYON_NUM_THREADS=1` for the one-thread figure.
fn matvec_streamed(c: &mut Criterion) {
    const TOTAL_BYTES: usize = 96 << 20;
    let shapes = [
        ("q4_1 1536x576", GgmlType::Q4_1, 1536, 576),
        ("q5_0 1536x576", GgmlType::Q5_0, 1536, 576),
        ("q8_0 1536x576", GgmlType::Q8_0, 1536, 576),
        ("q4_K 576x1536", GgmlType::Q4_K, 576, 1536),
        ("q6_K 576x1536", GgmlType::Q6_K, 576, 1536),
        ("q4_0 8192x2048 (1B ffn_up)", GgmlType::Q4_0, 8192, 2048),
        ("q4_K 8192x2048 (1B ffn_up)", GgmlType::Q4_K, 8192, 2048),
        ("q4_0 2048x8192 (1B ffn_down)", GgmlType::Q4_0, 2048, 8192),
        ("q4_K 2048x8192 (1B ffn_down)", GgmlType::Q4_K, 2048, 8192),
    ];
    let mut group = c.benchmark_group("matvec streamed 96 MB");
    group.sample_size(20);
    for shape @ (name, ty, n_rows, n_cols) in shapes {
        let one = matrix_data(ty, n_rows, n_cols);
        // Distinct copies, so no matrix is still in cache when it comes
        // round again.
        let data = streamed_copies(&one, TOTAL_BYTES);
        let x = activations(n_cols);
        let mut y = vec![0.0; n_rows];
        group.throughput(Throughput::Bytes(data.len() as u64));
        for kernel in kernels() {
            let matrices = row_major_copies(kernel, shape, &data, one.len());
            group.bench_function(format!("{name} {kernel:?}"), |b| {
                b.iter(|| matvec_each(&matrices, &x, &mut y))
            });
        }
    }
    group.finish();
}

/// Llama 3.2 1B's FFN shapes, row-major against packed in panels
/// (`quant/packed.rs`, `quant/packed_k.rs`, as a model load packs them),
/// on each kernel with panel products: one input streamed over 1 GiB of
/// distinct copies in 2 MB pages (decode, beyond any last-level cache met
/// so far: the Xeon's VM reports 480 MiB), and 128 inputs on one matrix
/// (prefill). With `RAYON_NUM_THREADS=1`, the streamed figure against the
/// one-thread read bandwidth of `cargo xtask bench` is a kernel's share of
/// the decode bound with nothing else of a step around it; with more
/// threads each product is also handed to the pool from outside, which a
/// decode pass does not pay (`in_pool`, `transformer/model.rs`).
/// `LM_BENCH_KERNELS=avx2` times the AVX2 path on an AVX-512 CPU (issue
/// 35).
fn panels(c: &mut Criterion) {
    const TOTAL_BYTES: usize = 1 << 30;
    const N: usize = 128;
    let shapes = [
        ("q4_0 8192x2048 (1B ffn_up)", GgmlType::Q4_0, 8192, 2048),
        ("q8_0 8192x2048 (1B ffn_up)", GgmlType::Q8_0, 8192, 2048),
        ("q4_K 8192x2048 (1B ffn_up)", GgmlType::Q4_K, 8192, 2048),
        ("q4_K 2048x8192 (1B ffn_down)", GgmlType::Q4_K, 2048, 8192),
        ("q6_K 2048x8192 (1B ffn_down)", GgmlType::Q6_K, 2048, 8192),
    ];
    let mut group = c.benchmark_group("panels");
    group.sample_size(10);
    for shape @ (name, ty, n_rows, n_cols) in shapes {
        let one = matrix_data(ty, n_rows, n_cols);
        let x = activations(n_cols);
        let xs = activations(N * n_cols);
        let (mut y, mut ys) = (vec![0.0; n_rows], vec![0.0; N * n_rows]);
        for kernel in kernels().filter(|k| k.has_panel_kernel()) {
            for layout in ["row-major", "panels"] {
                let mut data = streamed_copies(&one, TOTAL_BYTES);
                let matrices: Vec<QMatrix<'_>> = match layout {
                    "row-major" => row_major_copies(kernel, shape, &data, one.len()),
                    _ => data
                        .chunks_exact_mut(one.len())
                        .map(|bytes| {
                            panels_for_bench(ty, n_rows, n_cols, bytes, kernel)
                                .unwrap()
                                .expect("whole panels")
                        })
                        .collect(),
                };
                group.throughput(Throughput::Bytes((matrices.len() * one.len()) as u64));
                group.bench_function(format!("{name} {layout} {kernel:?} streamed"), |b| {
                    b.iter(|| matvec_each(&matrices, &x, &mut y))
                });
                group.throughput(Throughput::Elements((N * n_rows * n_cols) as u64));
                group.bench_function(format!("{name} {layout} {kernel:?} matmul {N}"), |b| {
                    b.iter(|| matrices[0].matmul(black_box(&xs), N, &mut ys).unwrap())
                });
            }
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    matvec,
    matvec_streamed,
    matmul,
    matmul_small_batches,
    panels
);
criterion_main!(benches);
