"""``python -m lance_assets``: table tools that are not assets.

    python -m lance_assets forget --where "<predicate>" [--force] [--json] [--data DIR]

``forget`` removes the documents the predicate selects from every version on disk
(``corpus.forget``); the predicate goes through the curation rules' parser.
"""

from __future__ import annotations

import argparse
import json
import sys

from lance_assets.table import Table, TableMissingError
from lance_assets.table.forget import ForgetError, forget


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lance_assets", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("forget", help="remove documents for good (every version on disk)")
    f.add_argument("--where", required=True,
                   help="which documents: a predicate over the table's columns, e.g. \"url = "
                        "'https://example.com/a'\" or \"id IN (4, 8)\"")
    f.add_argument("--force", action="store_true",
                   help="release snapshots even while a training run reads them")
    f.add_argument("--data", default=None, help="data root (default: $LANCE_ASSETS_DATA or ./data)")
    f.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    log = (lambda _m: None) if args.json else (lambda m: print(m, file=sys.stderr))
    try:
        report = forget(Table.of(args.data), args.where, force=args.force, log=log)
    except (ForgetError, TableMissingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.markdown())
    return 0 if report.still_readable == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
