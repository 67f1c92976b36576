"""Can `curation_ablation` tell? Planted junk on real text, before and after paired verdicts.

    python -m benchmarks.ablation_power [--corpus real|sentences] [--plantings 0 1] [--mb 3]
                                        [--junk-share 0.2] [--config '{"token_budget": ...}']
                                        [--before]

``--corpus real``: real text found offline (the Python sources and docs installed on this
machine and /usr/share/doc, ``benchmarks.tokenize_bench.build_corpus``) plus planted word salad
(the real text's own words in random order, hard-wrapped like it) making ``--junk-share`` of the
bytes. ``--corpus sentences``: ``corpus.synthetic.planted_junk``, short sentences and salad of
their words (the corpus ``test_ablation_power.py`` plants). A FineWeb-Edu-style ``score`` column
marks them (4 clean, 0.5 salad); byte tokens, so bits/byte is exact.
The held-out split is clean text only (``eval_filter: score >= 3``). Per planting seed
(a new salad and a new document order, so a new held-out split), two comparisons, each the
`curation_ablation` asset end to end (torchrun through Dagster Pipes) with its default config:

- **junk**: ``keep_all`` (every document) against ``drop_junk`` (``score >= 3``): the right
  answer is ``drop_junk``, and a real lead;
- **null**: the junk removed from both arms: ``drop_junk`` against ``drop_junk_subset``
  (``score >= 3`` and a fifth of the documents dropped by id): no lead is real.

``--before`` also runs the old defaults (8,192 tokens per arm, 16 evaluation blocks, batch 8,
seeds 0 and 1) and judges them with the old rule (a lead is clear beyond twice the larger seed
standard deviation), on the same tables. Prints one row per (planting, comparison, config).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.tokenize_bench import build_corpus
from lance_assets import paths
from lance_assets.curation import dedup_flag
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import planted_junk
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids

JUNK = {"keep_all": {}, "drop_junk": {"quality": "score >= 3"}}
NULL = {"drop_junk": {"quality": "score >= 3"},
        "drop_junk_subset": {"quality": "score >= 3", "subset": "id % 5 != 0"}}
HELD_OUT = "score >= 3"
BEFORE = {"token_budget": 8192, "eval_blocks": 16, "batch_size": 8, "seeds": [0, 1]}


def word_salad(texts: list[str], share: float, seed: int) -> list[str]:
    """Documents of the corpus's own words in random order, ``share`` of all bytes together."""
    rng = random.Random(seed)
    words = [w for t in texts for w in t.split()]
    real = sum(len(t.encode()) for t in texts)
    target, size, out = share / (1 - share) * real, 0, []
    while size < target:
        doc = "\n".join(textwrap.wrap(" ".join(rng.choices(words, k=rng.randrange(300, 1500))), 72))
        out.append(doc)
        size += len(doc.encode())
    return out


def planted_table(work: Path, corpus: str, mb: float, share: float, seed: int) -> Path:
    root = work / f"{corpus}-{seed}" / "data"
    if Table.of(root).exists():
        return root
    if corpus == "sentences":
        texts, scores = planted_junk(junk_share=share, seed=seed)
        rows = list(zip(texts, scores))
    else:
        source, _, _ = build_corpus(work / "local_text.parquet", int(mb * 1e6))
        real = pq.read_table(source).column("text").to_pylist()
        salad = word_salad(real, share, seed)
        rows = [(t, 4.0) for t in real] + [(t, 0.5) for t in salad]
        random.Random(seed).shuffle(rows)
    parquet = root.parent / "planted.parquet"
    parquet.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": [t for t, _ in rows], "score": [s for _, s in rows]}), parquet)
    quiet = lambda _m: None  # noqa: E731
    ingest(Table.of(root), str(parquet), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)
    return root


def old_rule(results: dict) -> str:
    """The verdict before paired seeds: clear beyond twice the larger seed sd."""
    arms = sorted((a for a in results["arms"] if a["val_mean"] is not None),
                  key=lambda a: a["val_mean"])
    best, second = arms[0], arms[1]
    spread = max(best["val_sd"] or 0, second["val_sd"] or 0)
    lead = second["val_mean"] - best["val_mean"]
    return f"{best['arm']}, {'clear' if lead > 2 * spread else 'within the spread'}"


def main() -> None:
    from lance_assets.defs.training.ablation import materialize_ablation  # Dagster: seconds

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plantings", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--corpus", choices=("real", "sentences"), default="real",
                    help="real: local text + word salad; sentences: "
                         "corpus.synthetic.planted_junk (what test_ablation_power.py plants)")
    ap.add_argument("--mb", type=float, default=3.0, help="MB of real text")
    ap.add_argument("--junk-share", type=float, default=0.2)
    ap.add_argument("--config", default="{}", help="JSON overriding the asset's defaults")
    ap.add_argument("--before", action="store_true", help="also the old defaults and rule")
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("LANCE_LOG", "error")
    work = args.work or Path(tempfile.mkdtemp(prefix="ablation-power-"))
    override = json.loads(args.config)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; work {work}")
    print("| planting | comparison | config | right answer | best arm | lead ± 95 % | verdict "
          "| smallest detectable | runs | seconds |")
    print("|---|---|---|---|---|---:|---|---:|---:|---:|")
    for planting in args.plantings:
        t0 = time.perf_counter()
        root = planted_table(work, args.corpus, args.mb, args.junk_share, planting)
        print(f"# planting {planting}: table ready in {time.perf_counter() - t0:.0f} s", flush=True)
        configs = [("defaults", override)] + ([("before", BEFORE)] if args.before else [])
        for label, extra in configs:
            for comparison, arms, right in (("junk", JUNK, "drop_junk, real"),
                                            ("null", NULL, "no real lead")):
                name = f"{label}-p{planting}"
                config = {"name": name, "rule_sets": arms, "eval_filter": HELD_OUT, **extra}
                t0 = time.perf_counter()
                meta = materialize_ablation(root, config)
                elapsed = time.perf_counter() - t0
                results = json.loads((paths.ablation_dir(root, name) / "results.json").read_text())
                lead = next(iter(results["paired"].values()), None)
                lead_text = (f"{lead['lead']:+.4f} ± {lead['ci95']:.4f}"
                             if lead and lead["ci95"] is not None else "—")
                verdict = (old_rule(results) if label == "before" else
                           f"{results['best_arm']}, "
                           + {True: "real", False: "not real", None: "no verdict"}[
                               results["lead_real"]])
                print(f"| {planting} | {comparison} | {label} | {right} | {results['best_arm']} | "
                      f"{lead_text} | {verdict} | {results['smallest_detectable_lead']} | "
                      f"{meta['runs_trained'].value} (+{meta['runs_reused'].value} reused) | "
                      f"{elapsed:.0f} |", flush=True)


if __name__ == "__main__":
    main()
