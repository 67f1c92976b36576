"""What share of each source, and of each large domain, every curation rule removes: so that one
rule emptying a whole source (a deduplication that removes 95% of a dataset, a length bound a
source's format never meets) is seen before training, not after.

Sources are grouped as a person names them (``source_name``: a file's folder and extension, a
Hugging Face dataset at its revision, the synthetic corpus); domains are the registered domains
of ``url`` (``url_domain``), those with at least ``min_domain_documents`` documents. One scan of
``id``, ``source``, ``url`` and ``n_tokens``, then one scan per rule of the columns it reads
(Lance evaluates the rule, as training does; a NULL does not pass). A rule that removes more
than ``max_share`` of a source's documents or tokens is a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow.compute as pc

from lance_assets.curation.rules import rule_predicates
from lance_assets.curation.url_domain import UNKNOWN, domain_codes

DEFAULT_MAX_SHARE = 0.9
DEFAULT_MIN_DOMAIN_DOCUMENTS = 50


def source_name(key: str) -> tuple[str, str]:
    """``(name, unit)`` of a stored source key: a file's folder and extension (its file set), a
    Hugging Face dataset with its revision, the synthetic corpus as generated."""
    if key.startswith("file:"):
        path = re.sub(r"@\d+-\d+$", "", key[len("file:"):].split("#", 1)[0])
        folder, _, base = path.rpartition("/")
        ext = base[base.rfind("."):] if "." in base else ""
        return f"file:{folder}/*{ext}", path
    return key.split("#", 1)[0], key.split("#", 1)[0]


@dataclass
class Share:
    kind: str  # source | domain
    group: str
    rule: str
    documents: int  # of the group
    tokens: int | None
    removed_documents: int
    removed_tokens: int | None

    @property
    def document_share(self) -> float:
        return self.removed_documents / self.documents if self.documents else 0.0

    @property
    def token_share(self) -> float | None:
        if self.tokens is None or self.removed_tokens is None:
            return None
        return self.removed_tokens / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict:
        return {"kind": self.kind, "group": self.group, "rule": self.rule,
                "documents": self.documents, "tokens": self.tokens,
                "removed_documents": self.removed_documents,
                "removed_tokens": self.removed_tokens,
                "document_share": round(self.document_share, 4),
                "token_share": None if self.token_share is None else round(self.token_share, 4)}


@dataclass
class Shares:
    shares: list[Share] = field(default_factory=list)
    wiped: list[Share] = field(default_factory=list)  # sources a rule removes > max_share of
    broken: list[str] = field(default_factory=list)  # rules that cannot be evaluated
    max_share: float = DEFAULT_MAX_SHARE
    min_domain_documents: int = DEFAULT_MIN_DOMAIN_DOCUMENTS
    domains_below_floor: int = 0


def _codes(values: list, name_of=lambda v: v) -> tuple[np.ndarray, list[str]]:
    names = sorted({name_of(v) for v in values})
    index = {n: i for i, n in enumerate(names)}
    return np.array([index[name_of(v)] for v in values], dtype=np.int64), names


def rule_shares(ds: lance.LanceDataset, rules: dict[str, str], *,
                max_share: float = DEFAULT_MAX_SHARE,
                min_domain_documents: int = DEFAULT_MIN_DOMAIN_DOCUMENTS) -> Shares:
    """For every source and every domain of at least ``min_domain_documents`` documents, the
    share of its documents and tokens each rule of ``rules`` removes."""
    if not 0 < max_share <= 1:
        raise ValueError(f"max_share {max_share}: give a share in (0, 1]")
    out = Shares(max_share=max_share, min_domain_documents=min_domain_documents)
    names = set(ds.schema.names)
    columns = ["id"] + [c for c in ("source", "url", "n_tokens") if c in names]
    table = ds.to_table(columns=columns)
    ids = table.column("id").to_numpy(zero_copy_only=False)
    tokens = (pc.fill_null(table.column("n_tokens"), 0).to_numpy(zero_copy_only=False)
              .astype(np.int64) if "n_tokens" in names else None)
    groups = []
    if "source" in names:
        raw = pc.fill_null(table.column("source"), "(no source)")
        encoded = pc.dictionary_encode(raw).combine_chunks()
        keys_ = [source_name(k)[0] for k in encoded.dictionary.to_pylist()]
        kcodes, knames = _codes(keys_)
        codes = kcodes[encoded.indices.to_numpy(zero_copy_only=False)] if len(keys_) else \
            np.zeros(len(ids), np.int64)
        groups.append(("source", codes, knames, None))
    if "url" in names:
        codes, dnames = domain_codes(table.column("url"))
        docs = np.bincount(codes, minlength=len(dnames))
        keep = np.array([n != UNKNOWN and docs[i] >= min_domain_documents
                         for i, n in enumerate(dnames)], dtype=bool)
        out.domains_below_floor = int(sum(1 for i, n in enumerate(dnames)
                                          if n != UNKNOWN and not keep[i]))
        groups.append(("domain", codes, dnames, keep))
    usable, problems = rule_predicates(ds, rules)
    out.broken = [p.rule for p in problems]
    totals = {kind: (np.bincount(codes, minlength=len(gnames)),
                     None if tokens is None else np.bincount(codes, tokens, minlength=len(gnames)))
              for kind, codes, gnames, _ in groups}
    for rule, predicate in usable.items():
        passing = ds.to_table(columns=["id"], filter=predicate.lance).column(0) \
            .to_numpy(zero_copy_only=False)
        removed = ~np.isin(ids, passing)
        for kind, codes, gnames, keep in groups:
            docs, toks = totals[kind]
            r_docs = np.bincount(codes[removed], minlength=len(gnames))
            r_toks = None if tokens is None else np.bincount(codes[removed], tokens[removed],
                                                             minlength=len(gnames))
            for i, g in enumerate(gnames):
                if keep is not None and not keep[i]:
                    continue
                share = Share(kind, g, rule, int(docs[i]), None if toks is None else int(toks[i]),
                              int(r_docs[i]), None if r_toks is None else int(r_toks[i]))
                out.shares.append(share)
                if kind == "source" and (share.document_share > max_share
                                         or (share.token_share or 0.0) > max_share):
                    out.wiped.append(share)
    return out


def markdown_rows(shares: Shares, limit: int = 200) -> list[dict]:
    """The table a reviewer reads: every (group, rule) that removes anything, largest share
    first."""
    rows = sorted((s for s in shares.shares if s.removed_documents),
                  key=lambda s: (-s.document_share, s.kind, s.group, s.rule))
    return [{"kind": s.kind, "group": s.group, "rule": s.rule, "documents": s.documents,
             "removed": s.removed_documents, "share of documents": f"{s.document_share:.1%}",
             "share of tokens": "–" if s.token_share is None else f"{s.token_share:.1%}"}
            for s in rows[:limit]]
