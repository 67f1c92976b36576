"""Locality-sensitive hashing for near-duplicate detection, with no table access: the
partitioned steps ``near_dup`` runs as tasks (:mod:`.shuffle`).

The face: the module ``shuffle``.
"""

__all__ = ["shuffle"]
