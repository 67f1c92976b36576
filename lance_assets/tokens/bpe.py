"""A byte-level BPE trained on the curated corpus (the ``tokenizer`` asset's library).

Training sample, reproducible from the table alone:

- documents that pass the curation filter (``NOT is_dup``), never the held-out slice
  ``id % 20 = 0`` (the trainer's validation split): the tokenizer never sees validation text;
- when the candidates hold more than ``max_train_bytes``, a fixed 1-in-k subset by id
  (``(id * 7919) % 1000 < k``, spread over the whole corpus), read in storage order and cut at
  ``max_train_bytes``.

``rustbpe`` learns the merges with the GPT-4 split pattern; the result is exported as a tiktoken
encoding: the learned ranks (256 single bytes first, then merges), ``<|endoftext|>`` = EOS and
``<|pad|>`` = PAD right after them (PAD is never produced by encoding text). The file is JSON,
named by its own sha256, under ``DATA/tokenizers/``; ``DATA/tokenizers/LATEST`` names the newest.
Finding and loading the file (``bpe``, ``bpe:<sha256>``) is ``tokenizers.py``'s job.
Bytes/token is measured on up to ``heldout_max_bytes`` of held-out text, for this BPE, for bytes
and for cl100k_base.

A tokenizer outlives the rows it was trained on: running again reuses the newest BPE when the
settings are the same and either the table is unchanged or its ``input_ids`` already use that BPE
(so a daily catch-up does not mint tokenizers nobody uses); ``retrain`` forces a new one.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lance

from lance_assets import paths, storage
from lance_assets.progress import Progress, phase, progress
from lance_assets.table import Table
from lance_assets.tokens.tokenizers import (
    EOS_TOKEN,
    FORMAT,
    PAD_TOKEN,
    ByteTokenizer,
    TiktokenTokenizer,
    has_token_data,
    latest_sha,
    load_bpe,
    load_tokenizer,
    table_tokenizer,
)

# GPT-4's (cl100k_base) pre-tokenization: contractions, words, 1-3 digit numbers, punctuation
# runs, newlines, other whitespace. Merges never cross these chunk boundaries.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
HELDOUT_MOD = 20  # the same slice as the trainer's frozen validation split (id % 20 = 0)
DEFAULT_VOCAB_SIZE = 8192  # ids including EOS and PAD; 32768 recommended for real corpora
DEFAULT_MAX_TRAIN_BYTES = 100_000_000
DEFAULT_HELDOUT_MAX_BYTES = 10_000_000
DEFAULT_FILTER = "NOT is_dup"
COMPARE_WITH = ("byte", "cl100k_base")


# ---------------------------------------------------------------------------------------------
# The file: JSON, deterministic bytes, named by its sha256.


def file_bytes(ranks: list[bytes], pattern: str = SPLIT_PATTERN) -> bytes:
    """The tokenizer file for ``ranks`` (token bytes in rank order)."""
    doc = {
        "format": FORMAT,
        "pattern": pattern,
        "special_tokens": {EOS_TOKEN: len(ranks), PAD_TOKEN: len(ranks) + 1},
        "ranks": [base64.b64encode(t).decode("ascii") for t in ranks],
    }
    return (json.dumps(doc, indent=0, sort_keys=True) + "\n").encode("utf-8")


def save(root: str | os.PathLike, ranks: list[bytes], pattern: str = SPLIT_PATTERN) -> Path:
    """Write the file (atomically) as ``DATA/tokenizers/<sha256>.json``; returns its path."""
    data = file_bytes(ranks, pattern)
    sha = hashlib.sha256(data).hexdigest()
    path = paths.tokenizers_dir(root) / f"{sha}.json"
    if not path.is_file():
        storage.write_atomic(path, data)
    return path


def _set_latest(root: str | os.PathLike, sha: str) -> None:
    storage.write_atomic(paths.tokenizers_dir(root) / "LATEST", (sha + "\n").encode())


# ---------------------------------------------------------------------------------------------
# Training.


@dataclass
class BpeReport:
    name: str  # bpe:<sha256>, what token_ids and the sampler load
    sha256: str
    path: str
    vocab_size: int  # ids, including EOS and PAD
    vocab_size_requested: int
    merges: int
    eos_id: int
    pad_id: int
    train_docs: int
    train_bytes: int
    train_s: float  # reading the sample + rustbpe training
    heldout_docs: int
    heldout_bytes: int
    bytes_per_token: dict[str, float | None] = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    nothing_to_do: bool = False
    duration_s: float = 0.0

    @property
    def saturated(self) -> bool:
        """True when the corpus ran out of pairs to merge before the requested vocabulary."""
        return self.vocab_size < self.vocab_size_requested


def _sidecar(root: str | os.PathLike, sha: str) -> Path:
    return paths.tokenizers_dir(root) / f"{sha}.train.json"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _spec(ds: lance.LanceDataset, **settings) -> dict:
    """What a training depends on: the settings, and the table's fragments (its rows)."""
    spec = {**settings, "heldout_mod": HELDOUT_MOD, "pattern": SPLIT_PATTERN, "format": FORMAT,
            "rustbpe": importlib.metadata.version("rustbpe")}
    spec["settings_fingerprint"] = _digest(spec)
    spec["fragments"] = [[f.fragment_id, f.physical_rows, f.metadata.num_deletions]
                         for f in ds.get_fragments()]
    spec["fingerprint"] = _digest(spec)
    return spec


