"""Writes fixtures/quant/kquant_dots.json: llama.cpp's own K-quant products,
the reference for lm-model's Q8_K activations and dot kernels.

Calls the ggml CPU library that llama-cpp-python ships (x86_64, the AVX2
build) through ctypes: `quantize_row_q8_K` on seeded activation vectors, and
`ggml_vec_dot_<type>_q8_K` on a row made of the first four blocks of
fixtures/quant/kquant_blocks.json (run kquant_blocks.py first). Records the
activations, their Q8_K blocks (d's bits, the quants, the group sums) and
each product.

Usage: python scripts/reference/kquant_dots.py
(needs llama-cpp-python and numpy).
"""

import ctypes
import json
import os

import numpy as np
import llama_cpp

from fixture_json import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKS = os.path.join(ROOT, "fixtures", "quant", "kquant_blocks.json")
OUT = os.path.join(ROOT, "fixtures", "quant", "kquant_dots.json")
Q8_K_BYTES = 4 + 256 + 2 * 16
N_VECTORS = 2
N_BLOCKS = 4


def ggml_cpu():
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    lib = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"))
    lib.ggml_cpu_init()
    lib.quantize_row_q8_K.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def main():
    lib = ggml_cpu()
    with open(BLOCKS, encoding="utf-8") as f:
        blocks = json.load(f)
    rng = np.random.default_rng(20261202)
    fixture = {}
    for name, cases in blocks.items():
        cases = cases[:N_BLOCKS]
        row = b"".join(bytes.fromhex(case["block"]) for case in cases)
        n_cols = 256 * len(cases)
        dot = getattr(lib, f"ggml_vec_dot_{name}_q8_K")  # q4_K, ..., iq4_xs
        dot.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                        ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        products = []
        for _ in range(N_VECTORS):
            # Activations with an outlier now and then, as in a residual stream.
            x = rng.uniform(-1.0, 1.0, n_cols).astype(np.float32)
            x[rng.integers(0, n_cols, n_cols // 97)] *= 20.0
            q8 = ctypes.create_string_buffer(Q8_K_BYTES * len(cases))
            lib.quantize_row_q8_K(x.ctypes.data, q8, n_cols)
            weights = ctypes.create_string_buffer(row, len(row))
            result = ctypes.c_float()
            dot(n_cols, ctypes.byref(result), 0, weights, 0, q8, 0, 1)
            products.append({
                "x": x.astype("<f4").tobytes().hex(),
                "q8_K": q8.raw.hex(),
                "dot": float(result.value),
                "dot_bits": int(np.float32(result.value).view(np.uint32)),
            })
        fixture[name] = {"n_cols": n_cols, "products": products}
    write_json(OUT, fixture)


if __name__ == "__main__":
    main()
