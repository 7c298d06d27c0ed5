#!/usr/bin/env python3
"""Measure llama.cpp's decode and prefill speed on a GGUF model; print JSON.

    python3 scripts/reference/llama_cpp_bench.py --model <gguf> [--threads 1 2] [--runs 3]
        [--prompts 128 512 2048] [--contexts 512 4096]

Decode: 128 new tokens (greedy, argmax of the last logits row) after an 11-token
prompt, timed from the first new token's forward pass to the last. Prefill, at each
length of --prompts (128 by default): the prompt read into an empty KV cache. Each
figure is the median of --runs timed runs after one untimed warm-up run (decode's
own; for prefill one at the shortest prompt). Each long context N (--contexts): an
N-token prompt read into an empty cache, then 128 tokens decoded after it, both
timed, without a warm-up of their own; its prefill figure is kept only when
--prompts does not measure N. Settings match the conformance fixtures: flash
attention off, F16 KV cache, n_ctx 512 (or what the longest prompt needs), batches
of at most 512 tokens. "seconds" holds each timed run by metric (`decode@11`,
`prefill@N`, `decode@N`). `cargo xtask bench` runs this with the same lengths as
its own worker. Needs llama-cpp-python (see
scripts/reference/llama_cpp_reference.py); opens no network connection.
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
DEFAULT_PROMPTS = [128]
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
    parser.add_argument("--prompts", type=int, nargs="+", default=DEFAULT_PROMPTS)
    parser.add_argument("--contexts", type=int, nargs="*", default=[])
    args = parser.parse_args()
    if min(args.prompts + args.contexts + [args.runs]) < 1:
        parser.error("--prompts, --contexts and --runs take positive counts")
    prompts = sorted(set(args.prompts))

    n_ctx = max([N_CTX] + prompts + [n + N_DECODE_NEW + 1 for n in args.contexts])
    results = []
    for n_threads in args.threads:
        llm = load(args.model, flash_attn=False, n_threads=n_threads, logits_all=False, n_ctx=n_ctx)
        source_ids = llm.tokenize(SOURCE_TEXT.encode("utf-8"), add_bos=False, special=False)
        longest = max(prompts + args.contexts)
        while len(source_ids) < longest:
            source_ids = source_ids + source_ids
        decode_prompt = source_ids[:N_DECODE_PROMPT]

        decode_seconds = [time_decode(llm, decode_prompt) for _ in range(args.runs + 1)][1:]
        seconds = {"decode@%d" % N_DECODE_PROMPT: statistics.median(decode_seconds)}
        time_prefill(llm, source_ids[: prompts[0]])  # the warm-up
        prefill_seconds = {}
        for n in prompts:
            prefill_seconds[n] = [time_prefill(llm, source_ids[:n]) for _ in range(args.runs)]
            seconds["prefill@%d" % n] = statistics.median(prefill_seconds[n])
        for n in args.contexts:
            runs = [time_context(llm, source_ids[:n]) for _ in range(args.runs)]
            seconds.setdefault("prefill@%d" % n, statistics.median(r[0] for r in runs))
            seconds["decode@%d" % n] = statistics.median(r[1] for r in runs)
        results.append(
            {
                "n_threads": n_threads,
                "decode_tok_per_s": round(N_DECODE_NEW / statistics.median(decode_seconds), 1),
                "prefill_tok_per_s": {
                    str(n): round(n / statistics.median(s), 1) for n, s in prefill_seconds.items()
                },
                "decode_seconds": [round(s, 4) for s in decode_seconds],
                "prefill_seconds": {
                    str(n): [round(x, 4) for x in s] for n, s in prefill_seconds.items()
                },
                "seconds": {key: round(value, 4) for key, value in seconds.items()},
            }
        )
        llm.close()

    json.dump(
        {
            "engine": "llama.cpp",
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode("utf-8").strip(),
            "settings": {
                "n_ctx": n_ctx,
                "flash_attn": False,
                "kv_cache_type": "f16",
                "decode_prompt_tokens": N_DECODE_PROMPT,
                "decode_new_tokens": N_DECODE_NEW,
                "prefill_tokens": prompts,
                "contexts": args.contexts,
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


def time_context(llm, prompt):
    """Seconds for reading the prompt into an empty cache (and choosing the first
    token), then for N_DECODE_NEW single-token forward passes after it."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    token = last_row_argmax(llm)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(N_DECODE_NEW):
        llm.eval([token])
        token = last_row_argmax(llm)
    return prefill, time.perf_counter() - start


def time_prefill(llm, prompt):
    """Seconds for one forward pass over the whole prompt into an empty cache."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    last_row_argmax(llm)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
