"""The `lance_assets` code location: everything under ``lance_assets/defs``, found there (every
column asset from its library declaration, ``defs/columns.py``; the other assets, checks, jobs,
schedules and sensors per domain; resources and executor in ``defs/location.py``). The project
(``pyproject.toml``'s ``[tool.dg]``) names the defs module."""

from pathlib import Path

import dagster as dg

defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
