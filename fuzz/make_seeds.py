#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs: four tiny valid GGUF v3 files.

    python3 fuzz/make_seeds.py      (from the workspace root)

seed-header     header only, no metadata, no tensors
seed-metadata   values of several types (u8, nested array, f64, bool, i64) and an f32 tensor
seed-tensors    one tensor of each type the reader knows (F32, F16, Q4_0, Q4_1, Q5_0,
                Q5_1, Q8_0, IQ4_NL, Q2_K..Q6_K, IQ4_XS, BF16, MXFP4), and a Q5_0 tensor whose
                second scale is NaN
seed-tokenizer  a byte-level BPE vocabulary as GGUF stores it (tokenizer.ggml.*)

Each is written to fuzz/corpus/gguf_parse/ and fuzz/corpus/gguf_tokenizer/.
Needs only the standard library.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ALIGNMENT = 32

# GGUF metadata value types and GGML tensor types used below.
U8, U32, I32, F32_VALUE, BOOL, STRING, ARRAY, I64, F64 = 0, 4, 5, 6, 7, 8, 9, 11, 12
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, BF16 = 0, 1, 2, 3, 6, 7, 8, 20, 30
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS = 10, 11, 12, 13, 14, 23
MXFP4 = 39


def string(text):
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def pair(key, value_type, value):
    return string(key) + struct.pack("<I", value_type) + value


def array(element_type, items, encode):
    return struct.pack("<IQ", element_type, len(items)) + b"".join(encode(i) for i in items)


def gguf(pairs, tensors):
    """A GGUF v3 file: metadata pairs, then tensors (name, dims, type, data)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(pairs)) + b"".join(pairs)
    offset, data = 0, []
    for name, dims, tensor_type, payload in tensors:
        out += string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", tensor_type, offset)
        padded = payload + b"\0" * (-len(payload) % ALIGNMENT)
        data.append(padded)
        offset += len(padded)
    out += b"\0" * (-len(out) % ALIGNMENT)
    return out + b"".join(data)


def f32s(values):
    return b"".join(struct.pack("<f", v) for v in values)


def write(name, data):
    for target in ("gguf_parse", "gguf_tokenizer"):
        folder = os.path.join(HERE, "corpus", target)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "wb") as out:
            out.write(data)


tokens = ["<|im_end|>", "a", "b", "ab", "\u0120", "\u0120ab", "h", "\u00c3", "\u00a9"]
write("seed-tokenizer", gguf([
    pair("tokenizer.ggml.model", STRING, string("gpt2")),
    pair("tokenizer.ggml.pre", STRING, string("smollm")),
    pair("tokenizer.ggml.tokens", ARRAY, array(STRING, tokens, string)),
    pair("tokenizer.ggml.token_type", ARRAY,
         array(I32, [3] + [1] * (len(tokens) - 1), lambda v: struct.pack("<i", v))),
    pair("tokenizer.ggml.merges", ARRAY, array(STRING, ["a b", "\u0120 ab"], string)),
    pair("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", 0)),
    pair("tokenizer.ggml.add_bos_token", BOOL, b"\0"),
], []))

q8_0 = struct.pack("<e", 0.5) + bytes(range(32))
q4_0 = struct.pack("<e", 0.25) + bytes(range(16))
q4_1 = struct.pack("<ee", 0.25, -1.0) + bytes(range(16))
# Q5: f16 scale (and minimum), 4 bytes of fifth bits, 16 bytes of nibbles.
q5_0 = struct.pack("<e", 0.25) + struct.pack("<I", 0xA5A5_0F0F) + bytes(range(16))
q5_1 = struct.pack("<ee", 0.25, -1.0) + struct.pack("<I", 0x1234_5678) + bytes(range(16))
iq4_nl = struct.pack("<e", 0.125) + bytes(range(0, 256, 16))
q5_0_nan = q5_0 + struct.pack("<H", 0x7E00) + q5_0[2:]
f16 = b"".join(struct.pack("<e", v) for v in [1.0, -2.0])
# K-quant super-blocks of 256 weights: packed bytes with the f16 scales at
# their offsets (the layouts in crates/lm-model/src/quant/block_k.rs).
def pattern(n):
    return bytes((i * 37 + 11) % 256 for i in range(n))
q2_k = pattern(80) + struct.pack("<ee", 0.25, 0.125)
q3_k = pattern(108) + struct.pack("<e", 0.25)
q4_k = struct.pack("<ee", 0.25, 0.125) + pattern(140)
q5_k = struct.pack("<ee", 0.25, 0.125) + pattern(172)
q6_k = pattern(208) + struct.pack("<e", 0.25)
iq4_xs = struct.pack("<e", 0.125) + pattern(134)
# MXFP4: an E8M0 exponent byte (127: scale 1/2), 16 bytes of FP4 codes.
mxfp4 = bytes([127]) + pattern(16)
write("seed-tensors", gguf([
    pair("general.architecture", STRING, string("llama")),
    pair("general.alignment", U32, struct.pack("<I", ALIGNMENT)),
], [
    ("f32", [2, 2], F32, f32s([1, 2, 3, 4])),
    ("f16", [2], F16, f16),
    ("q4_0", [32], Q4_0, q4_0),
    ("q4_1", [32], Q4_1, q4_1),
    ("q5_0", [32], Q5_0, q5_0),
    ("q5_1", [32], Q5_1, q5_1),
    ("q8_0", [32, 1], Q8_0, q8_0),
    ("iq4_nl", [32], IQ4_NL, iq4_nl),
    ("q2_k", [256], Q2_K, q2_k),
    ("q3_k", [256], Q3_K, q3_k),
    ("q4_k", [256], Q4_K, q4_k),
    ("q5_k", [256], Q5_K, q5_k),
    ("q6_k", [256], Q6_K, q6_k),
    ("iq4_xs", [256], IQ4_XS, iq4_xs),
    ("bf16", [2], BF16, b"\x80\x3f\x00\xc0"),
    ("mxfp4", [32], MXFP4, mxfp4),
    ("q5_0_nan", [64], Q5_0, q5_0_nan),
]))

write("seed-header", gguf([], []))

write("seed-metadata", gguf([
    pair("t.u8", U8, b"\x05"),
    pair("t.nested", ARRAY, array(ARRAY, [1], lambda _: array(U8, [1, 2], lambda v: bytes([v])))),
    pair("t.f64", F64, struct.pack("<d", 1.5)),
    pair("t.b", BOOL, b"\x01"),
    pair("t.i64", I64, struct.pack("<q", -3)),
], [("t", [2], F32, f32s([1, 2]))]))
