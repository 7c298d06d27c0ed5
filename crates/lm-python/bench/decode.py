"""Decode throughput from Python against lm-cli's on the same model and threads (issue 42).

Both generate 128 tokens greedily from the same prompt (SmolLM2 writes no end token in its first 400
greedy tokens after it, so every run is 128 long); each side's best of ROUNDS is reported. The
decode time is a 128-token run's minus a 1-token run's (load and prefill cancel): in one process
for Python, in two processes for lm-cli.

    python crates/lm-python/bench/decode.py [--threads 2] [--rounds 5] [--lm-cli target/release/lm-cli]
"""

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import lm

ROOT = Path(__file__).resolve().parents[3]
PROMPT = "Once upon a time"
N_TOKENS = 128


def smollm2():
    folder = Path(os.environ.get("LM_MODELS_DIR") or Path.home() / ".cache/lm/models")
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise SystemExit(f"needs SmolLM2 at {path}: cargo xtask fetch-model smollm2")
    return path


def python_decode(path, threads, rounds):
    """Tokens per second of the decode steps alone: the prefill is timed by a 1-token run."""
    model = lm.load(str(path), threads=threads)
    settings = dict(temperature=0)
    model.generate(PROMPT, max_new_tokens=N_TOKENS, **settings)  # warm-up
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        model.generate(PROMPT, max_new_tokens=1, **settings)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        run = model.generate(PROMPT, max_new_tokens=N_TOKENS, **settings)
        total = time.perf_counter() - start
        assert len(run.ids) == N_TOKENS
        best = max(best, (N_TOKENS - 1) / (total - prefill))
    return best


def cli_decode(cli, threads, rounds):
    """The same measure for lm-cli: a 128-token run minus a 1-token run, in one process each."""

    def wall(n):
        command = [cli, "generate", "-m", "smollm2", "-p", PROMPT, "--greedy", "-n", str(n),
                   "--threads", str(threads)]
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        return time.perf_counter() - start

    wall(N_TOKENS)  # warm-up (page cache)
    best = 0.0
    for _ in range(rounds):
        one = wall(1)
        full = wall(N_TOKENS)
        best = max(best, (N_TOKENS - 1) / (full - one))
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lm-cli", default=str(ROOT / "target/release/lm-cli"))
    args = parser.parse_args()
    path = smollm2()
    py = python_decode(path, args.threads, args.rounds)
    cli = cli_decode(args.lm_cli, args.threads, args.rounds)
    print(json.dumps({"model": path.name, "threads": args.threads, "tokens": N_TOKENS,
                      "python_tok_s": round(py, 1), "lm_cli_tok_s": round(cli, 1),
                      "python_vs_cli": round(py / cli, 3)}))


if __name__ == "__main__":
    main()
