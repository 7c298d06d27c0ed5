#!/usr/bin/env python3
"""Write a small seeded F16 llama GGUF and llama.cpp's quantizations of it to
Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1: fixtures/quantize/.

Run by hand with the reference Python (llama-cpp-python 0.3.36, gguf 0.19.0,
numpy):

    target/reference-venv/bin/python scripts/reference/quantize_reference.py \
        --out fixtures/quantize

It writes:
- input.f16.gguf: a one-layer llama (tokenizer model "none"; llama.cpp's
  quantizer reads only the hyperparameters) whose 2-D weights are F16 drawn
  from numpy's PCG64 with SEED, with outliers (one value in 29 scaled by 40),
  an all-zero row, a constant row and a row whose largest positive and
  negative values tie in magnitude; norms are F32;
- TYPE.gguf for each type: `llama_cpp.llama_model_quantize` of input.f16.gguf
  with that file type, one thread (F16 values widen to f32 exactly, so a
  quantizer given the same f32 rows must write the same blocks);
- input-k.f16.gguf: a second one with rows of 256 (K-quant super-blocks):
  untied token_embd and output.weight of 8 rows, attn_q of 8 rows, and an
  ffn_down with rows of 32 (which Q6_K cannot hold: llama.cpp falls back to
  Q8_0); q6_k.gguf, q4_k_s.gguf and q5_k_s.gguf are its Q6_K, Q4_K_S and
  Q5_K_S files, q4_0-k.gguf its Q4_0 file (where llama.cpp makes
  output.weight Q6_K), q2_k-k.gguf its Q2_K file (ffn_down: Q3_K, which
  falls back to Q4_0), iq4_xs-k.gguf its IQ4_XS file (ffn_down: IQ4_NL);
- input-mix.f16.gguf: a third one of 16 layers whose every 2-D weight has
  rows of 256 (two rows each, four for the embedding and output; no
  per-layer norms, which llama.cpp's quantizer does not need), with 8
  query heads per 2 key-value heads, so that llama.cpp's per-layer rules of
  the 2- and 3-bit mixes all show; q2_k.gguf, q3_k_s.gguf, q3_k_m.gguf,
  q3_k_l.gguf, iq4_nl.gguf and iq4_xs.gguf are its Q2_K, Q3_K_S, Q3_K_M,
  Q3_K_L, IQ4_NL and IQ4_XS files;
- manifest.json: the seed, the versions and each output's tensor types.

F16 keeps the files small (under 450 KB in all). The script opens no network
connection and writes only llama.cpp's outputs, never any of its code.
"""

import ctypes
import functools
import os
import sys

import numpy as np

import gguf
import llama_cpp
from fixture_json import out_folder, write_manifest

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SEED = 20261205
VOCAB = 32
N_EMBD = 64
N_HEAD = 2
N_KV_HEAD = 1
HEAD_DIM = 32
FFN = 96
# llama.h's file types.
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9}


def random_matrix(rng, n_out, n_in):
    """An F16 matrix of normal values scaled by 1/sqrt(n_in), one value in
    29 (on average) times 40: the outliers the quantizers must handle."""
    m = rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)
    m[rng.random((n_out, n_in)) < 1.0 / 29.0] *= 40.0
    return m.astype(np.float16)


def llama_writer(path, n_embd, n_layer, n_ff, n_head, n_kv_head, n_vocab, rope_dims=None):
    """A GGUF writer of a llama with these hyperparameters (context 64, no
    tokenizer, mostly F16), its tensors still to add (`finish` writes it)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if rope_dims is not None:
        w.add_rope_dimension_count(rope_dims)
    w.add_tokenizer_model("none")
    w.add_vocab_size(n_vocab)
    w.add_file_type(1)  # mostly F16
    return w


def finish(w):
    """Writes the file of `llama_writer`'s `w`."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_input(path, rng):
    matrix = functools.partial(random_matrix, rng)
    w = llama_writer(path, N_EMBD, 1, FFN, N_HEAD, N_KV_HEAD, VOCAB, rope_dims=HEAD_DIM)
    embd = matrix(VOCAB, N_EMBD)
    embd[0] = 0.0
    embd[1] = 0.5
    embd[2] = rng.standard_normal(N_EMBD).astype(np.float16) * 0.1
    embd[2, 3], embd[2, 7] = 1.25, -1.25  # a tie of |max| in the first block
    embd[2, 40], embd[2, 35] = -2.0, 2.0  # and one with the negative first
    w.add_tensor("token_embd.weight", embd)  # tied: no output.weight
    w.add_tensor("output_norm.weight", (1.0 + 0.2 * rng.standard_normal(N_EMBD)).astype(np.float32))
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", (1.0 + 0.2 * rng.standard_normal(N_EMBD)).astype(np.float32))
    w.add_tensor(p + "attn_q.weight", matrix(N_HEAD * HEAD_DIM, N_EMBD))
    w.add_tensor(p + "attn_k.weight", matrix(N_KV_HEAD * HEAD_DIM, N_EMBD))
    w.add_tensor(p + "attn_v.weight", matrix(N_KV_HEAD * HEAD_DIM, N_EMBD))
    w.add_tensor(p + "attn_output.weight", matrix(N_EMBD, N_HEAD * HEAD_DIM))
    w.add_tensor(p + "ffn_norm.weight", (1.0 + 0.2 * rng.standard_normal(N_EMBD)).astype(np.float32))
    w.add_tensor(p + "ffn_gate.weight", matrix(FFN, N_EMBD))
    w.add_tensor(p + "ffn_up.weight", matrix(FFN, N_EMBD))
    w.add_tensor(p + "ffn_down.weight", matrix(N_EMBD, FFN))
    finish(w)


