"""Forensics on the training table: what is in the corpus, and where generated text came from.

- ``embed``: the ``embedding`` column (all-MiniLM-L6-v2, 384-d, offline, per fragment).
- ``vector_index``: the ANN index on ``embedding``, with recall@10 against exact search.
- ``search``: BM25 + vector kNN fused by reciprocal rank fusion.
- ``attribution``: training documents ranked by shared verbatim token spans and meaning.
- ``near_dups``: semantic near-duplicate pairs on a sample.
- ``report``: all of it for every sample of a training run.

Everything reads the rows of the table version the newest model trained on (``pinned``).
CLI: ``python -m lance_assets.forensics {search,attribute,near-dups} --help``.
"""
