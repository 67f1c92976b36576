"""Forensics on the training table: what is in the corpus, and where generated text came from.

- ``search``: BM25 + vector kNN fused by reciprocal rank fusion.
- ``words``: the layout-free word view of a text, with the offsets back to the original.
- ``attribution``: training documents ranked by shared word spans (any layout) and meaning.
- ``near_dups``: semantic near-duplicate pairs on a sample.
- ``report``: all of it for every sample of a training run.
- ``text_index``: the full-text (BM25) index.
- ``explain``: one document's story; ``diff``: what changed between two snapshots;
  ``summary``: what a training run read.

Everything reads the rows of the table version the newest model trained on (``pinned``).
CLI: ``python -m lance_assets.forensics {search,attribute,near-dups} --help``.

The face: the modules ``diff``, ``explain``, ``report``, ``summary`` and ``text_index``
(``report`` loads the embedding model's code, so the package loads none of them itself).
"""

__all__ = ["diff", "explain", "report", "summary", "text_index"]
