"""Planted corpora and stand-in models shared by the tests (``lance_assets_tests``) and the
benchmarks (``benchmarks/``): small data whose right answers are known by construction. Plain
library code (no Dagster, no pytest), so both may import it and the wheel carries it.

The face: every module, each one planted corpus or stand-in.
"""

__all__ = ["curation_reference", "embedders", "longdocs", "mixture_planted", "multilingual",
           "pii_planted", "semantic_planted"]
