"""Writes fixtures/smollm2.json from lm-cli's own output, the expectation the pytest suite holds
the Python results to (same ids, logprobs within 1e-5).

    cargo build -p lm-cli && python crates/lm-python/tests/make_fixture.py [path/to/lm-cli]
"""

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run(command):
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def main():
    cli = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/debug/lm-cli")
    prompt = "The capital of France is"
    gen_cmd = [cli, "generate", "-m", "smollm2", "-p", prompt, "--greedy", "-n", "8", "--threads", "2"]
    generated = json.loads(run(gen_cmd + ["--json"]))
    score_text = "The cat sat on the mat."
    # The facade's score reads a text from the document start, <|endoftext|> for SmolLM2.
    score_cmd = [cli, "score", "-m", "smollm2", "--prompt", "<|endoftext|>", "--continuation", score_text,
                 "--threads", "2"]
    scored = json.loads(run(score_cmd + ["--json"]))
    fixture = {
        "_comment": "Written by lm-cli (the commands below) on SmolLM2-135M-Instruct Q4_1 "
        "(cargo xtask fetch-model smollm2); regenerate with crates/lm-python/tests/make_fixture.py",
        "generate": {
            "command": shlex.join(["lm-cli"] + gen_cmd[1:]),
            "prompt": prompt,
            "printed": run(gen_cmd),
            "prompt_ids": generated["prompt_ids"],
            "ids": generated["ids"],
            "text": generated["text"],
            "stop_reason": generated["stop_reason"],
            "logprobs": [step["logprob"] for step in generated["steps"]],
        },
        "score": {
            "command": shlex.join(["lm-cli"] + score_cmd[1:]),
            "text": score_text,
            "prompt_ids": scored["prompt_ids"],
            "ids": scored["ids"],
            "logprobs": scored["logprobs"],
        },
    }
    path = Path(__file__).parent / "fixtures/smollm2.json"
    path.write_text(json.dumps(fixture, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
