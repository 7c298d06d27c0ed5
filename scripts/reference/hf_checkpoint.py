#!/usr/bin/env python3
"""Write small Hugging Face model directories from the random-weight GGUF
files of fixtures/arch/ (their GGUF twins), undoing what llama.cpp's
convert_hf_to_gguf.py does to an HF checkpoint: fixtures/hf/.

Run with a Python that has numpy, gguf 0.19.0, tokenizers, jinja2 and
llama-cpp-python 0.3.36 (the reference venv):

    target/reference-venv/bin/python scripts/reference/hf_checkpoint.py \
        --arch fixtures/arch --out fixtures/hf

For each architecture NAME of fixtures/arch/ it writes NAME/ with:
- config.json: the fields the architecture's HF class reads (CLASSES below:
  LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM,
  MistralForCausalLM, Gemma2ForCausalLM, Phi3ForCausalLM, Olmo3ForCausalLM
  for the olmo2 twin's window, MixtralForCausalLM, Qwen3MoeForCausalLM,
  OlmoeForCausalLM, Qwen2MoeForCausalLM, Dots1ForCausalLM,
  GptOssForCausalLM), from the GGUF metadata; llama's
  `rope_scaling` is Llama 3's (factor 8, low 1, high 4, original context
  40), whose factors are the twin's `rope_freqs.weight`; phi3's is LongRoPE
  with the twin's `rope_factors_{long,short}` and attention factor;
- model.safetensors (qwen3: two shards and model.safetensors.index.json):
  the twin's tensors under HF's names and layouts, in the twin's type (F32
  or F16): llama's q/k rows un-permuted (the inverse of the converter's
  `LlamaModel.permute`; also mistral's and mixtral's), Gemma's norms minus
  1 (the converter adds 1), each 3-d `ffn_{gate,up,down}_exps` split into
  one matrix per expert (the converter stacks them), qwen2moe's
  `ffn_gate_inp_shexp` as the `[1, n_embd]` of an `nn.Linear`, no
  `lm_head.weight` where the twin has no `output.weight`
  (`tie_word_embeddings`); gpt_oss's MXFP4 experts in OpenAI's layout
  (`mlp.experts.{gate_up,down}_proj_{blocks,scales,bias}`: GGML's blocks
  split into U8 codes and E8M0 scales, the codes' nibbles reordered, gate
  and up rows interleaved; the inverse of the converter's `repack_mxfp4`);
- tokenizer.json, tokenizer_config.json, generation_config.json: one small
  byte-level BPE tokenizer (trained here by the `tokenizers` package on the
  lines of fixtures/tokenize/smollm2_prompts.json, vocabulary 400, BOS added
  by its post-processor) shared by every directory.

Also:
- qwen2-bf16/: qwen2's weights rounded to BF16 (round to nearest even), and
  its GGUF twin qwen2-bf16.gguf (the same BF16 arrays in GGUF's names, the
  twin's metadata) with llama.cpp's logits of fixtures/arch's 40 ids,
  qwen2-bf16.logits.f32le.bin;
- tokenize.json: the lines and the `tokenizers` package's ids of each
  (`encode(line).ids`, special tokens added by the post-processor);
- chat.json: conversations and jinja2's rendering of each directory's
  chat template (`add_generation_prompt=True`, `bos_token`, `eos_token`), as
  transformers' `apply_chat_template` renders it.

`--only a,b` rewrites only those directories (not the text fixtures, not
qwen2-bf16). Seeded and deterministic; opens no network connection.
"""

import argparse
import json
import os
import struct

import jinja2
import numpy as np
import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "mistral", "gemma2", "phi3", "olmo2", "mixtral", "qwen3moe",
         "olmoe", "qwen2moe", "dots1", "gpt_oss"]
