//! A mixture of experts opened with `GgufFile::open` packs the tensors it
//! copies into huge pages (attention, output) in panels, as a dense file's
//! are, and leaves its mapped experts as the file has them: the packed
//! matrices dequantize to the same rows and multiply to the row-major
//! products within their rounding, and the model's logits match the mapped
//! (unpacked) file's.

use lm_core::{LanguageModel, Rows, TokenId};
use lm_model::{GgmlType, GgufFile, Kernel, Llama};

use crate::arch_errors::Model;
use crate::common::fixture_path;
use crate::common::gguf_writer::GgufTensor;

/// The qwen3moe fixture with every 2-d matrix of whole panels (16 rows)
/// quantized to Q8_0 (its attention and output matrices; the 8-row router
/// stays f32), written to `path`; returns the quantized tensors' names.
fn write_quantized_mixture(path: &std::path::Path) -> Vec<String> {
    let fixture = GgufFile::map(fixture_path("arch/qwen3moe.gguf")).unwrap();
    let mut model = Model::read("qwen3moe");
    let mut quantized = Vec::new();
    for info in fixture.tensors() {
        if info.dims.len() != 2 || !info.n_rows().is_multiple_of(16) {
            continue;
        }
        let values = fixture.tensor(&info.name).unwrap().to_f32_vec().unwrap();
        let row_bytes = GgmlType::Q8_0.row_bytes(info.n_cols()).unwrap();
        let mut data = vec![0u8; info.n_rows() * row_bytes];
        for (row, out) in values
            .chunks_exact(info.n_cols())
            .zip(data.chunks_exact_mut(row_bytes))
        {
            GgmlType::Q8_0.quantize_row(row, out).unwrap();
        }
        model = model.replace(GgufTensor {
            name: info.name.clone(),
            dims: info.dims.iter().map(|&d| d as u64).collect(),
            type_id: GgmlType::Q8_0.id(),
            data,
        });
        quantized.push(info.name.clone());
    }
    std::fs::write(path, model.bytes(32)).unwrap();
    quantized
}

#[test]
fn an_opened_mixture_packs_its_copied_matrices_and_not_its_experts() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("qwen3moe-q8_0.gguf");
    let quantized = write_quantized_mixture(&path);
    assert!(quantized.len() >= 5, "{quantized:?}");
    let mapped = GgufFile::map(&path).unwrap();
    let mut opened = GgufFile::open(&path).unwrap();
    assert!(opened.is_mapped(), "the experts stay mapped");
    let packs = Kernel::configured().packs(GgmlType::Q8_0);
    let n_packed = opened.pack_tensors(|_| true);
    assert_eq!(n_packed, if packs { quantized.len() } else { 0 });
    // A map of the file packs nothing.
    assert_eq!(GgufFile::map(&path).unwrap().pack_tensors(|_| true), 0);

    for name in &quantized {
        let row_major = mapped.tensor(name).unwrap().matrix().unwrap();
        let view = opened.tensor(name).unwrap();
        assert_eq!(view.data.len(), row_major.data().len(), "{name}");
        assert_eq!(view.data == row_major.data(), !packs, "{name} rearranged");
        let panels = view.matrix().unwrap();
        let (n_rows, n_cols) = (row_major.n_rows(), row_major.n_cols());
        let x: Vec<f32> = (0..n_cols)
            .map(|i| ((i * 29 % 67) as f32 - 33.0) / 11.0)
            .collect();
        let (mut y_rows, mut y_panels) = (vec![0.0; n_rows], vec![0.0; n_rows]);
        row_major.matvec(&x, &mut y_rows).unwrap();
        panels.matvec(&x, &mut y_panels).unwrap();
        let (mut original, mut unpacked) = (vec![0.0; n_cols], vec![0.0; n_cols]);
        for r in 0..n_rows {
            row_major.dequantize_row(r, &mut original).unwrap();
            panels.dequantize_row(r, &mut unpacked).unwrap();
            assert_eq!(unpacked, original, "{name} row {r}");
            // The same quantized terms summed in another order.
            let magnitude: f32 = original.iter().zip(&x).map(|(w, x)| (w * x).abs()).sum();
            assert!(
                (y_panels[r] - y_rows[r]).abs() <= 1e-5 * magnitude,
                "{name} row {r}: {} vs {}",
                y_panels[r],
                y_rows[r]
            );
        }
    }
    // The experts are the file's bytes, in the file's layout.
    let experts = opened
        .tensors()
        .iter()
        .filter(|info| info.dims.len() == 3)
        .map(|info| info.name.clone())
        .collect::<Vec<_>>();
    assert_eq!(experts.len(), 12);
    for name in &experts {
        assert_eq!(
            opened.tensor(name).unwrap().data,
            mapped.tensor(name).unwrap().data,
            "{name}"
        );
    }
}

#[test]
fn an_opened_mixture_in_panels_computes_the_mapped_ones_logits() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("qwen3moe-q8_0.gguf");
    write_quantized_mixture(&path);
    let opened = Llama::from_file(GgufFile::open(&path).unwrap()).unwrap();
    let mapped = Llama::from_file(GgufFile::map(&path).unwrap()).unwrap();
    let prompt: Vec<TokenId> = (0..24).map(|i| (i * 53 + 5) % 512).collect();
    let logits = |model: &lm_model::Decoder| {
        let mut state = model.new_state();
        let mut logits = Vec::new();
        model
            .forward(&mut state, &prompt, Rows::All, &mut logits)
            .unwrap();
        logits
    };
    let (packed, row_major) = (logits(&opened), logits(&mapped));
    assert_eq!(packed.len(), prompt.len() * 512);
    let scale = row_major.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let largest_gap = packed
        .iter()
        .zip(&row_major)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(scale > 0.1, "{scale}");
    assert!(
        largest_gap <= 1e-4 * scale,
        "largest gap {largest_gap} of logits up to {scale}"
    );
}
