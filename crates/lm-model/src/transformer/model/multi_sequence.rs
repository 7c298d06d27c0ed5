//! The multi-sequence step: B sequences, one new token each, read in one
//! pass over the weights (continuous batching's decode step).
//!
//! ```text
//! x = embed(token of each sequence)                              [B][n_embd]
//! for each layer:
//!     q, k, v = norm(x) W^T           one matmul over the B rows
//!     rotate row b at its own position pos_b; write k_b, v_b to cache_b
//!     a_b = attention of q_b over cache_b rows 0..=pos_b      per sequence
//!     x += a Wo^T;  x += ffn(norm(x))  one matmul over the B rows
//! logits_b = norm(x_b) Wout^T          one matmul over the B rows
//! ```
//!
//! Every operation is row-wise, so each sequence's logits are what
//! [`Decoder::forward`](lm_core::LanguageModel::forward) gives for its token
//! alone (the tests compare the bits); only the weights are read once for
//! all of them instead of once per sequence.

use std::sync::atomic::Ordering;

use lm_core::TokenId;
use rayon::prelude::*;

use super::{DecoderState, PASS_SCRATCH, Scratch, add_bias_rows};
use crate::transformer::Decoder;
use crate::transformer::attention::{AttentionScratch, attend};
use crate::transformer::linear::Linear;

impl Decoder {
    /// Whether every state can take its one token in the multi-sequence
    /// pass: a sliding-window cache that no longer holds its window needs
    /// the single-sequence path, which recomputes the prefix first.
    pub(super) fn can_step_together(&self, states: &[DecoderState]) -> bool {
        let largest_window = self.config.largest_window();
        states.iter().all(|state| match largest_window {
            Some(window) => state.cache.holds_window(window),
            None => true,
        })
    }

    /// Reads `tokens[b]` into `states[b]` for every `b` in one pass and
    /// writes each sequence's next-token logits into `logits[b]`. The
    /// caller checked the input (lengths, ids, context bound) and
    /// [`Decoder::can_step_together`]. The pass runs in this thread's
    /// scratch buffers (sized for B rows, the unembedding's B rows
    /// included), so a step allocates nothing once they have grown and no
    /// sequence's buffer grows past one row.
    pub(super) fn step_together(
        &self,
        states: &mut [DecoderState],
        tokens: &[TokenId],
        logits: &mut [Vec<f32>],
    ) {
        let n = tokens.len();
        assert!(
            n > 0 && states.len() == n && logits.len() == n,
            "one token and one logits buffer per sequence"
        );
        self.positions_computed.fetch_add(n, Ordering::Relaxed);
        PASS_SCRATCH.with(|s| self.step_in(s, states, tokens, logits));
    }

    /// [`Decoder::step_together`] in the scratch `s`.
    fn step_in(
        &self,
        s: &mut Scratch,
        states: &mut [DecoderState],
        tokens: &[TokenId],
        logits: &mut [Vec<f32>],
    ) {
        let n = tokens.len();
        let c = &self.config;
        let (d, q_dim, kv_dim) = (c.n_embd, c.q_dim(), c.kv_dim());
        s.size_for(c, n);
        let positions: Vec<usize> = states.iter().map(|state| state.cache.pos()).collect();
        for state in states.iter_mut() {
            let pos = state.cache.pos();
            if let Some(history) = &mut state.history {
                history.truncate(pos);
            }
        }
        // copy each sequence's token embedding into its row of x
        for (b, (&token, x_row)) in tokens.iter().zip(s.x.chunks_exact_mut(d)).enumerate() {
            self.embed(token, positions[b], x_row);
        }

        // forward all the layers
        for (layer_idx, layer) in self.layers.iter().enumerate() {
            let shape = self.attention_shape(layer_idx);
            let rope = self.rope(layer_idx);
            // attention norm and qkv matmuls for the B rows
            super::pre_norm(&layer.attn_norm, &s.x, &mut s.normed);
            let products = [
                (&layer.wq, &mut s.q[..]),
                (&layer.wk, &mut s.k[..]),
                (&layer.wv, &mut s.v[..]),
            ];
            Linear::matmul_each(self.dispatch, &s.normed, n, products);
            if let Some(bias) = &layer.qkv_bias {
                add_bias_rows(&mut s.k, &bias.k);
                add_bias_rows(&mut s.v, &bias.v);
                add_bias_rows(&mut s.q, &bias.q);
            }
            // head norms and RoPE, each row at its own position; keys and
            // values into each sequence's kv cache
            for (b, ((k_row, v_row), q_row)) in
                s.k.chunks_exact_mut(kv_dim)
                    .zip(s.v.chunks_exact(kv_dim))
                    .zip(s.q.chunks_exact_mut(q_dim))
                    .enumerate()
            {
                let pos = positions[b];
                if let Some(norm) = &layer.k_norm {
                    norm.apply_rows_in_place(k_row);
                }
                if let Some(norm) = &layer.q_norm {
                    norm.apply_rows_in_place(q_row);
                }
                if let Some(table) = rope {
                    table.rotate_heads(k_row, c.head_dim, pos);
                    table.rotate_heads(q_row, c.head_dim, pos);
                }
                states[b].cache.write(layer_idx, pos, k_row, v_row);
            }
            // multihead attention, each query over its own sequence's cache
            let attended = &mut s.attended[..n * q_dim];
            if n == 1 {
                attend(
                    shape,
                    layer.attn_sinks.as_deref(),
                    &states[0].cache,
                    layer_idx,
                    positions[0],
                    &s.q,
                    &mut s.attention,
                    attended,
                );
            } else {
                let states = &*states;
                attended
                    .par_chunks_mut(q_dim)
                    .zip(s.q.par_chunks(q_dim))
                    .enumerate()
                    .for_each_init(AttentionScratch::default, |scratch, (b, (out, q_row))| {
                        let cache = &states[b].cache;
                        let sinks = layer.attn_sinks.as_deref();
                        attend(
                            shape,
                            sinks,
                            cache,
                            layer_idx,
                            positions[b],
                            q_row,
                            scratch,
                            out,
                        );
                    });
            }
            // output projection and residual, then the ffn and its residual
            self.finish_block(layer, s, 0, n);
        }
        for (state, &token) in states.iter_mut().zip(tokens) {
            state.cache.commit(1);
            if let Some(history) = &mut state.history {
                history.push(token);
            }
        }
        // final norm and the classifier: all B rows into the scratch, then
        // each row copied to its sequence's buffer
        let vocab_size = c.vocab_size;
        let mut rows = std::mem::take(&mut s.logits);
        rows.resize(n * vocab_size, 0.0);
        self.unembed(s, 0, &mut rows);
        for (out, row) in logits.iter_mut().zip(rows.chunks_exact(vocab_size)) {
            out.clear();
            out.extend_from_slice(row);
        }
        s.logits = rows;
    }
}