def write_k_input(path, rng):
    """Rows of 256 with outliers, one all-zero row, and a row whose first
    group of 16 is below ggml's GROUP_MAX_EPS."""
    matrix = functools.partial(random_matrix, rng)
    w = llama_writer(path, 256, 1, 32, 2, 2, 8)
    embd = matrix(8, 256)
    embd[0] = 0.0
    embd[1, :16] = 0.0
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    w.add_tensor("output.weight", matrix(8, 256))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(256, dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", matrix(8, 256))
    w.add_tensor("blk.0.ffn_down.weight", matrix(16, 32))
    finish(w)


def write_mix_input(path, rng):
    """16 layers of two-row weights with rows of 256: every tensor kind the
    K mixes treat apart (attn_v, attn_output, ffn_down by layer)."""
    matrix = functools.partial(random_matrix, rng)
    n_layer = 16
    w = llama_writer(path, 256, n_layer, 256, 8, 2, 4)
    w.add_tensor("token_embd.weight", matrix(4, 256))
    w.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    w.add_tensor("output.weight", matrix(4, 256))
    for i in range(n_layer):
        for name in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]:
            w.add_tensor(f"blk.{i}.{name}.weight", matrix(2, 256))
    finish(w)


def quantize(src, dst, ftype):
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = ftype
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize {src} -> {dst} failed: {rc}")


def tensor_types(path):
    reader = gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name for t in reader.tensors}


def quantize_each(out, src, ftypes, manifest):
    """llama.cpp's quantization of the input `src` (a file name in `out`) to
    each named file type of `ftypes`, recorded in the manifest's outputs
    (with the input's name, unless it is the manifest's own `input`)."""
    for name, ftype in ftypes.items():
        dst = os.path.join(out, f"{name}.gguf")
        quantize(os.path.join(out, src), dst, ftype)
        output = {"file": f"{name}.gguf"}
        if src != manifest["input"]:
            output["input"] = src
        output.update({"ftype": ftype, "tensor_types": tensor_types(dst)})
        manifest["outputs"][name] = output
        print(f"{name}: {os.path.getsize(dst)} bytes")


def main():
    out = out_folder(__doc__.splitlines()[0], llama_cpp.__version__, LLAMA_CPP_PYTHON_VERSION)
    write_input(os.path.join(out, "input.f16.gguf"), np.random.default_rng(SEED))
    manifest = {
        "llama_cpp_python": llama_cpp.__version__,
        "seed": SEED,
        "input": "input.f16.gguf",
        "outputs": {},
    }
    quantize_each(out, "input.f16.gguf", FTYPES, manifest)
    write_k_input(os.path.join(out, "input-k.f16.gguf"), np.random.default_rng(SEED + 1))
    manifest["input_k"] = "input-k.f16.gguf"
    # llama.h: Q4_K_S 14, Q5_K_S 16, Q6_K 18, Q4_0 2, Q2_K 10, IQ4_XS 30.
    quantize_each(out, "input-k.f16.gguf", {"q6_k": 18, "q4_0-k": 2, "q4_k_s": 14, "q5_k_s": 16,
                                            "q2_k-k": 10, "iq4_xs-k": 30}, manifest)
    write_mix_input(os.path.join(out, "input-mix.f16.gguf"), np.random.default_rng(SEED + 2))
    # llama.h: Q2_K 10, Q3_K_S 11, Q3_K_M 12, Q3_K_L 13, IQ4_NL 25, IQ4_XS 30.
    quantize_each(out, "input-mix.f16.gguf", {"q2_k": 10, "q3_k_s": 11, "q3_k_m": 12,
                                              "q3_k_l": 13, "iq4_nl": 25, "iq4_xs": 30}, manifest)
    write_manifest(out, manifest)

if __name__ == "__main__":
    main()
