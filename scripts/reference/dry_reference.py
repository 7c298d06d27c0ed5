"""Write llama.cpp's DRY sampler outputs: fixtures/samplers/dry.json.

Imported by `scripts/reference/sampler_reference.py` (one of its
`STATEFUL_MODULES`), which calls `write(args)` with `args.out` (the
fixtures/samplers folder), `args.row` (SmolLM2's 49,152-entry f32le logits row)
and `args.model` (SmolLM2's GGUF file).

SmolLM2's vocabulary alone is loaded (`vocab_only`): DRY compiles its sequence
breakers over it (`llama_sampler_init_dry` scans every token's text), and the
histories are repetitive texts tokenized with it. Each case builds
`llama_sampler_init_dry(vocab, multiplier, base, allowed_length,
penalty_last_n, breakers)`, feeds a history token by token with
`llama_sampler_accept`, applies the sampler once to the whole row (an unsorted
`llama_token_data_array` in id order) and records the ids whose logit changed
with their new logits (f32 values; `null` is -inf).

The llama.cpp bundled with llama-cpp-python 0.3.36 clamps a negative
`penalty_last_n` to 0 (DRY off): the -1 cases record that. The cases with a
window of 4,096 (longer than every history) are the whole-history ones.

Only llama.cpp's outputs are written, never any of its code; no weights are
loaded and no network connection is opened.
"""

import ctypes
import os
import random

import llama_cpp
from fixture_json import write_json

NEG_INF = float("-inf")

BREAKER_SETS = {
    "default": ["\n", ":", "\"", "*"],
    "none": [],
    # Multi-character breakers: llama.cpp also matches them split across
    # tokens (" sat" then " on"; "Age" then ":", " ", "3").
    "multi": ["\n\n", "###", " sat on", "Age: 3"],
}

# (multiplier, base, allowed_length, penalty_last_n, breaker set)
SETTINGS = [
    (0.8, 1.75, 2, 64, "default"),
    (0.8, 1.75, 2, -1, "default"),
    (0.8, 1.75, 2, 0, "default"),
    (1.5, 2.0, 1, 64, "default"),
    (0.8, 1.75, 4, 64, "default"),
    (0.8, 2.0, 2, 4096, "default"),
    (0.8, 1.75, 2, 64, "none"),
    (1.5, 1.75, 1, 4096, "none"),
    (0.8, 1.75, 0, 64, "none"),
    (0.8, 1.75, 2, 64, "multi"),
    (1.5, 2.0, 1, 4096, "multi"),
    (0.8, 1.75, 4, 4096, "multi"),
    # A loop long enough for the exponent cap (158 for base 1.75, 128 for 2):
    # 0.8 * 1.75^158 is finite in f32, 1.5 * 2^128 is not (the logit is -inf).
    (0.8, 1.75, 1, 4096, "default"),
    (1.5, 2.0, 1, 4096, "default"),
]


def history_texts():
    """The repetitive texts the histories are tokenized from, (name, text)."""
    rng = random.Random(38)
    words = ["the", "river", "ran", "past", "an", "old", "mill", "and", "a", "quiet",
             "town", "where", "nothing", "ever", "changed", "at", "all"]
    chunks = []
    phrase = "The river ran past the old mill and the quiet town."
    while len(chunks) < 900:
        if rng.random() < 0.3:
            chunks.append(phrase)
        else:
            chunks.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + ".")
        if rng.random() < 0.1:
            chunks.append("\n")
    return [
        ("repeated_phrase", "the cat sat on the mat. " * 6 + "the cat sat on the"),
        ("list_newlines_colons",
         "Name: Alice\nAge: 30\nCity: Paris\nName: Bob\nAge: 31\nCity: Paris\n"
         "Name: Alice\nAge: 30\nCity: Paris\nName: Alice\nAge: 30\nCity:"),
        ("quoted_dialogue",
         "\"I am fine,\" she said. \"How are you?\" he asked. \"I am fine,\" she said. "
         "*smiles* \"How are you?\" he asked. *smiles* \"I am fine,\" she said. \"How are"),
        # The end repeats "x = 1", which "\n" (a breaker) would extend.
        ("assignments", "x = 1\ny = 2\nx = 1\ny = 2\nx = 1"),
        ("markdown_sections",
         "### Step one\n\nMix the flour and the sugar.\n\n### Step two\n\n"
         "Mix the flour and the butter.\n\n### Step three\n\nMix the flour and the"),
        ("loop", "ha" + " ha" * 399),
        ("long_2000", " ".join(chunks)),
    ]


