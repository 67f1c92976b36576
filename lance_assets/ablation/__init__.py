"""Curation ablations: ``plan`` (arms, held-out split, equal tokens, run reuse, verdict),
``stats`` (paired leads, held-out error, power) and ``runner`` (the whole comparison, each
run launched by the caller)."""
