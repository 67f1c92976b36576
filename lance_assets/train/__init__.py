"""The trainer: runs under ``torchrun`` or alone; imports torch, lancedb and dagster_pipes only."""
