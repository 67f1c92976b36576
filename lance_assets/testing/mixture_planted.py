"""Planted corpora with a known answer for ``mixture_search``.

- ``planted_domains``: two text domains and one junk domain, named in the url. ``prose``
  is expository English (``ingest.synthetic``'s topics and sentence shapes), ``code`` is small
  Python functions, ``junk`` is strings of random consonants and symbols that teach a model
  nothing about either. With the target in ``prose``, the right mixture puts almost nothing on
  ``junk``, and it beats the natural mixture (the shares as stored, junk included).
- ``random_halves``: one corpus (prose and code mixed) cut into two domains at random: every
  mixture of them is the same data, so no lead may be called real.
- ``with_junk``: the same three-domain shape around real texts (the benchmark's: local Python
  sources and documentation).

Each comes back as a table of ``text`` and ``url`` (``https://example.org/<domain>/<n>``), the
domain in the url, which ingest keeps: ``url_domains`` gives the predicates. Tests and benchmarks
write it to parquet and ingest it.
"""

from __future__ import annotations

import random

import pyarrow as pa

from lance_assets.ingest.synthetic import CONNECTIVES, TEMPLATES, TOPICS

NAMES = ["total", "count", "items", "value", "result", "index", "name", "size", "data", "key"]
OPS = ["+", "-", "*", "//", "%"]
JUNK_CHARS = "bcdfghjklmnpqrstvwxz" + "#@$%&*~^"


def prose_document(rng: random.Random) -> str:
    topic = rng.choice(list(TOPICS))
    nouns, verbs, adjs = TOPICS[topic]
    sentences = [rng.choice(TEMPLATES).format(
        noun=rng.choice(nouns), noun2=rng.choice(nouns), verb=rng.choice(verbs),
        adj=rng.choice(adjs), adj2=rng.choice(adjs), conn=rng.choice(CONNECTIVES))
        for _ in range(rng.randrange(6, 16))]
    return " ".join(sentences)


def code_document(rng: random.Random) -> str:
    funcs = []
    for _ in range(rng.randrange(2, 5)):
        a, b, c = rng.sample(NAMES, 3)
        body = [f"    {c} = {a} {rng.choice(OPS)} {b}",
                f"    if {c} > {rng.randrange(1, 100)}:",
                f"        {c} = {c} {rng.choice(OPS)} {rng.randrange(2, 10)}",
                f"    return {c}"]
        funcs.append(f"def {rng.choice(['get', 'make', 'update', 'count'])}_{a}({a}, {b}):\n"
                     + "\n".join(body))
    return "\n\n\n".join(funcs) + "\n"


def junk_document(rng: random.Random, size: int | None = None) -> str:
    size = size or rng.randrange(300, 900)
    words, n = [], 0
    while n < size:
        words.append("".join(rng.choices(JUNK_CHARS, k=rng.randrange(2, 10))))
        n += len(words[-1]) + 1
    return " ".join(words)


def _table(rows: list[tuple[str, str]], seed: int) -> pa.Table:
    random.Random(seed).shuffle(rows)
    return pa.table({"text": pa.array([t for t, _ in rows], pa.string()),
                     "url": pa.array([f"https://example.org/{d}/{i}"
                                      for i, (_, d) in enumerate(rows)], pa.string())})


def url_domains(names) -> dict[str, str]:
    """The domains of a planted corpus as predicates over ``url`` (ingest keeps it)."""
    return {name: f"url LIKE '%/{name}/%'" for name in names}


def with_junk(texts: dict[str, list[str]], junk_share: float, seed: int = 0) -> pa.Table:
    """``texts`` (domain -> documents) and a ``junk`` domain of ``junk_share`` of all bytes,
    shuffled."""
    rng = random.Random(seed)
    rows = [(t, name) for name, docs in texts.items() for t in docs]
    real = sum(len(t.encode()) for t, _ in rows)
    target, size = junk_share / (1 - junk_share) * real, 0
    while size < target:
        rows.append((junk_document(rng), "junk"))
        size += len(rows[-1][0])
    return _table(rows, seed + 1)


def planted_domains(docs: int = 1500, junk_share: float = 0.4, seed: int = 0) -> pa.Table:
    """``docs`` documents each of ``prose`` and ``code``, and ``junk`` making ``junk_share`` of
    the bytes."""
    rng = random.Random(seed)
    return with_junk({"prose": [prose_document(rng) for _ in range(docs)],
                      "code": [code_document(rng) for _ in range(docs)]}, junk_share, seed)


def random_halves(docs: int = 3000, seed: int = 0) -> pa.Table:
    """``docs`` documents of prose and code (half each), each put in domain ``a`` or ``b`` by a
    coin."""
    rng = random.Random(seed)
    texts = [prose_document(rng) if i % 2 else code_document(rng) for i in range(docs)]
    return _table([(t, rng.choice("ab")) for t in texts], seed + 1)

