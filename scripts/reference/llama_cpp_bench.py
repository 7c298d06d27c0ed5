#!/usr/bin/env python3
"""Measure llama.cpp's decode and prefill speed on a GGUF model; print JSON.

    python3 scripts/reference/llama_cpp_bench.py --model <gguf> [--threads 1 2] [--runs 3]

Decode: 128 new tokens (greedy, argmax of the last logits row) after an 11-token
prompt, timed from the first new token's forward pass to the last. Prefill: one
forward pass over a 128-token prompt into an empty KV cache. Each figure is the
median of --runs timed runs after one untimed warm-up run. Settings match the
conformance fixtures: flash attention off, F16 KV cache, n_ctx 512. Needs
llama-cpp-python (see scripts/reference/llama_cpp_reference.py); opens no network
connection.
"""

import argparse
import json
import os
import statistics
import sys
import time

import llama_cpp
import numpy as np

# `cargo xtask bench` runs this file through runpy, which does not put its
# folder on the import path; the fixture settings live next to it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_cpp_reference import N_CTX, load  # noqa: E402

N_DECODE_PROMPT = 11
N_DECODE_NEW = 128
N_PREFILL = 128
SOURCE_TEXT = (
    "The history of computing is a story of people trying to make machines do "
    "arithmetic faster than humans could. In the seventeenth century, Blaise Pascal "
    "built a mechanical calculator that could add and subtract, and Gottfried Leibniz "
    "improved it so that it could also multiply. "
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    results = []
    for n_threads in args.threads:
        llm = load(args.model, flash_attn=False, n_threads=n_threads, logits_all=False)
        source_ids = llm.tokenize(SOURCE_TEXT.encode("utf-8"), add_bos=False, special=False)
        while len(source_ids) < N_PREFILL:
            source_ids = source_ids + source_ids
        decode_prompt = source_ids[:N_DECODE_PROMPT]
        prefill_prompt = source_ids[:N_PREFILL]

        decode_seconds = [time_decode(llm, decode_prompt) for _ in range(args.runs + 1)][1:]
        prefill_seconds = [time_prefill(llm, prefill_prompt) for _ in range(args.runs + 1)][1:]
        results.append(
            {
                "n_threads": n_threads,
                "decode_tok_per_s": round(N_DECODE_NEW / statistics.median(decode_seconds), 1),
                "prefill_tok_per_s": round(N_PREFILL / statistics.median(prefill_seconds), 1),
                "decode_seconds": [round(s, 4) for s in decode_seconds],
                "prefill_seconds": [round(s, 4) for s in prefill_seconds],
            }
        )
        llm.close()

    json.dump(
        {
            "engine": "llama.cpp",
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode("utf-8").strip(),
            "settings": {
                "n_ctx": N_CTX,
                "flash_attn": False,
                "kv_cache_type": "f16",
                "decode_prompt_tokens": N_DECODE_PROMPT,
                "decode_new_tokens": N_DECODE_NEW,
                "prefill_tokens": N_PREFILL,
                "runs": args.runs,
                "statistic": "median",
            },
            "results": results,
        },
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")


def last_row_argmax(llm):
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
    return int(row.argmax())


def time_decode(llm, prompt):
    """Seconds for N_DECODE_NEW single-token forward passes after the prompt."""
    llm.reset()
    llm.eval(prompt)
    token = last_row_argmax(llm)
    start = time.perf_counter()
    for _ in range(N_DECODE_NEW):
        llm.eval([token])
        token = last_row_argmax(llm)
    return time.perf_counter() - start


def time_prefill(llm, prompt):
    """Seconds for one forward pass over the whole prompt into an empty cache."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    last_row_argmax(llm)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
