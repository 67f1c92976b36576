"""``python -m lance_assets``: table tools that are not assets.

    python -m lance_assets forget --where "<predicate>" [--dry-run] [--max-share F] [--allow-all]
                                  [--release TAG ...] [--force] [--json] [--data DIR]
    python -m lance_assets explain --id N [--version V|TAG] [--against B] [--json] [--data DIR]
    python -m lance_assets diff A B [--domain NAME=PREDICATE ...] [--full] [--json] [--data DIR]
    python -m lance_assets diff --list [--data DIR]  |  summary [RUN] [--top N] [--json] [--data DIR]

``forget`` removes the documents the predicate selects from every version on disk, after its
guards (``table.forget``, ``table.forget_guard``); it first finishes any interrupted forget.
``explain`` tells one document's story (``forensics.explain``): every signal, each rule in force
and its verdict, its duplicate clusters, contamination, every snapshot, run and ablation arm
that read it, and the samples attributed to it; with ``--against B``, how its state differs
between the two snapshots. ``diff`` says what changed in the data between two snapshots A and B
(``forensics.diff``): each a tag, a version number, a training run or an ablation arm
(``<ablation>/<arm>``): documents added and removed (ids, never text), what each rule moved,
per source and ``--domain``, flipped flags and signals, the tokenizer, the overlap of what two
runs read. ``--list`` names what there is to compare. ``summary``: the public summary of what
a run or arm read (``forensics.summary``).

Exit status: 0 done; 1 forgotten rows left (``forget``), the document absent (``explain``); 2 a
refusal or a mistake in the input, named in one line. A standard output closed early (``|
head``, ``>&-``) costs only what would have been printed: the work is done, the status as above.
"""

from __future__ import annotations

import argparse
import json
import sys

from lance_assets.std_streams import closed, run_main
from lance_assets.table import Table, TableMissingError
from lance_assets.table.forget import MAX_SHARE, ForgetError, forget


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lance_assets", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("forget", help="remove documents for good (every version on disk)")
    f.add_argument("--where", required=True,
                   help="which documents: a predicate over the table's columns, e.g. \"url = "
                        "'https://example.com/a'\" or \"id IN (4, 8)\"")
    f.add_argument("--force", action="store_true",
                   help="redact (or release) snapshots even while a training run reads them")
    f.add_argument("--dry-run", action="store_true",
                   help="print how many documents would go, a few of their urls and the "
                        "snapshots it would redact or release; change nothing")
    f.add_argument("--max-share", type=float, default=MAX_SHARE,
                   help="refuse when the documents are more than this share of the table's "
                        "rows (default: %(default)s)")
    f.add_argument("--allow-all", action="store_true",
                   help="allow a predicate that matches every row of the table")
    f.add_argument("--release", action="append", default=[], metavar="TAG",
                   help="a snapshot holding one of the documents to release whole instead of "
                        "redacting it (repeat for each; every other holder keeps its other "
                        "rows under its tag)")
    f.add_argument("--data", default=None, help="data root (default: $LANCE_ASSETS_DATA or ./data)")
    f.add_argument("--json", action="store_true", help="print the report as JSON")
    e = sub.add_parser("explain", help="why a document is in or out, and what trained on it")
    e.add_argument("--id", type=int, required=True, help="the document's `id` (the table's row id)")
    e.add_argument("--version", default=None,
                   help="table version number or snapshot tag to read the signals and rules at "
                        "(default: the newest)")
    e.add_argument("--data", default=None, help="data root (default: $LANCE_ASSETS_DATA or ./data)")
    e.add_argument("--against", default=None,
                   help="another snapshot (a tag, version, training run or ablation arm): say "
                        "how the document's state differs between --version (default: the "
                        "newest) and it")
    e.add_argument("--json", action="store_true", help="print the story as JSON")
    d = sub.add_parser("diff", help="what changed in the data between two snapshots")
    d.add_argument("a", nargs="?", help="the earlier side: a tag, a version number, a training "
                   "run or an ablation arm (<ablation>/<arm>[/seed-N])")
    d.add_argument("b", nargs="?", help="the later side, named the same way")
    d.add_argument("--domain", action="append", default=[], metavar="NAME=PREDICATE",
                   help="count documents and tokens per domain too: a name and a predicate "
                        "over the table's columns (repeat for each domain)")
    d.add_argument("--full", action="store_true",
                   help="read every row of both versions, even where Lance's row versions say "
                        "which rows changed")
    d.add_argument("--list", action="store_true", help="list the tags, runs and ablations")
    d.add_argument("--data", default=None, help="data root (default: $LANCE_ASSETS_DATA or ./data)")
    d.add_argument("--json", action="store_true", help="print the diff as JSON")
    _summary_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "summary":
        return _summary(args)
    if args.command == "explain":
        return _explain(args)
    if args.command == "diff":
        return _diff(parser, args)
    log = (lambda _m: None) if args.json else _say
    try:
        report = forget(Table.of(args.data), args.where, force=args.force, dry_run=args.dry_run,
                        max_share=args.max_share, allow_all=args.allow_all,
                        release=args.release, log=log)
    except (ForgetError, TableMissingError) as e:
        _say(f"error: {e}")
        return 2
    _out(json.dumps(report.to_dict(), indent=2, default=str) if args.json else report.markdown())
    return 0 if report.still_readable == report.still_in_files == 0 else 1


