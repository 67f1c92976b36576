"""What ``forget`` reaches beyond the table: files under the data root that quote a forgotten
document (reports, stories, samples), removed and named with the asset that writes them again,
and artifacts made from the documents that cannot be edited (a corpus tokenizer), named with the
command that rebuilds them. A file quotes a document when it holds eight of its words in a row
(all of it when shorter), whatever it cut or wrapped around the quote; shingle hashes live in
the forgetting process only."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import lance

from lance_assets import paths

SHINGLE_WORDS = 8
# Files under the data root that may quote documents, and the asset that writes them again.
QUOTING = ("reports", "samples")
WRITER = {"stories": "document_stories", "forensics": "forensics", "samples": "samples",
          "corpus_profile": "corpus_profile"}
TEXT_SUFFIXES = (".md", ".json", ".jsonl", ".txt", ".csv", ".html")
MATERIALIZE = "dagster asset materialize -m lance_assets.definitions --select {}"


def texts(ds: lance.LanceDataset, filters: list[str]) -> list[str]:
    if "text" not in ds.schema.names:
        return []
    return [t for f in filters for t in ds.to_table(columns=["text"], filter=f)
            .column("text").to_pylist() if t]


def _windows(words: list[str], k: int) -> Iterator[int]:
    return (hash(" ".join(words[i:i + k])) for i in range(len(words) - k + 1))


def shingles(texts: list[str]) -> dict[int, set[int]]:
    """``{k: hashes}`` of every run of SHINGLE_WORDS words of ``texts`` (k = SHINGLE_WORDS), or
    of the whole text when it is shorter (k = its words): what a file quoting one of them holds,
    whatever it cut or wrapped around the quote. Hashes live in this process only."""
    out: dict[int, set[int]] = {}
    for text in texts:
        words = text.split()
        k = min(SHINGLE_WORDS, len(words))
        if k:
            out.setdefault(k, set()).update(_windows(words, k))
    return out


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _plain_text(path, raw: str) -> str:
    """A file's text as a reader sees it: a JSON file's strings unescaped."""
    if path.name.endswith((".json", ".jsonl")):
        try:
            docs = [json.loads(raw)] if path.name.endswith(".json") else \
                [json.loads(line) for line in raw.splitlines() if line.strip()]
            return "\n".join(s for d in docs for s in _strings(d))
        except ValueError:
            pass
    return raw


def quotes(text: str, fingerprints: dict[int, set[int]]) -> bool:
    words = text.split()
    return any(h in hashes for k, hashes in fingerprints.items() for h in _windows(words, k))


def _rebuild(root, path) -> str:
    """The command that writes ``path`` again (none for a file no asset writes)."""
    rel = path.relative_to(root).parts
    key = rel[1] if len(rel) > 2 else (rel[0] if rel[0] == "samples" else path.stem)
    return MATERIALIZE.format(WRITER[key]) if key in WRITER else "(no asset writes it)"


def scrub_files(root, fingerprints: dict[int, set[int]], ids: set[str],
                log: Callable[[str], None]) -> list[dict]:
    """Remove every file under the data root's reports and samples that quotes a forgotten
    document (eight words of it in a row, or all of a shorter one), and every story named by a
    forgotten id; returns what was removed and the asset that writes it again."""
    removed = []
    for folder in QUOTING:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or not path.name.endswith(TEXT_SUFFIXES):
                continue
            named = path.parent.name == "stories" and path.stem in ids
            try:
                hit = named or quotes(_plain_text(path, path.read_text(errors="replace")),
                                      fingerprints)
            except FileNotFoundError:
                continue
            if hit:
                path.unlink()
                removed.append({"path": str(path),
                                "rebuild": _rebuild(root, path)})
                log(f"forget: removed {path} (it quoted a forgotten document)")
    return removed


def artifacts(root) -> list[dict]:
    """Artifacts made from the documents that cannot be edited: a corpus tokenizer (a BPE
    learns its merges from every document it reads)."""
    out = []
    pointer = paths.tokenizers_dir(root) / "LATEST"
    if pointer.is_file():
        out.append({"path": str(paths.tokenizers_dir(root) / f"{pointer.read_text().strip()}.json"),
                    "rebuild": MATERIALIZE.format("tokenizer")})
    return out
