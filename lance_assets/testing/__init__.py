"""Planted corpora and stand-in models shared by the tests (``lance_assets_tests``) and the
benchmarks (``benchmarks/``): small data whose right answers are known by construction. Plain
library code (no Dagster, no pytest), so both may import it and the wheel carries it."""
