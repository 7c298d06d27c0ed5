#!/usr/bin/env python3
"""Write small seeded random-weight GGUF files, one per architecture, and
llama.cpp's logits for a fixed id sequence on each: fixtures/arch/.

Run through `cargo xtask reference-fixtures --arch`, or by hand with a Python
that has llama-cpp-python 0.3.36 and gguf 0.19.0:

    python3 scripts/reference/random_gguf.py --out fixtures/arch

With `LM_ARCH_ONLY=gemma2,olmo2` only those files are rewritten and their
entries of manifest.json replaced (the others' logits stay as measured).

For each architecture NAME it writes:
- NAME.gguf: the model (weights drawn from numpy's PCG64 with a fixed seed,
  so a rerun writes the same bytes), with llama.cpp's metadata keys for that
  architecture and `tokenizer.ggml.model = "none"` (no vocabulary);
- NAME.logits.f32le.bin: llama.cpp's logits of every position of IDS,
  `[len(IDS)][vocab]` little-endian f32, fed as ids with `Llama.eval`
  (`logits_all=True`, one thread, one batch);
- manifest.json: the ids, the shapes and the versions.

The script opens no network connection and writes only llama.cpp's outputs,
never any of its code.
"""

import json
import os

import numpy as np

import gguf
import llama_cpp
from fixture_json import out_folder, write_manifest

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
VOCAB = 512
N_IDS = 40
SEED = 20261201
# The fixed input: 40 ids drawn once from the seed (a gemma3 window of 12
# is crossed three times).
IDS = [int(i) for i in np.random.default_rng(SEED).integers(0, VOCAB, N_IDS)]

