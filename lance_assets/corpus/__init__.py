"""The data layer: plain functions over the one Lance table (no Dagster imports)."""
