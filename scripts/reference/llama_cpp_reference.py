#!/usr/bin/env python3
"""Generate the llama.cpp conformance fixtures.

Run through `cargo xtask reference-fixtures`, which provides a Python with
llama-cpp-python at the pinned version and the model files. By hand:

    python3 scripts/reference/llama_cpp_reference.py --model <gguf> --out fixtures/smollm2
    python3 scripts/reference/llama_cpp_reference.py --model <gguf> --out fixtures/smollm2-requant \
        --conformance smollm2 --name q4_k_m
    python3 scripts/reference/llama_cpp_reference.py --model <gguf> --out fixtures/gemma3 \
        --conformance gemma3 --name conformance

The first form writes tokenize.json, greedy.json and <case>.last_logits.f32le.bin for
SmolLM2 Q4_1 (format in fixtures/smollm2/README.md). The `--conformance` form
writes <name>.json and <name>.<case>.last_logits.f16le.bin, one model's prompts,
greedy runs and logits (format in fixtures/smollm2-requant/README.md), with the
prompts of that model family. The script only reads the local model file; it opens
no network connection. Only llama.cpp's outputs are written, never any of its code.
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np

import llama_cpp
from fixture_json import write_json, write_logits, write_logits_f16

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
N_CTX = 512
N_THREADS = 1
GREEDY_MAX_NEW_TOKENS = 32
N_TOP_LOGITS = 10
N_STEPS_WITH_TOP_LOGITS = 4
LOGITS_FILE_SUFFIX = ".last_logits.f32le.bin"

# Tokenizer cases: (name, text). Tokenized with add_bos=False, special=True.
TOKENIZE_CASES = [
    ("empty", ""),
    ("plain_english", "The quick brown fox jumps over the lazy dog."),
    ("punctuation", "Hello, world! How's it going? I'm fine\u2014thanks (really)."),
    ("contractions", "I'm, you're, he's, they've, we'd, it'll, don't, CAN'T, O'Neil's"),
    ("leading_space", " Hello"),
    ("leading_spaces", "   Hello world"),
    ("trailing_newline", "Hello\n"),
    ("accents", "Caf\u00e9 cr\u00e8me, na\u00efve fa\u00e7ade, S\u00e3o Paulo, Z\u00fcrich, \u00c5ngstr\u00f6m."),
    ("accents_decomposed", "Cafe\u0301 and nai\u0308ve written with combining marks"),
    ("cjk", "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4 \ubb38\uc7a5."),
    ("other_scripts", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac, \u0440\u0443\u0441\u0441\u043a\u0438\u0439, \u0627\u0644\u0639\u0631\u0628\u064a\u0629, \u05e2\u05d1\u05e8\u05d9\u05ea, \u0939\u093f\u0928\u094d\u0926\u0940"),
    ("emoji", "I love pizza \U0001f355 and rockets \U0001f680!"),
    (
        "zwj_emoji",
        "Family: \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466, "
        "rainbow flag: \U0001f3f3\ufe0f\u200d\U0001f308, thumbs: \U0001f44d\U0001f3fd",
    ),
    ("spaces_tabs_newlines", "a  b   c    d\t\te\n\nf\r\n  \n\t end   "),
    ("only_whitespace", "   \n\n\t "),
    ("many_spaces", "x" + " " * 17 + "y"),
    ("many_newlines", "end of paragraph.\n\n\n\nNext"),
    (
        "python_code",
        'def add(a, b):\n    """Return the sum."""\n    return a + b\n\n\nprint(add(2, 3))\n',
    ),
    (
        "rust_code",
        "fn main() {\n    let v: Vec<u32> = (1..=10).collect();\n"
        '    println!("{:?}", v.iter().sum::<u32>());\n}\n',
    ),
    (
        "numbers",
        "pi is 3.14159, e is 2.71828, and 1234567 + 89 = 1234656; year 2024, -42, 1e-5, 0x1F, 1,000,000.",
    ),
    ("url", "https://example.com/path/to?query=1&x=y#frag"),
    ("repeated_characters", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!????....----"),
    ("long_words", "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis"),
    ("special_chat_turn", "<|im_start|>user\nHi<|im_end|>"),
    ("special_end_of_text", "first document<|endoftext|>second document"),
    ("special_adjacent", "<|im_end|><|im_start|>assistant"),
    ("special_lookalike", "<|im_start| is not a special token, nor is <im_start>"),
]

# Greedy cases: (name, prompt, store last logits). The chat prompt is rendered
# from the GGUF chat template below.
CHAT_CASE = "chat_capital_of_france"
CHAT_QUESTION = "What is the capital of France?"
# What the GGUF's chat template renders for CHAT_QUESTION (checked at run time).
EXPECTED_CHAT_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
LONG_PROMPT = (
    "The history of computing is a story of people trying to make machines do "
    "arithmetic faster than humans could. In the seventeenth century, Blaise Pascal "
    "built a mechanical calculator that could add and subtract, and Gottfried Leibniz "
    "improved it so that it could also multiply. Two centuries later, Charles Babbage "
    "designed the Analytical Engine, a general purpose machine driven by punched "
    "cards, and Ada Lovelace wrote what many consider the first computer program for "
    "it. The machine was never finished, but its ideas returned in the twentieth "
    "century, when electronic computers were built during the Second World War. "
    "Today, a single phone holds more computing power than"
)
GREEDY_CASES = [
    ("capital_of_france", "The capital of France is", True),
    (CHAT_CASE, None, True),
    ("python_function", "def fibonacci(n):\n", False),
    ("prime_numbers", "The first ten prime numbers are 2, 3, 5,", False),
    ("history_of_computing", LONG_PROMPT, True),
]
# The cases used to measure llama.cpp's own variation (flash attention, KV cache
# precision, threads).
VARIATION_CASES = ["capital_of_france", CHAT_CASE]
# (flash_attn, kv_cache_type, n_threads) of each variant; the baseline is the fixture
# setting (False, "f16", N_THREADS).
VARIANTS = [(True, "f16", N_THREADS), (False, "f32", N_THREADS), (False, "f16", 2)]
GGML_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--out", required=True, help="output folder, e.g. fixtures/smollm2")
    parser.add_argument(
        "--conformance",
        choices=sorted(CONFORMANCE_FAMILIES),
        help="write one conformance fixture with this model family's prompts instead",
    )
    parser.add_argument("--name", help="the conformance fixture's file stem, e.g. q4_k_m")
    parser.add_argument(
        "--kv-type",
        choices=["f16", "q8_0"],
        default="f16",
        help="the conformance form's KV cache type (q8_0 runs with flash attention, which a "
        "quantized V cache needs in llama.cpp), e.g. --name kv_q8_0 --kv-type q8_0",
    )
    args = parser.parse_args()

    if llama_cpp.__version__ != LLAMA_CPP_PYTHON_VERSION:
        sys.exit(f"llama-cpp-python {llama_cpp.__version__} found, {LLAMA_CPP_PYTHON_VERSION} expected")
    if args.conformance:
        if not args.name:
            sys.exit("--conformance needs --name")
        write_conformance(args.model, args.out, args.conformance, args.name, args.kv_type)
        return
    os.makedirs(args.out, exist_ok=True)
    model_info = {
        "file": os.path.basename(args.model),
        "sha256": sha256_of_file(args.model),
    }
    llm = load(args.model, flash_attn=False, n_threads=N_THREADS)
    generator = {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8").strip(),
    }

    tokenize_cases = [tokenize_case(llm, name, text) for name, text in TOKENIZE_CASES]
    write_json(
        os.path.join(args.out, "tokenize.json"),
        {
            "model": model_info,
            "generator": generator,
            "settings": {"add_bos": False, "parse_special": True},
            "cases": tokenize_cases,
        },
    )

    chat_template = llm.metadata["tokenizer.chat_template"]
    chat_prompt = render_chat(chat_template, CHAT_QUESTION)
    if chat_prompt != EXPECTED_CHAT_PROMPT:
        sys.exit(f"the chat template rendered {chat_prompt!r}, expected {EXPECTED_CHAT_PROMPT!r}")
    greedy_cases = []
    for name, prompt, keep_logits in GREEDY_CASES:
        if prompt is None:
            prompt = chat_prompt
        case, last_logits = greedy_case(llm, name, prompt)
        if keep_logits:
            case["last_logits"] = write_logits(args.out, name + LOGITS_FILE_SUFFIX, last_logits)
        else:
            case["last_logits"] = None
        greedy_cases.append(case)
        print(f"{name}: {len(case['prompt_ids'])} prompt tokens -> {case['continuation_text']!r}", file=sys.stderr)

    variation = [
        measure_variation(args.model, llm, case["name"], case["prompt"])
        for case in greedy_cases
        if case["name"] in VARIATION_CASES
    ]
    write_json(
        os.path.join(args.out, "greedy.json"),
        {
            "model": model_info,
            "generator": generator,
            "settings": {
                "n_ctx": N_CTX,
                "n_batch": N_CTX,
                "n_threads": N_THREADS,
                "n_threads_batch": N_THREADS,
                "flash_attn": False,
                "kv_cache_type": "f16",
                "logits_all": True,
                "add_bos": False,
                "parse_special": True,
                "max_new_tokens": GREEDY_MAX_NEW_TOKENS,
                "end_of_generation_ids": end_of_generation_ids(llm),
            },
            "chat_template": {
                "question": CHAT_QUESTION,
                "rendered": chat_prompt,
                "template": chat_template,
            },
            "cases": greedy_cases,
            "variation": variation,
        },
    )


def load(model_path, flash_attn, n_threads, kv_cache_type="f16", logits_all=True, n_ctx=N_CTX, batch=None):
    """A llama.cpp context with the fixture settings (llama_cpp_bench.py measures
    with them too, keeping only the last logits row, with a longer context for
    its long prompts, still read in batches of at most N_CTX tokens). `batch` is
    (n_batch, n_ubatch) when they are not that."""
    n_batch, n_ubatch = batch or (min(n_ctx, N_CTX),) * 2
    return llama_cpp.Llama(
        model_path=model_path,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        n_gpu_layers=0,
        flash_attn=flash_attn,
        type_k=GGML_TYPES[kv_cache_type],
        type_v=GGML_TYPES[kv_cache_type],
        logits_all=logits_all,
        seed=0,
        verbose=False,
    )


def tokenize_case(llm, name, text):
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    detokenized = llm.detokenize(ids, special=True).decode("utf-8")
    detokenized_plain = llm.detokenize(ids, special=False).decode("utf-8")
    return {
        "name": name,
        "text": text,
        "ids": ids,
        "detokenized": detokenized,
        "detokenized_without_special": detokenized_plain,
    }


def render_chat(template, question):
    """The prompt for one user question, with the template's default system message."""
    import jinja2

    environment = jinja2.Environment(loader=jinja2.BaseLoader())
    rendered = environment.from_string(template).render(
        messages=[{"role": "user", "content": question}],
        add_generation_prompt=True,
    )
    return rendered