# Each architecture: its metadata and tensor layout. head_dim is the key
# length; q_dim = n_head * head_dim may differ from the width (qwen3, gemma3).
ARCHS = {
    # Llama 3.1-style: rope_freqs.weight holds per-pair frequency factors.
    "llama": dict(n_embd=64, n_layer=2, n_head=4, n_kv_head=2, head_dim=16, ffn=96,
                  rope_base=500000.0, dtype="f16", rope_freqs=True, tied=False),
    "qwen2": dict(n_embd=64, n_layer=2, n_head=4, n_kv_head=2, head_dim=16, ffn=96,
                  rope_base=1000000.0, dtype="f32", qkv_bias=True, tied=True),
    "qwen3": dict(n_embd=64, n_layer=2, n_head=4, n_kv_head=2, head_dim=32, ffn=96,
                  rope_base=1000000.0, dtype="f16", qk_norm=True, tied=False),
    "gemma3": dict(n_embd=64, n_layer=6, n_head=4, n_kv_head=1, head_dim=32, ffn=96,
                   rope_base=1000000.0, dtype="f16", qk_norm=True, post_norms=True,
                   sliding_window=12, tied=True),
    # Mixtures of experts, F32 throughout (experts as 3-d tensors). qk_scale
    # multiplies the query and key weights (or, with QK norms, their gains)
    # so that attention is peaked and positions matter.
    "qwen3moe": dict(n_embd=64, n_layer=4, n_head=4, n_kv_head=2, head_dim=32, ffn=96,
                     expert_ffn=32, n_expert=8, n_expert_used=2, qk_scale=2.0,
                     rope_base=1000000.0, dtype="f32", qk_norm=True, tied=False),
    # Mixtral: llama with llama.expert_count > 0, experts as wide as
    # feed_forward_length.
    "mixtral": dict(arch="llama", n_embd=64, n_layer=4, n_head=4, n_kv_head=2, head_dim=16,
                    ffn=48, n_expert=8, n_expert_used=2, qk_scale=2.0,
                    rope_base=1000000.0, dtype="f32", tied=False),
    # Top-8 of 16 experts.
    "qwen3moe_top8": dict(arch="qwen3moe", n_embd=64, n_layer=3, n_head=4, n_kv_head=2,
                          head_dim=32, ffn=96, expert_ffn=16, n_expert=16, n_expert_used=8,
                          qk_scale=2.0, rope_base=1000000.0, dtype="f32", qk_norm=True,
                          tied=False),
    # OLMoE: QK norms over all the heads together (so no grouped-query
    # attention: llama.cpp sizes the key norm by the width), experts as wide
    # as feed_forward_length, the chosen weights not renormalised.
    "olmoe": dict(n_embd=64, n_layer=4, n_head=4, n_kv_head=4, head_dim=16, ffn=32,
                  n_expert=8, n_expert_used=2, qk_scale=2.0, rope_base=10000.0,
                  dtype="f32", qk_norm=True, qk_norm_full=True, tied=False),
    # Gemma 2: soft-capped attention scores (cap 4) and logits (cap 5), so
    # both caps bite; layers 0, 2 slide over 12 positions, 1 and 3 are
    # global, all with the one RoPE base; pre- and post-norms, GeGLU.
    "gemma2": dict(n_embd=64, n_layer=4, n_head=4, n_kv_head=2, head_dim=32, ffn=96,
                   qk_scale=2.0, rope_base=10000.0, dtype="f32", post_norms=True,
                   sliding_window=12, attn_softcap=4.0, final_softcap=5.0, tied=True),
    # OLMo 2 (with OLMo 3's window: layers 0-2 slide over 12, layer 3 is
    # global): no pre-norms, QK norms over all the heads together, post-norms.
    "olmo2": dict(n_embd=64, n_layer=4, n_head=4, n_kv_head=2, head_dim=16, ffn=96,
                  qk_scale=2.0, rope_base=500000.0, dtype="f32", qk_norm=True,
                  qk_norm_full=True, post_norms=True, pre_norms=False,
                  sliding_window=12, tied=False),
    # Phi-3: fused attn_qkv and ffn_up (gate rows, then up); LongRoPE factors
    # (long ones chosen: the context of 256 exceeds the original 64) and an
    # attn_factor of 1.2; its sliding_window key of 12 is ignored by llama.cpp.
    "phi3": dict(n_embd=64, n_layer=3, n_head=4, n_kv_head=2, head_dim=16, ffn=96,
                 qk_scale=2.0, rope_base=10000.0, dtype="f32", fused=True,
                 long_rope=True, sliding_window=12, tied=False),
    # Mistral 7B v0.1-style: llama with llama.attention.sliding_window 12,
    # which llama.cpp 0.3.36 does not read (every layer attends globally).
    "mistral": dict(arch="llama", n_embd=64, n_layer=3, n_head=4, n_kv_head=2, head_dim=16,
                    ffn=96, qk_scale=2.0, rope_base=10000.0, dtype="f32",
                    sliding_window=12, tied=False),
    # Qwen1.5-MoE / Qwen2-57B-A14B: qwen2's attention (QKV biases) and a
    # softmax router whose top-2 weights are not renormalised, plus a shared
    # expert of width 48 (expert_shared_feed_forward_length) whose output is
    # multiplied by sigmoid(ffn_gate_inp_shexp . x).
    "qwen2moe": dict(n_embd=64, n_layer=4, n_head=4, n_kv_head=2, head_dim=16, ffn=96,
                     expert_ffn=32, n_expert=8, n_expert_used=2, shared_ffn=48,
                     shared_gate=True, qk_scale=2.0, rope_base=1000000.0, dtype="f32",
                     qkv_bias=True, tied=False),
    # dots.llm1: qwen3's attention (per-head QK norms; no grouping: llama.cpp
    # sizes K and V by the query heads), layer 0 dense
    # (leading_dense_block_count 1), then sigmoid gating (expert_gating_func
    # 2) with a selection bias exp_probs_b, top-3 of 8 renormalised and
    # scaled by 2.5, and 2 shared experts (width 2 x 32) added ungated.
    "dots1": dict(n_embd=64, n_layer=4, n_head=4, n_kv_head=4, head_dim=32, ffn=96,
                  expert_ffn=32, n_expert=8, n_expert_used=3, n_shared=2, dense_lead=1,
                  gating_func=2, weights_norm=True, weights_scale=2.5, probs_bias=True,
                  qk_scale=2.0, rope_base=1000000.0, dtype="f32", qk_norm=True, tied=False),
    # gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE): layers 0, 2 slide over 12
    # positions, 1 and 3 are global; a sink logit per head
    # (attn_sinks.weight, 3 N(0, 1): some heads' sinks take most of the
    # weight, others none); q/k/v and output biases; the norm before the
    # experts named post_attention_norm; a router with a bias choosing the
    # top-4 of 8 experts by logit, weighted by the softmax of those four;
    # experts in MXFP4 (gguf's quantizer) with F32 biases, through
    # swiglu_oai (alpha 1.702, limit 7); query and key weights times 1.5
    # (times 2, the f16 cache's roundings moved llama.cpp's own logits by
    # 0.03 and ours, rounding alike, by as much). Its logits are also
    # written with an f32 KV cache (f32_kv), where no f16 rounding intervenes.
    "gpt_oss": dict(arch="gpt-oss", n_embd=64, n_layer=4, n_head=4, n_kv_head=2, head_dim=32,
                    ffn=96, expert_ffn=32, n_expert=8, n_expert_used=4, qk_scale=1.5,
                    rope_base=150000.0, dtype="f32", sliding_window=12, qkv_bias=True,
                    out_bias=True, sinks=True, moe_bias=True, experts_type="mxfp4",
                    ffn_norm="post_attention_norm", f32_kv=True, tied=False),
    # gpt-oss with YaRN as its converter writes it (rope.scaling.type yarn;
    # here factor 4 over an original context of 64, so the ramp between the
    # correction dimensions spans pairs 0..3 of 16 and the sliding layers,
    # which keep the scale, are scaled too). Its experts are F32: with
    # MXFP4 experts (whose products round activations through q8_0) the f16
    # KV cache's last-bit differences flipped 8-bit roundings and moved
    # single logits by up to 0.02 from llama.cpp's f16 run, while the f32
    # runs agreed within 2e-6; gpt_oss covers the MXFP4 path.
    "gpt_oss_yarn": dict(arch="gpt-oss", n_embd=64, n_layer=4, n_head=4, n_kv_head=2,
                         head_dim=32, ffn=96, expert_ffn=32, n_expert=8, n_expert_used=4,
                         qk_scale=1.5, rope_base=150000.0, dtype="f32", sliding_window=12,
                         qkv_bias=True, out_bias=True, sinks=True, moe_bias=True,
                         ffn_norm="post_attention_norm", f32_kv=True,
                         yarn=(4.0, 64), tied=False),
    # qwen3moe with its experts quantized to Q8_0 by gguf's quantizer:
    # 3-d quantized expert tensors, multiplied with 8-bit activations as
    # llama.cpp multiplies them. Also written with f32 KV caches (f32_kv).
    # Float-rounding differences (about 1e-6) flip single 8-bit roundings
    # of the activations from position 16 on (fixtures/arch/README.md).
    "qwen3moe_q8_0": dict(arch="qwen3moe", n_embd=64, n_layer=4, n_head=4, n_kv_head=2,
                          head_dim=32, ffn=96, expert_ffn=32, n_expert=8, n_expert_used=2,
                          qk_scale=1.0, rope_base=1000000.0, dtype="f32", qk_norm=True,
                          experts_type="q8_0", f32_kv=True, tied=False),
}


