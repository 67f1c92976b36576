"""Search the corpus and attribute text to training documents, from the command line.

    python -m lance_assets.forensics search "telescope nebula" --k 10 [--mode hybrid] [--json]
    python -m lance_assets.forensics attribute --text-file sample.txt --k 5 [--json]
    python -m lance_assets.forensics near-dups --threshold 0.95 --sample 2000 [--json]

``attribute`` prints the verdict (near-verbatim, edited copy, remixed) and, for each source, the
matched ranges of both texts: ``text[a:b] <-> doc[c:d]`` character offsets with the two excerpts.

Rows searched: those of the table version the newest model trained on (DATA/train/LATEST);
``--version`` pins another one. ``--data`` (default $LANCE_ASSETS_DATA, else ./data).

A mistake in the input (no table yet, a column not materialized, a filter that is not one
predicate over the table's columns, a text file that is not UTF-8) prints one line naming it
and the fix, and exits with status 1; a traceback means a bug. A standard output closed early
(``| head``) ends the printing, with status 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lance_assets.std_streams import run_main


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help="data root (default $LANCE_ASSETS_DATA or ./data)")
    p.add_argument("--version", type=int, default=None,
                   help="table version whose rows to use (default: the newest model's)")
    p.add_argument("--json", action="store_true", help="print JSON")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lance_assets.forensics", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search", help="hybrid (BM25 + vector, RRF), vector or full-text search")
    s.add_argument("query")
    s.add_argument("--k", type=int, default=10)
    s.add_argument("--mode", choices=["hybrid", "vector", "text"], default="hybrid")
    s.add_argument("--filter", default=None, help="extra SQL predicate, e.g. 'NOT is_dup'")
    _common(s)
    a = sub.add_parser("attribute", help="rank the training documents a text draws on")
    src = a.add_mutually_exclusive_group(required=True)
    src.add_argument("--text-file", help="file holding the text ('-' = standard input)")
    src.add_argument("--text", help="the text itself")
    a.add_argument("--k", type=int, default=5)
    _common(a)
    n = sub.add_parser("near-dups", help="semantic near-duplicate pairs on a sample")
    n.add_argument("--threshold", type=float, default=0.95)
    n.add_argument("--sample", type=int, default=2000)
    n.add_argument("--top", type=int, default=10)
    _common(n)
    return p.parse_args(argv)


def _quiet(_msg: str) -> None:
    pass


class UsageError(ValueError):
    """A command-line input that cannot be used; the message says which and what to do."""


def read_text_arg(path: str) -> str:
    """The text of ``--text-file`` ('-' = standard input), which must be UTF-8."""
    where = "standard input" if path == "-" else f"--text-file {path}"
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{where}: is a folder; give a text file") from None
    except PermissionError:
        raise UsageError(f"{where}: not readable (permission denied)") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{where}: not UTF-8 text (invalid byte at offset {err.start}); "
                         "convert it to UTF-8 first (e.g. iconv -t UTF-8)") from None


def check_version(table, version: int | None) -> None:
    """``--version`` names a version of ``table`` (a ``Table``) that is still there."""
    if version is None:
        return
    from lance_assets.table import VersionChoiceError

    try:
        table.choose(version)
    except VersionChoiceError as err:
        raise UsageError(f"--version {version}: {err}") from None


def _user_errors() -> tuple[type[BaseException], ...]:
    from lance_assets.curation.predicate import PredicateError
    from lance_assets.embeddings.embeddings import EmbeddingMismatchError
    from lance_assets.forensics.search import MissingInputError
    from lance_assets.table import TableMissingError
    from lance_assets.train.checkpoint import CheckpointError

    return (UsageError, PredicateError, TableMissingError, MissingInputError,
            EmbeddingMismatchError, FileNotFoundError, CheckpointError)


def print_source(s, text: str, limit: int = 5) -> None:
    """One attributed source: its figures, then the matched ranges of both texts side by side
    (character offsets into the attributed text and into the document)."""
    cos = "-" if s.cosine is None else f"{s.cosine:.3f}"
    passage = (f"passage {s.passage_words} words ({s.passage_unmatched:.0%} changed)"
               if s.passage_words else "no passage")
    print(f"{s.rank:>3}. id {s.id}  score {s.score:.4f}  {passage}  longest span "
          f"{s.longest_span_words} words  coverage {s.coverage:.0%}  cosine {cos}  "
          f"[{'+'.join(s.found_by)}]")
    for m in s.matches[:limit]:
        (t0, t1), (d0, d1) = m["text"], m["doc"]
        print(f"     text[{t0}:{t1}] <-> doc[{d0}:{d1}]  {m['words']} words")
        print(f"       text: {' '.join(text[t0:t1].split())[:160]}")
        print(f"       doc:  {m['excerpt']}")
    if len(s.matches) > limit:
        print(f"     ... {len(s.matches) - limit} more matched ranges (--json lists them)")
    if not s.matches and s.closest_chunk:
        (t0, t1), (d0, d1) = s.closest_chunk["text"], s.closest_chunk["doc"]
        print(f"     closest chunks: text[{t0}:{t1}] <-> doc[{d0}:{d1}]  cosine "
              f"{s.closest_chunk['cosine']:.3f}")
    print(f"     {s.snippet}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    errors = _user_errors()
    try:
        return run(args)
    except errors as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    from lance_assets.table import Table

    table = Table.of(args.data)  # the table under --data (default $LANCE_ASSETS_DATA, ./data)
    check_version(table, args.version)
    log = _quiet if args.json else (lambda m: print(m, file=sys.stderr))
    if args.command == "search":
        from lance_assets.forensics.search import search

        res = search(table, args.query, args.k, mode=args.mode, version=args.version,
                     filter=args.filter)
        if args.json:
            print(json.dumps(res.to_dict(), indent=2))
            return 0
        print(f"{res.mode} search for {res.query!r} over {res.pinned['source']}")
        for note in res.notes:
            print(f"  note: {note}")
        for i, h in enumerate(res.hits, start=1):
            ranks = f"vector #{h.vector_rank or '-'}, text #{h.text_rank or '-'}"
            print(f"{i:>3}. id {h.id}  score {h.score:.4f}  ({ranks})\n     {h.snippet}")
        return 0
    if args.command == "attribute":
        from lance_assets.forensics.attribution import attribute

        text = args.text if args.text is not None else read_text_arg(args.text_file)
        res = attribute(table, text, args.k, version=args.version, log=log)
        if args.json:
            print(json.dumps(res.to_dict(), indent=2))
            return 0
        print(f"verdict: {res.verdict}: {res.reason}")
        print(f"{res.text_words} words, {res.covered_share:.0%} inside shared spans of >= "
              f"{res.min_span_words} words; meaning from {res.meaning} (table version "
              f"{res.table_version})")
        for s in res.sources:
            print_source(s, text)
        return 0
    from lance_assets.forensics.near_dups import semantic_near_dups
    from lance_assets.forensics.pinned import resolve_pin

    res = semantic_near_dups(table, pin=resolve_pin(table, args.version), threshold=args.threshold,
                             sample=args.sample, top=args.top)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
        return 0
    print(f"{res.pairs_above} of {res.pairs} pairs (rate {res.pair_rate:.4%}) in a sample of "
          f"{res.sample_rows} have cosine >= {res.threshold}; "
          f"{res.rows_with_neighbour_share:.1%} of sampled documents have such a neighbour; "
          f"{res.pairs_above_unflagged} of the pairs involve no document flagged by "
          f"{' or '.join(res.flags) or 'dedup'}. Closest such pairs:")
    for r in res.closest:
        print(f"  {r['cosine']:.4f}  {r['id_a']} ~ {r['id_b']}\n     {r['text_a']}\n     {r['text_b']}")
    return 0


if __name__ == "__main__":
    run_main(main, broken=0)  # the search was done: only its printing is lost
