"""Can `mixture_search` tell, and how long does it take with its defaults?

    python -m benchmarks.mixture_search [--mb 2] [--junk-share 0.33] [--corpus real|synthetic]
                                        [--config '{"token_budget": ...}'] [--only planted|halves]

Two searches, each the `mixture_search` asset end to end (torchrun through Dagster Pipes for
every run) with its default config, on corpora made offline and byte-tokenized:

- **planted**: two real-text domains, `docs` (the documentation installed on this machine:
  /usr/share/doc and the ``.rst``/``.md``/``.txt`` files of Python packages) and `code` (their
  ``.py`` sources), ``--mb`` MB each, cut at blank lines into documents of about 4,000
  characters, and a `junk` domain of random consonant strings making
  ``--junk-share`` of the bytes; the target is `docs`. The right answer: under a tenth on
  `junk`, and a real lead over the natural mixture (the shares as stored).
- **halves**: the docs and code together, each document put in domain `a` or `b` by a coin:
  no lead may be called real.

``--paired CONFIG ...``: no search; how far a proxy's seeds scatter under each config (the
per-seed leads of one fixed mixture over the natural one, in this process, one thread).
``--corpus synthetic``: the planted corpora of ``lance_assets.testing.mixture_planted`` (what
the tests search). Prints one row per search: the chosen weights, the verified mixtures'
held-out bits/byte, the lead over natural ± its 95 % interval, the smallest detectable lead,
the verdict, the regression's leave-one-out error, wall seconds and CPU seconds (this process
and every run it launched), and the load average while it ran (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.tokenize_bench import local_texts
from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.testing.mixture_planted import (
    planted_domains,
    random_halves,
    url_domains,
    with_junk,
)
from lance_assets.tokens import token_ids

DOC_SUFFIXES = (".rst", ".md", ".txt", ".gz")
PIECE_CHARS = 4000


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` cut at blank lines into documents of about ``size`` characters (a web page's
    size: the held-out error is counted over documents, and a few long files would leave few)."""
    out, current = [], ""
    for para in text.split("\n\n"):
        if current and len(current) + len(para) > size:
            out.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    return out + ([current] if current.strip() else [])


def real_texts(mb: float) -> dict[str, list[str]]:
    """``mb`` MB of local documentation and of local Python sources, in pieces."""
    out: dict[str, list[str]] = {"docs": [], "code": []}
    size = {"docs": 0, "code": 0}
    for path, raw, text in local_texts():
        domain = "code" if path.suffix == ".py" else "docs" if path.suffix in DOC_SUFFIXES else None
        if domain is None or size[domain] >= mb * 1e6:
            continue
        out[domain] += [p for p in pieces(text) if p.strip()]
        size[domain] += len(raw)
        if min(size.values()) >= mb * 1e6:
            break
    return out


def corpus(kind: str, source: str, mb: float, junk_share: float) -> tuple[pa.Table, list[str], str]:
    """(table, domains, target) of one search."""
    if source == "synthetic":
        if kind == "planted":
            return planted_domains(), ["prose", "code", "junk"], "url LIKE '%/prose/%'"
        return random_halves(), ["a", "b"], ""
    texts = real_texts(mb)
    if kind == "planted":
        return with_junk(texts, junk_share), ["docs", "code", "junk"], "url LIKE '%/docs/%'"
    rng = random.Random(0)
    both = [t for docs in texts.values() for t in docs]
    rng.shuffle(both)
    urls = [f"https://example.org/{rng.choice('ab')}/{i}" for i in range(len(both))]
    return pa.table({"text": both, "url": urls}), ["a", "b"], ""


def build(work: Path, table: pa.Table) -> Path:
    root = work / "data"
    if Table.of(root).exists():
        return root
    work.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, work / "corpus.parquet")
    quiet = lambda _m: None  # noqa: E731
    ingest(Table.of(root), str(work / "corpus.parquet"), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"),
            log=quiet)
    return root


class LoadSampler:
    """The 1-minute load average every 10 s while a search runs (a shared machine shows)."""

    def __init__(self):
        self.samples, self._stop = [os.getloadavg()[0]], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(10):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> str:
        self._stop.set()
        return f"{sum(self.samples) / len(self.samples):.1f} (max {max(self.samples):.1f})"


