#!/usr/bin/env python3
"""Write llama.cpp's sampler outputs on fixed logit vectors: fixtures/samplers/.

Run through `cargo xtask reference-fixtures --samplers`, which provides a Python
with llama-cpp-python at the pinned version. By hand:

    python3 scripts/reference/sampler_reference.py --out fixtures/samplers \
        --row fixtures/smollm2/chat_capital_of_france.last_logits.f32le.bin

Each case applies one llama.cpp sampler (`llama_sampler_init_typical`,
`_top_n_sigma`, `_xtc` at probability 1, `_top_p`, `_min_p`, the last two for
their `min_keep`) with `llama_sampler_apply` to a `llama_token_data_array` of
one vector (T = 1, unsorted, in id order) and records the ids it leaves: a
token is left when it is inside the array's new bounds and its logit is not
-inf (top-n-sigma masks instead of removing). `kept` lists them, or `removed`
lists the others when that is shorter; for at most 64 kept tokens, `probs` gives
their probabilities renormalised over the kept set, in f64 from the input
logits. The format is in fixtures/samplers/README.md.

Vectors: small ones (ties, -inf entries, one token, very peaked, Zipf-like,
seeded random ones up to 5,000 entries) are written into samplers.json; the
49,152-entry SmolLM2 row is read from its fixture file (`row` in the JSON
names it and its sha256), and once more with every fifth id masked to -inf.

llama.cpp's typical sampler computes the entropy as -sum p ln p, which is NaN
for a -inf entry (0 * -inf), and its top-p, min-p and XTC count -inf entries
toward `min_keep`; lm-decode's filters never see masked tokens (the chain
removes them first). So those samplers get the vector's finite entries only,
and top-n-sigma and XTC without min_keep get the whole vector, -inf included.

Only llama.cpp's outputs are written, never any of its code; only SmolLM2's vocabulary is loaded (for DRY)
and no network connection is opened.
"""

import argparse
import ctypes
import hashlib
import importlib
import math
import os
import random
import struct
import sys

import llama_cpp
from fixture_json import write_json

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
NEG_INF = float("-inf")
# The modules (in this folder) that write the multi-step samplers' fixtures:
# DRY (dry.json), mirostat v1/v2 and dynamic temperature (mirostat.json).
STATEFUL_MODULES = ("dry_reference", "mirostat_reference")
# A kept set of at most this many tokens also gets its probabilities.
MAX_PROBS = 64


def small_vectors():
    """The hand-made and seeded vectors, each (name, logits)."""
    rng = random.Random(38)
    vectors = [
        ("lesson_000", [2.0, 1.0, 0.0]),
        ("probs_50_30_20", [math.log(0.5), math.log(0.3), math.log(0.2)]),
        ("uniform_4", [1.0, 1.0, 1.0, 1.0]),
        ("tied_pairs", [3.0, 3.0, 1.0, 1.0, 0.0, 0.0, -1.0]),
        ("tied_top_three", [2.0, 2.0, 2.0, 0.0, 0.0]),
        ("masked_some", [2.0, NEG_INF, 1.0, NEG_INF, 0.5, 0.0]),
        ("masked_all_but_two", [NEG_INF, 1.0, NEG_INF, 0.25, NEG_INF]),
        ("one_token", [0.7]),
        ("two_tokens", [1.0, 0.0]),
        ("peaked", [10.0] + [0.0] * 19),
        ("wide_range", [100.0, 50.0, 0.0, -50.0, -100.0]),
        ("all_negative", [-3.0, -4.0, -5.0, -6.0]),
        ("geometric", [math.log(p) for p in (0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02)]),
        ("bimodal", [4.0, 3.9, 0.0, 0.0, 0.0, 3.8, 0.0, -1.0, 3.7, 0.0]),
        ("zipf_1000", [-1.1 * math.log(rank + 1) for rank in range(1000)]),
        ("normal_50", [rng.gauss(0.0, 1.0) for _ in range(50)]),
        ("normal_200_sd3", [rng.gauss(0.0, 3.0) for _ in range(200)]),
        ("uniform_1000", [rng.uniform(-5.0, 5.0) for _ in range(1000)]),
    ]
    masked = [rng.gauss(0.0, 2.0) for _ in range(64)]
    for i in range(0, 64, 3):
        masked[i] = NEG_INF
    vectors.append(("normal_64_masked", masked))
    tied = [round(rng.gauss(0.0, 2.0), 1) for _ in range(5000)]
    vectors.append(("normal_5000_rounded_ties", tied))
    # f32 values, so llama.cpp and the Rust test read the same numbers.
    return [(name, [to_f32(z) for z in logits]) for name, logits in vectors]


def to_f32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def read_row(path):
    with open(path, "rb") as f:
        data = f.read()
    row = list(struct.unpack(f"<{len(data) // 4}f", data))
    return row, hashlib.sha256(data).hexdigest()


def masked_every_fifth(row):
    return [NEG_INF if i % 5 == 0 else z for i, z in enumerate(row)]


