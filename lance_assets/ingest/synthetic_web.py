"""A web corpus at real size, shaped like FineWeb-Edu, made offline in seconds per million documents.

``synthetic`` (the demo's corpus) is a few thousand short template sentences. This one is what
the seed's real workload looks like to every stage that reads text:

- **lengths**: log-normal characters per document, median ~3.0 K, mean ~4.5 K (FineWeb-Edu's
  10BT sample: 10 B GPT-2 tokens in 9.67 M documents at ~4.5 bytes per token), cut to
  [200, 100,000];
- **vocabulary**: Zipf (exponent 1.07) over English stop words first, then 60,000 generated
  word forms (shorter words more frequent), with capitalised sentence starts, commas, full
  stops, paragraph breaks and a number now and then; each document tilts the mid-frequency
  vocabulary towards its own topic;
- **duplicates with known ground truth**: a share of documents are exact copies of an earlier
  original (half with different whitespace: equal once normalised), near copies (1-3 words
  replaced, Jaccard of word 5-grams well above 0.8) and partial copies (a contiguous 10-30% of
  the words replaced: Jaccard mostly 0.4-0.8, the pairs an LSH band often brings together and
  the Jaccard check must reject). :func:`planted` says which document copies which.

Generation is vectorised over blocks of :data:`BLOCK_ROWS` documents, each made from its own
seeded generator, so any block (an ingest part) is made alone, in any order, always the same. A
copy's original lives in the same block or an earlier one, which is made again to copy from.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa

BLOCK_ROWS = 1024  # equals sources.PART_ROWS: one ingest part per block
VOCAB_WORDS = 60_000
ZIPF_EXPONENT = 1.07
LENGTH_MEDIAN_CHARS = 3100.0
LENGTH_SIGMA = 0.9  # mean = median * exp(sigma^2 / 2) ~ 4.6 K
MIN_CHARS, MAX_CHARS = 200, 100_000
SAMPLER_SIZE = 1 << 22  # Zipf sampling by table lookup: one gather per word
STOP_WORDS = (
    "the of and to a in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were their one all we can her has there been if more when will would "
    "who so no she other its may these what them than some him time into only do out also could "
    "two over first then about such most like after our new these made many before must through "
    "years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since against "
    "go came right used take three"
).split()
SYLLABLES = [c + v for c in ["", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t",
                             "v", "w", "st", "tr", "pl", "gr", "ch", "sh", "th"]
             for v in ["a", "e", "i", "o", "u", "ea", "io", "ou", "ar", "er", "in", "on", "al"]]
CODAS = ["", "", "", "s", "n", "t", "r", "l", "d", "ng", "st", "ct", "sm", "ty", "ly", "tion"]
# Separator variants after a word: " ", ", ", ". " (the next word capitalised), ".\n\n", then
# the whitespace-only variants of " " that respaced copies use (equal once normalised).
SEPARATORS = [b" ", b", ", b". ", b".\n\n", b"  ", b"\n", b"\t", b" \n "]
N_SEP = len(SEPARATORS)
RESPACED = range(4, N_SEP)


@dataclass(frozen=True)
class WebSpec:
    rows: int = 100_000
    seed: int = 0
    exact_dup: float = 0.02  # share of documents that are exact copies (half respaced)
    near_dup: float = 0.03  # share that are near copies (1-3 words replaced)
    partial_dup: float = 0.01  # share that are partial copies (10-30% of the words replaced)

    @property
    def key(self) -> str:
        """Identity of this corpus for incremental ingest: same spec, same rows."""
        return (f"synthetic-web:rows={self.rows},seed={self.seed},exact={self.exact_dup},"
                f"near={self.near_dup},partial={self.partial_dup}")

    @property
    def n_blocks(self) -> int:
        return (self.rows + BLOCK_ROWS - 1) // BLOCK_ROWS


# Kinds in :func:`planted`
ORIGINAL, EXACT, RESPACED_EXACT, NEAR, PARTIAL = 0, 1, 2, 3, 4


@lru_cache(maxsize=1)
def vocabulary() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The token table: every (word, capitalised?, separator) variant as bytes.

    Returns (table, lengths, sampler): token t = (word * 2 + cap) * N_SEP + separator; its bytes
    are ``table[t, :lengths[t]]``; ``sampler`` holds word ranks in Zipf proportions."""
    rng = np.random.default_rng(12345)
    words = list(dict.fromkeys(STOP_WORDS))
    seen = set(words)
    while len(words) < VOCAB_WORDS:
        # rarer words are longer: 1-2 syllables near the top, up to 5 in the tail
        rank = len(words)
        n_syl = 1 + min(3, int(rng.exponential(0.3 + rank / 40_000)))
        w = "".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), n_syl))
        w += CODAS[rng.integers(0, len(CODAS))]
        if rng.random() < 0.01:
            w = str(rng.integers(2, 3000))  # numbers: folded to 0 by near_dup's simplify
        if w and w not in seen:
            seen.add(w)
            words.append(w)
    tokens = [((w[:1].upper() + w[1:]) if cap else w).encode() + sep
              for w in words for cap in (False, True) for sep in SEPARATORS]
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    table = np.zeros((len(tokens), int(lengths.max())), dtype=np.uint8)
    for i, t in enumerate(tokens):
        table[i, :len(t)] = np.frombuffer(t, dtype=np.uint8)
    p = 1.0 / np.arange(1, VOCAB_WORDS + 1) ** ZIPF_EXPONENT
    counts = np.floor(p / p.sum() * SAMPLER_SIZE).astype(np.int64)
    sampler = np.repeat(np.arange(VOCAB_WORDS, dtype=np.int32), counts)
    return table, lengths, sampler


