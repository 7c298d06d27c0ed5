#!/usr/bin/env python3
"""A small, independent byte-level BPE for SmolLM2's GGUF vocabulary.

It shares no code with the `tokenizers` crate: it reads the vocabulary with
the `gguf` package, splits special tokens the way llama.cpp does (longest
token first), splits the rest with llama.cpp's "smollm" regexes (every digit
alone, then GPT-2's regex; text no regex matches stays a piece), maps bytes
to GPT-2's printable characters and applies the merges by rank.

Usage (needs `pip install gguf regex`):

    python3 scripts/tokenize/reference_bpe.py MODEL.gguf \
        fixtures/tokenize/smollm2_prompts.json fixtures/tokenize/smollm2_reference_ids.json

The output maps each prompt to its ids; the Rust test
`crates/lm/tests/smollm2_tokenizer.rs` compares against it.
"""

import json
import sys

import gguf
import regex

EACH_DIGIT = r"\p{N}"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


def byte_to_char():
    """GPT-2's map from bytes to printable characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {}
    shift = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def read_field(reader, key):
    field = reader.fields[key]
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [int(field.parts[i][0]) for i in field.data]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


def split_isolated(pattern, pieces):
    """Each piece split into matches and the text between them (llama.cpp)."""
    out = []
    for piece in pieces:
        start = 0
        for match in regex.finditer(pattern, piece):
            if match.start() > start:
                out.append(piece[start:match.start()])
            if match.end() > match.start():
                out.append(match.group())
            start = match.end()
        if start < len(piece):
            out.append(piece[start:])
    return out


class ReferenceBpe:
    def __init__(self, tokens, token_types, merges):
        self.token_to_id = {t: i for i, t in enumerate(tokens)}
        self.ranks = {}
        for rank, merge in enumerate(merges):
            cut = merge.index(" ", 1)
            self.ranks[(merge[:cut], merge[cut + 1:])] = rank
        # Control (3), user-defined (4) and unknown (2) tokens, longest first.
        self.specials = sorted(
            (t for t, kind in zip(tokens, token_types) if kind in (2, 3, 4)),
            key=len,
            reverse=True,
        )
        self.byte_char = byte_to_char()

    def partition(self, text):
        """Text fragments (str) and special-token ids (int), in order."""
        fragments = [text]
        for special in self.specials:
            out = []
            for fragment in fragments:
                if isinstance(fragment, int):
                    out.append(fragment)
                    continue
                parts = fragment.split(special)
                for i, part in enumerate(parts):
                    if i > 0:
                        out.append(self.token_to_id[special])
                    if part:
                        out.append(part)
            fragments = out
        return fragments

    def bpe(self, word):
        symbols = [self.byte_char[b] for b in word.encode("utf-8")]
        while len(symbols) > 1:
            best = None
            for i in range(len(symbols) - 1):
                rank = self.ranks.get((symbols[i], symbols[i + 1]))
                if rank is not None and (best is None or rank < best[0]):
                    best = (rank, i)
            if best is None:
                break
            i = best[1]
            symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
        return [self.token_to_id[s] for s in symbols]

    def encode(self, text):
        ids = []
        for fragment in self.partition(text):
            if isinstance(fragment, int):
                ids.append(fragment)
                continue
            for word in split_isolated(GPT2, split_isolated(EACH_DIGIT, [fragment])):
                ids.extend(self.bpe(word))
        return ids


def main():
    model_path, prompts_path, out_path = sys.argv[1:4]
    reader = gguf.GGUFReader(model_path)
    assert read_field(reader, "tokenizer.ggml.model") == "gpt2"
    assert read_field(reader, "tokenizer.ggml.pre") == "smollm"
    tokenizer = ReferenceBpe(
        read_field(reader, "tokenizer.ggml.tokens"),
        read_field(reader, "tokenizer.ggml.token_type"),
        read_field(reader, "tokenizer.ggml.merges"),
    )
    with open(prompts_path, encoding="utf-8") as f:
        prompts = json.load(f)
    cases = [{"text": text, "ids": tokenizer.encode(text)} for text in prompts]
    with open(out_path, "w", encoding="utf-8") as f:
        lines = (json.dumps(case, ensure_ascii=False) for case in cases)
        f.write("[\n" + ",\n".join(lines) + "\n]\n")


if __name__ == "__main__":
    main()
