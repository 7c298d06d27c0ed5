#!/usr/bin/env python3
"""Exact-math reference: SmolLM2's forward pass in float64 with numpy.

Dequantizes every tensor of the GGUF with the `gguf` package (no llama.cpp involved),
runs the llama architecture in float64 (no activation quantization, no F16 KV cache),
and compares the last-position logits with llama.cpp's rows in fixtures/smollm2/.
Writes fixtures/smollm2/exact_f64.json and, for EXACT_LOGITS_CASE, the exact logits
row rounded to f32. Run by `cargo xtask reference-fixtures` after
llama_cpp_reference.py:

    python3 scripts/reference/exact_forward.py --model <gguf> --out fixtures/smollm2

Architecture facts used (from the GGUF metadata): 30 layers, width 576, 9 query heads and
3 KV heads of 64, RMSNorm eps 1e-5, RoPE base 100000 on adjacent pairs (llama.cpp's
"normal" mode), SwiGLU feed-forward, output projection tied to the token embedding.
"""

import argparse
import json
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

from fixture_json import write_json, write_logits

N_LAYERS, WIDTH, N_HEADS, N_KV_HEADS, HEAD_DIM = 30, 576, 9, 3, 64
RMS_EPS, ROPE_BASE = 1e-5, 100000.0
EXACT_LOGITS_CASE = "chat_capital_of_france"
N_TOP_LOGITS = 10


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    reader = gguf.GGUFReader(args.model)
    weights = {tensor.name: dequantize(tensor.data, tensor.tensor_type).astype(np.float64) for tensor in reader.tensors}
    with open(os.path.join(args.out, "greedy.json"), encoding="utf-8") as file:
        greedy = json.load(file)

    cases = []
    for case in greedy["cases"]:
        if case["last_logits"] is None:
            continue
        llama_cpp_row = np.fromfile(os.path.join(args.out, case["last_logits"]["file"]), dtype="<f4")
        exact_row = forward(weights, case["prompt_ids"])[-1]
        order = np.argsort(-exact_row, kind="stable")
        entry = {
            "name": case["name"],
            "max_abs_difference_from_llama_cpp": round(float(np.abs(exact_row - llama_cpp_row).max()), 6),
            "argmax": int(order[0]),
            "llama_cpp_argmax": int(llama_cpp_row.argmax()),
            "top1_minus_top2": round(float(exact_row[order[0]] - exact_row[order[1]]), 6),
            "top_logits": [[int(i), round(float(exact_row[i]), 6)] for i in order[:N_TOP_LOGITS]],
            "logits": None,
        }
        if case["name"] == EXACT_LOGITS_CASE:
            entry["logits"] = write_logits(args.out, case["name"] + ".exact_logits.f32le.bin", exact_row)
        cases.append(entry)
        print(f"{case['name']}: max |exact - llama.cpp| = {entry['max_abs_difference_from_llama_cpp']}", file=sys.stderr)

    write_json(
        os.path.join(args.out, "exact_f64.json"),
        {
            "model": greedy["model"],
            "generator": {"gguf": package_version("gguf"), "numpy": np.__version__, "precision": "float64"},
            "cases": cases,
        },
    )


def package_version(name):
    from importlib.metadata import version

    return version(name)


def rms_norm(x, weight):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS) * weight


def rope(x, positions):
    """Rotates adjacent pairs (x[2i], x[2i+1]) of every head; x is [T, heads, 64]."""
    pair = np.arange(HEAD_DIM // 2)
    angles = positions[:, None] * ROPE_BASE ** (-2.0 * pair / HEAD_DIM)[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def forward(weights, ids):
    """Logits rows [T, vocab] for the token ids, causal attention over the whole prefix."""
    n_tokens = len(ids)
    positions = np.arange(n_tokens, dtype=np.float64)
    embedding = weights["token_embd.weight"]  # [vocab, 576]
    x = embedding[ids]
    mask = np.triu(np.full((n_tokens, n_tokens), -np.inf), 1)
    group = N_HEADS // N_KV_HEADS
    for layer in range(N_LAYERS):
        w = lambda name: weights[f"blk.{layer}.{name}.weight"]  # noqa: E731
        h = rms_norm(x, w("attn_norm"))
        q = rope((h @ w("attn_q").T).reshape(n_tokens, N_HEADS, HEAD_DIM), positions)
        k = rope((h @ w("attn_k").T).reshape(n_tokens, N_KV_HEADS, HEAD_DIM), positions)
        v = (h @ w("attn_v").T).reshape(n_tokens, N_KV_HEADS, HEAD_DIM)
        attended = np.empty((n_tokens, N_HEADS, HEAD_DIM))
        for head in range(N_HEADS):
            kv_head = head // group
            scores = q[:, head] @ k[:, kv_head].T / np.sqrt(HEAD_DIM) + mask
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            attended[:, head] = scores @ v[:, kv_head]
        x = x + attended.reshape(n_tokens, WIDTH) @ w("attn_output").T
        h = rms_norm(x, w("ffn_norm"))
        gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w("ffn_down").T
    return rms_norm(x, weights["output_norm.weight"]) @ embedding.T


if __name__ == "__main__":
    main()
