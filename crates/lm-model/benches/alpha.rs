//! The cost of each extra input of a batched product, as a table: alpha(n) =
//! (t(n) / t(1) - 1) / (n - 1), the fraction of a one-input product that each
//! further input costs, for `matmul` of n = 1, 2, 3, 4, 5, 8 and 16 inputs on
//! SmolLM2-sized matrices with every SIMD kernel this CPU runs
//! (`LM_BENCH_KERNELS=avx2,avx512` narrows the list, `LM_BENCH_TYPES=q4_1`
//! the matrices).
//!
//! Each time is the minimum over rounds that visit every n in turn, so a
//! busy machine (other processes taking the cores) inflates few of them.
//! Run with `RAYON_NUM_THREADS=1 cargo bench -p lm-model --bench alpha`.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use lm_model::{GgmlType, Kernel, QMatrix};

use common::{activations, kernels, matrix_data};

const WIDTHS: [usize; 7] = [1, 2, 3, 4, 5, 8, 16];

/// Minimum time of one `matmul` of n inputs, for each n of [`WIDTHS`].
fn min_times(m: &QMatrix<'_>, rounds: usize) -> [Duration; WIDTHS.len()] {
    let xs = activations(16 * m.n_cols());
    let mut ys = vec![0.0; 16 * m.n_rows()];
    let mut best = [Duration::MAX; WIDTHS.len()];
    for _ in 0..rounds {
        for (best, &n) in best.iter_mut().zip(&WIDTHS) {
            let start = Instant::now();
            for _ in 0..4 {
                m.matmul(
                    black_box(&xs[..n * m.n_cols()]),
                    n,
                    &mut ys[..n * m.n_rows()],
                )
                .unwrap();
            }
            *best = (*best).min(start.elapsed() / 4);
        }
    }
    best
}

fn main() {
    let wanted_types = std::env::var("LM_BENCH_TYPES").unwrap_or_default();
    let shapes = [
        ("q4_1 1536x576", GgmlType::Q4_1, 1536, 576),
        ("q8_0 1536x576", GgmlType::Q8_0, 1536, 576),
        ("q5_0 1536x576", GgmlType::Q5_0, 1536, 576),
        ("q4_K 576x1536", GgmlType::Q4_K, 576, 1536),
    ]
    .into_iter()
    .filter(|(name, ..)| {
        wanted_types.is_empty() || wanted_types.split(',').any(|w| name.starts_with(w.trim()))
    });
    let rounds: usize = std::env::var("LM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(200);
    let kernels: Vec<Kernel> = kernels().filter(|&k| k != Kernel::Portable).collect();
    let header: Vec<String> = WIDTHS[1..].iter().map(|n| format!("n={n:<3}")).collect();
    println!(
        "{:15} {:8} {:>9}  alpha {}",
        "matrix",
        "kernel",
        "t(1) µs",
        header.join(" ")
    );
    for (name, ty, n_rows, n_cols) in shapes {
        let data = matrix_data(ty, n_rows, n_cols);
        for &kernel in &kernels {
            let m = QMatrix::new(ty, n_rows, n_cols, &data)
                .unwrap()
                .with_kernel(kernel)
                .unwrap();
            let t = min_times(&m, rounds);
            let t1 = t[0].as_secs_f64();
            let alphas: Vec<String> = WIDTHS[1..]
                .iter()
                .zip(&t[1..])
                .map(|(&n, t)| format!("{:<5.2}", (t.as_secs_f64() / t1 - 1.0) / (n - 1) as f64))
                .collect();
            println!(
                "{name:15} {:8} {:9.1}        {}",
                kernel.name(),
                t1 * 1e6,
                alphas.join(" ")
            );
        }
    }
}
