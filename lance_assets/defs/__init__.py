"""Dagster definitions: thin assets over the library (``table``, ``ingest``, ``curation``,
``tokens``, ``embeddings``, ``forensics``, ``ablation``) and the trainer."""
