"""The forensics report: every generated sample attributed to training documents, and the
corpus's semantic near-duplicates, as Markdown (``DATA/reports/forensics.md``) and JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lance_assets import paths, storage
from lance_assets.embeddings.embeddings import EMBEDDING
from lance_assets.forensics.attribution import Attribution, Attributor
from lance_assets.forensics.near_dups import NearDupReport, semantic_near_dups
from lance_assets.forensics.pinned import Pin, resolve_pin
from lance_assets.markdown import markdown_table
from lance_assets.progress import phase, progress
from lance_assets.table import Table


@dataclass
class ForensicsReport:
    pin: Pin
    samples_file: str
    checkpoint: str | None
    attributions: list[dict]  # {"prompt", "text", "attribution": Attribution.to_dict()}
    near_dups: NearDupReport | None
    duration_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def verdicts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.attributions:
            v = a["attribution"]["verdict"]
            out[v] = out.get(v, 0) + 1
        return out

    def to_dict(self) -> dict:
        return {"pin": self.pin.to_dict(), "samples_file": self.samples_file,
                "checkpoint": self.checkpoint, "attributions": self.attributions,
                "near_dups": self.near_dups.to_dict() if self.near_dups else None,
                "duration_s": round(self.duration_s, 3), "notes": self.notes,
                "verdicts": self.verdicts}

    def markdown(self, quote: bool = True) -> str:
        """The report; ``quote=False`` leaves out every text (the samples, the documents of
        the closest pairs), for records that ``forget`` cannot reach."""
        lines = [f"**Pinned rows:** {self.pin.source}.", ""]
        if self.pin.train_filter:
            # a fenced block: the filter quotes columns with backticks
            lines += ["Training documents:", "", "```sql", self.pin.train_filter.replace("```", ""),
                      "```", ""]
        for i, a in enumerate(self.attributions, start=1):
            att = a["attribution"]
            prompt = a["prompt"] or "(unconditional)"
            lines += [f"### Sample {i}: {_cell(prompt)} — **{att['verdict']}**", "",
                      *(["> " + _cell(a["text"][:300]), ""] if quote else []),
                      f"{att['reason']}. {att['text_words']} words; "
                      f"{att['covered_share']:.0%} inside shared spans of >= "
                      f"{att['min_span_words']} words; meaning from {att['meaning']}.", ""]
            rows = [{"rank": s["rank"], "id": s["id"], "score": s["score"],
                     "passage (words, changed)":
                         f"{s['passage_words']}, {s['passage_unmatched']:.0%}"
                         if s["passage_words"] else "",
                     "coverage": f"{s['coverage']:.0%}",
                     "cosine": "" if s["cosine"] is None else s["cosine"],
                     "found by": "+".join(s["found_by"]),
                     "matched ranges (text ↔ document, characters)": _cell(matched_ranges(s))}
                    for s in att["sources"]]
            lines += [markdown_table(rows), ""]
        if self.near_dups is not None:
            nd = self.near_dups
            lines += ["### Semantic near-duplicates", "",
                      f"{nd.pairs_above} of {nd.pairs:,} pairs in a sample of {nd.sample_rows} "
                      f"documents have cosine >= {nd.threshold} (rate {nd.pair_rate:.4%}); "
                      f"{nd.rows_with_neighbour_share:.1%} of the sampled documents have such a "
                      f"neighbour. {nd.pairs_above - nd.pairs_above_unflagged} of those pairs "
                      f"involve a document already flagged by {' or '.join(nd.flags) or 'no flag'}; "
                      f"{nd.pairs_above_unflagged} do not. The closest pairs dedup did not flag:", "",
                      markdown_table([{k: _cell(str(v)) for k, v in r.items()
                                       if quote or not isinstance(v, str)}
                                      for r in nd.closest]), ""]
        lines += [f"_{n}_" for n in self.notes]
        return "\n".join(lines)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "/")


def matched_ranges(source: dict, limit: int = 3) -> str:
    """``a–b ↔ c–d (n w)``: character ranges of the attributed text and of the document for the
    first ``limit`` matches of a source (a ``Source.to_dict()``), or its closest chunk pair when
    no words are shared."""
    ms = source["matches"]
    if ms:
        out = "; ".join(f"{m['text'][0]}–{m['text'][1]} ↔ {m['doc'][0]}–{m['doc'][1]} "
                        f"({m['words']} w)" for m in ms[:limit])
        return out + (f"; +{len(ms) - limit} more" if len(ms) > limit else "")
    c = source.get("closest_chunk")
    if c:
        return (f"closest chunks {c['text'][0]}–{c['text'][1]} ↔ {c['doc'][0]}–{c['doc'][1]} "
                f"(cosine {c['cosine']:.2f})")
    return ""


def load_samples(root: str | Path) -> tuple[Path, dict]:
    path = paths.samples_dir(root) / "samples.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: materialize `samples` first")
    return path, json.loads(path.read_text())


def forensics_report(table: Table, *, k: int = 5,
                     version: int | None = None,
                     near_dup_threshold: float = 0.95, near_dup_sample: int = 2000,
                     attributor: Attributor | None = None,
                     log: Callable[[str], None] = print) -> ForensicsReport:
    """Attribute every sample in ``samples.json``; add the semantic near-duplicates. Written to
    ``DATA/reports/forensics.{md,json}``."""
    start = time.perf_counter()
    root = paths.data_dir(table.root)
    samples_path, samples = load_samples(root)
    pin = attributor.pin if attributor else resolve_pin(table, version)
    att = attributor or Attributor(table, pin, log=log)
    notes = []
    results = []
    with progress(len(samples["samples"]), "forensics: attributing", "sample", log) as bar:
        for s in samples["samples"]:
            text = s["prompt"] + s["completion"]
            a: Attribution = att.attribute(text, k)
            results.append({"prompt": s["prompt"], "text": text, "attribution": a.to_dict()})
            log(f"sample {s['prompt']!r}: {a.verdict} ({a.reason})")
            bar.update(1)
    near = None
    if EMBEDDING.name in att.latest.schema.names:
        with phase(f"forensics: semantic near-duplicates among {near_dup_sample:,} documents",
                   log):
            near = semantic_near_dups(table, pin=pin, threshold=near_dup_threshold,
                                      sample=near_dup_sample)
    else:
        notes.append("no `embedding` column: semantic near-duplicates skipped")
    if not att.has_vectors:
        notes.append("no `chunk_embeddings` or `embedding` column: attribution by shared words "
                     "only (materialize `chunk_embeddings` for meaning over whole documents)")
    report = ForensicsReport(pin, str(samples_path), samples.get("checkpoint"), results, near,
                             time.perf_counter() - start, notes)
    out = paths.reports_dir(root)
    storage.write_atomic(out / "forensics.md", (report.markdown() + "\n").encode())
    storage.write_atomic(out / "forensics.json", json.dumps(report.to_dict(), indent=2).encode())
    return report
