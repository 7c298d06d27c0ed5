"""llama.cpp's side of lm-cli's `quantize DIR` test, written once so the
test needs no llama-cpp-python: the GGUF that `lm-cli quantize
SmolLM2-135M-Instruct-hf-f32 OUT q8_0` wrote (its SHA-256, so the test
knows the file is the one measured here), and on it llama.cpp's prompt ids
and last-row logits for two prompts (little-endian f16 rows beside the
JSON).

usage: python quantize_hf_reference.py OURS-Q8_0.gguf OUT_DIR
Needs llama-cpp-python 0.3.36 and numpy (the reference venv).
"""

import hashlib
import json
import os
import sys

import llama_cpp
import numpy as np

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
]
STEM = "smollm2-hf-q8_0"


def main():
    path, out = sys.argv[1], sys.argv[2]
    with open(path, "rb") as f:
        sha256 = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=1, verbose=False)
    cases = []
    for i, prompt in enumerate(PROMPTS):
        llm.reset()
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        llm.eval(ids)
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        name = f"{STEM}.{i}.last_logits.f16le.bin"
        row.astype("<f2").tofile(os.path.join(out, name))
        cases.append({"prompt": prompt, "prompt_ids": ids, "last_logits": name})
    with open(os.path.join(out, STEM + ".json"), "w") as f:
        json.dump({"q8_0_sha256": sha256, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
