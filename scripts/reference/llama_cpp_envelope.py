#!/usr/bin/env python3
"""How far llama.cpp itself moves from exact math when only its batch layout
or attention kernel changes: the envelope a conformance check may not leave.

A conformance fixture (`llama_cpp_reference.py --conformance`) is one llama.cpp
run: the prompt in one batch, then one token per pass. The same build on the
same file gives other rows when the prompt is cut into smaller micro-batches
(`n_ubatch`: the matrix products switch between vector and tiled kernels, and
their sums round differently), with flash attention, or with an F32 KV cache
(more precise, so also rounded differently); on rows sensitive to
rounding (SmolLM2's chat prompt) KL(exact || llama.cpp) ranged from 0.005 to
0.031 over these settings alone. This script replays every fixture case,
teacher-forced along the fixture's greedy ids, under each variant, and writes
`<name>.envelope.json` beside the fixture:

    { "model": {"file", "sha256"}, "generator": {...},
      "variants": [{"n_ubatch", "flash_attn", "kv_cache_type"}],
      "cases": [ { "name",
          "chosen_logprobs": [[f64 per step] per variant],   // of the fixture's id
          "argmax_ids": [[u32 per step] per variant],
          "last_row": null | [{"kl_from_exact", "max_abs_from_exact"} per variant] } ] }

The distances are measured against the exact twin's stored (f16) last row, as
the test measures ours. Run through `cargo xtask reference-fixtures`, after the
fixture and its exact twin are written. Only llama.cpp's outputs are written.
"""

import argparse
import json
import os
import sys

import numpy as np

import llama_cpp
from fixture_json import write_json
from llama_cpp_reference import (
    CONFORMANCE_N_CTX,
    LLAMA_CPP_PYTHON_VERSION,
    load_conformance,
    logprob,
    sha256_of_file,
    short_float,
)

# Micro-batch sizes: one token at a time (vector kernels only), a size no kernel
# tiles evenly, a small tile multiple, and the fixture's whole-prompt batch; with
# flash attention off and on, and the KV cache in F16 (the fixture's) or F32.
N_UBATCHES = [1, 7, 32, CONFORMANCE_N_CTX]
VARIANTS = [
    {"n_ubatch": n, "flash_attn": fa, "kv_cache_type": kv}
    for kv in ("f16", "f32")
    for fa in (False, True)
    for n in N_UBATCHES
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the fixture's GGUF file")
    parser.add_argument("--out", required=True, help="the fixture's folder")
    parser.add_argument("--name", required=True, help="the fixture's file stem, e.g. q4_k_m")
    args = parser.parse_args()
    if llama_cpp.__version__ != LLAMA_CPP_PYTHON_VERSION:
        sys.exit(f"llama-cpp-python {llama_cpp.__version__} found, {LLAMA_CPP_PYTHON_VERSION} expected")

    fixture = read_json(args.out, f"{args.name}.json")
    exact = {case["name"]: case for case in read_json(args.out, f"{args.name}.exact.json")["cases"]}
    model_sha = sha256_of_file(args.model)
    if model_sha != fixture["model"]["sha256"]:
        sys.exit(f"{args.model} is not the file {args.name}.json was made from")

    runs = []
    for variant in VARIANTS:
        llm = load_conformance(args.model, **variant)
        runs.append([replay(llm, case) for case in fixture["cases"]])
        llm.close()

    cases = []
    for index, case in enumerate(fixture["cases"]):
        exact_case = exact[case["name"]]
        last_row = None
        if exact_case.get("last_logits"):
            exact_row = read_f16(args.out, exact_case["last_logits"]["file"])
            last_row = [distances(exact_row, run[index]["last_row"]) for run in runs]
        cases.append(
            {
                "name": case["name"],
                "chosen_logprobs": [run[index]["chosen_logprobs"] for run in runs],
                "argmax_ids": [run[index]["argmax_ids"] for run in runs],
                "last_row": last_row,
            }
        )
    write_json(
        os.path.join(args.out, f"{args.name}.envelope.json"),
        {
            "model": fixture["model"],
            "generator": {
                "llama_cpp_python": llama_cpp.__version__,
                "system_info": llama_cpp.llama_print_system_info().decode("utf-8").strip(),
            },
            "variants": VARIANTS,
            "cases": cases,
        },
    )


def replay(llm, case):
    """The fixture's prompt, then its greedy ids one per pass: each step's row
    gives the chosen id's log-probability and the row's own argmax."""
    n_vocab = llm.n_vocab()

    def last_row():
        pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(n_vocab,)).astype(np.float32).copy()

    llm.reset()
    llm.eval(case["prompt_ids"])
    row = last_row()
    first_row = row
    chosen_logprobs, argmax_ids = [], []
    continuation = case["continuation_ids"]
    for step, chosen in enumerate(continuation):
        chosen_logprobs.append(logprob(row.astype(np.float64), chosen))
        argmax_ids.append(int(np.argmax(row)))
        if step + 1 < len(continuation):
            llm.eval([chosen])
            row = last_row()
    return {"chosen_logprobs": chosen_logprobs, "argmax_ids": argmax_ids, "last_row": first_row}


def distances(exact_row, row):
    """KL(exact || row) and max |row - exact|, as the conformance test measures ours."""

    def log_softmax(x):
        x = x.astype(np.float64)
        shifted = x - x.max()
        return shifted - np.log(np.exp(shifted).sum())

    p, q = log_softmax(exact_row), log_softmax(row)
    return {
        "kl_from_exact": short_float(float((np.exp(p) * (p - q)).sum())),
        "max_abs_from_exact": short_float(np.abs(row - exact_row).max()),
    }


def read_json(folder, name):
    with open(os.path.join(folder, name), encoding="utf-8") as file:
        return json.load(file)


def read_f16(folder, name):
    return np.fromfile(os.path.join(folder, name), dtype="<f2").astype(np.float32)


if __name__ == "__main__":
    main()
