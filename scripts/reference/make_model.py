#!/usr/bin/env python3
"""Write a random-weight F16 GGUF file in a real model's shape, with
SmolLM2's vocabulary: the source `cargo xtask make-model` requantizes.

Run through `cargo xtask make-model SHAPE --type TYPE`, which holds the shapes
and passes one as JSON. By hand, with a Python that has numpy and gguf 0.19.0:

    python3 scripts/reference/make_model.py --spec '{"arch": "llama", ...}' \\
        --tokenizer-from SmolLM2-135M-Instruct.Q4_1.gguf --out llama-3.2-1b-shape-f16.gguf

The spec's keys: name, arch (llama, qwen2 or qwen3moe), n_layer, n_embd,
n_head, n_kv_head, head_dim, ffn, rope_base, rms_eps, context, tied, qkv_bias,
rope_scaling (null, or Llama 3's factor, low_freq_factor, high_freq_factor and
original_context, written as rope_freqs.weight as llama.cpp's converter does),
and n_expert, n_expert_used, expert_ffn (0 for a dense model). A mixture of
experts (qwen3moe) has, in place of the dense FFN, an F32 router
ffn_gate_inp (n_expert x width, N(0, 1/width), so its logits have unit
scale) and the experts as 3-d F16 tensors ffn_{gate,up,down}_exps, plus
Qwen3's query and key norms (at 1).

Weights are what the speed of a forward pass does not depend on, so they are
drawn from numpy's PCG64 with a fixed seed (a rerun writes the same bytes):
every matrix and the embedding N(0, 0.02^2), biases N(0, 0.02^2), norms at 1.
With unit-RMS activations after each norm, a projection's outputs have a
standard deviation of 0.02 * sqrt(width) (about 0.9 at width 2,048), so the
forward pass stays finite and the logits spread over the vocabulary instead
of collapsing on one token. The tokenizer is SmolLM2's (every `tokenizer.*`
key of --tokenizer-from copied), vocabulary 49,152.

The file is written tensor by tensor (header and tensor table first, then
each tensor generated and written, then freed), so a 3B shape needs a few
hundred MB of memory, not the file's size. Before writing, the script checks
that the folder has room for this file and a quantized copy of it (at most as
large). It opens no network connection.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np

import gguf

SEED = 20261205
SCALE = 0.02
# Rows generated at a time, bounding the float32 scratch of a large tensor.
CHUNK_ROWS = 4096


def llama3_rope_factors(head_dim, base, scaling):
    """The per-pair frequency divisors convert_hf_to_gguf.py writes for Llama
    3.1/3.2's rope_scaling ("llama3" type): kept for short wavelengths,
    divided by `factor` for long ones, blended between. The same formula as
    random_gguf.py's helper, with the real models' parameters instead of its
    tiny original context."""
    factor = scaling["factor"]
    low_freq_wavelen = scaling["original_context"] / scaling["low_freq_factor"]
    high_freq_wavelen = scaling["original_context"] / scaling["high_freq_factor"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * base ** (i / head_dim)
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (scaling["original_context"] / wavelen - scaling["low_freq_factor"]) / (
                scaling["high_freq_factor"] - scaling["low_freq_factor"]
            )
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def tensor_plan(spec, vocab):
    """Every tensor in file order: (name, numpy shape, kind), kind one of
    `matrix` (f16, random; 2-d, or 3-d for experts), `router` (f32, random),
    `vector` (f32, random: biases), `ones` (f32 norm gains) and `rope_freqs`
    (f32, computed)."""
    d, hd, ffn = spec["n_embd"], spec["head_dim"], spec["ffn"]
    q_dim, kv_dim = spec["n_head"] * hd, spec["n_kv_head"] * hd
    plan = [("token_embd.weight", (vocab, d), "matrix"), ("output_norm.weight", (d,), "ones")]
    if not spec["tied"]:
        plan.append(("output.weight", (vocab, d), "matrix"))
    if spec.get("rope_scaling"):
        plan.append(("rope_freqs.weight", (hd // 2,), "rope_freqs"))
    for i in range(spec["n_layer"]):
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", (d,), "ones"),
            (p + "attn_q.weight", (q_dim, d), "matrix"),
            (p + "attn_k.weight", (kv_dim, d), "matrix"),
            (p + "attn_v.weight", (kv_dim, d), "matrix"),
        ]
        if spec.get("qkv_bias"):
            plan += [
                (p + "attn_q.bias", (q_dim,), "vector"),
                (p + "attn_k.bias", (kv_dim,), "vector"),
                (p + "attn_v.bias", (kv_dim,), "vector"),
            ]
        if spec["arch"] == "qwen3moe":
            plan += [
                (p + "attn_q_norm.weight", (hd,), "ones"),
                (p + "attn_k_norm.weight", (hd,), "ones"),
            ]
        plan += [
            (p + "attn_output.weight", (d, q_dim), "matrix"),
            (p + "ffn_norm.weight", (d,), "ones"),
        ]
        n_expert, expert_ffn = spec.get("n_expert", 0), spec.get("expert_ffn", 0)
        if n_expert:
            # numpy (experts, rows, row length) is ggml's [row length, rows, experts].
            plan += [
                (p + "ffn_gate_inp.weight", (n_expert, d), "router"),
                (p + "ffn_gate_exps.weight", (n_expert, expert_ffn, d), "matrix"),
                (p + "ffn_up_exps.weight", (n_expert, expert_ffn, d), "matrix"),
                (p + "ffn_down_exps.weight", (n_expert, d, expert_ffn), "matrix"),
            ]
        else:
            plan += [
                (p + "ffn_gate.weight", (ffn, d), "matrix"),
                (p + "ffn_up.weight", (ffn, d), "matrix"),
                (p + "ffn_down.weight", (d, ffn), "matrix"),
            ]
    return plan


def dtype_of(kind):
    return np.float16 if kind == "matrix" else np.float32


def make_tensor(rng, spec, shape, kind):
    """One tensor of the plan, drawn from `rng` (matrices in row chunks)."""
    if kind == "ones":
        return np.ones(shape, dtype=np.float32)
    if kind == "rope_freqs":
        return llama3_rope_factors(spec["head_dim"], spec["rope_base"], spec["rope_scaling"])
    if kind == "vector":
        return (rng.standard_normal(shape, dtype=np.float32) * SCALE).astype(np.float32)
    if kind == "router":
        return rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))
    out = np.empty(shape, dtype=np.float16)
    # The rows of every matrix (of every expert) one after the other.
    flat = out.reshape(-1, shape[-1])
    for start in range(0, flat.shape[0], CHUNK_ROWS):
        rows = min(CHUNK_ROWS, flat.shape[0] - start)
        chunk = rng.standard_normal((rows, shape[-1]), dtype=np.float32)
        chunk *= SCALE
        flat[start : start + rows] = chunk
    return out


def copy_tokenizer(writer, path):
    """Copies every `tokenizer.*` key of the GGUF file at `path`; returns the
    vocabulary size (the length of tokenizer.ggml.tokens)."""
    reader = gguf.GGUFReader(path)
    vocab = None
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(field.name, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, value, vtype)
        if field.name == "tokenizer.ggml.tokens":
            vocab = len(value)
    if vocab is None:
        sys.exit(f"{path} has no tokenizer.ggml.tokens: not a file to take a vocabulary from")
    return vocab


def add_hyperparameters(writer, spec, vocab):
    """The metadata llama.cpp reads for a llama, qwen2 or qwen3moe model."""
    writer.add_name(spec["name"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(spec["context"])
    writer.add_embedding_length(spec["n_embd"])
    writer.add_block_count(spec["n_layer"])
    writer.add_feed_forward_length(spec["ffn"])
    writer.add_head_count(spec["n_head"])
    writer.add_head_count_kv(spec["n_kv_head"])
    if spec["arch"] == "qwen3moe":
        # Qwen3's head width is not the width over the heads.
        writer.add_key_length(spec["head_dim"])
        writer.add_value_length(spec["head_dim"])
    else:
        writer.add_rope_dimension_count(spec["head_dim"])
    writer.add_layer_norm_rms_eps(spec["rms_eps"])
    writer.add_rope_freq_base(spec["rope_base"])
    writer.add_vocab_size(vocab)
    if spec.get("n_expert", 0):
        writer.add_expert_count(spec["n_expert"])
        writer.add_expert_used_count(spec["n_expert_used"])
        writer.add_expert_feed_forward_length(spec["expert_ffn"])


def check_room(out, n_bytes):
    """Exits with a clear message unless the folder of `out` has room for
    `n_bytes` and a quantized copy (at most as large)."""
    folder = os.path.dirname(os.path.abspath(out))
    free = shutil.disk_usage(folder).free
    if free < 2 * n_bytes:
        sys.exit(
            f"not enough space in {folder}: the F16 file needs {n_bytes / 1e9:.1f} GB and its "
            f"quantized copy up to as much again ({2 * n_bytes / 1e9:.1f} GB), "
            f"{free / 1e9:.1f} GB are free"
        )


def write_model(spec, tokenizer_from, out, seed):
    """Writes the F16 file: metadata and tensor table, then tensor by tensor."""
    if spec["arch"] not in ("llama", "qwen2", "qwen3moe"):
        sys.exit(f"unsupported arch {spec['arch']!r}: llama, qwen2 or qwen3moe")
    if (spec["arch"] == "qwen3moe") != bool(spec.get("n_expert", 0)):
        sys.exit("experts (n_expert > 0) go with arch qwen3moe and only with it")
    writer = gguf.GGUFWriter(out, spec["arch"])
    vocab = copy_tokenizer(writer, tokenizer_from)
    add_hyperparameters(writer, spec, vocab)
    plan = tensor_plan(spec, vocab)
    total = 0
    for name, shape, kind in plan:
        dtype = np.dtype(dtype_of(kind))
        n_bytes = int(np.prod(shape)) * dtype.itemsize
        writer.add_tensor_info(name, shape, dtype, n_bytes)
        total += n_bytes
    check_room(out, total)
    n_params = sum(int(np.prod(shape)) for _, shape, _ in plan)
    print(f"writing {out}: {n_params:,} parameters, {total / 1e9:.2f} GB of tensors", flush=True)
    rng = np.random.default_rng(seed)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, shape, kind in plan:
            writer.write_tensor_data(make_tensor(rng, spec, shape, kind))
    except OSError as error:
        writer.close()
        sys.exit(f"cannot write {out}: {error}")
    writer.close()
    return n_params


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the shape, a JSON object")
    parser.add_argument("--tokenizer-from", required=True, help="GGUF file whose tokenizer is copied")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    spec = json.loads(args.spec)
    write_model(spec, args.tokenizer_from, args.out, args.seed)


if __name__ == "__main__":
    main()