def end_of_generation_ids(llm):
    return [token for token in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token)]


def greedy_from(llm, logits, max_new_tokens, next_logits, on_step):
    """Greedy decoding from `logits` until an end-of-generation token or
    `max_new_tokens`: `on_step(step, order, logits)` sees each step's logits
    and their order before its token is appended; each token but the last is
    fed back, and `next_logits()` reads the row that follows. Returns the
    continuation, the top-1 minus top-2 gaps and the stop reason."""
    eog = set(end_of_generation_ids(llm))
    continuation, gaps = [], []
    stop_reason = "max_new_tokens"
    for step in range(max_new_tokens):
        order = np.argsort(-logits, kind="stable")
        chosen = int(order[0])
        gaps.append(short_float(logits[order[0]] - logits[order[1]]))
        on_step(step, order, logits)
        continuation.append(chosen)
        if chosen in eog:
            stop_reason = "end_of_generation"
            break
        if step + 1 < max_new_tokens:
            llm.eval([chosen])
            logits = next_logits()
    return continuation, gaps, stop_reason


def logprob(row, token):
    """The log-probability of `token` under the f64 logits `row`, to 6 decimals."""
    log_normalizer = row.max() + np.log(np.exp(row - row.max()).sum())
    return round(float(row[token] - log_normalizer), 6)


