"""Dagster definitions: thin assets over the library in ``lance_assets.corpus`` and the trainer."""
