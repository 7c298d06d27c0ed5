#!/usr/bin/env python3
"""Exact-math reference: a GGUF model's forward pass in float64 with numpy.

Dequantizes every tensor of the GGUF with the `gguf` package (no llama.cpp involved) and
runs the architecture in float64 (no activation quantization, no F16 KV cache). Two uses,
both run by `cargo xtask reference-fixtures` after llama_cpp_reference.py:

    # without --conformance: SmolLM2 Q4_1's greedy.json rows -> fixtures/smollm2/exact_f64.json
    python3 scripts/reference/exact_forward.py --model <gguf> --out fixtures/smollm2
    # the conformance fixture <out>/<stem>.json -> <stem>.exact.json, <stem>.<case>.exact_logits.f16le.bin
    python3 scripts/reference/exact_forward.py --model <gguf> --out fixtures/smollm2-requant --conformance q2_k

The conformance output gives, for every case, each chosen token's exact log-probability
(teacher-forced along llama.cpp's greedy ids, as the harness does) and, where the fixture
keeps llama.cpp's last-position row, the exact row (f16) and llama.cpp's distance from
it (max abs difference, KL(exact || llama.cpp)). crates/lm/tests/conformance.rs uses them
to tell "we differ from llama.cpp" from "we differ from the model".

Architectures (read from the GGUF metadata, as llama.cpp's src/models/*.cpp build them):
- llama: RMSNorm, RoPE on adjacent pairs, SwiGLU, output tied to the embedding if absent.
- gemma3: the embedding times sqrt(n_embd); RMSNorm per head on queries and keys; RoPE on
  NeoX halves; a post-attention and a post-feed-forward RMSNorm; GeGLU with the tanh GELU;
  five of every six layers attend over a sliding window (a query sees the keys less than
  `sliding_window` positions back) with RoPE base 10000, the sixth globally with
  `rope.freq_base`; queries scaled by 1/sqrt(key_length). The converter already added
  Gemma's `+ 1` to the norm gains.
"""

import argparse
import json
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

from fixture_json import write_json, write_logits, write_logits_f16

EXACT_LOGITS_CASE = "chat_capital_of_france"
N_TOP_LOGITS = 10
GEMMA3_SWA_PERIOD, GEMMA3_SWA_ROPE_BASE = 6, 10000.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True, help="the fixture folder")
    parser.add_argument("--conformance", metavar="STEM", help="the conformance fixture <out>/<STEM>.json")
    args = parser.parse_args()

    model = Model(args.model)
    if args.conformance:
        conformance(model, os.path.join(args.out, args.conformance + ".json"))
    else:
        greedy_rows(model, args.out)


class Model:
    """The dequantized tensors (float64) and the hyperparameters of one GGUF file."""

    def __init__(self, path):
        reader = gguf.GGUFReader(path)
        meta = {name: field.contents() for name, field in reader.fields.items()}
        self.arch = meta["general.architecture"]
        if self.arch not in ("llama", "gemma3"):
            sys.exit(f"exact_forward.py: architecture {self.arch} is not implemented")
        key = lambda suffix, default=None: meta.get(f"{self.arch}.{suffix}", default)  # noqa: E731
        self.n_layers = key("block_count")
        self.width = key("embedding_length")
        self.n_heads = key("attention.head_count")
        self.n_kv_heads = key("attention.head_count_kv", self.n_heads)
        self.head_dim = key("attention.key_length", self.width // self.n_heads)
        self.rope_dim = key("rope.dimension_count", self.head_dim)
        self.rope_base = key("rope.freq_base", 10000.0)
        self.eps = key("attention.layer_norm_rms_epsilon")
        self.window = key("attention.sliding_window")
        self.weights = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}
        self.output = self.weights.get("output.weight", self.weights["token_embd.weight"])

    def w(self, layer, name):
        return self.weights[f"blk.{layer}.{name}.weight"]

    def rms_norm(self, x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight

    def rope(self, x, positions, base):
        """Rotates the first rope_dim components of every head; x is [T, heads, head_dim].
        llama pairs (x[2i], x[2i+1]); gemma3 (NeoX) pairs (x[i], x[i + rope_dim/2])."""
        half = self.rope_dim // 2
        angles = positions[:, None] * base ** (-2.0 * np.arange(half) / self.rope_dim)[None, :]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        out = x.copy()
        if self.arch == "llama":
            first, second = x[..., 0 : self.rope_dim : 2], x[..., 1 : self.rope_dim : 2]
            out[..., 0 : self.rope_dim : 2] = first * cos - second * sin
            out[..., 1 : self.rope_dim : 2] = first * sin + second * cos
        else:
            first, second = x[..., :half], x[..., half : self.rope_dim]
            out[..., :half] = first * cos - second * sin
            out[..., half : self.rope_dim] = first * sin + second * cos
        return out

    def forward(self, ids, first_row=0, rows=None):
        """Logits rows [T - first_row, vocab] for the token ids (positions 0..T),
        or the rows `rows` (any numpy index of positions) when given."""
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
        kept = x[first_row:] if rows is None else x[rows]
        return self.rms_norm(kept, self.weights["output_norm.weight"]) @ self.output.T


def log_softmax(row):
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def kl(p_logits, q_logits):
    """KL(p || q) of the softmax distributions of two logits rows, in float64."""
    log_p, log_q = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(log_p) * (log_p - log_q)).sum())


