"""Writes the fixture files: JSON with objects indented and lists of numbers on
one line, and logits rows as raw little-endian f32 with a descriptor."""

import hashlib
import json
import os
import sys


def write_json(path, value):
    """JSON with objects indented and every list of numbers or pairs on one line."""
    with open(path, "w", encoding="utf-8") as out:
        out.write(to_json(value, 0))
        out.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def to_json(value, depth):
    indent = "  " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{indent}{json.dumps(key)}: {to_json(item, depth + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * depth + "}"
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        items = [indent + to_json(item, depth + 1) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * depth + "]"
    if isinstance(value, list) and any(isinstance(item, list) and len(item) > 2 for item in value):
        items = [indent + json.dumps(item, ensure_ascii=False) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * depth + "]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def write_logits(out_dir, file_name, row, dtype="f32"):
    """Writes one logits row as little-endian `dtype` (f32, or IEEE f16: half
    the size; the rounding, at most 2^-6 for logits below 32, is far inside
    the tests' tolerance of 1.0) to `out_dir/file_name` and returns its
    descriptor for the JSON fixture."""
    data = row.astype({"f32": "<f4", "f16": "<f2"}[dtype]).tobytes()
    with open(os.path.join(out_dir, file_name), "wb") as out:
        out.write(data)
    return {
        "file": file_name,
        "dtype": dtype,
        "byte_order": "little",
        "len": int(row.shape[0]),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def write_logits_f16(out_dir, file_name, row):
    """`write_logits` in IEEE f16."""
    return write_logits(out_dir, file_name, row, "f16")


def write_manifest(out_dir, manifest):
    """`out_dir/manifest.json`: what a generator wrote, indented one space."""
    with open(os.path.join(out_dir, "manifest.json"), "w") as out:
        json.dump(manifest, out, indent=1)
        out.write("\n")


def out_folder(description, llama_cpp_version, expected_version):
    """The `--out` folder of a generator with only that argument, created, once
    the llama-cpp-python found is the pinned one."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True)
    out = parser.parse_args().out
    if llama_cpp_version != expected_version:
        sys.exit(f"need llama-cpp-python {expected_version}, found {llama_cpp_version}")
    os.makedirs(out, exist_ok=True)
    return out
