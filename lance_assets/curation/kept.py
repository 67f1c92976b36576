"""A kept member for every cluster of duplicates, after deletes.

The duplicate columns flag every copy of a text but one, the kept member (the smallest id):
``is_dup`` among the rows of one ``text_hash``, ``near_dup`` among the rows of one
``near_dup_cluster``, ``semantic_dup`` among the rows of one ``semantic_rep``. Values once
written never change, except here: a delete (``forget``, or an operator's) can remove a
cluster's kept member, and its surviving copies would then stay flagged, so that no copy of the
text is trained on any more.

``elect`` runs at the end of each run of those columns, only when rows were deleted (the table
holds fewer rows below the run's ``rows_end`` than ids it handed out). It finds, on the table as
it is, every cluster whose live rows are all flagged, and unflags its smallest id: the member the
column would have kept had the deleted ones never been there. The change is a Lance ``update``
of those rows (``id IN (...)``: integers only); rows deleted meanwhile simply match nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow.compute as pc

from lance_assets.table import Table

CHUNK = 2000


def orphaned_clusters(table: Table, *, flag: str, cluster: str, rows_end: int) -> np.ndarray:
    """The smallest id of every cluster (rows below ``rows_end`` with ``flag`` written) whose
    live rows are all flagged."""
    ds = table.newest()
    if flag not in ds.schema.names or cluster not in ds.schema.names:
        return np.empty(0, np.int64)
    if ds.count_rows() >= table.next_row_id(ds) > 0:  # read from the manifest: no scan
        return np.empty(0, np.int64)  # every id ever handed out is live: nothing was deleted
    if ds.count_rows(filter=f"id < {int(rows_end)}") >= rows_end:
        return np.empty(0, np.int64)  # nothing below rows_end was ever deleted
    rows = ds.to_table(columns=[cluster, "id", flag],
                       filter=f"`{flag}` IS NOT NULL AND id < {int(rows_end)}")
    if rows.num_rows == 0:
        return np.empty(0, np.int64)
    groups = rows.group_by(cluster).aggregate([("id", "min"), (flag, "all")])
    orphans = groups.filter(pc.field(f"{flag}_all"))
    return np.sort(orphans.column("id_min").to_numpy(zero_copy_only=False)).astype(np.int64)


def elect(table: Table, *, flag: str, cluster: str, rows_end: int,
          log: Callable[[str], None] = print) -> int:
    """Unflag the smallest live id of every cluster that lost its kept member; returns how many
    rows were unflagged."""
    ids = orphaned_clusters(table, flag=flag, cluster=cluster, rows_end=rows_end)
    done = 0
    for lo in range(0, len(ids), CHUNK):
        where = f"id IN ({','.join(str(int(i)) for i in ids[lo:lo + CHUNK])}) AND `{flag}`"

        def attempt(ds, where=where):
            return int(ds.update({flag: "false"}, where=where)["num_rows_updated"])

        done += table.commit(f"{flag}: a kept member for clusters that lost theirs", attempt,
                             log=log)
    if done:
        log(f"{flag}: {done} cluster(s) lost their kept member to a delete; their smallest "
            "remaining id is kept now")
    return done
