#!/usr/bin/env python3
"""Independent reference for interpolated modified Kneser-Ney as KenLM's lmplz
estimates it, written from lmplz's documented algorithm (lm/builder:
corpus_count, adjust_counts, initial_probabilities, interpolate) and not from
the Rust code it checks.

It follows lmplz's own route, which differs from the Rust trainer's:
  1. Pad every sentence with order-1 <s> and count only full order-n n-grams.
  2. Derive every lower order from those: n-grams that start with <s> keep
     the count of the one full n-gram they end; every other lower n-gram gets
     the number of distinct one-word-longer suffixes of full n-grams that end
     in it (N1+(. x)). Full n-grams with <s> past their first word are
     padding, not n-grams. a(<s>) = a(<unk>) = 0.
  3. Discounts per order from the count-of-counts of adjusted counts:
     Y = n1/(n1+2 n2), D_k = k - (k+1) Y n_{k+1}/n_k (k = 1, 2, 3+).
  4. u(w|c) = (a(cw) - D(a(cw))) / sum_w a(cw);
     gamma(c) = (D1 N1(c.) + D2 N2(c.) + D3 N3+(c.)) / sum_w a(cw).
  5. p(w) = u(w) + gamma() / |V| (|V| counts <unk> and </s>, not <s>);
     p(<s>) = 1; p(w|c) = u(w|c) + gamma(c) p(w|c[1:]).
  6. ARPA: log10 p (capped at 0), log10 gamma as backoff for n-grams that are
     contexts, 0 for the others; no backoff at the top order.

Words are split on white space (the committed corpus is pre-tokenised, so
this equals the Rust splitter); blank lines are skipped.

Usage: kneser_ney_reference.py CORPUS ORDER OUT.arpa [--discount-fallback]
Numbers are written as the shortest decimal that round-trips through a
32-bit float, in positional notation (lmplz and Rust's f32 Display agree).
"""
import math
import sys
from collections import defaultdict

import numpy as np

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
FALLBACK = (0.5, 1.0, 1.5)


def fmt(value):
    return np.format_float_positional(np.float32(value), unique=True, trim="-")


def read_sentences(path):
    with open(path, encoding="utf-8") as corpus:
        for line in corpus:
            words = [w for w in line.split() if w not in (BOS, EOS, UNK)]
            if words:
                yield words


def full_counts(sentences, order):
    counts = defaultdict(int)
    first_seen = {}
    for words in sentences:
        for w in words + [EOS]:
            first_seen.setdefault(w, len(first_seen))
        padded = [BOS] * (order - 1) + words + [EOS]
        for end in range(order - 1, len(padded)):
            counts[tuple(padded[end - order + 1 : end + 1])] += 1
    return counts, first_seen


def adjusted_counts(full, order):
    """adjusted[m][ngram] for m = 1..order."""
    adjusted = {m: {} for m in range(1, order + 1)}
    extensions = {m: defaultdict(set) for m in range(1, order)}
    for gram, count in full.items():
        bos_inside = [i for i in range(1, order) if gram[i] == BOS]
        if not bos_inside:
            adjusted[order][gram] = count
            start = 0
        else:
            start = bos_inside[-1]
            suffix = gram[start:]
            adjusted[len(suffix)][suffix] = adjusted[len(suffix)].get(suffix, 0) + count
        # Every suffix longer than one word and not starting past the last <s>
        # is an extension of its own suffix.
        for i in range(start, order - 1):
            longer = gram[i:]
            shorter = gram[i + 1 :]
            extensions[len(shorter)][shorter].add(longer[0])
    for m in range(1, order):
        for gram, left_words in extensions[m].items():
            if gram[0] == BOS:
                continue  # keeps its raw count, set above
            adjusted[m][gram] = len(left_words)
    adjusted[1][(BOS,)] = 0
    adjusted[1][(UNK,)] = 0
    return adjusted


def discounts(adjusted, order, fallback):
    result = {}
    for m in range(1, order + 1):
        n = [0] * 5
        for a in adjusted[m].values():
            if a < 5:
                n[a] += 1
        try:
            if 0 in n[1:4]:
                raise ValueError(f"order {m}: count-of-counts {n[1:4]} has a zero")
            y = n[1] / (n[1] + 2 * n[2])
            d = [k - (k + 1) * y * n[k + 1] / n[k] for k in (1, 2, 3)]
            if any(not (0 <= d[k - 1] <= k) for k in (1, 2, 3)):
                raise ValueError(f"order {m}: discounts {d} out of range")
        except ValueError:
            if not fallback:
                raise
            d = list(FALLBACK)
        result[m] = d
    return result


def discount_for(d, a):
    return 0.0 if a == 0 else d[min(a, 3) - 1]


def estimate(adjusted, order, disc):
    probs, gammas = {}, {}
    vocab_size = len(adjusted[1]) - 1  # without <s>
    for m in range(1, order + 1):
        totals, discounted = defaultdict(float), defaultdict(float)
        for gram, a in adjusted[m].items():
            totals[gram[:-1]] += a
            discounted[gram[:-1]] += discount_for(disc[m], a)
        gamma = {c: discounted[c] / totals[c] for c in totals}
        gammas.update(gamma)
        for gram, a in adjusted[m].items():
            context = gram[:-1]
            own = (a - discount_for(disc[m], a)) / totals[context]
            lower = 1.0 / vocab_size if m == 1 else probs[gram[1:]]
            probs[gram] = own + gamma[context] * lower
    probs[(BOS,)] = 1.0
    return probs, gammas


def write_arpa(path, adjusted, order, probs, gammas, first_seen):
    contexts = {gram[:-1] for m in range(2, order + 1) for gram in adjusted[m]}
    rank = {UNK: 0, BOS: 1, EOS: 2}
    for w in first_seen:
        rank.setdefault(w, len(rank))
    with open(path, "w", encoding="utf-8") as out:
        out.write("\\data\\\n")
        for m in range(1, order + 1):
            out.write(f"ngram {m}={len(adjusted[m])}\n")
        for m in range(1, order + 1):
            out.write(f"\n\\{m}-grams:\n")
            for gram in sorted(adjusted[m], key=lambda g: [rank[w] for w in g]):
                line = f"{fmt(min(0.0, math.log10(probs[gram])))}\t{' '.join(gram)}"
                if m < order:
                    backoff = math.log10(gammas[gram]) if gram in contexts else 0.0
                    line += f"\t{fmt(backoff)}"
                out.write(line + "\n")
        out.write("\n\\end\\\n")


def main(argv):
    if len(argv) not in (4, 5):
        sys.exit(__doc__)
    corpus, order, out = argv[1], int(argv[2]), argv[3]
    fallback = len(argv) == 5 and argv[4] == "--discount-fallback"
    full, first_seen = full_counts(list(read_sentences(corpus)), order)
    adjusted = adjusted_counts(full, order)
    disc = discounts(adjusted, order, fallback)
    for m in range(1, order + 1):
        print(f"order {m}: D1={disc[m][0]:.6f} D2={disc[m][1]:.6f} D3+={disc[m][2]:.6f}", file=sys.stderr)
    probs, gammas = estimate(adjusted, order, disc)
    write_arpa(out, adjusted, order, probs, gammas, first_seen)


if __name__ == "__main__":
    main(sys.argv)
