//! What a model costs in memory traffic and in memory, from its GGUF header
//! alone (no weight is read): the bytes decode reads per token, hence its
//! bound at a measured read bandwidth, and the peak RSS budget of issue 35
//! (file size + KV cache + 10%).
//!
//! ```text
//! weights per token = every tensor's bytes, except token_embd.weight, of which decode
//!                     reads one row (unless the output matrix is tied to it: then it
//!                     is the unembedding, read whole, counted once), and a mixture of
//!                     experts' 3-d expert tensors (`*_exps`), of which it reads the
//!                     n_expert_used experts a token runs out of n_expert
//! KV cache stored   = sum over layers of 2 (K, V) x n_kv_head x head_dim x element bytes
//!                     x positions the layer keeps (whole chunks of KV_CHUNK_LEN,
//!                     capped at the context and, for a sliding layer, at its ring)
//! KV read per token = the same with the positions the token attends to
//! decode bound      = read bandwidth / (weights per token + KV read per token)
//! RSS budget        = 1.1 x (file size + KV cache stored for the longest run)
//! ```
//!
//! The KV element type is the model's `KvPrecision` (f16 as llama.cpp's
//! default cache, as `Llama` loads every model; f32 otherwise), and the
//! positions a sliding-window layer keeps follow lm-model's `kv_cache.rs`
//! (a ring of twice the largest window, in whole chunks).

use std::path::Path;

use anyhow::{Context, Result};
use lm_model::{AttentionKind, GgufFile, KV_CHUNK_LEN, Llama, TensorInfo, TransformerConfig};

/// Issue 35's peak RSS allowance over file size + KV cache.
pub(super) const RSS_MARGIN: f64 = 1.1;
/// The token embedding table's tensor name.
const TOKEN_EMBEDDING: &str = "token_embd.weight";
/// What the names of a mixture of experts' 3-d expert tensors hold
/// (`blk.N.ffn_{gate,up,down}_exps.weight` and their biases).
const EXPERTS_MARK: &str = "_exps.";

/// A model's file size, weight traffic per token and configuration.
#[derive(Debug, Clone)]
pub(super) struct Footprint {
    /// The GGUF file's size.
    pub(super) file_bytes: u64,
    /// Weight bytes one decode step reads.
    pub(super) weight_bytes_per_token: u64,
    /// The model's shape and KV precision.
    pub(super) config: TransformerConfig,
}

impl Footprint {
    /// Reads `path`'s header (a map of the file: no weight is copied).
    pub(super) fn of(path: &Path) -> Result<Self> {
        let file_bytes = std::fs::metadata(path)
            .with_context(|| format!("cannot stat {}", path.display()))?
            .len();
        let file = GgufFile::open_metadata(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let config = Llama::config(&file)
            .with_context(|| format!("cannot read the configuration of {}", path.display()))?;
        Ok(Self {
            file_bytes,
            weight_bytes_per_token: weight_bytes_per_token(file.tensors(), &config),
            config,
        })
    }

    /// Bytes our KV cache allocates to hold `n_positions`.
    pub(super) fn kv_bytes_stored(&self, n_positions: usize) -> u64 {
        kv_bytes(&self.config, |kind| {
            positions_stored(&self.config, kind, n_positions)
        })
    }

    /// The peak RSS budget for a run whose cache holds `n_positions`.
    pub(super) fn rss_budget(&self, n_positions: usize) -> f64 {
        (self.file_bytes + self.kv_bytes_stored(n_positions)) as f64 * RSS_MARGIN
    }

    /// Bytes one decode step reads at position `pos`: the weights and the
    /// keys and values of every position it attends to.
    pub(super) fn bytes_per_token(&self, pos: usize) -> u64 {
        let kv = kv_bytes(&self.config, |kind| match kind {
            AttentionKind::Global => pos + 1,
            AttentionKind::Sliding { window } => (pos + 1).min(window),
        });
        self.weight_bytes_per_token + kv
    }

    /// `f16`, `f32` or `q8_0`, as the cache stores keys and values.
    pub(super) fn kv_type(&self) -> &'static str {
        self.config.kv_precision.name()
    }
}

/// Weight bytes one decode step reads: every tensor whole, except the token
/// embedding table, of which one row is read, unless the configuration's
/// `tied_output` makes it the unembedding too (then it is read whole,
/// once), and each expert tensor of a mixture of experts, of which the
/// `n_expert_used` experts a token runs are read.
fn weight_bytes_per_token(tensors: &[TensorInfo], config: &TransformerConfig) -> u64 {
    let experts_read = |bytes: usize| match config.options.moe {
        Some(moe) => bytes / moe.n_expert.max(1) * moe.n_expert_used,
        None => bytes,
    };
    tensors
        .iter()
        .map(|tensor| {
            if tensor.name == TOKEN_EMBEDDING && !config.tied_output {
                tensor.n_bytes / tensor.n_rows().max(1)
            } else if tensor.name.contains(EXPERTS_MARK) {
                experts_read(tensor.n_bytes)
            } else {
                tensor.n_bytes
            }
        })
        .map(|bytes| bytes as u64)
        .sum()
}

/// Key and value bytes over every layer, with `positions(kind)` positions
/// in a layer of that attention kind.
fn kv_bytes(config: &TransformerConfig, positions: impl Fn(AttentionKind) -> usize) -> u64 {
    let per_position = 2 * config.n_kv_head * config.kv_precision.row_bytes(config.head_dim);
    (0..config.n_layer)
        .map(|layer_idx| (per_position * positions(config.attention_kind(layer_idx))) as u64)
        .sum()
}

