"""Proxy-model comparisons: ``plan`` (arms, held-out split, equal tokens, run reuse, verdict),
``stats`` (paired leads, held-out error, power) and ``runner`` (the whole comparison, each
run launched by the caller) for curation ablations; ``mixture`` (the mixture search: swarm,
verification), ``regression`` (weights to held-out loss, the optimum) and ``remote`` (runs as
Ray tasks) for ``mixture_search``."""