def read_row(path, dtype):
    return np.fromfile(path, dtype={"f16": "<f2", "f32": "<f4"}[dtype]).astype(np.float64)


def conformance(model, fixture_path):
    """Exact chosen-token log-probabilities and last rows for one conformance fixture."""
    out_dir = os.path.dirname(fixture_path)
    stem = os.path.splitext(os.path.basename(fixture_path))[0]
    with open(fixture_path, encoding="utf-8") as file:
        fixture = json.load(file)
    cases = []
    for case in fixture["cases"]:
        prompt, continuation = case["prompt_ids"], case["continuation_ids"]
        # Step k is the row after the prompt and continuation[:k].
        rows = model.forward(prompt + continuation[:-1], first_row=len(prompt) - 1)
        chosen = [float(log_softmax(row)[token]) for row, token in zip(rows, continuation)]
        entry = {
            "name": case["name"],
            "chosen_logprobs": [round(value, 6) for value in chosen],
            "top1_minus_top2": [round(float(gap), 6) for gap in top_gaps(rows)],
            "last_logits": None,
        }
        if case["last_logits"] is not None:
            exact = rows[0]
            theirs = read_row(os.path.join(out_dir, case["last_logits"]["file"]), case["last_logits"]["dtype"])
            entry["llama_cpp_max_abs_difference"] = round(float(np.abs(exact - theirs).max()), 6)
            entry["llama_cpp_kl_from_exact"] = round(kl(exact, theirs), 8)
            file_name = f"{stem}.{case['name']}.exact_logits.f16le.bin"
            entry["last_logits"] = write_logits_f16(out_dir, file_name, exact)
            print(
                f"{stem} {case['name']}: llama.cpp max |diff| {entry['llama_cpp_max_abs_difference']}"
                f" KL {entry['llama_cpp_kl_from_exact']:.5f}",
                file=sys.stderr,
            )
        worst = max(abs(a - b) for a, b in zip(chosen, case["chosen_logprobs"]))
        print(f"{stem} {case['name']}: llama.cpp log p(chosen) worst |diff| from exact {worst:.4f}", file=sys.stderr)
        cases.append(entry)
    write_json(
        os.path.join(out_dir, f"{stem}.exact.json"),
        {
            "model": fixture["model"],
            "generator": {"gguf": package_version("gguf"), "numpy": np.__version__, "precision": "float64"},
            "cases": cases,
        },
    )


def top_gaps(rows):
    top2 = np.sort(rows, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def greedy_rows(model, out):
    """fixtures/smollm2/exact_f64.json: the last rows of greedy.json's cases."""
    with open(os.path.join(out, "greedy.json"), encoding="utf-8") as file:
        greedy = json.load(file)
    cases = []
    for case in greedy["cases"]:
        if case["last_logits"] is None:
            continue
        llama_cpp_row = np.fromfile(os.path.join(out, case["last_logits"]["file"]), dtype="<f4")
        exact_row = model.forward(case["prompt_ids"], first_row=len(case["prompt_ids"]) - 1)[-1]
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
            entry["logits"] = write_logits(out, case["name"] + ".exact_logits.f32le.bin", exact_row)
        cases.append(entry)
        print(f"{case['name']}: max |exact - llama.cpp| = {entry['max_abs_difference_from_llama_cpp']}", file=sys.stderr)

    write_json(
        os.path.join(out, "exact_f64.json"),
        {
            "model": greedy["model"],
            "generator": {"gguf": package_version("gguf"), "numpy": np.__version__, "precision": "float64"},
            "cases": cases,
        },
    )


def package_version(name):
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
