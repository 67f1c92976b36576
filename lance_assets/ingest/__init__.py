"""Ingest: rows appended to the table exactly once, from files, Hugging Face or the
synthetic generator (``raw_text``), what it reads (``sources``), how a source's columns are
kept (``columns``).

The face: the modules ``raw_text``, ``sources`` and ``synthetic`` (the generator's vocabulary
plants corpora), and the source column's key and error.
"""

from lance_assets.ingest.columns import SOURCE_COLUMN_KEY, SourceError

__all__ = ["SOURCE_COLUMN_KEY", "SourceError", "raw_text", "sources", "synthetic"]