# directory -> (HF class, model_type); the GGUF architecture is the twin's.
CLASSES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
    # The twin slides 3 of 4 layers: OLMo 3's config says so, OLMo 2's cannot.
    "olmo2": ("Olmo3ForCausalLM", "olmo3"),
    "mixtral": ("MixtralForCausalLM", "mixtral"),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "olmoe": ("OlmoeForCausalLM", "olmoe"),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
    "dots1": ("Dots1ForCausalLM", "dots1"),
    "gpt_oss": ("GptOssForCausalLM", "gpt_oss"),
}
# Directories whose q/k rows the converter permutes (LlamaModel and its
# Mistral, Mixtral classes) and whose norms it stores with `+ 1` (Gemma).
PERMUTED = {"llama", "mistral", "mixtral"}
PLUS_ONE = {"gemma3", "gemma2"}
# The experts' HF names: Mixtral's w1/w3/w2, the others' gate/up/down_proj.
EXPERT_NAMES = {
    "mixtral": ("block_sparse_moe.experts.{e}.", {"ffn_gate_exps": "w1", "ffn_up_exps": "w3", "ffn_down_exps": "w2"}),
    "default": ("mlp.experts.{e}.", {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj",
                                     "ffn_down_exps": "down_proj"}),
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma-like: the BOS text first, roles renamed.
BOS_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|im_start|>' + role + '\n' + message['content'] | trim + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>model\n' }}{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "  Hi there  "},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name 3 colours: red, green, ..."},
    ],
]
EXTRA_LINES = [
    "<|im_start|>user\nHi<|im_end|>\n",
    "text with <|endoftext|> inside",
    "",
]


def gguf_arrays(path):
    """name -> (numpy array in numpy order, ggml type), and the metadata."""
    reader = gguf.GGUFReader(path)
    tensors = {}
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        if t.tensor_type == gguf.GGMLQuantizationType.MXFP4:
            shape[-1] = -1  # the bytes of a row: 17 per block of 32
        tensors[t.name] = (np.array(t.data).reshape(shape), t.tensor_type)
    meta = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or not field.types:
            continue
        if field.types[0] == gguf.GGUFValueType.STRING:
            meta[field.name] = bytes(field.parts[field.data[0]]).decode()
        elif field.types[0] != gguf.GGUFValueType.ARRAY:
            meta[field.name] = field.parts[field.data[0]][0].item()
    return tensors, meta


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rows to GGUF rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    """Its inverse (GGUF rows to HF rows)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(arch, name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    _, i, rest = name.split(".", 2)
    post = "pre_feedforward_layernorm" if arch in PLUS_ONE else "post_attention_layernorm"
    router = "block_sparse_moe.gate.weight" if arch == "mixtral" else "mlp.gate.weight"
    shared = "mlp.shared_experts" if arch == "dots1" else "mlp.shared_expert"
    table = {
        "attn_norm.weight": "input_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight",
        "attn_q.bias": "self_attn.q_proj.bias",
        "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.bias": "self_attn.v_proj.bias",
        "attn_q_norm.weight": "self_attn.q_norm.weight",
        "attn_k_norm.weight": "self_attn.k_norm.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_norm.weight": post + ".weight",
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
        "attn_qkv.weight": "self_attn.qkv_proj.weight",
        "ffn_gate_inp.weight": router,
        "ffn_gate_shexp.weight": f"{shared}.gate_proj.weight",
        "ffn_up_shexp.weight": f"{shared}.up_proj.weight",
        "ffn_down_shexp.weight": f"{shared}.down_proj.weight",
        "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
        "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    }
    if arch == "gpt_oss":
        table.update({"attn_sinks.weight": "self_attn.sinks", "attn_output.bias": "self_attn.o_proj.bias",
                      "ffn_gate_inp.weight": "mlp.router.weight", "ffn_gate_inp.bias": "mlp.router.bias"})
    if arch == "phi3" and rest == "ffn_up.weight":
        return f"model.layers.{i}.mlp.gate_up_proj.weight"  # gate rows, then up: as GGUF
    return f"model.layers.{i}.{table[rest]}"


def mxfp4_to_hf(rows):
    """GGML's MXFP4 rows [..., n_blocks * 17] as HF's (blocks [..., n_blocks, 16],
    scales [..., n_blocks]): GGML's byte j holds values j (low nibble) and
    j + 16 (high), HF's byte b values 2b (low) and 2b + 1 (high)."""
    blocks = rows.reshape(*rows.shape[:-1], -1, 17)
    scales = np.ascontiguousarray(blocks[..., 0])
    codes = blocks[..., 1:]
    values = np.concatenate([codes & 0x0F, codes >> 4], axis=-1)  # value order 0..32
    hf = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(hf), scales


