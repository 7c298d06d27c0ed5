#!/usr/bin/env python3
"""Write SmolLM2-135M-Instruct as Hugging Face model directories (F32 and
BF16) from its Q4_1 GGUF, with GGUF twins of the same arrays and
llama.cpp's conformance runs of the twins: `cargo xtask fetch-model
smollm2-hf` runs it in the reference venv. By hand:

    target/reference-venv/bin/python scripts/reference/hf_smollm2.py \
        --gguf ~/.cache/lm/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out ~/.cache/lm/models [--tokenize-fixture fixtures/hf/smollm2_tokenize.json]

Needs numpy, gguf 0.19.0, tokenizers, jinja2 and llama-cpp-python 0.3.36.
Writes into --out:
- SmolLM2-135M-Instruct-hf-f32/ and -hf-bf16/: every tensor dequantized by
  the `gguf` package (the Q4_1 file's Q4_1, Q8_0 and F32 tensors) and
  written under HF's names and layouts (`hf_checkpoint.hf_tensors`: q/k rows
  un-permuted, tied embeddings, no lm_head.weight), F32 or rounded to BF16;
  config.json (LlamaForCausalLM, no rope_scaling); tokenizer.json built by
  the `tokenizers` package from the GGUF's tokens and merges (byte-level BPE
  with SmolLM2's pre-tokenizer: single digits, then the GPT-2 regex, as
  llama.cpp's `smollm` pre-tokenizer; the CONTROL tokens added as special
  tokens; no BOS added, as the GGUF says); tokenizer_config.json with the
  GGUF's chat template; generation_config.json (the model card's sampling
  advice: temperature 0.2, top_p 0.9; end id <|im_end|>);
- SmolLM2-135M-Instruct-hf-f32.gguf and -hf-bf16.gguf: the GGUF twins, the
  Q4_1 file's metadata (tokenizer included) and the same arrays (BF16: the
  matrices BF16, the 1-D tensors F32);
- SmolLM2-135M-Instruct-hf-f32.llama_cpp.json and -hf-bf16.llama_cpp.json:
  llama.cpp's conformance run of each twin (llama_cpp_reference.py's
  format: prompt ids, greedy ids, top-1/top-2 gaps, chosen log-probs).

Before writing, the tokenizer.json is checked against llama.cpp's ids of
fixtures/smollm2/tokenize.json (it exits non-zero on any difference). With
--tokenize-fixture it also writes the `tokenizers` package's ids of the test
lines (fixtures/smollm2/tokenize.json, fixtures/tokenize/smollm2_prompts.json,
the conformance prompts).

Deterministic; opens no network connection.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_checkpoint  # noqa: E402

STEM = "SmolLM2-135M-Instruct-hf"
CONTROL = 3
FIXTURE_TOKENIZE = "fixtures/smollm2/tokenize.json"
FIXTURE_PROMPTS = "fixtures/tokenize/smollm2_prompts.json"


def read_gguf(path):
    """name -> (dequantized f32 array in numpy order, type), the reader."""
    reader = gguf.GGUFReader(path)
    tensors = {}
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        tensors[t.name] = (values.reshape(shape), gguf.GGMLQuantizationType.F32)
    return tensors, reader


def field(reader, name):
    return reader.fields[name].contents()


def build_tokenizer(reader):
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [t for t, ty in zip(tokens, types) if ty == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok, tokens, specials


def write_text_files(d, reader, tok, tokens, specials):
    tok.save(os.path.join(d, "tokenizer.json"))
    name = lambda key: tokens[int(field(reader, f"tokenizer.ggml.{key}_token_id"))]
    added = {str(tokens.index(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                    "single_word": False, "special": True} for t in specials}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"add_prefix_space": False, "added_tokens_decoder": added,
                   "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                   "bos_token": name("bos"), "eos_token": name("eos"), "pad_token": name("padding"),
                   "unk_token": name("unknown"), "clean_up_tokenization_spaces": False,
                   "chat_template": field(reader, "tokenizer.chat_template"),
                   "model_max_length": 8192, "tokenizer_class": "GPT2Tokenizer"}, f, indent=1)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
                   "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
                   "pad_token_id": int(field(reader, "tokenizer.ggml.padding_token_id")),
                   "do_sample": True, "temperature": 0.2, "top_p": 0.9}, f, indent=1)


def write_dir(d, tensors, meta, reader, tok, tokens, specials, bf16):
    tmp = d + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    config = hf_checkpoint.config_json("llama", meta, tensors)
    del config["rope_scaling"]
    config.update({"bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
                   "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
                   "torch_dtype": "bfloat16" if bf16 else "float32"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    hf = hf_checkpoint.hf_tensors("llama", tensors, meta, bf16)
    hf_checkpoint.save_safetensors(os.path.join(tmp, "model.safetensors"), hf)
    write_text_files(tmp, reader, tok, tokens, specials)
    shutil.rmtree(d, ignore_errors=True)
    os.rename(tmp, d)


def write_twin(path, reader, tensors, bf16):
    """The GGUF twin: every metadata key of the Q4_1 file but the file type,
    and the dequantized arrays (F32, or BF16 matrices with F32 1-D tensors)."""
    arch = field(reader, "general.architecture")
    w = gguf.GGUFWriter(path + ".partial", arch)
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.file_type"):
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)
    for name, (array, _) in tensors.items():
        if bf16 and array.ndim > 1:
            bits = hf_checkpoint.to_bf16_bits(array)
            w.add_tensor(name, bits, raw_shape=bits.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".partial", path)


def meta_of(reader):
    meta = {}
    for f in reader.fields.values():
        if f.name.startswith("llama.") or f.name in ("general.architecture", "tokenizer.ggml.model"):
            meta[f.name] = f.contents()
    return meta


def check_tokenizer(tok, root):
    """tokenizers' ids against llama.cpp's on fixtures/smollm2/tokenize.json."""
    with open(os.path.join(root, FIXTURE_TOKENIZE)) as f:
        cases = json.load(f)["cases"]
    bad = [c["name"] for c in cases if tok.encode(c["text"]).ids != c["ids"]]
    if bad:
        sys.exit(f"tokenizer.json disagrees with llama.cpp on {bad}")
    print(f"tokenizer.json gives llama.cpp's ids on {len(cases)} lines", file=sys.stderr)


def test_lines(root):
    import llama_cpp_reference as ref
    with open(os.path.join(root, FIXTURE_TOKENIZE)) as f:
        lines = [c["text"] for c in json.load(f)["cases"]]
    with open(os.path.join(root, FIXTURE_PROMPTS)) as f:
        lines += json.load(f)
    lines += [ref.EXPECTED_CHAT_PROMPT, ref.UNICODE_PROMPT, ref.CODE_PROMPT, ref.LONG_DOCUMENT]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--out", required=True, help="the models folder")
    parser.add_argument("--root", default=".", help="the repository (for fixtures/)")
    parser.add_argument("--tokenize-fixture", help="also write the tokenizers package's ids here")
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip the conformance runs")
    args = parser.parse_args()
    tensors, reader = read_gguf(args.gguf)
    tok, tokens, specials = build_tokenizer(reader)
    check_tokenizer(tok, args.root)
    if args.tokenize_fixture:
        lines = test_lines(args.root)
        with open(args.tokenize_fixture, "w") as f:
            json.dump({"lines": lines, "ids": [tok.encode(line).ids for line in lines]}, f,
                      indent=1, ensure_ascii=False)
    meta = meta_of(reader)
    for kind, bf16 in (("f32", False), ("bf16", True)):
        stem = os.path.join(args.out, f"{STEM}-{kind}")
        write_dir(stem, tensors, meta, reader, tok, tokens, specials, bf16)
        write_twin(stem + ".gguf", reader, tensors, bf16)
        if not args.no_llama_cpp:
            import llama_cpp_reference as ref
            ref.write_conformance(stem + ".gguf", args.out, "smollm2", f"{STEM}-{kind}.llama_cpp")
        print(stem)


if __name__ == "__main__":
    main()