def load_vocab(model_path):
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise RuntimeError(f"cannot load the vocabulary of {model_path}")
    return model, llama_cpp.llama_model_get_vocab(model)


def tokenize(vocab, text):
    data = text.encode()
    ids = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), ids, len(ids), False, False)
    if n < 0:
        raise RuntimeError(f"tokenize failed: {n}")
    return list(ids[:n])


def piece(vocab, token):
    """A token's text as llama.cpp's DRY reads it (special tokens rendered)."""
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    if n < 0:
        raise RuntimeError(f"token {token}: piece longer than {len(buf)} bytes")
    return buf.raw[:n]


def read_row(path):
    with open(path, "rb") as f:
        data = f.read()
    return (ctypes.c_float * (len(data) // 4)).from_buffer_copy(data)


def apply_dry(vocab, row, history, setting):
    """The (id, new logit) pairs DRY changes, by id."""
    multiplier, base, allowed_length, last_n, breaker_set = setting
    breakers = [b.encode() for b in BREAKER_SETS[breaker_set]]
    array_of = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
    sampler = llama_cpp.llama_sampler_init_dry(
        vocab, multiplier, base, allowed_length, last_n, array_of, len(breakers))
    try:
        for token in history:
            llama_cpp.llama_sampler_accept(sampler, token)
        n = len(row)
        data = (llama_cpp.llama_token_data * n)()
        for i in range(n):
            data[i].id = i
            data[i].logit = row[i]
            data[i].p = 0.0
        array = llama_cpp.llama_token_data_array(
            data=ctypes.cast(data, ctypes.POINTER(llama_cpp.llama_token_data)),
            size=n, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        assert array.size == n
        changed = []
        for i in range(n):
            entry = array.data[i]
            if entry.logit != row[entry.id]:
                changed.append((entry.id, entry.logit))
    finally:
        llama_cpp.llama_sampler_free(sampler)
    changed.sort()
    return [[token, None if z == NEG_INF else z] for token, z in changed]


def write(args):
    llama_cpp.llama_backend_init()
    model, vocab = load_vocab(args.model)
    try:
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        pieces = [piece(vocab, token) for token in range(n_vocab)]
        row = read_row(args.row)
        assert len(row) == n_vocab, (len(row), n_vocab)
        histories = []
        for name, text in history_texts():
            ids = tokenize(vocab, text)
            if name == "long_2000":
                ids, text = ids[:2000], None
                assert len(ids) == 2000
            histories.append((name, text, ids))
        cases = []
        for name, _, ids in histories:
            for setting in SETTINGS:
                multiplier, base, allowed_length, last_n, breaker_set = setting
                changed = apply_dry(vocab, row, ids, setting)
                cases.append({
                    "history": name,
                    "multiplier": multiplier,
                    "base": base,
                    "allowed_length": allowed_length,
                    "penalty_last_n": last_n,
                    "breakers": breaker_set,
                    "n_changed": len(changed),
                    "changed": changed,
                })
        # The tokens whose own text holds a breaker: llama.cpp's text of each
        # token, for a check of the Rust side's detokenizer.
        containing = {
            name: [t for t, text in enumerate(pieces)
                   if any(b.encode() in text for b in breakers)]
            for name, breakers in BREAKER_SETS.items() if breakers
        }
    finally:
        llama_cpp.llama_model_free(model)
    write_json(os.path.join(args.out, "dry.json"), {
        "generator": {
            "script": "scripts/reference/dry_reference.py",
            "llama_cpp_python": llama_cpp.__version__,
        },
        "vocabulary": os.path.basename(args.model),
        "row": "fixtures/smollm2/" + os.path.basename(args.row),
        "breaker_sets": BREAKER_SETS,
        "breaker_tokens": containing,
        "histories": [{"name": name, "text": text, "ids": ids} for name, text, ids in histories],
        "cases": cases,
    })
