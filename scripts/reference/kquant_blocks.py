"""Writes fixtures/quant/kquant_blocks.json: K-quant (and IQ4_XS) super-blocks and their
values as gguf-py (ggml's Python GGUF package) dequantizes them, the
reference for lm-model's bit-exact dequantisation.

For each type: a few blocks of a real tensor of the requantized SmolLM2 files
(when one holds the type), then seeded random blocks with finite scales.
Values are stored as the hex of their little-endian f32 bytes, so the test
compares bits.

Usage: python scripts/reference/kquant_blocks.py [REQUANT_DIR]
(needs `gguf` and `numpy`; REQUANT_DIR defaults to /work/requant).
"""

import os
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize

from fixture_json import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "fixtures", "quant", "kquant_blocks.json")

# type -> (block bytes, byte offsets of its f16 scale fields)
TYPES = {
    "q2_K": (T.Q2_K, 84, [80, 82]),
    "q3_K": (T.Q3_K, 110, [108]),
    "q4_K": (T.Q4_K, 144, [0, 2]),
    "q5_K": (T.Q5_K, 176, [0, 2]),
    "q6_K": (T.Q6_K, 210, [208]),
    "iq4_xs": (T.IQ4_XS, 136, [0]),
}
FILES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q2_K", "Q3_K_M", "IQ4_XS"]
N_REAL = 4
N_RANDOM = 3


def real_blocks(requant_dir, qtype, block_bytes):
    """N_REAL blocks of the first tensor of `qtype` in the requantized files:
    the first two of row 0 and the first two of the last row."""
    for name in FILES:
        path = os.path.join(requant_dir, f"SmolLM2-135M-Instruct.{name}.gguf")
        if not os.path.exists(path):
            continue
        reader = GGUFReader(path)
        for tensor in reader.tensors:
            if tensor.tensor_type != qtype:
                continue
            data = np.asarray(tensor.data).reshape(-1).view(np.uint8)
            n_rows = int(np.prod(tensor.shape[1:]))
            row_bytes = data.size // n_rows
            last = (n_rows - 1) * row_bytes
            picks = [0, block_bytes, last, last + block_bytes]
            source = f"{os.path.basename(path)}:{tensor.name}"
            return source, [bytes(data[p:p + block_bytes]) for p in picks[:N_REAL]]
    return None, []


def random_blocks(rng, block_bytes, scale_offsets):
    blocks = []
    for _ in range(N_RANDOM):
        block = bytearray(rng.integers(0, 256, block_bytes, dtype=np.uint8).tobytes())
        for offset in scale_offsets:
            scale = np.float16(rng.uniform(-0.05, 0.05))
            block[offset:offset + 2] = scale.tobytes()
        blocks.append(bytes(block))
    return blocks


def main():
    requant_dir = sys.argv[1] if len(sys.argv) > 1 else "/work/requant"
    rng = np.random.default_rng(20261201)
    fixture = {}
    for name, (qtype, block_bytes, scale_offsets) in TYPES.items():
        source, blocks = real_blocks(requant_dir, qtype, block_bytes)
        cases = [{"source": source, "bytes": b} for b in blocks]
        cases += [{"source": "random", "bytes": b} for b in random_blocks(rng, block_bytes, scale_offsets)]
        entries = []
        for case in cases:
            values = dequantize(np.frombuffer(case["bytes"], dtype=np.uint8), qtype).astype("<f4")
            assert values.size == 256
            entries.append({
                "source": case["source"],
                "block": case["bytes"].hex(),
                "values": values.tobytes().hex(),
            })
        fixture[name] = entries
    write_json(OUT, fixture)


if __name__ == "__main__":
    main()
