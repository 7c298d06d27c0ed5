"""llama.cpp's mirostat v1 and v2 over runs of logit rows, and its dynamic
temperature on single rows: fixtures/samplers/mirostat.json.

Called by sampler_reference.py (`write(args)`, after samplers.json), or by hand:

    target/reference-venv/bin/python -c "import sys, argparse; \
        sys.path.insert(0, 'scripts/reference'); import mirostat_reference as m; \
        m.write(argparse.Namespace(out='fixtures/samplers', \
            row='fixtures/smollm2/chat_capital_of_france.last_logits.f32le.bin', model=None))"

Mirostat: each run is one sampler chain, built as llama.cpp's common sampler
builds it (`llama_sampler_init_temp(T)` when T != 1, then
`llama_sampler_init_mirostat(n_vocab, seed, tau, eta, 100)` or
`_mirostat_v2(seed, tau, eta)`), applied with `llama_sampler_apply` to one row
per step of a sequence and accepted. Each step records the bound `mu` the
sampler held before the step (read from the sampler's state), how many ids
were left inside the array's bounds (`n_kept`; both versions keep a prefix of
the sorted array, so these are the n_kept highest logits, which is checked
here; the ids themselves, `kept`, when at most 64), the token llama.cpp drew (`selected`, with its seeded
generator) and the probability llama.cpp gave it (`p_selected`, f32, over the
kept set); the run's last record is the bound after the last step (`mu_end`).
Every update is checked here against mu - eta (-log2 p - tau) in f32.

Sequences: the small ones are written out (`rows`, one per step, short decimals
read as f32), SmolLM2's 49,152-entry row gets a perturbation per step that both
sides compute from integers (`perturbation` in the JSON). Mirostat v1 gets the
finite entries only: its estimate of s from the top 100 ratios p_i / p_(i+1)
is NaN or infinite in llama.cpp when a -inf entry is among them (and lm-decode's
stages never see masked tokens); its vocabulary size is the row's length. v2
gets the whole row, -inf included (a -inf entry has infinite surprise and goes).
Where v1's k does not fit an int, llama.cpp's conversion is undefined (on x86
it keeps one token, and its bound then grows by eta tau per step): those steps
are recorded as they come, and crates/lm-decode/tests/sampler_mirostat.rs
names them.

Dynamic temperature: `llama_sampler_init_temp_ext(T, range, exponent)` alone on
one row (its finite entries: llama.cpp counts -inf entries in ln n). Its output
logits are the input ones divided by T_dyn in f32; `temperature` is T_dyn read
back from them (z_in / z_out of the largest |z|; null when llama.cpp left the
logits as they were, one candidate), and `probs` the softmax of its output
logits in f64 (checked here against the f32 `p` llama.cpp stores when range >
0): every finite id's for rows up to 64 entries, else the 64 most probable as
`top` [id, p] pairs.
"""

import ctypes
import math
import os
import random
import struct

import llama_cpp
from fixture_json import write_json
from sampler_reference import token_array

NEG_INF = float("-inf")
STEPS = 24
SEED = 38
# llama.cpp's common sampler gives mirostat v1 m = 100.
MIROSTAT_M = 100
# (version, tau, eta, temperature) per run, for every sequence.
RUNS = [
    (1, 3.0, 0.1, 1.0), (1, 5.0, 0.1, 0.7), (1, 5.0, 0.5, 1.0), (1, 8.0, 0.5, 1.3),
    (2, 3.0, 0.1, 1.0), (2, 5.0, 0.1, 0.7), (2, 5.0, 0.5, 1.0), (2, 8.0, 0.5, 1.3),
]
# The perturbation of SmolLM2's row at step s: z_i + AMPLITUDE * (h - 0.5),
# h = ((i * MUL + (s + 1) * STEP_MUL) mod 2^32) / 2^32, summed in f64, to f32.
PERTURBATION = {"amplitude": 4.0, "mul": 2654435761, "step_mul": 40503}
# (T, range, exponent) of the dynamic temperature cases.
DYNATEMP = [
    (1.0, 0.5, 1.0), (0.8, 0.5, 1.0), (0.3, 0.5, 1.0), (1.0, 0.0, 1.0),
    (1.0, 1.0, 2.0), (1.2, 0.3, 0.5), (0.7, 0.2, 0.0), (1.5, 1.5, 1.0),
]
MAX_ALL_PROBS = 64
# A kept set of at most this many tokens is listed.
MAX_LISTED = 64


