"""Curation: the taggers that write a signal column per document (``dedup_flag``,
``near_dup``, ``quality_signals``, ``personal_data``, ``detected_language`` ...), the rules
that turn them into the training filter (``rules``), and what checks and measures them
(``guards``, ``profile``, ``sweeps``, ``source_shares``).

The face: the modules other packages use as a whole (``rules``, ``predicate``, ``guards``,
``profile``, ``sweeps``, ``source_shares``, ``minhash``, ``near_dup``, ``quality_signals``) and
the few helpers the tokens and forensics reuse. A tagger is found by the producer registry, not
by name.
"""

from lance_assets.curation.dedup_flag import text_hashes
from lance_assets.curation.personal_data import PII_SPANS, PLACEHOLDERS, redact
from lance_assets.curation.url_domain import UNKNOWN, domain_codes

__all__ = ["PII_SPANS", "PLACEHOLDERS", "UNKNOWN", "domain_codes", "guards", "minhash",
           "near_dup", "predicate", "profile", "quality_signals", "redact", "rules",
           "source_shares", "sweeps", "text_hashes"]
