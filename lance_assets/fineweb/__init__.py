"""FineWeb's quality filters decision for decision: spaCy's English words without spaCy
(``web_words``) and the columns datatrove's four filters decide on (``fineweb_signals``).

The face: ``fineweb_signals``, the column producer (found by the producer registry).
"""

__all__ = ["fineweb_signals"]
