//! Shared by the quantized-product benches (`quant`, `alpha`): the same
//! deterministic matrices and activations, and the kernels to time.

use lm_model::{GgmlType, Kernel};

/// Deterministic bytes from an xorshift generator.
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// A random matrix whose f16 scales are small normal numbers (byte 1 of each
/// scale is forced into 0x10..0x2F, so no scale is NaN or infinite).
pub fn matrix_data(ty: GgmlType, n_rows: usize, n_cols: usize) -> Vec<u8> {
    let n_bytes = n_rows * ty.row_bytes(n_cols).unwrap();
    let mut data = bytes(n_bytes, 0x9e37_79b9_7f4a_7c15);
    let scale_bytes: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[1, 3],
        GgmlType::Q6_K => &[209],
        GgmlType::Q3_K => &[109],
        GgmlType::Q2_K => &[81, 83],
        _ => &[1],
    };
    for block in data.chunks_exact_mut(ty.block_bytes()) {
        for &i in scale_bytes {
            block[i] = 0x10 | (block[i] & 0x1f);
        }
    }
    data
}

/// `n` deterministic activations in -2..2.
pub fn activations(n: usize) -> Vec<f32> {
    bytes(n, 7)
        .into_iter()
        .map(|b| f32::from(b) / 64.0 - 2.0)
        .collect()
}

/// The kernels this CPU runs that `LM_BENCH_KERNELS` (a comma-separated
/// list of kernel names; unset or empty for all) asks for, slowest first.
pub fn kernels() -> impl Iterator<Item = Kernel> {
    let wanted = std::env::var("LM_BENCH_KERNELS").unwrap_or_default();
    Kernel::available()
        .into_iter()
        .filter(move |k| wanted.is_empty() || wanted.split(',').any(|w| w.trim() == k.name()))
}
