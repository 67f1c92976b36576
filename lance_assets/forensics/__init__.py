"""Forensics on the training table: what is in the corpus, and where generated text came from.

- ``embed``: the ``embedding`` column (all-MiniLM-L6-v2, 384-d, offline, per fragment).
- ``chunks``: the ``chunk_embeddings`` column: one vector per overlapping chunk, whole documents.
- ``vector_index``: the ANN indexes on both, with recall@10 against exact search.
- ``search``: BM25 + vector kNN fused by reciprocal rank fusion.
- ``words``: the layout-free word view of a text, with the offsets back to the original.
- ``attribution``: training documents ranked by shared word spans (any layout) and meaning.
- ``near_dups``: semantic near-duplicate pairs on a sample.
- ``report``: all of it for every sample of a training run.

Everything reads the rows of the table version the newest model trained on (``pinned``).
CLI: ``python -m lance_assets.forensics {search,attribute,near-dups} --help``.
"""