def _out(text: str) -> None:
    """Print ``text`` on the standard output; one closed early (``| head``) drops it and what
    follows, never the work (module docstring)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        closed(sys.stdout)


def _say(text: str) -> None:
    """A progress line or an error on the standard error, dropped likewise when it is closed."""
    try:
        print(text, file=sys.stderr, flush=True)
    except BrokenPipeError:
        closed(sys.stderr)


def _explain(args: argparse.Namespace) -> int:
    from lance_assets.forensics.explain import ExplainError, explain

    ref = args.version
    if args.against is not None:
        from lance_assets.forensics.diff import DiffError
        from lance_assets.forensics.diff.document import document_diff

        table = Table.of(args.data)
        try:
            change = document_diff(table, args.id, ref if ref is not None else
                                   table.newest().version, args.against)
        except (ExplainError, DiffError, TableMissingError) as err:
            _say(f"error: {err}")
            return 2
        _out(json.dumps(change.to_dict(), indent=2, default=str) if args.json
             else change.markdown())
        return 0 if all(change.present) else 1
    try:
        story = explain(Table.of(args.data), args.id, ref=ref)
    except (ExplainError, TableMissingError) as err:
        _say(f"error: {err}")
        return 2
    _out(json.dumps(story.to_dict(), indent=2, default=str) if args.json else story.markdown())
    return 0 if story.present or story.forgotten else 1  # a forgotten one is answered too


def _diff(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from lance_assets.forensics.diff import DiffError, diff, listing

    try:
        table = Table.of(args.data)
        if args.list:
            _out(listing(table))
            return 0
        if not args.a or not args.b:
            parser.error("diff: give two sides, A and B (or --list)")
        domains = {}
        for item in args.domain:
            name, sep, predicate = item.partition("=")
            if not sep or not name.strip():
                raise DiffError(f"--domain {item!r}: give NAME=PREDICATE, e.g. --domain "
                                "\"web=source LIKE 'file:%web%'\"")
            domains[name.strip()] = predicate
        log = (lambda _m: None) if args.json else _say
        result = diff(table, args.a, args.b, domains=domains, full=args.full, log=log)
    except (DiffError, TableMissingError) as err:
        _say(f"error: {err}")
        return 2
    _out(json.dumps(result.to_dict(), indent=2, default=str) if args.json else result.markdown())
    return 0


def _summary_parser(sub) -> None:
    from lance_assets.forensics.summary import DEFAULT_TOP_N, DEFAULT_TOP_SHARE, MAX_TOP_DOMAINS

    s = sub.add_parser("summary", help="the public summary of what a training run read")
    s.add_argument("run", nargs="?", default=None,
                   help="a run under DATA/train or an ablation arm <ablation>/<arm> (default: "
                        "the newest run)")
    s.add_argument("--top-share", type=float, default=DEFAULT_TOP_SHARE,
                   help="share of domain names listed, ranked by bytes (default: %(default)s)")
    s.add_argument("--cap", type=int, default=MAX_TOP_DOMAINS,
                   help="at most this many of them (default and most: %(default)s)")
    s.add_argument("--top", type=int, default=DEFAULT_TOP_N,
                   help="also the top N domains (default: %(default)s)")
    s.add_argument("--source-kind", action="append", default=[], metavar="PREFIX=CATEGORY",
                   help="the template category of the sources whose name starts with PREFIX "
                        "(publicly_available_datasets, crawled_and_scraped, ...; repeat)")
    for name in ("provider-name", "provider-contact", "model-name", "model-version"):
        s.add_argument(f"--{name}", default="",
                       help="a value the table cannot know (default: blank, said so)")
    s.add_argument("--data", default=None, help="data root (default: $LANCE_ASSETS_DATA or ./data)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")


def _summary(args: argparse.Namespace) -> int:
    from lance_assets.curation.rules import RuleError
    from lance_assets.forensics.summary import Declared, SummaryError, markdown, summarize

    kinds = dict(item.rpartition("=")[::2] for item in args.source_kind)
    declared = Declared(provider_name=args.provider_name, provider_contact=args.provider_contact,
                        model_name=args.model_name, model_version=args.model_version,
                        source_kinds=kinds)
    try:
        got = summarize(Table.of(args.data), args.run, top_share=args.top_share, cap=args.cap,
                        top_n=args.top, declared=declared)
    except (SummaryError, RuleError, TableMissingError) as err:
        _say(f"error: {err}")
        return 2
    _out(json.dumps(got, indent=2) if args.json else markdown(got))
    return 0


if __name__ == "__main__":
    run_main(main)