def _reusable(ds: lance.LanceDataset, spec: dict, stored: dict) -> str | None:
    """Why the newest BPE can stand, or None: same settings, and either the same table state
    or the table's input_ids already hold it (a new BPE would not be used by them)."""
    old = stored.get("spec", {})
    if old.get("settings_fingerprint", "") != spec["settings_fingerprint"]:
        return None
    if old.get("fingerprint") == spec["fingerprint"]:
        return "trained on this table state with these settings"
    current = table_tokenizer(ds)
    if current is not None and current.sha256 == stored["sha256"] and has_token_data(ds):
        return ("the table's input_ids use it (new rows since; `retrain` to train on them, then "
                "re-tokenize with token_ids `replace`)")
    return None


def _check_filter(ds: lance.LanceDataset, where: str) -> str:
    """``where`` parsed against the table's columns and rendered for Lance (user text is
    never handed to Lance as typed); a clear error when it cannot run."""
    from lance_assets.curation.predicate import safe_predicate

    try:
        lance_sql = safe_predicate(where, ds.schema.names).lance
        ds.count_rows(filter=lance_sql)
        return lance_sql
    except Exception as exc:
        raise ValueError(
            f"filter {where!r} cannot run on {ds.uri} ({exc}). It is SQL over the table's "
            f"columns {ds.schema.names}; `NOT is_dup` needs `dedup_flag` materialized first."
        ) from exc


def sample_filter(ds: lance.LanceDataset, where: str, max_bytes: int) -> str:
    """The SQL predicate selecting the training sample (see the module docstring)."""
    candidates = f"({where}) AND id % {HELDOUT_MOD} != 0"
    total = 0
    for batch in ds.scanner(columns=["n_chars"], filter=candidates).to_batches():
        total += int(batch.column(0).to_numpy(zero_copy_only=False).sum())
    if total <= max_bytes:
        return candidates
    per_mille = max(1, math.ceil(1000 * max_bytes / total))
    return f"{candidates} AND (id * 7919) % 1000 < {per_mille}"


def _texts(ds: lance.LanceDataset, where: str, max_bytes: int, counter: dict) -> Iterator[str]:
    """Texts matching ``where`` in storage order until ``max_bytes`` UTF-8 bytes were given."""
    for batch in ds.scanner(columns=["text"], filter=where, batch_size=1024).to_batches():
        for text in batch.column(0).to_pylist():
            if counter["bytes"] >= max_bytes:
                return
            counter["docs"] += 1
            counter["bytes"] += len(text.encode("utf-8"))
            yield text


def _counted(texts: Iterator[str], bar: Progress) -> Iterator[str]:
    """``texts``, each counted on ``bar``; once they are all read the merges are learnt."""
    for text in texts:
        bar.update(1)
        yield text
    bar.note("learning the merges")


def bytes_per_token(tokenizers: dict, texts: list[str]) -> dict[str, float | None]:
    """UTF-8 bytes per token of ``texts`` under each tokenizer (None when there is no text)."""
    import pyarrow as pa

    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    out = {}
    for name, tok in tokenizers.items():
        ids = tok.encode_batch(pa.array(texts, pa.string()))
        n_tokens = len(ids.values)
        out[name] = round(n_bytes / n_tokens, 3) if n_tokens else None
    return out