def to_f32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def small_sequences():
    """(name, rows) for the written-out sequences, values as short decimals."""
    rng = random.Random(SEED)

    def rows(n, make):
        return [[make(i) for i in range(n)] for _ in range(STEPS)]

    normal_100 = rows(100, lambda i: round(rng.gauss(0.0, 2.0), 3))
    peaked_30 = rows(30, lambda i: round(rng.gauss(0.0, 1.0) + (9.0 if i == 7 else 0.0), 3))

    def tied_masked(i):
        if rng.random() < 0.15:
            return NEG_INF
        return round(rng.gauss(0.0, 2.0) * 2.0) / 2.0

    ties_masked_64 = rows(64, tied_masked)
    for row in ties_masked_64:
        row[3] = 4.0  # a finite token in every row
    zipf_500 = []
    for _ in range(STEPS):
        ranks = list(range(500))
        rng.shuffle(ranks)
        zipf_500.append([round(-1.1 * math.log(rank + 1) + rng.gauss(0.0, 0.1), 2) for rank in ranks])
    few_3 = rows(3, lambda i: round(rng.uniform(-1.0, 1.0), 2))
    return [("normal_100", normal_100), ("peaked_30", peaked_30), ("ties_masked_64", ties_masked_64),
            ("zipf_500_shuffled", zipf_500), ("three_tokens", few_3)]


def perturbed(row, step):
    amplitude, mul, step_mul = (PERTURBATION[k] for k in ("amplitude", "mul", "step_mul"))
    out = []
    for i, z in enumerate(row):
        h = ((i * mul + (step + 1) * step_mul) % 2**32) / 2**32
        out.append(to_f32(z + amplitude * (h - 0.5)))
    return out


class SamplerHead(ctypes.Structure):
    """llama.cpp's `struct llama_sampler { iface; ctx; }`."""
    _fields_ = [("iface", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


def mirostat_mu(sampler, version):
    """The bound in llama.cpp's mirostat state: v1's struct is (n_vocab, seed,
    seed_cur, tau, eta, m, mu), v2's (seed, seed_cur, tau, eta, mu)."""
    head = ctypes.cast(sampler, ctypes.POINTER(SamplerHead)).contents
    offset = 24 if version == 1 else 16
    return ctypes.c_float.from_address(head.ctx + offset).value


def kept_record(ids_left, logits):
    """`n_kept`, and the ids when few. Both versions keep a prefix of the
    sorted array: the n_kept highest logits (checked), so the count and the
    row give the set up to ties."""
    kept = sorted(ids_left)
    kept_set = set(kept)
    lowest_kept = min(logits[i] for i in kept)
    highest_gone = max((z for i, z in enumerate(logits) if i not in kept_set), default=NEG_INF)
    assert highest_gone <= lowest_kept, (highest_gone, lowest_kept)
    record = {"n_kept": len(kept)}
    if len(kept) <= MAX_LISTED:
        record["kept"] = kept
    return record


def run_mirostat(version, tau, eta, temperature, rows, n_vocab, seed):
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if temperature != 1.0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temperature))
    if version == 1:
        mirostat = llama_cpp.llama_sampler_init_mirostat(n_vocab, seed, tau, eta, MIROSTAT_M)
    else:
        mirostat = llama_cpp.llama_sampler_init_mirostat_v2(seed, tau, eta)
    llama_cpp.llama_sampler_chain_add(chain, mirostat)
    steps = []
    try:
        for logits in rows:
            mu = mirostat_mu(mirostat, version)
            ids = [i for i, z in enumerate(logits) if version == 2 or z != NEG_INF]
            data, array = token_array(logits, ids)
            llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
            left = array.data
            ids_left = [left[i].id for i in range(array.size)]
            selected = left[array.selected].id
            p_selected = left[array.selected].p
            llama_cpp.llama_sampler_accept(chain, selected)
            mu_next = mirostat_mu(mirostat, version)
            expected = to_f32(mu - to_f32(eta) * to_f32(to_f32(-math.log2(p_selected)) - to_f32(tau)))
            assert abs(mu_next - expected) <= 1e-5 * max(1.0, abs(expected)), (mu, mu_next, expected)
            step = {"mu": mu}
            step.update(kept_record(ids_left, logits))
            step.update({"selected": selected, "p_selected": p_selected})
            steps.append(step)
        return steps, mirostat_mu(mirostat, version)
    finally:
        llama_cpp.llama_sampler_free(chain)


def softmax64(values):
    best = max(values)
    weights = [math.exp(z - best) if z != NEG_INF else 0.0 for z in values]
    total = sum(weights)
    return [w / total for w in weights]


