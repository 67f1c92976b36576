"""Curation: quality signals, near-duplicates, the full-text index, the corpus profile and the
rules (SQL predicates) that make the training filter, guarded by blocking checks."""