def interleave(gate, up):
    """[E, F, ...] twice as [E, 2F, ...], gate rows even, up rows odd."""
    out = np.empty((gate.shape[0], 2 * gate.shape[1], *gate.shape[2:]), dtype=gate.dtype)
    out[:, 0::2], out[:, 1::2] = gate, up
    return out


def gpt_oss_experts(tensors, i, put_raw, put):
    """Layer i's experts in OpenAI's layout (the converter's input)."""
    t = lambda kind: tensors[f"blk.{i}.{kind}"][0]
    gate, up, down = (mxfp4_to_hf(t(f"ffn_{k}_exps.weight")) for k in ("gate", "up", "down"))
    prefix = f"model.layers.{i}.mlp.experts."
    put_raw(prefix + "gate_up_proj_blocks", interleave(gate[0], up[0]))
    put_raw(prefix + "gate_up_proj_scales", interleave(gate[1], up[1]))
    put(prefix + "gate_up_proj_bias", interleave(t("ffn_gate_exps.bias"), t("ffn_up_exps.bias")))
    put_raw(prefix + "down_proj_blocks", down[0])
    put_raw(prefix + "down_proj_scales", down[1])
    put(prefix + "down_proj_bias", t("ffn_down_exps.bias"))


def to_bf16_bits(a):
    """f32 -> bf16 bit patterns, rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def save_safetensors(path, tensors):
    """tensors: name -> (dtype name, numpy array of the stored bytes' shape)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def hf_tensors(arch, tensors, meta, bf16=False):
    g = meta["general.architecture"]
    n_head = meta[f"{g}.attention.head_count"]
    n_kv = meta[f"{g}.attention.head_count_kv"]
    out = {}

    def put(name, a):
        if bf16:
            out[name] = ("BF16", to_bf16_bits(a))
        else:
            dtype = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}[a.dtype]
            out[name] = (dtype, a)

    for name, (array, _) in tensors.items():
        if name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
            continue  # config.json's rope_scaling gives them
        if arch == "gpt_oss" and "_exps." in name:
            i = name.split(".")[1]
            if name.endswith("ffn_gate_exps.weight"):
                gpt_oss_experts(tensors, i, lambda n, a: out.__setitem__(n, ("U8", a)), put)
            continue
        a = array
        if arch in PERMUTED and name.endswith("attn_q.weight"):
            a = unpermute(a, n_head)
        if arch in PERMUTED and name.endswith("attn_k.weight"):
            a = unpermute(a, n_kv)
        if arch in PLUS_ONE and name.endswith("norm.weight"):
            a = (a.astype(np.float32) - 1.0).astype(np.float32)
        if name.endswith("ffn_gate_inp_shexp.weight"):
            a = a.reshape(1, -1)  # nn.Linear(hidden, 1): [1, hidden]
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if kind.endswith("_exps"):
            # GGUF's 3-d [expert][rows][cols], HF's one matrix per expert.
            prefix, names = EXPERT_NAMES.get(arch, EXPERT_NAMES["default"])
            i = name.split(".")[1]
            for e in range(a.shape[0]):
                put(f"model.layers.{i}.{prefix.format(e=e)}{names[kind]}.weight", np.ascontiguousarray(a[e]))
            continue
        put(hf_name(arch, name), a)
    return out


