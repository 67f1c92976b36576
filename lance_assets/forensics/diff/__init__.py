"""What changed in the data between two snapshots: documents, rules, flags and tokens.

``diff(table, A, B)`` (and ``python -m lance_assets diff A B``) compares two tagged versions,
version numbers, training runs or ablation arms document by document: the documents added and
removed (ids, never text), the documents and tokens each rule moved between kept and dropped
and the rules added, removed or changed, the same per source and per domain, every flag and
signal column's flipped values with example ids, the tokenizer, and what two runs both read.

- ``refs``: a side as a person names it, and why a snapshot is gone;
- ``rows``: which rows to read (Lance's row versions: only what changed), and reading them;
- ``core``: ``diff`` and ``against_previous``: resolve, plan, read, compare;
- ``compare``: two sides' rows compared by ``id``;
- ``report``: the result, in Markdown (whole, or short with a chart) and JSON;
- ``document``: one document's state at two snapshots (``explain --against``).

The face: ``diff``, ``against_previous``, the refs and the result, and the module ``document``
(it loads ``explain``, so the package does not).
"""

from lance_assets.forensics.diff.core import against_previous, diff
from lance_assets.forensics.diff.refs import DiffError, Side, listing, resolve
from lance_assets.forensics.diff.report import DataDiff

__all__ = ["DataDiff", "DiffError", "Side", "against_previous", "diff", "document", "listing",
           "resolve"]
