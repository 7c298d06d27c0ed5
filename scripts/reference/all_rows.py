#!/usr/bin/env python3
"""llama.cpp's and the exact (float64) logits of every (or every STRIDE-th) prompt
position of one conformance case, as raw little-endian f32, so that our rows can be
compared with both over hundreds of positions instead of the last one only
(crates/lm/examples/rows_vs_exact.rs; fixtures/smollm2-requant/README.md, "Known
deviations"). Run from the repository root with the reference interpreter:

    python scripts/reference/all_rows.py MODEL FIXTURE_JSON CASE OUTPREFIX [STRIDE] [KV]

writes OUTPREFIX.llama.f32, OUTPREFIX.exact.f32 and OUTPREFIX.json (ids, rows, vocab);
KV=f32 writes only llama.cpp's rows with an F32 cache (OUTPREFIX.llama_f32.f32).
The llama.cpp settings are the conformance fixtures' (n_ctx 1024, one batch, one
thread, flash attention off) with every row kept (logits_all).
"""
import json
import sys

import numpy as np

sys.path.insert(0, "scripts/reference")
import llama_cpp  # noqa: E402
from exact_forward import Model  # noqa: E402


def main():
    model_path, fixture, case_name, out = sys.argv[1:5]
    stride = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    kv = sys.argv[6] if len(sys.argv) > 6 else "f16"
    case = next(c for c in json.load(open(fixture))["cases"] if c["name"] == case_name)
    ids = case["prompt_ids"]
    rows = list(range(len(ids) - 1, -1, -stride))[::-1]
    llm = llama_cpp.Llama(
        model_path=model_path, n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=1,
        n_threads_batch=1, n_gpu_layers=0, flash_attn=False,
        type_k={"f16": 1, "f32": 0}[kv], type_v={"f16": 1, "f32": 0}[kv],
        logits_all=True, seed=0, verbose=False,
    )
    llm.reset()
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)[rows]
    theirs.astype("<f4").tofile(out + f".llama{'' if kv == 'f16' else '_' + kv}.f32")
    if kv == "f16":
        model = Model(model_path)
        exact = model.forward(ids, rows=rows)
        exact.astype("<f4").tofile(out + ".exact.f32")
        json.dump({"ids": ids, "rows": rows, "vocab": int(theirs.shape[1])}, open(out + ".json", "w"))


if __name__ == "__main__":
    main()