def run_fields(llm, name, prompt, prompt_ids, run):
    """The fields every greedy case starts with; `run` is what `greedy_from` returned."""
    continuation, gaps, stop_reason = run
    return {
        "name": name,
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "continuation_ids": continuation,
        "continuation_text": llm.detokenize(continuation, special=True).decode("utf-8", errors="replace"),
        "stop_reason": stop_reason,
        "top1_minus_top2": gaps,
    }


def greedy_case(llm, name, prompt):
    """Greedy decoding with llama.cpp; the logits at each step come from `llm.scores`."""
    prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    llm.reset()
    llm.eval(prompt_ids)
    prompt_rows = np.array(llm.scores[: len(prompt_ids)], dtype=np.float32)
    last_logits = prompt_rows[-1].copy()

    top_logits = []

    def on_step(step, order, logits):
        if step < N_STEPS_WITH_TOP_LOGITS:
            top_logits.append([[int(i), short_float(logits[i])] for i in order[:N_TOP_LOGITS]])

    def next_logits():
        return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)

    run = greedy_from(llm, last_logits, GREEDY_MAX_NEW_TOKENS, next_logits, on_step)

    # Teacher-forced rows over the prompt: the argmax at every position and the
    # log-probability (computed in f64 from the f32 logits) of the next prompt token.
    argmax_ids = [int(i) for i in prompt_rows.argmax(axis=1)]
    next_token_logprobs = [
        logprob(prompt_rows[position].astype(np.float64), prompt_ids[position + 1])
        for position in range(len(prompt_ids) - 1)
    ]
    case = {
        **run_fields(llm, name, prompt, prompt_ids, run),
        "top_logits": top_logits,
        "prompt_rows": {
            "argmax_ids": argmax_ids,
            "next_token_logprobs": next_token_logprobs,
        },
    }
    return case, last_logits