def cpu_seconds() -> float:
    own, children = (resource.getrusage(resource.RUSAGE_SELF),
                     resource.getrusage(resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


CHOSEN = {"docs": 0.93, "code": 0.05, "junk": 0.02}


def paired(root: Path, overrides: list[dict], seeds=(0, 1, 2)) -> None:
    """How far apart a proxy's seeds scatter under each config: the ``CHOSEN`` and the natural
    mixture of the planted table, once per seed, every run the trainer's CLI in this process
    with the asset's settings (one torch thread); per-seed leads of the chosen over natural."""
    import contextlib
    import io
    import statistics

    import numpy as np
    import torch

    from lance_assets.ablation import mixture
    from lance_assets.defs.training.mixture import MixtureConfig
    from lance_assets.table.fingerprint import digest
    from lance_assets.train.trainer import main as train

    torch.set_num_threads(1)
    table = Table.of(root)
    version = table.choose().version
    table.snapshots.hold("ablation-mixture-paired", version, owner="benchmark", kind="ablation")
    print("| config | steps | per-seed leads | mean | sd | chosen bpb | natural bpb | CPU s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for override in overrides:
        cfg = MixtureConfig(name="paired", domains=url_domains(CHOSEN), filter="NOT is_dup",
                            target="url LIKE '%/docs/%'", **override)
        plan = mixture.plan_search(table.open(version), cfg, cfg.filter)
        arms = {"chosen": np.array(list(CHOSEN.values())),
                "natural": mixture.rounded(plan.vector("natural"), np.ones(3))}
        got, c0 = {}, cpu_seconds()
        for seed in seeds:
            for arm, weights in arms.items():
                out = root.parent / "paired" / digest(override) / f"{arm}-{seed}"
                spec = mixture.make_run(table, cfg, plan, weights, seed, out,
                                        ("ablation-mixture-paired", version))
                if not (out / "summary.json").is_file():
                    with contextlib.redirect_stdout(io.StringIO()):
                        train(spec.argv())
                got[arm, seed] = json.loads((out / "summary.json").read_text())["val_bpb"]
        leads = [got["natural", s] - got["chosen", s] for s in seeds]
        print(f"| {json.dumps(override)} | {plan.steps} | {', '.join(f'{x:+.3f}' for x in leads)} "
              f"| {statistics.fmean(leads):.3f} | {statistics.stdev(leads):.3f} | "
              f"{statistics.fmean(got['chosen', s] for s in seeds):.3f} | "
              f"{statistics.fmean(got['natural', s] for s in seeds):.3f} | "
              f"{cpu_seconds() - c0:.0f} |", flush=True)


def main() -> None:
    from lance_assets.defs.training.mixture import materialize_in_process  # Dagster: seconds

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=("real", "synthetic"), default="real")
    ap.add_argument("--mb", type=float, default=2.0, help="MB of docs and of code")
    ap.add_argument("--junk-share", type=float, default=0.33)
    ap.add_argument("--config", default="{}", help="JSON overriding the asset's defaults")
    ap.add_argument("--only", choices=("planted", "halves"), default=None)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--paired", nargs="+", default=None, metavar="CONFIG",
                    help="instead of searching: for each JSON config, the per-seed leads of "
                         "docs 0.93 / code 0.05 / junk 0.02 over the natural mixture (planted)")
    args = ap.parse_args()
    os.environ.setdefault("LANCE_LOG", "error")
    work = args.work or Path(tempfile.mkdtemp(prefix="mixture-search-"))
    override = json.loads(args.config)
    if args.paired:
        if args.corpus != "real":
            ap.error("--paired compares mixtures of the real corpus's docs, code and junk")
        table, _, _ = corpus("planted", args.corpus, args.mb, args.junk_share)
        paired(build(work / f"{args.corpus}-planted", table), [json.loads(c) for c in args.paired])
        return
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; work {work}; "
          f"config {override or 'defaults'}")
    print("| search | right answer | chosen weights | held-out bits/byte (chosen, natural, "
          "uniform) | lead over natural ± 95 % | smallest detectable | verdict | regression "
          "LOO error (R²) | runs | wall s | CPU s | load |")
    print("|---|---|---|---|---:|---:|---|---|---:|---:|---:|---:|")
    for kind in ("planted", "halves"):
        if args.only and kind != args.only:
            continue
        table, names, target = corpus(kind, args.corpus, args.mb, args.junk_share)
        root = build(work / f"{args.corpus}-{kind}", table)
        config = {"name": kind, "domains": url_domains(names), "target": target,
                  "filter": "NOT is_dup", **override}
        t0, c0, load = time.perf_counter(), cpu_seconds(), LoadSampler()
        meta = materialize_in_process(root, config).asset_materializations_for_node(
            "mixture_search")[0].metadata
        wall, cpu, load = time.perf_counter() - t0, cpu_seconds() - c0, load.stop()
        weights = meta["weights"].value
        bpb = ", ".join(str(meta[f"arm/{a}/val_bpb"].value) if f"arm/{a}/val_bpb" in meta
                        else "—" for a in ("chosen", "natural", "uniform"))
        verdict = {True: "real", False: "not real"}.get(meta["lead_is_real"].value, "unknown")
        right = ("junk < 0.1, real" if kind == "planted" else "no real lead")
        print(f"| {kind} | {right} | {json.dumps(weights)} | {bpb} | "
              f"{meta['lead_over_natural'].value} ± {meta['lead_over_natural_ci95'].value} | "
              f"{meta['smallest_detectable_lead'].value} | {verdict} | "
              f"{meta['regression_loo_rmse'].value} ({meta['regression_loo_r2'].value}) | "
              f"{meta['runs_trained'].value} (+{meta['runs_reused'].value} reused) | "
              f"{wall:.0f} | {cpu:.0f} | {load} |", flush=True)


if __name__ == "__main__":
    main()
