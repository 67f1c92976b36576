"""Benchmarks: scripts that print figures and ratios against a baseline measured in the same run."""