def config_json(arch, meta, tensors):
    cls, model_type = CLASSES[arch]
    g = meta["general.architecture"]
    m = lambda key: meta[f"{g}.{key}"]
    config = {
        "architectures": [cls],
        "model_type": model_type,
        "hidden_size": m("embedding_length"),
        "intermediate_size": m("feed_forward_length"),
        "num_hidden_layers": m("block_count"),
        "num_attention_heads": m("attention.head_count"),
        "num_key_value_heads": m("attention.head_count_kv"),
        "max_position_embeddings": m("context_length"),
        "rms_norm_eps": m("attention.layer_norm_rms_epsilon"),
        "rope_theta": m("rope.freq_base"),
        "vocab_size": m("vocab_size"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    if f"{g}.attention.key_length" in meta:
        config["head_dim"] = m("attention.key_length")
    if arch == "llama":
        config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 40}
        config["hidden_act"] = "silu"
    if arch == "gemma3":
        config.update({"sliding_window": m("attention.sliding_window"), "sliding_window_pattern": 6,
                       "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": m("attention.key_length"),
                       "hidden_activation": "gelu_pytorch_tanh"})
    if arch in ("mistral", "phi3"):
        config["sliding_window"] = m("attention.sliding_window")
    if arch == "gemma2":
        config.update({"sliding_window": m("attention.sliding_window"), "query_pre_attn_scalar": m("attention.key_length"),
                       "attn_logit_softcapping": m("attn_logit_softcapping"),
                       "final_logit_softcapping": m("final_logit_softcapping"),
                       "hidden_activation": "gelu_pytorch_tanh"})
    if arch == "phi3":
        # LongRoPE, as Phi-3's 128k configs spell it; the twin's attention
        # factor (1.2) is given, where transformers would compute
        # sqrt(1 + ln(256 / 64) / ln(64)) = 1.155 without it.
        factors = lambda n: [float(v) for v in tensors[n][0]]
        config["original_max_position_embeddings"] = m("rope.scaling.original_context_length")
        config["rope_scaling"] = {"type": "longrope", "long_factor": factors("rope_factors_long.weight"),
                                  "short_factor": factors("rope_factors_short.weight"),
                                  "attention_factor": m("rope.scaling.attn_factor")}
    if arch == "olmo2":
        n = m("block_count")
        config["sliding_window"] = m("attention.sliding_window")
        config["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n)]
    if arch == "dots1":
        # DeepSeek-V3's router names (transformers' Dots1Config).
        config.update({"n_routed_experts": m("expert_count"), "num_experts_per_tok": m("expert_used_count"),
                       "moe_intermediate_size": m("expert_feed_forward_length"),
                       "n_shared_experts": m("expert_shared_count"),
                       "first_k_dense_replace": m("leading_dense_block_count"),
                       "norm_topk_prob": bool(m("expert_weights_norm")),
                       "routed_scaling_factor": m("expert_weights_scale"), "scoring_func": "noaux_tc",
                       "n_group": 1, "topk_group": 1})
        assert m("expert_gating_func") == 2  # sigmoid, what noaux_tc scores with
        return config
    if arch == "gpt_oss":
        # The converter writes intermediate_size as both widths; GGUF's
        # feed_forward_length (96 in the twin) is unread for gpt-oss.
        n = m("block_count")
        config.update({"intermediate_size": m("expert_feed_forward_length"),
                       "num_local_experts": m("expert_count"), "num_experts_per_tok": m("expert_used_count"),
                       "sliding_window": m("attention.sliding_window"),
                       "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
                       "rope_scaling": None, "swiglu_limit": 7.0, "attention_bias": True, "hidden_act": "silu",
                       "quantization_config": {"quant_method": "mxfp4",
                                               "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                          "model.layers.*.mlp.router",
                                                                          "model.embed_tokens", "lm_head"]}})
        return config
    if f"{g}.expert_count" in meta:
        key = "num_local_experts" if arch == "mixtral" else "num_experts"
        config[key] = m("expert_count")
        config["num_experts_per_tok"] = m("expert_used_count")
        if arch != "mixtral":
            config["norm_topk_prob"] = arch == "qwen3moe"  # llama.cpp's choice per architecture
    if f"{g}.expert_feed_forward_length" in meta:
        config["moe_intermediate_size"] = m("expert_feed_forward_length")
    if f"{g}.expert_shared_feed_forward_length" in meta:
        config["shared_expert_intermediate_size"] = m("expert_shared_feed_forward_length")
    return config


def build_tokenizer(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", 0)])
    return tok


def write_text_files(d, tok, template):
    tok.save(os.path.join(d, "tokenizer.json"))
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, t in enumerate(SPECIALS)}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"add_prefix_space": False, "added_tokens_decoder": added, "bos_token": "<|endoftext|>",
                   "eos_token": "<|im_end|>", "chat_template": template,
                   "model_max_length": 256, "tokenizer_class": "GPT2Tokenizer"}, f, indent=1)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": [0, 2], "do_sample": True, "temperature": 0.7,
                   "top_p": 0.9, "top_k": 40}, f, indent=1)


