#!/usr/bin/env python3
"""Scores sentences with KenLM's own query code (the `kenlm` PyPI package,
`pip install kenlm`), to check the Rust scorer against it.

Usage: kenlm_query_reference.py MODEL.arpa SENTENCES.txt OUT.tsv

For each sentence (one per line, words split on white space), and for the
three flag settings (bos, eos) = (1, 1), (0, 1), (1, 0), writes one line:
  bos <TAB> eos <TAB> sentence <TAB> total log10 <TAB> per-token log10 probs
  <TAB> per-token n-gram lengths <TAB> per-token oov flags (0/1)
Per-token lists are space-separated; `</s>` is the last token when eos = 1.
"""
import sys

import kenlm


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    model = kenlm.Model(argv[1])
    with open(argv[2], encoding="utf-8") as sentences, open(argv[3], "w", encoding="utf-8") as out:
        for sentence in sentences:
            sentence = sentence.strip()
            for bos, eos in ((True, True), (False, True), (True, False)):
                scores = list(model.full_scores(sentence, bos=bos, eos=eos))
                total = model.score(sentence, bos=bos, eos=eos)
                probs = " ".join(repr(p) for p, _, _ in scores)
                lengths = " ".join(str(n) for _, n, _ in scores)
                oovs = " ".join(str(int(o)) for _, _, o in scores)
                out.write(f"{int(bos)}\t{int(eos)}\t{sentence}\t{total!r}\t{probs}\t{lengths}\t{oovs}\n")


if __name__ == "__main__":
    main(sys.argv)