def llama3_rope_factors(head_dim, base):
    """The factors convert_hf_to_gguf.py writes for Llama 3.1's rope_scaling
    (factor 8, low 1, high 4, original context 8192), for a head of head_dim.
    With the tiny original context used here (40) the three regimes (kept,
    blended, scaled) all occur: factors 1, 5.17, then 8."""
    factor, low_freq_factor, high_freq_factor, old_context_len = 8.0, 1.0, 4.0, 40
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * np.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_model(path, arch, spec, seed):
    rng = np.random.default_rng(seed)
    d, hd, nh, nkv, ffn = spec["n_embd"], spec["head_dim"], spec["n_head"], spec["n_kv_head"], spec["ffn"]
    wdtype = np.float16 if spec["dtype"] == "f16" else np.float32

    def matrix(n_out, n_in):
        # numpy shape (rows, row length) is ggml's [row length, rows].
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(wdtype)

    def gain(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.5 * rng.standard_normal(n)).astype(np.float32)

    qk_scale = spec.get("qk_scale", 1.0)
    n_expert = spec.get("n_expert", 0)

    def experts(n_out, n_in):
        # numpy shape (experts, rows, row length) is ggml's [row length, rows, experts].
        return (rng.standard_normal((n_expert, n_out, n_in)) / np.sqrt(n_in)).astype(wdtype)

    def add_experts(name, n_out, n_in):
        values = experts(n_out, n_in)
        if "experts_type" in spec:
            qtype = gguf.GGMLQuantizationType[spec["experts_type"].upper()]
            # The quantized bytes, (experts, rows, row bytes): gguf reads the
            # shape back from the type's block size.
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, values)

    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(256)
    w.add_embedding_length(d)
    w.add_block_count(spec["n_layer"])
    w.add_feed_forward_length(ffn)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(1e-6 if arch in ("gemma3", "gemma2") else 1e-5)
    w.add_rope_freq_base(spec["rope_base"])
    if arch in ("qwen3", "gemma3", "qwen3moe", "gemma2", "dots1", "gpt-oss"):
        w.add_key_length(hd)
        w.add_value_length(hd)
    else:
        w.add_rope_dimension_count(hd)
    if "sliding_window" in spec:
        w.add_sliding_window(spec["sliding_window"])
    if "attn_softcap" in spec:
        w.add_attn_logit_softcapping(spec["attn_softcap"])
        w.add_final_logit_softcapping(spec["final_softcap"])
    if "yarn" in spec:
        factor, original = spec["yarn"]
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(original)
    if spec.get("long_rope"):
        w.add_rope_scaling_orig_ctx_len(64)
        w.add_rope_scaling_attn_factors(1.2)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(spec["n_expert_used"])
    if "expert_ffn" in spec:
        w.add_expert_feed_forward_length(spec["expert_ffn"])
    if "shared_ffn" in spec:
        w.add_expert_shared_feed_forward_length(spec["shared_ffn"])
    if "n_shared" in spec:
        w.add_expert_shared_count(spec["n_shared"])
    if "dense_lead" in spec:
        w.add_leading_dense_block_count(spec["dense_lead"])
    if "gating_func" in spec:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(spec["gating_func"]))
        w.add_expert_weights_norm(spec["weights_norm"])
        w.add_expert_weights_scale(spec["weights_scale"])
    w.add_tokenizer_model("none")
    w.add_vocab_size(VOCAB)

    # Embedding rows of unit scale (gemma3 multiplies them by sqrt(width)).
    emb_scale = 1.0 / np.sqrt(d) if arch in ("gemma3", "gemma2") else 1.0
    w.add_tensor("token_embd.weight", (rng.standard_normal((VOCAB, d)) * emb_scale).astype(wdtype))
    w.add_tensor("output_norm.weight", gain(d))
    if not spec["tied"]:
        w.add_tensor("output.weight", matrix(VOCAB, d))
    if spec.get("rope_freqs"):
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(hd, spec["rope_base"]))
    if spec.get("long_rope"):
        # LongRoPE: per-pair divisors, long ones far from the short ones.
        w.add_tensor("rope_factors_long.weight", (1.0 + 7.0 * rng.random(hd // 2)).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", (1.0 + 0.5 * rng.random(hd // 2)).astype(np.float32))
    for i in range(spec["n_layer"]):
        p = f"blk.{i}."
        if spec.get("pre_norms", True):
            w.add_tensor(p + "attn_norm.weight", gain(d))
        # Without QK norms the scale goes into the projections (the
        # product of two f16 matrices scaled by a power of two is exact).
        w_scale = 1.0 if spec.get("qk_norm") else qk_scale
        q = (matrix(nh * hd, d) * w_scale).astype(wdtype)
        k = (matrix(nkv * hd, d) * w_scale).astype(wdtype)
        v = matrix(nkv * hd, d)
        if spec.get("fused"):
            w.add_tensor(p + "attn_qkv.weight", np.concatenate([q, k, v]))
        else:
            w.add_tensor(p + "attn_q.weight", q)
            w.add_tensor(p + "attn_k.weight", k)
            w.add_tensor(p + "attn_v.weight", v)
        if spec.get("qkv_bias"):
            w.add_tensor(p + "attn_q.bias", bias(nh * hd))
            w.add_tensor(p + "attn_k.bias", bias(nkv * hd))
            w.add_tensor(p + "attn_v.bias", bias(nkv * hd))
        if spec.get("qk_norm"):
            q_width, k_width = (nh * hd, nkv * hd) if spec.get("qk_norm_full") else (hd, hd)
            w.add_tensor(p + "attn_q_norm.weight", gain(q_width) * np.float32(qk_scale))
            w.add_tensor(p + "attn_k_norm.weight", gain(k_width) * np.float32(qk_scale))
        w.add_tensor(p + "attn_output.weight", matrix(d, nh * hd))
        if spec.get("out_bias"):
            w.add_tensor(p + "attn_output.bias", bias(d))
        if spec.get("sinks"):
            w.add_tensor(p + "attn_sinks.weight", (3.0 * rng.standard_normal(nh)).astype(np.float32))
        if spec.get("post_norms"):
            w.add_tensor(p + "post_attention_norm.weight", gain(d))
        if spec.get("pre_norms", True):
            w.add_tensor(p + spec.get("ffn_norm", "ffn_norm") + ".weight", gain(d))
        if n_expert and i >= spec.get("dense_lead", 0):
            f = spec.get("expert_ffn", ffn)
            # The router in F32 (llama.cpp's converter keeps it so).
            w.add_tensor(p + "ffn_gate_inp.weight",
                         (rng.standard_normal((n_expert, d)) / np.sqrt(d)).astype(np.float32))
            add_experts(p + "ffn_gate_exps.weight", f, d)
            add_experts(p + "ffn_up_exps.weight", f, d)
            add_experts(p + "ffn_down_exps.weight", d, f)
            if spec.get("moe_bias"):
                # numpy (experts, width) is ggml's [width, experts].
                w.add_tensor(p + "ffn_gate_inp.bias", bias(n_expert))
                w.add_tensor(p + "ffn_gate_exps.bias", bias(n_expert * f).reshape(n_expert, f))
                w.add_tensor(p + "ffn_up_exps.bias", bias(n_expert * f).reshape(n_expert, f))
                w.add_tensor(p + "ffn_down_exps.bias", bias(n_expert * d).reshape(n_expert, d))
            if spec.get("probs_bias"):
                # Of the size of the sigmoids' spread, so it changes choices.
                w.add_tensor(p + "exp_probs_b.bias", (0.2 * rng.standard_normal(n_expert)).astype(np.float32))
            shared = spec.get("shared_ffn", f * spec.get("n_shared", 0))
            if shared:
                if spec.get("shared_gate"):
                    w.add_tensor(p + "ffn_gate_inp_shexp.weight",
                                 (rng.standard_normal(d) / np.sqrt(d)).astype(np.float32))
                w.add_tensor(p + "ffn_gate_shexp.weight", matrix(shared, d))
                w.add_tensor(p + "ffn_up_shexp.weight", matrix(shared, d))
                w.add_tensor(p + "ffn_down_shexp.weight", matrix(d, shared))
        elif spec.get("fused"):
            # One tensor: the gate's rows, then the up projection's.
            w.add_tensor(p + "ffn_up.weight", np.concatenate([matrix(ffn, d), matrix(ffn, d)]))
            w.add_tensor(p + "ffn_down.weight", matrix(d, ffn))
        else:
            w.add_tensor(p + "ffn_gate.weight", matrix(ffn, d))
            w.add_tensor(p + "ffn_up.weight", matrix(ffn, d))
            w.add_tensor(p + "ffn_down.weight", matrix(d, ffn))
        if spec.get("post_norms"):
            w.add_tensor(p + "post_ffw_norm.weight", gain(d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_mxfp4_blocks(out):
    """mxfp4_blocks.bin: 300 random MXFP4 blocks (17 bytes each: every
    exponent byte 0..254 once, then random ones, and random codes), and
    mxfp4_blocks.f32le.bin: the gguf package's dequantization of them
    (`gguf.quants.dequantize`), 32 little-endian f32 per block."""
    rng = np.random.default_rng(SEED - 39)
    blocks = rng.integers(0, 256, (300, 17), dtype=np.uint8)
    blocks[:255, 0] = np.arange(255, dtype=np.uint8)
    blocks[255:, 0] = rng.integers(0, 255, 45, dtype=np.uint8)
    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.MXFP4)
    blocks.tofile(os.path.join(out, "mxfp4_blocks.bin"))
    values.astype("<f4").tofile(os.path.join(out, "mxfp4_blocks.f32le.bin"))


def llama_cpp_logits(path, **cache):
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=256,
        n_batch=256,
        n_threads=1,
        n_threads_batch=1,
        logits_all=True,
        verbose=False,
        **cache,
    )
    llm.eval(IDS)
    n_vocab = llm.n_vocab()
    assert n_vocab == VOCAB, n_vocab
    return np.array(llm.scores[: len(IDS)], dtype=np.float32)


def main():
    out = out_folder(__doc__.splitlines()[0], llama_cpp.__version__, LLAMA_CPP_PYTHON_VERSION)
    only = [name for name in os.environ.get("LM_ARCH_ONLY", "").split(",") if name]
    previous = {}
    if only:
        with open(os.path.join(out, "manifest.json")) as f:
            previous = json.load(f)["models"]
    manifest = {
        "llama_cpp_python": llama_cpp.__version__,
        "gguf": gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0",
        "seed": SEED,
        "ids": IDS,
        "vocab_size": VOCAB,
        "models": {},
    }
    for k, (name, spec) in enumerate(ARCHS.items()):
        if only and name not in only:
            manifest["models"][name] = previous[name]
            continue
        path = os.path.join(out, f"{name}.gguf")
        write_model(path, spec.get("arch", name), spec, SEED + k + 1)
        logits = llama_cpp_logits(path)
        logits.astype("<f4").tofile(os.path.join(out, f"{name}.logits.f32le.bin"))
        if spec.get("f32_kv"):
            # type_k = type_v = 0: GGML_TYPE_F32.
            f32_kv = llama_cpp_logits(path, type_k=0, type_v=0)
            f32_kv.astype("<f4").tofile(os.path.join(out, f"{name}.f32kv.logits.f32le.bin"))
        manifest["models"][name] = {
            "file": f"{name}.gguf",
            "logits": f"{name}.logits.f32le.bin",
            "rows": len(IDS),
            "argmax": [int(a) for a in logits.argmax(axis=1)],
            **{key: value for key, value in spec.items()},
        }
        print(f"{name}: {os.path.getsize(path)} bytes, logits range {logits.min():.3f}..{logits.max():.3f}")
    if not only or "gpt_oss" in only:
        write_mxfp4_blocks(out)
    write_manifest(out, manifest)


if __name__ == "__main__":
    main()
