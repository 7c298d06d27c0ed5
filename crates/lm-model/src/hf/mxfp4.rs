//! gpt-oss's MXFP4 experts from Hugging Face's two tensors to GGML's
//! blocks (`quant/mxfp4.rs`), as `convert_hf_to_gguf.py`'s `repack_mxfp4`
//! does: the E8M0 scale byte is the same in both, the 16 code bytes are
//! reordered.
//!
//! ```text
//! HF   *_scales [.., n_blocks]       e
//!      *_blocks [.., n_blocks, 16]   byte b: value 2b (low nibble), value 2b + 1 (high)
//! GGML block (17 bytes)              e, then byte j: value j (low nibble), value j + 16 (high)
//! ```
//!
//! A repack, not a view: the bytes change, so the experts are a buffer of
//! their own (4.25 bits a weight, the size of the two HF tensors).

/// GGML's MXFP4 blocks of HF's `blocks` (16 bytes each) and `scales` (one
/// byte each), block by block; `None` when the counts differ.
pub(crate) fn ggml_blocks(blocks: &[u8], scales: &[u8]) -> Option<Vec<u8>> {
    if blocks.len() != scales.len().checked_mul(16)? {
        return None;
    }
    let mut out = Vec::with_capacity(scales.len() * 17);
    for (codes, &e) in blocks.chunks_exact(16).zip(scales) {
        out.push(e);
        // Value k is byte k / 2's low nibble when k is even, high when odd.
        let value = |k: usize| (codes[k / 2] >> (4 * (k % 2))) & 0x0F;
        out.extend((0..16).map(|j| value(j) | (value(j + 16) << 4)));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;

    /// transformers' `convert_moe_packed_tensors` of one block, written
    /// out: value `k` of HF's block from its byte `k / 2`, low nibble
    /// first, times `2^(e - 127)`.
    fn hf_dequantize(codes: &[u8], e: u8) -> Vec<f32> {
        const FP4: [f32; 16] = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        let scale = 2f32.powi(i32::from(e) - 127);
        codes
            .iter()
            .flat_map(|&b| [FP4[usize::from(b & 0x0F)], FP4[usize::from(b >> 4)]])
            .map(|v| v * scale)
            .collect()
    }

    /// Repacked blocks dequantize (the GGUF path's MXFP4) to what
    /// transformers computes from the HF bytes, for every code in every
    /// position and a spread of exponents.
    #[test]
    fn repacked_blocks_dequantize_as_transformers_does() {
        let n_blocks = 8;
        let blocks: Vec<u8> = (0..n_blocks * 16)
            .map(|i| (i as u8).wrapping_mul(37).wrapping_add(11))
            .collect();
        let scales: Vec<u8> = (0..n_blocks).map(|i| 110 + 3 * i as u8).collect();
        let ggml = ggml_blocks(&blocks, &scales).unwrap();
        assert_eq!(ggml.len(), n_blocks * 17);
        let mut ours = vec![0f32; n_blocks * 32];
        crate::quant::block::dequantize_row(GgmlType::MXFP4, &ggml, &mut ours);
        let expected: Vec<f32> = blocks
            .chunks_exact(16)
            .zip(&scales)
            .flat_map(|(codes, &e)| hf_dequantize(codes, e))
            .collect();
        assert_eq!(ours, expected);
        assert!(ggml_blocks(&blocks[..16], &scales).is_none());
    }
}