def last_logits_of(llm, prompt):
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[len(ids) - 1], dtype=np.float32)


def greedy_ids(llm, prompt):
    case, _ = greedy_case(llm, "variation", prompt)
    return case["continuation_ids"]


def measure_variation(model_path, reference_llm, name, prompt):
    """How much llama.cpp's own logits move when only flash attention, the KV cache
    precision or the thread count changes (same build, same machine)."""
    reference = last_logits_of(reference_llm, prompt)
    reference_greedy = greedy_ids(reference_llm, prompt)
    results = {
        "case": name,
        "baseline": {"flash_attn": False, "kv_cache_type": "f16", "n_threads": N_THREADS},
        "variants": [],
    }
    for flash_attn, kv_cache_type, n_threads in VARIANTS:
        llm = load(model_path, flash_attn=flash_attn, n_threads=n_threads, kv_cache_type=kv_cache_type)
        logits = last_logits_of(llm, prompt)
        greedy = greedy_ids(llm, prompt)
        first_difference = next(
            (i for i, (a, b) in enumerate(zip(reference_greedy, greedy)) if a != b),
            None,
        )
        results["variants"].append(
            {
                "flash_attn": flash_attn,
                "kv_cache_type": kv_cache_type,
                "n_threads": n_threads,
                "max_abs_last_logit_difference": short_float(np.abs(logits - reference).max()),
                "same_argmax": bool(logits.argmax() == reference.argmax()),
                "same_greedy_continuation": greedy == reference_greedy,
                "first_differing_step": first_difference,
            }
        )
        llm.close()
    return results


def short_float(value):
    """The shortest decimal that reads back as the same f32."""
    return float(str(np.float32(value)))


def sha256_of_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------
# Conformance fixtures: one per model file, the same format for every model.

