#!/usr/bin/env python3
"""llama.cpp's and the exact (float64) logits of every (or every STRIDE-th) prompt
position of one conformance case, as raw little-endian f32, so that our rows can be
compared with both over hundreds of positions instead of the last one only
(crates/lm/examples/rows_vs_exact.rs; fixtures/smollm2-requant/README.md, "Known
deviations"). Run from the repository root with the reference interpreter:

    python scripts/reference/all_rows.py MODEL FIXTURE_JSON CASE OUTPREFIX [STRIDE] [KV]

writes OUTPREFIX.llama.f32, OUTPREFIX.exact.f32 and OUTPREFIX.json (ids, rows, vocab);
KV=f32 writes only llama.cpp's rows with an F32 cache (OUTPREFIX.llama_f32.f32).
The llama.cpp settings are the conformance fixtures' (n_ctx 1024, one batch, one
thread, flash attention off) with every row kept (logits_all).
"""
import json
import sys

import numpy as np

sys.path.insert(0, "scripts/reference")
import llama_cpp  # noqa: E402
from exact_forward import Model, GEMMA3_SWA_PERIOD, GEMMA3_SWA_ROPE_BASE  # noqa: E402


def exact_rows(self, ids, rows):
    """exact_forward.Model.forward, keeping only the logits rows `rows`."""
    gemma = self.arch == "gemma3"
    n_tokens = len(ids)
    positions = np.arange(n_tokens, dtype=np.float64)
    x = self.weights["token_embd.weight"][ids]
    if gemma:
        x = x * np.sqrt(self.width)
    query, key = np.arange(n_tokens)[:, None], np.arange(n_tokens)[None, :]
    causal = np.where(key <= query, 0.0, -np.inf)
    sliding = np.where((key <= query) & (query - key < (self.window or n_tokens)), 0.0, -np.inf)
    group = self.n_heads // self.n_kv_heads
    for layer in range(self.n_layers):
        w = lambda name: self.w(layer, name)  # noqa: E731
        is_sliding = gemma and layer % GEMMA3_SWA_PERIOD < GEMMA3_SWA_PERIOD - 1
        base = GEMMA3_SWA_ROPE_BASE if is_sliding else self.rope_base
        mask = sliding if is_sliding else causal
        h = self.rms_norm(x, w("attn_norm"))
        q = (h @ w("attn_q").T).reshape(n_tokens, self.n_heads, self.head_dim)
        k = (h @ w("attn_k").T).reshape(n_tokens, self.n_kv_heads, self.head_dim)
        v = (h @ w("attn_v").T).reshape(n_tokens, self.n_kv_heads, self.head_dim)
        if gemma:
            q, k = self.rms_norm(q, w("attn_q_norm")), self.rms_norm(k, w("attn_k_norm"))
        q, k = self.rope(q, positions, base), self.rope(k, positions, base)
        attended = np.empty((n_tokens, self.n_heads, self.head_dim))
        for head in range(self.n_heads):
            kv_head = head // group
            scores = q[:, head] @ k[:, kv_head].T / np.sqrt(self.head_dim) + mask
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            attended[:, head] = scores @ v[:, kv_head]
        out = attended.reshape(n_tokens, self.n_heads * self.head_dim) @ w("attn_output").T
        if gemma:
            out = self.rms_norm(out, w("post_attention_norm"))
        x = x + out
        h = self.rms_norm(x, w("ffn_norm"))
        gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
        if gemma:
            act = 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate**3)))
        else:
            act = gate / (1.0 + np.exp(-gate))
        out = (act * up) @ w("ffn_down").T
        if gemma:
            out = self.rms_norm(out, w("post_ffw_norm"))
        x = x + out
    return self.rms_norm(x[rows], self.weights["output_norm.weight"]) @ self.output.T


def main():
    model_path, fixture, case_name, out = sys.argv[1:5]
    stride = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    kv = sys.argv[6] if len(sys.argv) > 6 else "f16"
    case = next(c for c in json.load(open(fixture))["cases"] if c["name"] == case_name)
    ids = case["prompt_ids"]
    rows = list(range(len(ids) - 1, -1, -stride))[::-1]
    llm = llama_cpp.Llama(
        model_path=model_path, n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=1,
        n_threads_batch=1, n_gpu_layers=0, flash_attn=False,
        type_k={"f16": 1, "f32": 0}[kv], type_v={"f16": 1, "f32": 0}[kv],
        logits_all=True, seed=0, verbose=False,
    )
    llm.reset()
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)[rows]
    theirs.astype("<f4").tofile(out + f".llama{'' if kv == 'f16' else '_' + kv}.f32")
    if kv == "f16":
        model = Model(model_path)
        exact = exact_rows(model, ids, rows)
        exact.astype("<f4").tofile(out + ".exact.f32")
        json.dump({"ids": ids, "rows": rows, "vocab": int(theirs.shape[1])}, open(out + ".json", "w"))


if __name__ == "__main__":
    main()
