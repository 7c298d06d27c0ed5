//! The K-quants and IQ4_XS (256-weight super-blocks): bit-exact dequantisation against
//! gguf-py on real and random blocks (fixtures/quant/kquant_blocks.json,
//! written by scripts/reference/kquant_blocks.py), products against
//! llama.cpp's own kernels (fixtures/quant/kquant_dots.json, written by
//! scripts/reference/kquant_dots.py) and a brute-force f64 reference, the
//! SIMD path against the portable one, and batched products against single
//! ones, on seeded random matrices.

use lm_model::{GgmlType, QMatrix, QuantError};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::common::{FixtureJson, fixture_path, kernels_of_this_cpu, read_json};
use crate::quant_kernels::{
    Product, check_matmul_gives_each_input_its_matvec_bits, check_matvec_errors,
    check_simd_kernels_give_portable_bits, kernel_products, random_matrix, reference_matvec,
};

/// The super-block types: the K-quants and IQ4_XS, all multiplied with Q8_K.
pub(crate) const K_TYPES: [GgmlType; 6] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn hex_f32s(hex: &str) -> Vec<f32> {
    hex_bytes(hex)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn assert_bits_eq(actual: &[f32], expected: &[f32], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for (j, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert_eq!(a.to_bits(), e.to_bits(), "{what} element {j}: {a} != {e}");
    }
}

#[test]
fn k_quant_ids_and_block_geometry() {
    let table = [
        (10, GgmlType::Q2_K, 84),
        (11, GgmlType::Q3_K, 110),
        (12, GgmlType::Q4_K, 144),
        (13, GgmlType::Q5_K, 176),
        (14, GgmlType::Q6_K, 210),
        (23, GgmlType::IQ4_XS, 136),
    ];
    for (id, ty, block_bytes) in table {
        assert_eq!(GgmlType::from_id(id).unwrap(), ty);
        assert_eq!((ty.block_size(), ty.block_bytes()), (256, block_bytes));
        assert_eq!(ty.row_bytes(1536), Ok(6 * block_bytes));
        // SmolLM2's width 576 is not a whole number of super-blocks.
        assert_eq!(
            ty.row_bytes(576),
            Err(QuantError::NotBlockMultiple {
                ty,
                n_cols: 576,
                block_size: 256
            })
        );
    }
    assert_eq!(GgmlType::Q4_K.to_string(), "q4_K");
    assert_eq!(GgmlType::IQ4_XS.to_string(), "iq4_xs");
}

/// Every block of the fixture, alone and all of a type's blocks as one row,
/// dequantizes to gguf-py's values bit for bit.
#[test]
fn k_quant_blocks_dequantize_like_gguf_py() {
    let fixture = read_json(&fixture_path("quant/kquant_blocks.json"));
    for ty in K_TYPES {
        let cases = fixture.field(ty.name()).array();
        assert!(cases.len() >= 3, "{ty}: fixture cases");
        let (mut row, mut expected_row) = (Vec::new(), Vec::new());
        for case in cases {
            let block = hex_bytes(case.field("block").str());
            let expected = hex_f32s(case.field("values").str());
            let m = QMatrix::new(ty, 1, 256, &block).unwrap();
            let mut out = vec![f32::NAN; 256];
            m.dequantize_row(0, &mut out).unwrap();
            let source = case.field("source").str();
            assert_bits_eq(&out, &expected, &format!("{ty} block from {source}"));
            row.extend(block);
            expected_row.extend(expected);
        }
        let n_cols = 256 * cases.len();
        let m = QMatrix::new(ty, 1, n_cols, &row).unwrap();
        let mut out = vec![f32::NAN; n_cols];
        m.dequantize_row(0, &mut out).unwrap();
        assert_bits_eq(
            &out,
            &expected_row,
            &format!("{ty} row of {} blocks", cases.len()),
        );
    }
}

/// llama.cpp's `ggml_vec_dot_<type>_q8_K` (its AVX2 build) on the fixture's
/// first four blocks of each type as one row, against our products on every
/// kernel: the same Q8_K activations and exact integer sums, so only the
/// order of the f32 additions differs, within 1e-6 of Σ|w_j x_j|.
#[test]
fn k_quant_products_match_llama_cpp() {
    let blocks = read_json(&fixture_path("quant/kquant_blocks.json"));
    let dots = read_json(&fixture_path("quant/kquant_dots.json"));
    for ty in K_TYPES {
        let expected = dots.field(ty.name());
        let n_cols = expected.field("n_cols").u64() as usize;
        let row: Vec<u8> = blocks.field(ty.name()).array()[..n_cols / 256]
            .iter()
            .flat_map(|case| hex_bytes(case.field("block").str()))
            .collect();
        for kernel in kernels_of_this_cpu() {
            let m = QMatrix::new(ty, 1, n_cols, &row)
                .unwrap()
                .with_kernel(kernel)
                .unwrap();
            for product in expected.field("products").array() {
                let x = hex_f32s(product.field("x").str());
                let llama = f32::from_bits(product.field("dot_bits").u64() as u32);
                let mut y = [f32::NAN];
                m.matvec(&x, &mut y).unwrap();
                let magnitude = reference_matvec(&m, &x).1[0];
                let diff = f64::from(y[0] - llama).abs();
                assert!(
                    diff <= 1e-6 * magnitude,
                    "{ty} {kernel:?}: {} vs llama.cpp's {llama} (Σ|w x| = {magnitude})",
                    y[0]
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Products on seeded random matrices.
// ---------------------------------------------------------------------------

#[test]
fn k_quant_exact_matvec_matches_f64_reference_within_f32_rounding() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    check_matvec_errors(&K_TYPES, (37, 1536), |_| 1e-5, &[Product::Exact], &mut rng);
}

/// Q8_K activations round each value to 1/254 of its super-block's largest
/// magnitude. A super-block of 256 always holds one of the test vector's
/// outliers (one in 97 values, 20 times the others), so the rounding step is
/// coarser than with 32-value blocks: the error relative to Σ|W x| measures
/// up to 6e-3 (Q2_K, whose minimums make every weight of a group one sign);
/// we assert 1e-2 per row.
#[test]
fn k_quant_matvec_is_within_stated_tolerance_of_f64_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    check_matvec_errors(&K_TYPES, (64, 1536), |_| 1e-2, &kernel_products(), &mut rng);
}

/// Each SIMD path computes the same integer block sums as the portable path
/// in the same f32 operations and order: every path gives the portable
/// path's bits. A kernel this CPU lacks is a typed error instead.
#[test]
fn k_quant_simd_and_portable_kernels_agree() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    check_simd_kernels_give_portable_bits(&K_TYPES, &[256, 512, 1536], &mut rng);
}

/// Batches of 2, 3, 5 and 9 inputs (on the SIMD path: one group of 2 or 3,
/// then groups of 3 and 2 and of 3, 3 and 3) give each input the bits of its
/// own product, on every kernel.
#[test]
fn k_quant_matmul_equals_one_matvec_per_input_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    check_matmul_gives_each_input_its_matvec_bits(&K_TYPES, &[2, 3, 5, 9], (40, 512), &mut rng);
}

#[test]
fn k_quant_zero_activations_give_zero() {
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    for ty in K_TYPES {
        for kernel in kernels_of_this_cpu() {
            let data = random_matrix(ty, 3, 256, &mut rng);
            let m = QMatrix::new(ty, 3, 256, &data)
                .unwrap()
                .with_kernel(kernel)
                .unwrap();
            let mut y = [f32::NAN; 3];
            m.matvec(&[0.0; 256], &mut y).unwrap();
            assert_eq!(y, [0.0; 3], "{ty} {kernel:?}");
        }
    }
}
