#!/usr/bin/env python3
"""Generate llama.cpp's tokenizer fixture for a SentencePiece (`llama`) vocabulary:
fixtures/gemma3/tokenize.json.

Run through `cargo xtask reference-fixtures` (which calls it with Gemma 3 270M
after the SmolLM2 fixtures), or by hand:

    python3 scripts/reference/tokenize_reference.py --model <gguf> --out fixtures/gemma3

Only the vocabulary is loaded (llama-cpp-python's `vocab_only=True`), so the
weights are never read. Each case holds llama.cpp's ids for the text with its
special tokens parsed (`parse_special`) and without the BOS token, the ids with
the BOS token the vocabulary asks for, and `llama_detokenize`'s text of the ids
(remove_special=False) with control tokens written out (`unparse_special`) and
left out. The same texts as the SmolLM2 fixture, plus cases that matter to
SentencePiece (leading spaces, tabs, byte fallback, Gemma's turn markers).

Gemma's vocabulary has `add_space_prefix = false`; Llama 2's style (true) is
covered by `with_add_space_prefix`: the same texts under a copy of the
vocabulary's metadata with only that key set to true (written with the `gguf`
package to a temporary vocabulary-only file).
Only llama.cpp's outputs are written, never any of its code.
"""

import argparse
import ctypes
import os
import sys
import tempfile

import gguf

import llama_cpp
from fixture_json import write_json
from llama_cpp_reference import LLAMA_CPP_PYTHON_VERSION, TOKENIZE_CASES, sha256_of_file

EXTRA_CASES = [
    ("single_space", " "),
    ("leading_and_trailing_spaces", "  two leading, three trailing   "),
    ("tabs_indentation", "if x:\n\tif y:\n\t\treturn 1\n\treturn 2\n"),
    ("double_newline", "First paragraph.\n\nSecond paragraph."),
    ("digits", "0123456789 9876543210 3.14 1,024"),
    ("rtl_mixed", "English then \u05e9\u05dc\u05d5\u05dd and \u0645\u0631\u062d\u0628\u0627 back"),
    ("rare_cjk_byte_fallback", "\U00020000\U0002a6d6 \u4e02\u9fa5"),
    ("control_characters", "bell\x07 escape\x1b null-free \x7f end"),
    ("gemma_turns", "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"),
    ("bos_in_text", "<bos>Hello"),
    ("eos_in_text", "Goodbye<eos>"),
    ("special_lookalike_gemma", "<start_of_turn is not special, nor is <end_of_turn >"),
    ("capital_of_france", "The capital of France is"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="path to gemma-3-270m-q4_k_m.gguf")
    parser.add_argument("--out", required=True, help="output folder, e.g. fixtures/gemma3")
    args = parser.parse_args()

    if llama_cpp.__version__ != LLAMA_CPP_PYTHON_VERSION:
        sys.exit(f"llama-cpp-python {llama_cpp.__version__} found, {LLAMA_CPP_PYTHON_VERSION} expected")
    os.makedirs(args.out, exist_ok=True)
    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    texts = TOKENIZE_CASES + EXTRA_CASES
    cases = [tokenize_case(llm, vocab, name, text) for name, text in texts]
    with tempfile.TemporaryDirectory() as tmp:
        prefixed_path = os.path.join(tmp, "space_prefix.gguf")
        write_metadata_copy(args.model, prefixed_path, {"tokenizer.ggml.add_space_prefix": True})
        prefixed = llama_cpp.Llama(model_path=prefixed_path, vocab_only=True, verbose=False)
        prefixed_cases = [
            tokenize_case(prefixed, prefixed._model.vocab, name, text) for name, text in texts
        ]
        prefixed.close()
    write_json(
        os.path.join(args.out, "tokenize.json"),
        {
            "model": {"file": os.path.basename(args.model), "sha256": sha256_of_file(args.model)},
            "generator": {"llama_cpp_python": llama_cpp.__version__, "vocab_only": True},
            "settings": {
                "ids": "add_special=False, parse_special=True",
                "ids_with_bos": "add_special=True, parse_special=True",
                "detokenized": "llama_detokenize(remove_special=False, unparse_special=True)",
                "detokenized_without_special": "llama_detokenize(remove_special=False, unparse_special=False)",
            },
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            "end_of_generation_ids": [
                token for token in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, token)
            ],
            "cases": cases,
            "with_add_space_prefix": {"cases": prefixed_cases},
        },
    )


def write_metadata_copy(source, destination, overrides):
    """A GGUF file with `source`'s metadata (no tensors), `overrides` (bool
    values) replacing keys."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(destination, arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name in overrides:
            writer.add_bool(name, overrides[name])
            continue
        value_type = field.types[0]
        if value_type == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, field.contents())
        elif value_type == gguf.GGUFValueType.STRING:
            writer.add_string(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), value_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tokenize_case(llm, vocab, name, text):
    data = text.encode("utf-8")
    ids = llm.tokenize(data, add_bos=False, special=True)
    return {
        "name": name,
        "text": text,
        "ids": ids,
        "ids_with_bos": llm.tokenize(data, add_bos=True, special=True),
        "detokenized": detokenize(vocab, ids, unparse_special=True),
        "detokenized_without_special": detokenize(vocab, ids, unparse_special=False),
    }


def detokenize(vocab, ids, unparse_special):
    """llama.cpp's own `llama_detokenize` (not llama-cpp-python's piece-by-piece
    join), decoded with U+FFFD for bytes that are not UTF-8."""
    tokens = (llama_cpp.llama_token * len(ids))(*ids)
    capacity = 16 * len(ids) + 16
    buffer = ctypes.create_string_buffer(capacity)
    n = llama_cpp.llama_detokenize(vocab, tokens, len(ids), buffer, capacity, False, unparse_special)
    if n < 0:
        sys.exit(f"detokenize needs {-n} bytes, more than {capacity}")
    return buffer.raw[:n].decode("utf-8", errors="replace")


if __name__ == "__main__":
    main()