def dynatemp_case(name, logits, temperature, delta, exponent):
    ids = [i for i, z in enumerate(logits) if z != NEG_INF]
    data, array = token_array(logits, ids)
    sampler = llama_cpp.llama_sampler_init_temp_ext(temperature, delta, exponent)
    try:
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        out = {array.data[i].id: (array.data[i].logit, array.data[i].p) for i in range(array.size)}
    finally:
        llama_cpp.llama_sampler_free(sampler)
    assert array.size == len(ids)
    probs = dict(zip(ids, softmax64([out[i][0] for i in ids])))
    if delta > 0 and len(ids) > 1:
        for i in ids:
            assert abs(out[i][1] - probs[i]) <= 1e-6 + 1e-5 * probs[i], (name, i, out[i][1], probs[i])
    # T_dyn = z_in / z_out of the largest |z| (0: llama.cpp's greedy limit,
    # every token but the best at -inf).
    n_finite = sum(1 for i in ids if out[i][0] != NEG_INF)
    if len(ids) <= 1:
        t_dyn = None
    elif n_finite == 1:
        t_dyn = 0.0
    else:
        i = max(ids, key=lambda i: abs(logits[i]))
        t_dyn = float(f"{logits[i] / out[i][0]:.9g}")
    record = {"vector": name, "temperature": temperature, "range": delta, "exponent": exponent,
              "dynamic_temperature": t_dyn}
    if len(logits) <= MAX_ALL_PROBS:
        record["probs"] = [[i, float(f"{probs[i]:.12g}")] for i in ids]
    else:
        top = sorted(ids, key=lambda i: -probs[i])[:MAX_ALL_PROBS]
        record["top"] = [[i, float(f"{probs[i]:.12g}")] for i in sorted(top)]
    return record


def dynatemp_vectors(sequences, row):
    rng = random.Random(SEED + 1)
    vectors = [
        ("one_token", [0.7]),
        ("uniform_4", [1.0, 1.0, 1.0, 1.0]),
        ("very_peaked", [40.0, 0.0, -1.0, -2.0]),
        ("masked_some", [2.0, NEG_INF, 1.0, NEG_INF, 0.5, 0.0]),
        ("normal_50", [round(rng.gauss(0.0, 1.5), 3) for _ in range(50)]),
    ]
    for name, rows in sequences:
        vectors.append((name + "_step_0", rows[0]))
    return vectors


def write(args):
    llama_cpp.llama_backend_init()
    with open(args.row, "rb") as f:
        data = f.read()
    row = list(struct.unpack(f"<{len(data) // 4}f", data))
    sequences = small_sequences()
    f32_sequences = [(name, [[to_f32(z) for z in r] for r in rows]) for name, rows in sequences]
    smollm2 = [perturbed(row, step) for step in range(STEPS)]
    runs = []
    for seq_index, (name, rows) in enumerate(f32_sequences + [("smollm2_perturbed", smollm2)]):
        for run_index, (version, tau, eta, temperature) in enumerate(RUNS):
            seed = 1000 * seq_index + run_index
            steps, mu_end = run_mirostat(version, tau, eta, temperature, rows, len(rows[0]), seed)
            runs.append({"sequence": name, "version": version, "tau": tau, "eta": eta,
                         "temperature": temperature, "m": MIROSTAT_M if version == 1 else None,
                         "vocab_size": len(rows[0]), "seed": seed, "steps": steps, "mu_end": mu_end})
    dynatemp = []
    vectors = dynatemp_vectors(sequences, row)
    f32_vectors = [(name, [to_f32(z) for z in logits]) for name, logits in vectors]
    for name, logits in f32_vectors + [("smollm2_chat_capital_of_france", row)]:
        for temperature, delta, exponent in DYNATEMP:
            dynatemp.append(dynatemp_case(name, logits, temperature, delta, exponent))
    write_json(os.path.join(args.out, "mirostat.json"), {
        "generator": {
            "script": "scripts/reference/mirostat_reference.py",
            "llama_cpp_python": llama_cpp.__version__,
        },
        "row": {"file": "fixtures/smollm2/" + os.path.basename(args.row), "len": len(row)},
        "perturbation": PERTURBATION,
        "sequences": [{"name": name, "rows": [[z if z != NEG_INF else None for z in r] for r in rows]}
                      for name, rows in sequences],
        "runs": runs,
        "dynatemp_vectors": [{"name": name, "logits": [z if z != NEG_INF else None for z in logits]}
                             for name, logits in vectors],
        "dynatemp": dynatemp,
    })