CONFORMANCE_N_CTX = 1024
CONFORMANCE_MAX_NEW_TOKENS = 32
CONFORMANCE_N_TOP_LOGITS = 10
CONFORMANCE_LOGITS_SUFFIX = ".last_logits.f16le.bin"
# A prompt longer than 512 tokens with both vocabularies: Gemma 3's sliding window
# is 512 positions, so its last rows see only part of the prompt in the local layers.
LONG_DOCUMENT = "\n\n".join(
    [
        LONG_PROMPT.rsplit(" Today,", 1)[0],
        "The first electronic machines filled whole rooms. They used thousands of vacuum "
        "tubes, which burned out often, and engineers walked the aisles with baskets of "
        "spare tubes. Programs were entered by setting switches and plugging cables, and a "
        "change that takes seconds today could take a team of people several days. Memory "
        "was tiny and expensive: delay lines of mercury, rotating drums, and later small "
        "rings of magnetic ferrite threaded by hand onto grids of wire.",
        "The transistor, invented in 1947 at Bell Laboratories, changed everything. It was "
        "smaller, cooler and far more reliable than the tube. In the late 1950s, Jack Kilby "
        "and Robert Noyce each found ways to put several transistors on one piece of "
        "semiconductor, the integrated circuit. Gordon Moore observed in 1965 that the "
        "number of components on a chip was doubling about every year, a pace he later "
        "revised to every two years, and the industry treated the observation as a goal.",
        "Software grew up alongside the hardware. Grace Hopper built one of the first "
        "compilers, and languages such as FORTRAN, COBOL and Lisp let people write "
        "programs in terms closer to their problems than to the machine. Operating systems "
        "appeared to share one expensive computer among many users. In 1969, Ken Thompson "
        "and Dennis Ritchie began the work that became Unix, and the C language followed "
        "a few years later; both are still in wide use more than fifty years on.",
        "Personal computers arrived in the 1970s as kits for hobbyists, and by the early "
        "1980s they were sold in department stores. Spreadsheets gave businesses a reason "
        "to buy them, and word processors replaced typewriters in most offices. Networks "
        "connected the machines, first inside universities and companies, then across the "
        "world: the Internet grew out of a research network funded by the United States "
        "government, and the World Wide Web, proposed by Tim Berners-Lee in 1989, made it "
        "easy to publish and link documents.",
        "Each generation of machines made the previous one look slow. Phones now carry "
        "processors with billions of transistors, cameras, radios and sensors, and they "
        "run programs written by millions of developers around the world. Much of the "
        "progress came from steady improvements rather than single breakthroughs: better "
        "materials, finer manufacturing, cleverer circuits, and compilers that squeeze more "
        "work out of every cycle. Looking back over this long history, the most important "
        "lesson is that",
    ]
)
UNICODE_PROMPT = (
    "Caf\u00e9 cr\u00e8me, na\u00efve fa\u00e7ade, Z\u00fcrich \u2014 "
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, \u0440\u0443\u0441\u0441\u043a\u0438\u0439, "
    "\U0001f355\U0001f680 \u2192 In English, these words mean"
)
CODE_PROMPT = (
    "fn fibonacci(n: u64) -> u64 {\n    match n {\n        0 => 0,\n        1 => 1,\n"
)
# family -> (cases, chat prompt builder). A case is (name, prompt or None for the
# chat case, store last logits).
CONFORMANCE_FAMILIES = {
    "smollm2": "chat template of the GGUF file (<|im_start|>, <|im_end|>)",
    "gemma3": "Gemma's turn markers (<start_of_turn>, <end_of_turn>); the file has no template",
}
GEMMA_CHAT_PROMPT = (
    "<start_of_turn>user\nWhat is the capital of France? Answer in one sentence.<end_of_turn>\n"
    "<start_of_turn>model\n"
)


def conformance_cases(family, llm):
    if family == "smollm2":
        chat = render_chat(llm.metadata["tokenizer.chat_template"], CHAT_QUESTION)
        if chat != EXPECTED_CHAT_PROMPT:
            sys.exit(f"the chat template rendered {chat!r}, expected {EXPECTED_CHAT_PROMPT!r}")
    else:
        chat = GEMMA_CHAT_PROMPT
    return [
        ("capital_of_france", "The capital of France is", False),
        ("chat", chat, True),
        ("unicode", UNICODE_PROMPT, False),
        ("code", CODE_PROMPT, False),
        ("long_document", LONG_DOCUMENT, True),
    ]


