#!/usr/bin/env python3
"""Write seeded f32 rows of varied data and ggml's Q2_K, Q3_K, IQ4_NL and
IQ4_XS blocks of them: fixtures/quantize/rows.*.

Run by hand with the reference Python (llama-cpp-python 0.3.36, gguf 0.19.0,
numpy):

    target/reference-venv/bin/python scripts/reference/quantize_rows_reference.py \
        --out fixtures/quantize

The blocks come from `ggml_quantize_chunk(type, rows, ..., imatrix = NULL)` in
llama-cpp-python's own libggml-base, the call `llama_model_quantize` makes for
every tensor (without an importance matrix it runs `quantize_row_q2_K_ref`,
`quantize_row_q3_K_ref`, and `quantize_iq4_nl` / `quantize_iq4_xs` with no
weights). The rows are f32, not f16, so they take values an
F16 GGUF cannot hold.

It writes:
- rows.f32le.bin: N_ROWS rows of N_COLS little-endian f32 (kinds below);
- rows.TYPE.bin for TYPE in q2_K, q3_K, iq4_nl, iq4_xs: ggml's blocks of
  every row;
- rows.json: the shape, each row's kind, and for each type the SHA-256 of its
  blocks and the RMSE of every row and of all rows, measured with gguf-py's
  `dequantize` (numpy, independent of llama.cpp and of this project) against
  the f32 rows, in float64.

The script opens no network connection and writes only data.
"""

import ctypes
import hashlib
import os
import sys

import numpy as np

import llama_cpp
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from fixture_json import out_folder, write_json

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SEED = 20261206
N_COLS = 512  # two super-blocks per row
TYPES = {"q2_K": T.Q2_K, "q3_K": T.Q3_K, "iq4_nl": T.IQ4_NL, "iq4_xs": T.IQ4_XS}
# Bytes per block and values per block.
BLOCKS = {T.Q2_K: (84, 256), T.Q3_K: (110, 256), T.IQ4_NL: (18, 32), T.IQ4_XS: (136, 256)}
# ggml's GROUP_MAX_EPS: Q3_K's groups whose largest magnitude is below it are zero.
GROUP_MAX_EPS = 1e-15


def rows(rng):
    """(kind, row) pairs: each kind twice with fresh draws."""
    n = N_COLS

    def outliers(m):
        m = m.copy()
        m[rng.random(n) < 1.0 / 29.0] *= 40.0
        return m

    kinds = {
        "normal": lambda: rng.standard_normal(n) * 0.02,
        "normal with outliers": lambda: outliers(rng.standard_normal(n) * 0.02),
        "uniform": lambda: rng.uniform(-1.0, 1.0, n),
        "all positive": lambda: np.abs(rng.standard_normal(n)) + 0.25,
        "all negative": lambda: -np.abs(rng.standard_normal(n)) - 0.1,
        "laplace": lambda: rng.laplace(0.0, 0.05, n),
        "student t (2)": lambda: rng.standard_t(2.0, n) * 0.01,
        "large": lambda: rng.standard_normal(n) * 3e4,
        "tiny": lambda: rng.standard_normal(n) * 1e-20,
        "near GROUP_MAX_EPS": lambda: rng.standard_normal(n) * 2e-15,
        "few levels": lambda: rng.integers(-3, 4, n) * 0.125,
        "sign ties": lambda: np.where(rng.random(n) < 0.5, -0.5, 0.5),
        "one value": lambda: np.eye(1, n, int(rng.integers(n)))[0] * rng.standard_normal(),
        "zero groups": lambda: np.repeat(rng.random(n // 16) < 0.5, 16) * rng.standard_normal(n),
        "scaled groups": lambda: np.repeat(10.0 ** rng.uniform(-4, 1, n // 16), 16) * rng.standard_normal(n),
        "constant": lambda: np.full(n, rng.standard_normal()),
    }
    out = [("zero", np.zeros(n))]
    for kind, draw in kinds.items():
        for _ in range(2):
            out.append((kind, draw()))
    return [(kind, row.astype(np.float32)) for kind, row in out]


def ggml_quantize(lib, qtype, x):
    n_rows, n_cols = x.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    block_bytes, block_len = BLOCKS[qtype]
    size = n_rows * (n_cols // block_len) * block_bytes
    out = ctypes.create_string_buffer(size)
    written = lib.ggml_quantize_chunk(int(qtype), x.ctypes.data_as(ctypes.c_void_p), out, 0, n_rows, n_cols, None)
    if written != size:
        sys.exit(f"ggml_quantize_chunk wrote {written} bytes, expected {size}")
    return out.raw


def main():
    out_dir = out_folder(__doc__.splitlines()[0], llama_cpp.__version__, LLAMA_CPP_PYTHON_VERSION)
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    pairs = rows(np.random.default_rng(SEED))
    x = np.stack([row for _, row in pairs])
    with open(os.path.join(out_dir, "rows.f32le.bin"), "wb") as f:
        f.write(x.astype("<f4").tobytes())
    result = {
        "llama_cpp_python": llama_cpp.__version__,
        "seed": SEED,
        "n_rows": len(pairs),
        "n_cols": N_COLS,
        "rows": "rows.f32le.bin",
        "kinds": [kind for kind, _ in pairs],
        "types": {},
    }
    for name, qtype in TYPES.items():
        data = ggml_quantize(lib, qtype, x)
        file = f"rows.{name}.bin"
        with open(os.path.join(out_dir, file), "wb") as f:
            f.write(data)
        back = dequantize(np.frombuffer(data, dtype=np.uint8).reshape(len(pairs), -1), qtype)
        err = back.astype(np.float64) - x.astype(np.float64)
        row_rmse = np.sqrt(np.mean(err * err, axis=1))
        result["types"][name] = {
            "file": file,
            "sha256": hashlib.sha256(data).hexdigest(),
            "rmse": float(np.sqrt(np.mean(err * err))),
            "row_rmse": [float(v) for v in row_rmse],
        }
        print(f"{name}: {len(data)} bytes, rmse {result['types'][name]['rmse']:.6g}")
    write_json(os.path.join(out_dir, "rows.json"), result)


if __name__ == "__main__":
    main()
