"""The `lance_assets` code location: everything under ``lance_assets/defs``, found there (every
column asset from its library declaration, ``defs/columns.py``; the other assets, checks, jobs,
schedules and sensors per domain; resources and executor in ``defs/location.py``)."""

import dagster as dg

import lance_assets.defs

defs = dg.load_defs(lance_assets.defs)