def write_conformance(model_path, out_dir, family, name, kv_type="f16"):
    """One model's conformance fixture: for each prompt, llama.cpp's ids (with the
    model's own BOS rule), a greedy run with each step's top-1/top-2 gap and the
    chosen token's log-probability, and for two prompts the last logits row as f16.
    With a KV cache type other than f16, flash attention is on (llama.cpp quantizes
    V only with it)."""
    os.makedirs(out_dir, exist_ok=True)
    flash_attn = kv_type != "f16"
    llm = load_conformance(model_path, flash_attn=flash_attn, kv_cache_type=kv_type)
    cases = []
    for case_name, prompt, keep_logits in conformance_cases(family, llm):
        case, last_logits = conformance_case(llm, case_name, prompt)
        if keep_logits:
            case["last_logits"] = write_logits_f16(
                out_dir, f"{name}.{case_name}{CONFORMANCE_LOGITS_SUFFIX}", last_logits
            )
        else:
            case["last_logits"] = None
        cases.append(case)
        print(
            f"{name}/{case_name}: {len(case['prompt_ids'])} prompt tokens -> {case['continuation_text']!r}",
            file=sys.stderr,
        )
    long_ids = next(case["prompt_ids"] for case in cases if case["name"] == "long_document")
    if len(long_ids) <= 512:
        sys.exit(f"long_document has {len(long_ids)} tokens; it must be longer than 512")
    write_json(
        os.path.join(out_dir, f"{name}.json"),
        {
            "model": {"file": os.path.basename(model_path), "sha256": sha256_of_file(model_path)},
            "generator": {
                "llama_cpp_python": llama_cpp.__version__,
                "system_info": llama_cpp.llama_print_system_info().decode("utf-8").strip(),
            },
            "settings": {
                "n_ctx": CONFORMANCE_N_CTX,
                "n_batch": CONFORMANCE_N_CTX,
                "n_threads": N_THREADS,
                "flash_attn": flash_attn,
                "kv_cache_type": kv_type,
                "add_special": True,
                "add_bos": bool(llm._model.add_bos_token()),
                "parse_special": True,
                "max_new_tokens": CONFORMANCE_MAX_NEW_TOKENS,
                "end_of_generation_ids": end_of_generation_ids(llm),
                "special_tokens": CONFORMANCE_FAMILIES[family],
            },
            "cases": cases,
        },
    )


def load_conformance(model_path, n_ubatch=None, flash_attn=False, kv_cache_type="f16"):
    """A llama.cpp context with the conformance fixtures' settings (the prompt in one
    batch of up to CONFORMANCE_N_CTX tokens, one thread, an F16 KV cache, no flash
    attention, only the last row kept); llama_cpp_envelope.py varies the micro-batch,
    flash attention and the cache."""
    return load(
        model_path,
        flash_attn,
        N_THREADS,
        kv_cache_type,
        logits_all=False,
        n_ctx=CONFORMANCE_N_CTX,
        batch=(CONFORMANCE_N_CTX, n_ubatch or CONFORMANCE_N_CTX),
    )


def conformance_case(llm, name, prompt):
    """Greedy decoding from llama.cpp's last logits row, read after each eval."""
    n_vocab = llm.n_vocab()
    # add_bos=True is llama.cpp's add_special: BOS only when the vocabulary asks for it.
    prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)

    def last_row():
        pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(n_vocab,)).astype(np.float32).copy()

    llm.reset()
    llm.eval(prompt_ids)
    last_logits = last_row()
    chosen_logprobs = []
    top_logits = None

    def on_step(step, order, logits):
        nonlocal top_logits
        chosen_logprobs.append(logprob(logits.astype(np.float64), int(order[0])))
        if step == 0:
            top_logits = [[int(i), short_float(logits[i])] for i in order[:CONFORMANCE_N_TOP_LOGITS]]

    run = greedy_from(llm, last_logits, CONFORMANCE_MAX_NEW_TOKENS, last_row, on_step)
    case = {
        **run_fields(llm, name, prompt, prompt_ids, run),
        "chosen_logprobs": chosen_logprobs,
        "top_logits": top_logits,
    }
    return case, last_logits


if __name__ == "__main__":
    main()