def train_bpe(
    table: Table,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    max_train_bytes: int = DEFAULT_MAX_TRAIN_BYTES,
    filter: str = DEFAULT_FILTER,
    heldout_max_bytes: int = DEFAULT_HELDOUT_MAX_BYTES,
    compare_with: Iterable[str] = COMPARE_WITH,
    retrain: bool = False,
    log: Callable[[str], None] = print,
) -> BpeReport:
    """Train the corpus BPE, or reuse the newest one when its settings are the same and either
    the table has not changed or its input_ids already use it (``retrain`` forces training);
    returns what was trained and how well it compresses. The
    tokenizer is saved under the table's data root."""
    start = time.perf_counter()
    if vocab_size < 258:
        raise ValueError(f"vocab_size {vocab_size}: needs at least 258 ids (256 bytes, EOS, PAD)")
    root = table.root
    ds = table.newest()
    checked = _check_filter(ds, filter)
    spec = _spec(ds, vocab_size=vocab_size, max_train_bytes=max_train_bytes, filter=filter,
                 heldout_max_bytes=heldout_max_bytes, compare_with=list(compare_with))
    previous = latest_sha(root)
    if previous and _sidecar(root, previous).is_file() and not retrain:
        stored = json.loads(_sidecar(root, previous).read_text())
        path = paths.tokenizers_dir(root) / f"{previous}.json"
        why = _reusable(ds, spec, stored) if path.is_file() else None
        if why:
            log(f"tokenizer {stored['name']}: {why}; nothing to do")
            return BpeReport(**{**stored, "path": str(path), "nothing_to_do": True,
                                "duration_s": time.perf_counter() - start})

    import rustbpe

    where = sample_filter(ds, checked, max_train_bytes)
    counter = {"docs": 0, "bytes": 0}
    t0 = time.perf_counter()
    trainer = rustbpe.Tokenizer()
    with progress(None, "tokenizer: training the BPE", "text", log) as bar:
        bar.note("reading texts")
        trainer.train_from_iterator(_counted(_texts(ds, where, max_train_bytes, counter), bar),
                                    vocab_size - 2, pattern=SPLIT_PATTERN)
    train_s = time.perf_counter() - t0
    if not counter["docs"]:
        raise ValueError(f"no documents of {ds.uri} pass {where!r}: nothing to train a BPE on")
    ranked = sorted(((bytes(tok), rank) for tok, rank in trainer.get_mergeable_ranks()),
                    key=lambda kv: kv[1])
    if [r for _, r in ranked] != list(range(len(ranked))):
        raise RuntimeError("rustbpe returned non-contiguous ranks")
    path = save(root, [t for t, _ in ranked])
    tok = load_bpe(str(path))
    log(f"trained BPE {tok.info.name[:16]}: {len(ranked)} tokens from {counter['docs']} docs "
        f"({counter['bytes'] / 1e6:.1f} MB) in {train_s:.1f}s")

    with phase("tokenizer: bytes per token on held-out text", log, announce=False):
        heldout = list(_texts(ds, f"({checked}) AND id % {HELDOUT_MOD} = 0", heldout_max_bytes,
                              held := {"docs": 0, "bytes": 0}))
        compared = {"bpe": tok, **{name: load_tokenizer(name) if name != "byte"
                                   else ByteTokenizer() for name in compare_with}}
        per_token = bytes_per_token(compared, heldout) if heldout else {}
    report = BpeReport(
        name=tok.info.name, sha256=tok.info.sha256, path=str(path),
        vocab_size=tok.info.vocab_size, vocab_size_requested=vocab_size,
        merges=len(ranked) - 256, eos_id=tok.info.eos_id, pad_id=tok.info.pad_id,
        train_docs=counter["docs"], train_bytes=counter["bytes"], train_s=round(train_s, 3),
        heldout_docs=held["docs"], heldout_bytes=held["bytes"],
        bytes_per_token=per_token,
        spec=spec,
    )
    stored = {k: v for k, v in asdict(report).items() if k not in ("nothing_to_do", "duration_s")}
    storage.write_atomic(_sidecar(root, report.sha256), json.dumps(stored, indent=1).encode())
    _set_latest(root, report.sha256)
    report.duration_s = time.perf_counter() - start
    return report


def longest_token_lengths(tok: TiktokenTokenizer, n: int = 12) -> list[int]:
    """The byte lengths of the ``n`` longest learned tokens."""
    return sorted((len(t) for t in tok.ranks), reverse=True)[:n]


def longest_tokens(tok: TiktokenTokenizer, n: int = 12) -> list[str]:
    """The ``n`` longest learned tokens, as text (for a glance at what the BPE learned)."""
    tokens = sorted(tok.ranks, key=lambda t: (-len(t), t))[:n]
    return [t.decode("utf-8", errors="replace") for t in tokens]
