#!/usr/bin/env python3
"""Writes fixtures/gguf/block_types.json: real rows of the 32-weight block
types Q5_0, Q5_1 and IQ4_NL, as raw bytes and as the `gguf` Python package
dequantizes them (gguf.quants.dequantize, numpy; independent of our code).

The rows come from SmolLM2-135M-Instruct requantized by llama.cpp itself
(llama_cpp.llama_model_quantize with allow_requantize, from the Q4_1 file):
Q5_0 from the Q5_0 file, Q5_1 from the Q5_K_M file, IQ4_NL from the IQ4_XS
file. crates/lm-model/tests/quant_kernels.rs reads the fixture without the
model files and checks dequantize_row bit for bit and the products.

    pip install gguf==0.19.0 numpy
    python3 scripts/gguf/make_block_fixture.py [folder with the requantized files]

Values that must match bit-exactly are stored as their f32 bit patterns.
"""

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "reference"))
from fixture_json import write_json  # noqa: E402  (the project's JSON layout)

OUT = ROOT / "fixtures" / "gguf" / "block_types.json"

# (type name, file suffix, tensor, rows)
SOURCES = [
    ("Q5_0", "Q5_0", "blk.0.attn_q.weight", [0, 575]),
    ("Q5_1", "Q5_K_M", "blk.0.attn_q.weight", [0, 575]),
    ("IQ4_NL", "IQ4_XS", "blk.0.attn_q.weight", [0, 575]),
]


def main():
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/requant")
    entries = []
    for type_name, suffix, tensor_name, rows in SOURCES:
        file_name = f"SmolLM2-135M-Instruct.{suffix}.gguf"
        reader = GGUFReader(folder / file_name)
        tensor = next(t for t in reader.tensors if t.name == tensor_name)
        assert tensor.tensor_type.name == type_name, (tensor_name, tensor.tensor_type.name)
        raw = np.asarray(tensor.data)
        values = dequantize(raw, tensor.tensor_type).astype(np.float32)
        entries.append({
            "type": type_name.lower(),
            "type_id": int(tensor.tensor_type),
            "file": file_name,
            "tensor": tensor_name,
            "n_cols": int(values.shape[-1]),
            "rows": [
                {
                    "row": row,
                    "bytes": raw[row].tobytes().hex(),
                    "values_f32_bits": [int(b) for b in values[row].view(np.uint32)],
                }
                for row in rows
            ],
        })
    fixture = {
        "generator": "scripts/gguf/make_block_fixture.py (gguf python package + numpy)",
        "types": entries,
    }
    write_json(OUT, fixture)


if __name__ == "__main__":
    main()
