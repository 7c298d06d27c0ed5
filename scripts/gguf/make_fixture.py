#!/usr/bin/env python3
"""Writes fixtures/gguf/smollm2_reference.json from the real model file.

The values come from the `gguf` Python package (GGUFReader and
gguf.quants.dequantize), an implementation independent of ours; the Rust tests
in crates/lm-model/tests/gguf_real_model.rs compare against them when the model
is present.

    pip install gguf numpy
    python3 scripts/gguf/make_fixture.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

Floats that must match bit-exactly are stored as their f32 bit patterns.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "fixtures" / "gguf" / "smollm2_reference.json"

TYPE_NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "string",
    GGUFValueType.ARRAY: "array", GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}

# (tensor, rows): rows whose first values and whole-row sums are recorded.
ROWS = [
    ("token_embd.weight", [0, 1, 2, 1000, 49151]),
    ("blk.0.attn_q.weight", [0, 1, 575]),
    ("blk.0.attn_k.weight", [0, 191]),
    ("blk.0.ffn_down.weight", [0, 575]),
    ("blk.29.ffn_up.weight", [0, 1535]),
    ("blk.0.attn_norm.weight", [0]),
    ("output_norm.weight", [0]),
]
N_FIRST = 64
# (tensor, number of leading rows) for the matvec reference.
MATVEC = [("blk.0.attn_q.weight", 16), ("blk.5.ffn_down.weight", 16), ("token_embd.weight", 16)]


def x_rule(n):
    """x[j] = ((37 j) mod 101 - 50) / 50, computed in f32 exactly as the Rust test does."""
    j = np.arange(n, dtype=np.int64)
    return (((37 * j) % 101 - 50).astype(np.float32) / np.float32(50)).astype(np.float32)


def main():
    default = Path(os.environ.get("LM_MODELS_DIR", Path.home() / ".cache" / "lm" / "models")) / MODEL_NAME
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    reader = GGUFReader(path)

    metadata = {}
    n_metadata = 0
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's pseudo-fields for the header
        n_metadata += 1
        main_type = field.types[0]
        entry = {"type": TYPE_NAMES[main_type]}
        if main_type == GGUFValueType.ARRAY:
            values = field.contents()
            entry["element_type"] = TYPE_NAMES[field.types[-1]]
            entry["len"] = len(values)
            entry["first"] = values[:20]
            entry["last"] = values[-3:]
        else:
            entry["value"] = field.contents()
        metadata[key] = entry

    version = int(reader.fields["GGUF.version"].contents())
    alignment = int(reader.fields["general.alignment"].contents()) if "general.alignment" in reader.fields else 32
    tensors = []
    type_counts = {}
    by_name = {}
    for t in reader.tensors:
        ty = t.tensor_type.name.lower()
        type_counts[ty] = type_counts.get(ty, 0) + 1
        tensors.append({
            "name": t.name,
            "dims": [int(d) for d in t.shape],
            "type": ty,
            "offset": int(t.data_offset - reader.data_offset),
            "n_bytes": int(t.n_bytes),
        })
        by_name[t.name] = t

    def dequantized(name):
        t = by_name[name]
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        n_cols = int(t.shape[0])
        return values.reshape(-1, n_cols)

    rows = []
    for name, row_ids in ROWS:
        matrix = dequantized(name)
        for r in row_ids:
            row = matrix[r]
            rows.append({
                "tensor": name,
                "row": r,
                "first_bits": [int(b) for b in row[:N_FIRST].view(np.uint32)],
                "sum": float(row.astype(np.float64).sum()),
            })

    matvecs = []
    for name, n_rows in MATVEC:
        matrix = dequantized(name)
        x = x_rule(matrix.shape[1]).astype(np.float64)
        y = matrix[:n_rows].astype(np.float64) @ x
        matvecs.append({"tensor": name, "rows": n_rows, "y": [float(v) for v in y]})

    out = {
        "generator": "scripts/gguf/make_fixture.py (gguf python package + numpy)",
        "file": path.name,
        "file_size": path.stat().st_size,
        "version": version,
        "n_tensors": len(reader.tensors),
        "n_metadata": n_metadata,
        "alignment": alignment,
        "data_offset": int(reader.data_offset),
        "type_counts": type_counts,
        "metadata": metadata,
        "tensors": tensors,
        "rows": rows,
        "matvec": matvecs,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
