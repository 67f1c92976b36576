"""Reference implementations the curation code is tested against, shared by the tests and the
curation benchmark (``benchmarks/curation_bench.py``): plain Python written for clarity, not
speed, and a way to plant near-duplicates whose ground truth is known."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter

from lance_assets.curation import quality_signals as quality


def _repeats(items):
    seen, n, chars = set(), 0, 0
    for x in items:
        if x in seen:
            n, chars = n + 1, chars + len(x)
        else:
            seen.add(x)
    return n, chars


def reference_signals(text: str) -> dict:
    """The quality signals of one document in plain Python, written for clarity, not speed:
    the definition the vectorised ``quality.compute_signals`` is tested against, and its
    baseline here."""
    words = [t.strip(quality.PUNCTUATION) for t in text.split()]
    words = [w for w in words if w]
    nw = len(words)
    lower = [w.lower() for w in words]
    lines = text.split("\n")
    non_empty = [ln for ln in lines if ln.strip()]
    paras = re.split(r"\n{2,}", text.strip())
    dl, dlc = _repeats(non_empty)
    dp, dpc = _repeats(paras)

    def div(a, b):
        return a / b if b else 0.0

    out = {
        "word_count": nw,
        "mean_word_length": div(sum(map(len, words)), nw),
        "symbol_word_ratio": div(max(text.count("#"), text.count("...") + text.count("…")), nw),
        "alpha_word_share": div(sum(any(c.isalpha() for c in w) for w in words), nw),
        "stop_word_count": sum(w in quality.STOP_WORDS for w in lower),
        "bullet_line_share": div(sum(bool(re.match(r"\s*[•‣◦▪●○■□\-*]", ln)) for ln in lines),
                                 len(lines)),
        "ellipsis_line_share": div(sum(ln.rstrip().endswith(("...", "…")) for ln in lines), len(lines)),
        "terminal_punct_line_share": div(sum(ln.endswith((".", "'", '"', "!", "?")) for ln in lines),
                                         len(lines)),
        "short_line_share": div(sum(len(ln) <= 30 for ln in lines), len(lines)),
        "dup_line_share": div(dl, len(non_empty)),
        "dup_line_char_share": div(dlc, len(text.replace("\n", ""))),
        "dup_para_share": div(dp, len(paras)),
        "dup_para_char_share": div(dpc, len(text)),
        "newline_word_ratio": div(text.count("\n"), nw),
        "has_lorem_ipsum": "lorem ipsum" in text.lower(),
        "has_curly_bracket": "{" in text,
    }
    for n in quality.TOP_NGRAMS:
        grams = Counter(tuple(lower[i:i + n]) for i in range(nw - n + 1))
        best = max((len(" ".join(g)) * c for g, c in grams.items()), default=0)
        out[f"top_{n}gram_char_share"] = div(best, len(text))
    for n in quality.DUP_NGRAMS:
        seen, covered = set(), set()
        for i in range(nw - n + 1):
            g = tuple(lower[i:i + n])
            if g in seen:
                covered.update(range(i, i + n))
            seen.add(g)
        out[f"dup_{n}gram_char_share"] = div(sum(len(words[i]) + 1 for i in covered), len(text))
    return out


def plant_near_duplicates(texts: list[str], fraction: float, *, seed: int = 0, max_edits: int = 3,
                          min_words: int = 50) -> tuple[list[str], list[tuple[int, int]]]:
    """``texts`` followed by edited copies of a ``fraction`` of the documents with at least
    ``min_words`` words: 1..``max_edits`` words replaced, deleted or duplicated. Returns the new
    list and the (copy index, source index) pairs."""
    rng = random.Random(seed)
    eligible = [i for i, t in enumerate(texts) if len(t.split()) >= min_words]
    chosen = rng.sample(eligible, min(len(eligible), int(fraction * len(texts))))
    out = list(texts)
    pairs = []
    for src in chosen:
        words = texts[src].split(" ")
        for _ in range(rng.randint(1, max_edits)):
            i = rng.randrange(len(words))
            op = rng.random()
            if op < 0.6:
                words[i] = rng.choice(words)
            elif op < 0.8 and len(words) > 1:
                del words[i]
            else:
                words.insert(i, words[i])
        pairs.append((len(out), src))
        out.append(" ".join(words))
    return out, pairs


def brute_force_pairs(sets: list[set], threshold: float) -> set[tuple[int, int]]:
    """Every pair (i < j) with Jaccard >= ``threshold``, by comparing all pairs."""
    out = set()
    sizes = [len(s) for s in sets]
    for i, j in itertools.combinations(range(len(sets)), 2):
        a, b = sizes[i], sizes[j]
        if min(a, b) < threshold * max(a, b):  # J <= min/max: cannot reach the threshold
            continue
        inter = len(sets[i] & sets[j])
        union = a + b - inter
        if union and inter / union >= threshold:
            out.add((i, j))
    return out


def precision_recall(clusters: list[int], truth: set[tuple[int, int]]) -> dict:
    """Pairs in the same cluster vs. pairs with Jaccard >= threshold (both over the sample)."""
    members: dict[int, list[int]] = {}
    for i, c in enumerate(clusters):
        members.setdefault(c, []).append(i)
    predicted = {(i, j) for m in members.values() for i, j in itertools.combinations(sorted(m), 2)}
    tp = len(predicted & truth)
    return {
        "true_pairs": len(truth), "predicted_pairs": len(predicted), "true_positives": tp,
        "precision": tp / len(predicted) if predicted else 1.0,
        "recall": tp / len(truth) if truth else 1.0,
    }
