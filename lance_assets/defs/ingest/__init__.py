"""Ingest: ``raw_text``, and the schedule and sensor that bring new rows in."""