/// Positions a layer of `kind` allocates to hold `n_positions`: whole
/// chunks, at most the context, and for a sliding layer at most the ring
/// (twice the largest window, whole chunks: `KvCache::ring_len`).
fn positions_stored(config: &TransformerConfig, kind: AttentionKind, n_positions: usize) -> usize {
    let ring_len = || {
        let largest_window = (0..config.n_layer)
            .filter_map(|layer_idx| match config.attention_kind(layer_idx) {
                AttentionKind::Sliding { window } => Some(window),
                AttentionKind::Global => None,
            })
            .max()
            .unwrap_or(0);
        (2 * largest_window).max(1).div_ceil(KV_CHUNK_LEN) * KV_CHUNK_LEN
    };
    let held = n_positions.min(config.context_length);
    let held = match kind {
        AttentionKind::Global => held,
        AttentionKind::Sliding { .. } => held.min(ring_len()),
    };
    held.div_ceil(KV_CHUNK_LEN) * KV_CHUNK_LEN
}

#[cfg(test)]
mod tests {
    use lm_core::LanguageModel;
    use lm_model::{
        Gating, GgmlType, KvPrecision, MoeOptions, SlidingWindow, Toy, ToyArchitecture,
    };

    use super::*;

    /// The KV formula against what a real cache allocates (the toy llama:
    /// 2 layers, 2 key/value heads of 4, context 64), in f16 and f32.
    #[test]
    fn kv_bytes_stored_match_a_real_cache() {
        for precision in [KvPrecision::F16, KvPrecision::F32] {
            let model = Toy::with_options(ToyArchitecture::Llama, 64, Toy::SEED)
                .unwrap()
                .with_kv_precision(precision);
            let footprint = Footprint {
                file_bytes: 0,
                weight_bytes_per_token: 0,
                config: model.config().clone(),
            };
            for n in [1, 31, 32, 33, 64, 200] {
                let mut state = model.new_state();
                state.reserve(n);
                assert_eq!(
                    footprint.kv_bytes_stored(n),
                    state.cache().allocated_bytes() as u64,
                    "{precision:?} at {n} positions"
                );
            }
        }
    }

    /// A sliding-window model by hand: 6 layers of 2 heads of 64 in f16
    /// (512 bytes a position), five sliding with window 100 (a ring of
    /// 224 positions: 200 rounded up to chunks), one global.
    #[test]
    fn sliding_layers_keep_their_ring_and_read_their_window() {
        let mut config = toy_llama_config();
        (config.n_layer, config.n_kv_head, config.head_dim) = (6, 2, 64);
        config.context_length = 4096;
        config.kv_precision = KvPrecision::F16;
        config.options.sliding_window = Some(SlidingWindow {
            window: 100,
            period: 6,
            rope_base: 10_000.0,
        });
        let footprint = Footprint {
            file_bytes: 1000,
            weight_bytes_per_token: 7,
            config,
        };
        assert_eq!(footprint.kv_bytes_stored(10), 6 * 512 * 32);
        assert_eq!(footprint.kv_bytes_stored(1000), (5 * 224 + 1024) * 512);
        assert_eq!(footprint.bytes_per_token(9), 7 + 6 * 512 * 10);
        assert_eq!(footprint.bytes_per_token(999), 7 + (5 * 100 + 1000) * 512);
        let budget = (1000 + (5 * 224 + 1024) * 512) as f64 * 1.1;
        assert!((footprint.rss_budget(1000) - budget).abs() < 1e-6);
    }

    /// The toy llama's configuration, for a test to change.
    fn toy_llama_config() -> TransformerConfig {
        Toy::with_options(ToyArchitecture::Llama, 64, Toy::SEED)
            .unwrap()
            .config()
            .clone()
    }

    fn tensor(name: &str, n_cols: usize, n_rows: usize, n_bytes: usize) -> TensorInfo {
        TensorInfo {
            name: name.to_owned(),
            dims: vec![n_cols, n_rows],
            ggml_type: GgmlType::F16,
            offset: 0,
            n_bytes,
        }
    }

    #[test]
    fn decode_reads_one_embedding_row_unless_the_output_is_tied() {
        let tensors = [
            tensor("token_embd.weight", 8, 100, 1600),
            tensor("blk.0.attn_q.weight", 8, 8, 128),
            tensor("output_norm.weight", 8, 1, 32),
        ];
        let mut config = toy_llama_config();
        config.tied_output = false;
        assert_eq!(weight_bytes_per_token(&tensors, &config), 16 + 128 + 32);
        config.tied_output = true;
        assert_eq!(weight_bytes_per_token(&tensors, &config), 1600 + 128 + 32);
    }

    /// Of 8 experts with 2 used, decode reads a quarter of each expert
    /// tensor and the router whole.
    #[test]
    fn decode_reads_only_the_experts_a_token_runs() {
        let tensors = [
            tensor("blk.0.ffn_gate_inp.weight", 8, 8, 256),
            tensor("blk.0.ffn_up_exps.weight", 8, 64, 8000),
            tensor("blk.0.ffn_down_exps.bias", 8, 8, 800),
        ];
        let mut config = toy_llama_config();
        assert_eq!(weight_bytes_per_token(&tensors, &config), 256 + 8000 + 800);
        config.options.moe = Some(MoeOptions {
            n_expert: 8,
            n_expert_used: 2,
            expert_ffn_dim: 8,
            norm_weights: true,
            gating: Gating::Softmax,
            weights_scale: 1.0,
            n_dense_lead: 0,
            shared: None,
            biased: true,
        });
        assert_eq!(weight_bytes_per_token(&tensors, &config), 256 + 2000 + 200);
    }
}