def samplers_for(n):
    """The (sampler, params) cases for a vector of n entries."""
    cases = []
    for p, min_keep in [(0.2, 0), (0.5, 0), (0.9, 0), (0.95, 3), (0.99, 1)]:
        cases.append(("typical", {"p": p, "min_keep": min_keep}))
    for sigma in [0.5, 1.0, 1.5, 2.0, 3.0]:
        cases.append(("top_n_sigma", {"n": sigma}))
    for threshold, min_keep in [(0.05, 0), (0.1, 0), (0.2, 0), (0.3, 0), (0.1, 3), (0.5, 0)]:
        cases.append(("xtc", {"probability": 1.0, "threshold": threshold, "min_keep": min_keep}))
    for p, min_keep in [(0.5, 3), (0.9, 2)]:
        cases.append(("top_p", {"p": p, "min_keep": min_keep}))
    for p, min_keep in [(0.2, 3), (0.05, 0)]:
        cases.append(("min_p", {"p": p, "min_keep": min_keep}))
    if n > 1000:
        # Fewer cases on the long rows, so the fixture stays small.
        keep = {("typical", 0.5), ("typical", 0.9), ("typical", 0.95), ("top_n_sigma", 1.0),
                ("top_n_sigma", 3.0), ("xtc", 0.05), ("xtc", 0.1), ("top_p", 0.9), ("min_p", 0.2)}
        cases = [(s, q) for s, q in cases
                 if (s, q.get("p", q.get("n", q.get("threshold")))) in keep]
    return cases


def init_sampler(name, params):
    if name == "typical":
        return llama_cpp.llama_sampler_init_typical(params["p"], params["min_keep"])
    if name == "top_n_sigma":
        return llama_cpp.llama_sampler_init_top_n_sigma(params["n"])
    if name == "xtc":
        return llama_cpp.llama_sampler_init_xtc(
            params["probability"], params["threshold"], params["min_keep"], 42)
    if name == "top_p":
        return llama_cpp.llama_sampler_init_top_p(params["p"], params["min_keep"])
    if name == "min_p":
        return llama_cpp.llama_sampler_init_min_p(params["p"], params["min_keep"])
    raise ValueError(name)


def takes_masked(name, params):
    """Whether llama.cpp's sampler gets the -inf entries too (see the module doc)."""
    return name == "top_n_sigma" or (name == "xtc" and params["min_keep"] == 0)


def token_array(logits, ids):
    """llama.cpp's unsorted candidate array of `ids` (and the buffer it points into)."""
    data = (llama_cpp.llama_token_data * len(ids))()
    for slot, token in enumerate(ids):
        data[slot].id = token
        data[slot].logit = logits[token]
        data[slot].p = 0.0
    array = llama_cpp.llama_token_data_array(
        data=ctypes.cast(data, ctypes.POINTER(llama_cpp.llama_token_data)),
        size=len(ids), selected=-1, sorted=False)
    return data, array


def apply(name, params, logits):
    """The ids llama.cpp's sampler leaves, sorted."""
    ids = [i for i, z in enumerate(logits) if takes_masked(name, params) or z != NEG_INF]
    _data, array = token_array(logits, ids)
    sampler = init_sampler(name, params)
    try:
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        left = array.data
        kept = sorted(left[i].id for i in range(array.size) if left[i].logit != NEG_INF)
    finally:
        llama_cpp.llama_sampler_free(sampler)
    return kept


def renormalised(logits, kept):
    best = max(logits[i] for i in kept)
    weights = [math.exp(logits[i] - best) for i in kept]
    total = sum(weights)
    return [float(f"{w / total:.9g}") for w in weights]


def case_record(vector, name, params, logits):
    kept = apply(name, params, logits)
    record = {"vector": vector, "sampler": name, "params": params, "n_kept": len(kept)}
    finite = [i for i, z in enumerate(logits) if z != NEG_INF]
    if len(kept) * 2 <= len(finite):
        record["kept"] = kept
    else:
        kept_set = set(kept)
        record["removed"] = [i for i in finite if i not in kept_set]
    if len(kept) <= MAX_PROBS:
        record["probs"] = renormalised(logits, kept)
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the fixtures/samplers folder")
    parser.add_argument("--row", required=True, help="SmolLM2's 49,152-entry f32le logits row")
    parser.add_argument("--model", required=True,
                        help="SmolLM2's GGUF file: the vocabulary DRY matches its sequence breakers in")
    args = parser.parse_args()
    if llama_cpp.__version__ != LLAMA_CPP_PYTHON_VERSION:
        sys.exit(f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} expected, found {llama_cpp.__version__}")
    llama_cpp.llama_backend_init()
    row, row_sha = read_row(args.row)
    vectors = small_vectors()
    long_vectors = [("smollm2_chat_capital_of_france", row),
                    ("smollm2_chat_capital_of_france_masked_every_fifth", masked_every_fifth(row))]
    cases = []
    for index, (name, logits) in enumerate(vectors + long_vectors):
        for sampler, params in samplers_for(len(logits)):
            cases.append(case_record(name, sampler, params, logits))
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "samplers.json"), {
        "generator": {
            "script": "scripts/reference/sampler_reference.py",
            "llama_cpp_python": llama_cpp.__version__,
        },
        "row": {
            "file": "fixtures/smollm2/" + os.path.basename(args.row),
            "len": len(row),
            "sha256": row_sha,
            "vectors": [name for name, _ in long_vectors],
        },
        "vectors": [{"name": name, "logits": [z if z != NEG_INF else None for z in logits]}
                    for name, logits in vectors],
        "cases": cases,
    })
    # The samplers with state or a vocabulary, each written by its own module
    # into its own file of the folder.
    for module in STATEFUL_MODULES:
        importlib.import_module(module).write(args)


if __name__ == "__main__":
    main()