def _block_rng(spec: WebSpec, block: int) -> np.random.Generator:
    return np.random.default_rng([spec.seed, block, 0x5EB])


def _originals(spec: WebSpec, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Every document of ``block`` as an original: (tokens, per-document token offsets)."""
    _, _, sampler = vocabulary()
    rng = _block_rng(spec, block)
    n = min(BLOCK_ROWS, spec.rows - block * BLOCK_ROWS)
    chars = np.exp(rng.normal(np.log(LENGTH_MEDIAN_CHARS), LENGTH_SIGMA, n))
    chars = np.clip(chars, MIN_CHARS, MAX_CHARS)
    mean_token_bytes = 6.0  # measured: bytes per token with its separator
    n_tokens = np.maximum(5, (chars / mean_token_bytes).astype(np.int64))
    offsets = np.concatenate([[0], np.cumsum(n_tokens)])
    total = int(offsets[-1])
    doc = np.repeat(np.arange(n), n_tokens)
    word = sampler[rng.integers(0, len(sampler), total)].astype(np.int64)
    # a topic per document: mid-frequency words (rank >= 500) shifted by its own offset
    topic = rng.integers(0, VOCAB_WORDS, n)[doc]
    mid = word >= 500
    word[mid] = 500 + (word[mid] - 500 + topic[mid]) % (VOCAB_WORDS - 500)
    # separators: sentence ends every ~18 words, paragraph ends every ~6 sentences, commas
    u = rng.random(total)
    sep = np.where(u < 1 / 18, 2, np.where(u < 1 / 18 + 1 / 14, 1, 0))
    sep[(sep == 2) & (rng.random(total) < 1 / 6)] = 3
    sep[offsets[1:] - 1] = 2  # every document ends a sentence
    cap = np.zeros(total, dtype=np.int64)
    cap[1:] = sep[:-1] >= 2
    cap[offsets[:-1]] = 1
    return (word * 2 + cap) * N_SEP + sep, offsets


def _render(tokens: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Documents as a UTF-8 string array. Every document ends in a full stop (its last token's
    separator is ". "; the space is left out)."""
    table, lengths, _ = vocabulary()
    tok_len = lengths[tokens]
    rows = table[tokens]  # (tokens, widest token) bytes, zero-padded
    rows[(offsets[1:] - 1), tok_len[offsets[1:] - 1] - 1] = 0  # the final space
    tok_len[offsets[1:] - 1] -= 1
    buf = rows[np.arange(rows.shape[1])[None, :] < tok_len[:, None]]
    doc_bytes = np.add.reduceat(tok_len, offsets[:-1])
    text_offsets = np.concatenate([[0], np.cumsum(doc_bytes)]).astype(np.int64)
    return pa.LargeStringArray.from_buffers(
        len(doc_bytes), pa.py_buffer(text_offsets), pa.py_buffer(buf)).cast(pa.string())


@dataclass(frozen=True)
class Plan:
    """Which documents of a block are copies: kind per row, and the global row they copy."""

    kind: np.ndarray
    source: np.ndarray  # -1 for originals


def _plan(spec: WebSpec, block: int) -> Plan:
    rng = np.random.default_rng([spec.seed, block, 0xD0C])
    n = min(BLOCK_ROWS, spec.rows - block * BLOCK_ROWS)
    u = rng.random(n)
    e, nr, pt = spec.exact_dup, spec.near_dup, spec.partial_dup
    kind = np.select([u < e / 2, u < e, u < e + nr, u < e + nr + pt],
                     [EXACT, RESPACED_EXACT, NEAR, PARTIAL], ORIGINAL)
    first = block * BLOCK_ROWS
    # an original in one earlier block (chosen per block) or earlier in this block
    src_block = int(rng.integers(0, block)) if block else 0
    src_n = min(BLOCK_ROWS, spec.rows - src_block * BLOCK_ROWS)
    earlier = rng.random(n) < 0.5
    pos = np.arange(n)
    same = (rng.random(n) * np.maximum(pos, 1)).astype(np.int64)
    other = src_block * BLOCK_ROWS + rng.integers(0, src_n, n)
    source = np.where(earlier | (block == 0), first + np.minimum(same, np.maximum(pos - 1, 0)),
                      other)
    source = np.where(kind == ORIGINAL, -1, source)
    kind = np.where(pos == 0, ORIGINAL, kind)  # the first row of block 0 has nothing before it
    source = np.where(kind == ORIGINAL, -1, source)
    # copy only originals: a source that is itself a copy makes this row an original
    own = (source >= first) & (kind != ORIGINAL)
    src_kind = np.full(n, ORIGINAL)
    src_kind[own] = kind[source[own] - first]
    if block:
        other_plan_kind = _plan_kinds(spec, src_block)
        ext = (source >= 0) & (source < first)
        src_kind[ext] = other_plan_kind[source[ext] - src_block * BLOCK_ROWS]
    bad = src_kind != ORIGINAL
    kind = np.where(bad, ORIGINAL, kind)
    source = np.where(kind == ORIGINAL, -1, source)
    return Plan(kind.astype(np.int8), source.astype(np.int64))


def _plan_kinds(spec: WebSpec, block: int) -> np.ndarray:
    """The kinds :func:`_plan` gives ``block`` before it drops copies of copies (enough to
    tell an original: a row of kind ORIGINAL here is one in the final plan too)."""
    rng = np.random.default_rng([spec.seed, block, 0xD0C])
    n = min(BLOCK_ROWS, spec.rows - block * BLOCK_ROWS)
    u = rng.random(n)
    e, nr, pt = spec.exact_dup, spec.near_dup, spec.partial_dup
    kind = np.select([u < e, u < e + nr, u < e + nr + pt], [EXACT, NEAR, PARTIAL], ORIGINAL)
    if block == 0:
        kind[0] = ORIGINAL
    return kind


def planted(spec: WebSpec, blocks: range | None = None) -> Plan:
    """The ground truth of the whole corpus (or of ``blocks``): kind and source per row."""
    blocks = range(spec.n_blocks) if blocks is None else blocks
    plans = [_plan(spec, b) for b in blocks]
    return Plan(np.concatenate([p.kind for p in plans]), np.concatenate([p.source for p in plans]))


def generate_block(spec: WebSpec, block: int) -> pa.Table:
    """Rows ``block * BLOCK_ROWS ...`` of the corpus: ``doc_id``, ``url``, ``text``, ``score``."""
    tokens, offsets = _originals(spec, block)
    plan = _plan(spec, block)
    first = block * BLOCK_ROWS
    n = len(plan.kind)
    copies = np.flatnonzero(plan.kind != ORIGINAL)
    if len(copies):
        rng = np.random.default_rng([spec.seed, block, 0xC0B])
        src_block = {int(s) // BLOCK_ROWS for s in plan.source[copies]} - {block}
        other = {b: _originals(spec, b) for b in src_block}
        parts_tok, lens = [], np.diff(offsets).copy()
        for i in range(n):
            if plan.kind[i] == ORIGINAL:
                parts_tok.append(tokens[offsets[i]:offsets[i + 1]])
                continue
            s = int(plan.source[i])
            sb, sp = divmod(s, BLOCK_ROWS)
            st, so = (tokens, offsets) if sb == block else other[sb]
            t = st[so[sp]:so[sp + 1]].copy()
            k = plan.kind[i]
            variant = t % (2 * N_SEP)  # capitalisation and separator, kept on a replaced word
            if k == RESPACED_EXACT:
                plain = np.flatnonzero(t % N_SEP == 0)
                pick = plain[rng.random(len(plain)) < 0.05]
                t[pick] += rng.choice(RESPACED, len(pick))
            elif k == NEAR:
                at = rng.integers(0, len(t), rng.integers(1, 4))
                t[at] = rng.integers(500, VOCAB_WORDS, len(at)) * 2 * N_SEP + variant[at]
            elif k == PARTIAL:
                span = max(1, int(len(t) * rng.uniform(0.10, 0.30)))
                lo = int(rng.integers(0, len(t) - span + 1))
                t[lo:lo + span] = (rng.integers(500, VOCAB_WORDS, span) * 2 * N_SEP
                                   + variant[lo:lo + span])
            parts_tok.append(t)
            lens[i] = len(t)
        tokens = np.concatenate(parts_tok)
        offsets = np.concatenate([[0], np.cumsum(lens)])
    text = _render(tokens, offsets)
    rows = np.arange(first, first + n)
    score_rng = np.random.default_rng([spec.seed, block, 0x5C0])
    score = np.clip(score_rng.normal(2.6, 0.8, n), 0, 5).round(3)
    score = np.where(plan.source >= 0, np.nan, score)  # copies take their original's below
    table = pa.table({
        "doc_id": pa.array([f"web-{spec.seed}-{r:09d}" for r in rows.tolist()]),
        "url": pa.array([f"https://web.example/{spec.seed}/{r}" for r in rows.tolist()]),
        "text": text,
        "score": pa.array(score, pa.float64()),
    })
    if len(copies):
        # a copy keeps its original's score (recomputed from that block's generator)
        src = plan.source[copies]
        src_scores = np.empty(len(copies))
        for b in np.unique(src // BLOCK_ROWS):
            nb = min(BLOCK_ROWS, spec.rows - int(b) * BLOCK_ROWS)
            sc = np.clip(np.random.default_rng([spec.seed, int(b), 0x5C0]).normal(2.6, 0.8, nb),
                         0, 5).round(3)
            sel = src // BLOCK_ROWS == b
            src_scores[sel] = sc[src[sel] - int(b) * BLOCK_ROWS]
        score[copies] = src_scores
        table = table.set_column(3, "score", pa.array(score, pa.float64()))
    return table
