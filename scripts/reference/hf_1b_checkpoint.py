#!/usr/bin/env python3
"""Write the 1 GB BF16 Hugging Face checkpoint issue 37's load and
`--quantize` timings use: random weights in Llama 3.2 1B's shape cut to 8
layers (width 2,048, 32/8 heads of 64, FFN 8,192, tied embeddings, Llama 3
RoPE scaling), SmolLM2's vocabulary of 49,152, one `model.safetensors` of
about 1,120 MiB, and SmolLM2's tokenizer files copied from an HF directory.

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install gguf==0.19.0 numpy tokenizers jinja2
    /tmp/hfvenv/bin/python scripts/reference/hf_1b_checkpoint.py \\
        --tokenizer-dir ~/.cache/lm/models/SmolLM2-135M-Instruct-hf-bf16 --out /tmp/hf-1b-bf16

The weights are exactly what the previous route gave (make_model.py's F16
GGUF of this shape, converted by hf_checkpoint.py's functions): the same
plan and generator (make_model.py's `tensor_plan` and `make_tensor`, its
seed), each matrix drawn as F16, then under HF's names and layouts
(llama's q/k rows un-permuted) rounded to BF16 by `hf_checkpoint.py`'s
`hf_tensors`. Seeded and deterministic; opens no network connection.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_checkpoint  # noqa: E402
import make_model  # noqa: E402

VOCAB = 49152
SPEC = {
    "arch": "llama",
    "n_layer": 8,
    "n_embd": 2048,
    "n_head": 32,
    "n_kv_head": 8,
    "head_dim": 64,
    "ffn": 8192,
    "rope_base": 500000.0,
    "rms_eps": 1e-5,
    "context": 131072,
    "tied": True,
    "qkv_bias": False,
    "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_context": 8192},
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json"]


def metadata():
    """The GGUF metadata keys hf_checkpoint.config_json reads, from SPEC."""
    s, a = SPEC, "llama."
    return {a + "embedding_length": s["n_embd"], a + "feed_forward_length": s["ffn"],
            a + "block_count": s["n_layer"], a + "attention.head_count": s["n_head"],
            a + "attention.head_count_kv": s["n_kv_head"], a + "context_length": s["context"],
            a + "attention.layer_norm_rms_epsilon": s["rms_eps"], a + "rope.freq_base": s["rope_base"],
            a + "vocab_size": VOCAB}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer-dir", required=True, help="an HF directory with SmolLM2's tokenizer.json")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(make_model.SEED)
    tensors = {}
    for name, shape, kind in make_model.tensor_plan(SPEC, VOCAB):
        array = make_model.make_tensor(rng, SPEC, shape, kind)
        tensors[name] = (array, None)
    meta = metadata()
    hf = hf_checkpoint.hf_tensors("llama", tensors, meta, bf16=True)
    del tensors
    os.makedirs(args.out, exist_ok=True)
    hf_checkpoint.save_safetensors(os.path.join(args.out, "model.safetensors"), hf)
    config = hf_checkpoint.config_json("llama", meta, hf_names_to_gguf(hf))
    scaling = SPEC["rope_scaling"]
    config["rope_scaling"] = {"rope_type": "llama3", "factor": scaling["factor"],
                              "low_freq_factor": scaling["low_freq_factor"],
                              "high_freq_factor": scaling["high_freq_factor"],
                              "original_max_position_embeddings": scaling["original_context"]}
    config["head_dim"] = SPEC["head_dim"]
    config["torch_dtype"] = "bfloat16"
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for file in TOKENIZER_FILES:
        source = os.path.join(args.tokenizer_dir, file)
        if os.path.exists(source):
            shutil.copy(source, os.path.join(args.out, file))
    if not os.path.exists(os.path.join(args.out, "tokenizer.json")):
        sys.exit(f"{args.tokenizer_dir} has no tokenizer.json")
    for name in sorted(os.listdir(args.out)):
        print(name, os.path.getsize(os.path.join(args.out, name)))


def hf_names_to_gguf(hf):
    """config_json asks only whether `output.weight` is among the tensors."""
    return {"output.weight": None} if "lm_head.weight" in hf else {}


if __name__ == "__main__":
    main()
