"""The trainer under torchrun, with rank 1 held back before it opens the table.

    torchrun --nproc-per-node 2 -m lance_assets_tests.rank_start_driver TRAINER_FLAGS...

Every rank writes the table version it opened to ``$RANK_START_FLAGS/rank<N>``; rank 0 also
creates ``opened`` once it has. Rank 1 waits for ``committed`` before it opens the table, so a
test can land a commit between the two ranks' starts. Nothing here is imported by the package.
"""

import os
import sys
import time
from pathlib import Path

from lance_assets.train import data, trainer

FLAGS = Path(os.environ["RANK_START_FLAGS"])
RANK = int(os.environ["RANK"])
real_open_snapshot = data.open_snapshot


def open_snapshot(table, version=None, tag=None):
    if RANK == 1:
        deadline = time.monotonic() + 300
        while not (FLAGS / "committed").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never landed its commit")
            time.sleep(0.05)
    snap = real_open_snapshot(table, version, tag)
    (FLAGS / f"rank{RANK}").write_text(str(snap.version))
    if RANK == 0:
        (FLAGS / "opened").touch()
    return snap


data.open_snapshot = open_snapshot

if __name__ == "__main__":
    sys.exit(trainer.main(sys.argv[1:]))
