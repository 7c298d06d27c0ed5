"""llama.cpp's side of lm-cli's SmolLM2 quantize tests, written once so the
tests need no llama-cpp-python: SmolLM2 Q8_0 (the catalog's file)
requantized to TYPE (default q4_0) by `llama_model_quantize`, its SHA-256
(key `TYPE_sha256`), and on it llama.cpp's greedy ids for two prompts with
each step's gap between the best and second-best logit (the test compares
ids up to the first near-tie) and, for each prompt's last position, the
TOP_LOGITS largest logits with their ids (`top_logits`, [id, logit] pairs).

usage: python quantize_smollm2_reference.py SMOLLM2-Q8_0.gguf OUT.json [TYPE]
(TYPE: q4_0, q2_k, q3_k_m or iq4_xs). Needs llama-cpp-python 0.3.36 and numpy (the
reference venv).
"""

import ctypes
import hashlib
import json
import os
import sys
import tempfile

import llama_cpp
import numpy as np

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
N_NEW = 24
TOP_LOGITS = 32
FTYPES = {
    "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
    "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,
    "iq4_xs": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
}


def main():
    source, out = sys.argv[1], sys.argv[2]
    ty = sys.argv[3] if len(sys.argv) > 3 else "q4_0"
    with tempfile.TemporaryDirectory() as tmp:
        q4_0 = os.path.join(tmp, f"{ty}.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[ty]
        params.nthread = 2
        params.allow_requantize = True
        rc = llama_cpp.llama_model_quantize(source.encode(), q4_0.encode(), ctypes.byref(params))
        assert rc == 0, rc
        with open(q4_0, "rb") as f:
            sha256 = hashlib.sha256(f.read()).hexdigest()
        llm = llama_cpp.Llama(q4_0, n_ctx=256, n_threads=1, n_threads_batch=1, logits_all=True, verbose=False)
        cases = []
        for prompt in PROMPTS:
            llm.reset()
            ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
            llm.eval(ids)
            last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top = [[int(i), float(last[i])] for i in np.argsort(-last)[:TOP_LOGITS]]
            chosen, gaps = [], []
            for _ in range(N_NEW):
                logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
                top2 = np.sort(logits)[-2:]
                token = int(np.argmax(logits))
                chosen.append(token)
                gaps.append(float(top2[1] - top2[0]))
                llm.eval([token])
            cases.append({"prompt": prompt, "prompt_ids": ids, "ids": chosen, "gaps": gaps, "top_logits": top})
    with open(out, "w") as f:
        json.dump({f"{ty}_sha256": sha256, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