def write_dir(d, arch, tensors, meta, tok, template, bf16=False, shards=1):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config_json(arch, meta, tensors), f, indent=1)
    hf = hf_tensors(arch, tensors, meta, bf16)
    if shards == 1:
        save_safetensors(os.path.join(d, "model.safetensors"), hf)
    else:
        names = list(hf)
        weight_map = {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: hf[n] for n in names[k::shards]}
            save_safetensors(os.path.join(d, file), part)
            weight_map.update({n: file for n in part})
        total = sum(a.nbytes for _, a in hf.values())
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    write_text_files(d, tok, template)
    return hf


def write_bf16_twin(path, arch, tensors, meta):
    """The GGUF twin of the BF16 directory: GGUF names, BF16 matrices (norms
    and biases F32 as the converter keeps 1-D tensors), the twin's metadata."""
    w = gguf.GGUFWriter(path, arch)
    for key, value in meta.items():
        if key.startswith(arch + ".") or key == "tokenizer.ggml.model":
            if isinstance(value, str):
                w.add_string(key, value)
            elif isinstance(value, float):
                w.add_float32(key, value)
            else:
                w.add_uint32(key, value)
    for name, (array, _) in tensors.items():
        bits = to_bf16_bits(array)
        if array.ndim == 1:
            w.add_tensor(name, bits.view(np.uint16).astype(np.uint32).__lshift__(16).view(np.float32))
        else:
            w.add_tensor(name, bits, raw_shape=bits.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_logits(path, ids):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=1, n_threads_batch=1,
                          logits_all=True, verbose=False)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", required=True, help="fixtures/arch")
    parser.add_argument("--prompts", default="fixtures/tokenize/smollm2_prompts.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", help="comma-separated directories to (re)write, nothing else")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    os.makedirs(args.out, exist_ok=True)
    with open(args.prompts) as f:
        lines = json.load(f)
    tok = build_tokenizer(lines)
    templates = {"llama": CHATML, "qwen2": CHATML, "gemma3": BOS_TEMPLATE,
                 "qwen3": [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": "{{ 1 }}"}]}
    env = jinja2.Environment()
    chat = {}
    for arch in ARCHS:
        if only is not None and arch not in only:
            continue
        tensors, meta = gguf_arrays(os.path.join(args.arch, f"{arch}.gguf"))
        write_dir(os.path.join(args.out, arch), arch, tensors, meta, tok, templates.get(arch, CHATML),
                  shards=2 if arch == "qwen3" else 1)
        if only is not None or arch not in templates:
            continue
        source = templates[arch] if isinstance(templates[arch], str) else templates[arch][0]["template"]
        chat[arch] = [env.from_string(source).render(messages=c, add_generation_prompt=True,
                                                     bos_token="<|endoftext|>", eos_token="<|im_end|>")
                      for c in CONVERSATIONS]
        if arch == "qwen2":
            write_dir(os.path.join(args.out, "qwen2-bf16"), arch, tensors, meta, tok, CHATML, bf16=True)
            twin = os.path.join(args.out, "qwen2-bf16.gguf")
            write_bf16_twin(twin, arch, tensors, meta)
            with open(os.path.join(args.arch, "manifest.json")) as f:
                ids = json.load(f)["ids"]
            llama_cpp_logits(twin, ids).astype("<f4").tofile(
                os.path.join(args.out, "qwen2-bf16.logits.f32le.bin"))
    if only is not None:
        return
    with open(os.path.join(args.out, "chat.json"), "w") as f:
        json.dump({"conversations": CONVERSATIONS, "rendered": chat}, f, indent=1, ensure_ascii=False)
    all_lines = lines + EXTRA_LINES
    with open(os.path.join(args.out, "tokenize.json"), "w") as f:
        json.dump({"lines": all_lines, "ids": [tok.encode(line).ids for line in all_lines]}, f,
                  indent=1, ensure_ascii=False)
    for name in sorted(os.listdir(args.out)):
        print(name)


if __name__ == "__main__":
    main()
