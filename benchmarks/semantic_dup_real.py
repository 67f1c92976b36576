"""``semantic_dup`` on real text, and its cost per new document as the table grows.

    LANCE_LOG=error python -m benchmarks.semantic_dup_real [--docs 2000] [--rewordings 200]
        [--work DIR]               # keep the embedded table there, and reuse it on the next run
    python -m benchmarks.semantic_dup_real --growth [--sizes 20000,80000,320000] [--new 1000]
    python -m benchmarks.semantic_dup_real --kernels

**Quality (the default).** Real documents found on this machine, offline (the tokenizer
benchmark's corpus: the Python sources and docs installed here and ``/usr/share/doc``, one file
per document, in a fixed order), plus reworded copies of ``--rewordings`` English prose ones
planted after them (``semantic_planted.reworded``: sentences dropped, moved, synonyms
replaced; originals drawn among the documentation files, not the Python sources). The table
gets ``lang`` (fastText), ``is_dup``, ``near_dup``, ``chunk_embeddings`` (the real model, CPU)
and then ``semantic_dup`` with its defaults. Scored:

- *distinct documents*: English rows that are neither exact nor near copies nor planted: the
  share of them that a threshold flags (each compared with every earlier English row: one
  cluster, the most any clustering can flag), and the same for the non-English rows compared
  among themselves (why they are left out);
- *rewordings MinHash misses*: planted copies ``near_dup`` does not flag; the share a threshold
  flags (against their original or anything earlier);
- then the producer with its defaults (clusters, probes, ``languages``), as a user runs it.

Vectors are the producer's own: the normalised mean of ``chunk_embeddings`` kept as int8
(``semantic_vector``); a cosine is exact on those.

**Growth (``--growth``).** The cost per new document of a ``--new``-row increment on tables of
``--sizes`` rows: each table is made directly (rows on ``--topics`` topics with copies, their
``chunk_embeddings`` from a stand-in, the semantic columns and the side store of a run that
wrote them, in one pass), then ``--new`` rows are appended and ``semantic_dup`` runs on them.
CPU seconds of this process (every thread) per new row, the median of ``--repeats`` increments
(one after another on the same table), and the ratio against the smallest size: of the medians,
and within each round (every size runs once a round, so a shared machine's changing speed weighs
on every size alike), its median and quartiles. The product's
kernel is loaded before the first increment (a one-off of the process, ~0.6 s: importing
``onnx``), as a long-lived worker would have it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

import lance
import numpy as np

from benchmarks.tokenize_bench import local_texts
from lance_assets import keys, paths
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.testing.semantic_planted import reworded

THRESHOLDS = (0.80, 0.85, 0.87, 0.88, 0.90, 0.92, 0.93, 0.94, 0.95, 0.96)
REWORD = {"drop": 0.2, "synonyms": 0.7, "shuffle": 0.6}  # the planted set's "heavy" rewording
MIN_SENTENCES = 8  # an original to reword: English prose with at least this many sentences
MAX_CHARS = 20_000  # documents longer than this are cut (the embedding cost is per chunk)


def quiet(_msg: str) -> None:
    pass


def real_documents(limit: int) -> tuple[list[str], list[bool]]:
    """Up to ``limit`` distinct local text files (gzip ones decompressed), in a fixed order, and
    whether each is documentation (not Python source)."""
    texts, prose, seen = [], [], set()
    for path, _raw, text in local_texts():
        if text in seen:
            continue
        seen.add(text)
        texts.append(text[:MAX_CHARS])
        prose.append(path.suffix not in (".py", ".pyi"))
        if len(texts) >= limit:
            break
    return texts, prose


def sentences(text: str) -> int:
    return len(re.findall(r"[a-z][^.!?]{30,}[.!?](\s|$)", text))


def prepare(work: Path, docs: int, rewordings: int, seed: int, backend: str) -> Path:
    """The embedded table under ``work`` (made once; reused when its record matches)."""
    from lance_assets.curation import dedup_flag, detected_language, near_dup
    from lance_assets.embeddings import chunk_embeddings
    from lance_assets.ingest.raw_text import ingest

    root = work / "real"
    record = {"docs": docs, "rewordings": rewordings, "seed": seed, "backend": backend}
    made = work / "real.json"
    if made.is_file() and json.loads(made.read_text()).get("record") == record:
        return root
    shutil.rmtree(root, ignore_errors=True)
    texts, is_doc = real_documents(docs)
    rng = random.Random(seed)
    prose = [i for i, t in enumerate(texts) if is_doc[i] and sentences(t) >= MIN_SENTENCES]
    chosen = sorted(rng.sample(prose, min(rewordings, len(prose))))
    copies = [reworded(texts[i], rng, **REWORD) for i in chosen]
    src = work / "real.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts + copies))
    ingest(Table.of(root), str(src), rows_per_fragment=256, log=quiet)
    t = time.perf_counter()
    produce(detected_language.PRODUCER, Table.of(root), log=quiet)
    produce(dedup_flag.PRODUCER, Table.of(root), log=quiet)
    produce(near_dup.PRODUCER, Table.of(root), log=quiet)
    print(f"tagged {len(texts) + len(copies)} rows in {time.perf_counter() - t:.0f} s")
    t = time.perf_counter()
    produce(chunk_embeddings.PRODUCER, Table.of(root),
            chunk_embeddings.ChunkEmbeddingsSettings(backend=backend), log=quiet)
    print(f"chunk_embeddings in {time.perf_counter() - t:.0f} s")
    made.write_text(json.dumps({"record": record, "originals": chosen,
                                "first_copy": len(texts)}))
    return root


def best_earlier(vecs: np.ndarray, norms: np.ndarray, among: np.ndarray) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
    """For each row of ``among`` (positions, ascending ids): its best cosine with an earlier
    row of ``among``, and that row's position (-1: none)."""
    x = vecs[among].astype(np.float32)
    s = (x @ x.T) / np.outer(norms[among], norms[among])
    s[np.triu_indices(len(among))] = -np.inf
    at = np.argmax(s, axis=1) if len(among) else np.zeros(0, np.int64)
    best = s[np.arange(len(among)), at] if len(among) else np.zeros(0)
    return best, np.where(np.isfinite(best), among[at], -1)


def quality(work: Path, docs: int, rewordings: int, seed: int, backend: str) -> None:
    from lance_assets.curation import semantic_compare as cmp
    from lance_assets.curation import semantic_dup as sd
    from lance_assets.embeddings import int8_vectors as iv
    from lance_assets.table import Table

    root = prepare(work, docs, rewordings, seed, backend)
    made = json.loads((work / "real.json").read_text())
    first_copy = made["first_copy"]
    copy_of = {first_copy + n: o for n, o in enumerate(made["originals"])}
    ds = lance.dataset(paths.table_uri(root))
    t = ds.to_table(columns=["id", "lang", "is_dup", "near_dup", "near_dup_cluster",
                             keys.CHUNK_EMBEDDINGS]).sort_by("id")
    ids = t.column("id").to_numpy()
    assert np.array_equal(ids, np.arange(len(ids))), "ids are positions here"
    unit, ok = cmp.document_vectors(t.column(keys.CHUNK_EMBEDDINGS))
    vecs = iv.quantize(unit)
    norms = np.linalg.norm(vecs.astype(np.float32), axis=1)
    norms[norms == 0] = 1
    lang = np.asarray(t.column("lang").to_pylist(), dtype=object)
    dup = np.asarray(t.column("is_dup").to_pylist(), bool)
    near = np.asarray(t.column("near_dup").to_pylist(), bool)
    near_cluster = np.asarray(t.column("near_dup_cluster").to_pylist())
    planted = np.zeros(len(ids), bool)
    planted[list(copy_of)] = True
    english = ok & (lang == "en")
    distinct = english & ~dup & ~near & ~planted
    other = ok & (lang != "en") & ~dup & ~near & ~planted
    missed = np.array([c for c, o in copy_of.items()
                       if not (near[c] and near_cluster[c] == near_cluster[o]) and ok[c]])
    n_chunks = np.diff(t.column(keys.CHUNK_EMBEDDINGS).combine_chunks().offsets.to_numpy())
    print(f"\n## Quality on real text: {first_copy} real documents + {len(copy_of)} planted "
          f"rewordings; {int(english.sum())} English rows with vectors, {int(distinct.sum())} "
          f"of them distinct; {int(other.sum())} distinct rows in other languages "
          f"({len(set(lang[other]))} languages); {n_chunks.mean():.1f} chunks per row; "
          f"near_dup misses {len(missed)} of the {len(copy_of)} rewordings")
    _, is_doc = real_documents(first_copy)
    is_doc = np.array(is_doc + [True] * len(copy_of))  # the planted copies reword documentation
    copy_cos = np.array([float(vecs[c].astype(np.float32) @ vecs[copy_of[c]] /
                               (norms[c] * norms[copy_of[c]])) for c in missed])
    print(f"cosine rewording-original (int8 chunk-mean vectors): median "
          f"{np.median(copy_cos):.3f}, p10 {np.percentile(copy_cos, 10):.3f}, min "
          f"{copy_cos.min():.3f}")
    ot_pos = np.flatnonzero(other)
    best_ot, _ = best_earlier(vecs, norms, ot_pos)
    best, at = None, None
    for name, rows in (("every file (Python sources and documentation)", english),
                       ("documentation pages only (no Python source)", english & is_doc)):
        pos = np.flatnonzero(rows)
        b, a = best_earlier(vecs, norms, pos)
        best_here = np.full(len(ids), -np.inf)
        at_here = np.full(len(ids), -1)
        best_here[pos], at_here[pos] = b, a
        best, at = (best_here, at_here) if best is None else (best, at)
        here = distinct & rows
        print(f"\n{name}: {int(here.sum())} distinct English documents, {len(missed)} "
              "rewordings")
        print("\n| threshold | distinct English documents flagged | rewordings MinHash misses "
              "flagged (against their original) | distinct non-English documents flagged (if "
              "compared) |\n|---|---|---|---|")
        for th in THRESHOLDS:
            flagged = float((best_here[here] >= th).mean())
            rec = float((best_here[missed] >= th).mean())
            rec_orig = float(np.mean([best_here[c] >= th and at_here[c] == copy_of[c]
                                      for c in missed]))
            flagged_other = float((best_ot >= th).mean()) if len(best_ot) else 0.0
            print(f"| {th:.2f} | {flagged:.2%} ({int((best_here[here] >= th).sum())}) | "
                  f"{rec:.1%} ({rec_orig:.1%}) | {flagged_other:.1%} |")

    # the producer as a user runs it: its defaults, on a copy of the table
    run_root = work / "real-run"
    shutil.rmtree(run_root, ignore_errors=True)
    shutil.copytree(root, run_root)
    settings = sd.SemanticDupSettings()
    start = time.perf_counter()
    report = produce(sd.PRODUCER, Table.of(run_root), settings, log=quiet)
    stats = report.stats
    took = time.perf_counter() - start
    got = Table.of(run_root).newest().to_table(
        columns=["id", sd.SEMANTIC_DUP.name, sd.SEMANTIC_REP.name]).sort_by("id")
    flag = np.asarray(got.column(sd.SEMANTIC_DUP.name).to_pylist(), dtype=object)
    is_flagged = np.array([bool(f) for f in flag])
    print(f"\nsemantic_dup with its defaults ({settings.to_dict()}), {stats.clusters} "
          f"cluster(s), {took:.1f} s: flags {is_flagged[distinct].mean():.2%} of the distinct "
          f"English documents ({int(is_flagged[distinct].sum())}; documentation pages: "
          f"{is_flagged[distinct & is_doc].mean():.2%}), "
          f"{is_flagged[missed].mean():.1%} of the rewordings MinHash misses, "
          f"{int(is_flagged[~english & ok].sum())} rows in other languages "
          f"({stats.other_languages} left out, null)")
    for i in np.flatnonzero(is_flagged & distinct)[:8]:
        j = int(at[i])
        print(f"- flagged distinct pair (cos {best[i]:.3f}): {first_line(root, i)!r} ~ "
              f"{first_line(root, j)!r}")


def first_line(root: Path, i: int) -> str:
    t = lance.dataset(paths.table_uri(root)).to_table(columns=["text"], filter=f"id = {int(i)}")
    text = t.column("text")[0].as_py() if t.num_rows else ""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:60]


# ---------------------------------------------------------------------------- growth

def growth(work: Path, sizes: list[int], new: int, topics: int, repeats: int) -> None:
    from benchmarks.semantic_tables import add_rows, grown_table
    from lance_assets.curation import semantic_dup as sd
    from lance_assets.embeddings import int8_vectors as iv

    settings = sd.SemanticDupSettings()
    kernel = iv.kernel()  # loaded once per process, before the clock starts
    print(f"\n## Cost per new document: {new:,}-row increments, {topics} topics, "
          f"{settings.rows_per_cluster} rows per cluster, {settings.probes} probes, product: "
          f"{kernel}; the median of {repeats} increments")
    print("\n| rows in the table | clusters | CPU s per increment | CPU µs per new row | "
          "wall µs per new row | of which comparing (wall µs) | stored rows read | pairs "
          "compared per new row | ratio (CPU) of the medians to the smallest | ratio within a "
          "round: median (quartiles) |\n|---|---|---|---|---|---|---|---|---|---|")
    roots = {}
    for rows in sizes:
        roots[rows] = work / f"grown-{rows}"
        shutil.rmtree(roots[rows], ignore_errors=True)
        grown_table(roots[rows], rows, topics=topics, seed=0)
    got: dict = {rows: {"cpu": [], "wall": [], "read": [], "pairs": [], "comp": []}
                 for rows in sizes}
    clusters = {}
    for r in range(repeats):  # rounds: every size once a round, so a machine that slows
        for rows in sizes:    # down or speeds up meanwhile weighs on every size alike
            add_rows(roots[rows], new, topics=topics, seed=r)
            c0, w0 = time.process_time(), time.perf_counter()
            report = produce(sd.PRODUCER, Table.of(roots[rows]), settings, log=quiet)
            stats = report.stats
            got[rows]["cpu"].append(time.process_time() - c0)
            got[rows]["wall"].append(time.perf_counter() - w0)
            assert stats.documents == new and not stats.trained, stats
            got[rows]["read"].append(stats.side_rows_read)
            got[rows]["comp"].append(stats.compare_s)
            got[rows]["pairs"].append(stats.pairs_compared)
            clusters[rows] = stats.clusters
    for root in roots.values():
        shutil.rmtree(root, ignore_errors=True)
    base = np.asarray(got[sizes[0]]["cpu"])
    for rows in sizes:
        g = got[rows]
        c, w = float(np.median(g["cpu"])), float(np.median(g["wall"]))
        ratios = np.asarray(g["cpu"]) / base  # per round
        print(f"| {rows:,} | {clusters[rows]} | {c:.3f} | {c / new * 1e6:,.0f} "
              f"| {w / new * 1e6:,.0f} | {np.median(g['comp']) / new * 1e6:,.0f} "
              f"| {int(np.median(g['read'])):,} | {np.median(g['pairs']) / new:,.0f} "
              f"| {c / float(np.median(base)):.2f} | {np.median(ratios):.2f} "
              f"({np.quantile(ratios, 0.25):.2f}-{np.quantile(ratios, 0.75):.2f}) |", flush=True)


def kernels(repeats: int) -> None:
    """The comparison's product, int8 (ONNX Runtime's MatMulInteger) against float32 BLAS on the
    same int8 vectors, at the shapes a run multiplies: a cluster of 5,000 stored rows against
    the new rows probing it (a few in a small increment on a large table, hundreds in a batch)."""
    from lance_assets.embeddings import int8_vectors as iv

    rng = np.random.default_rng(0)
    n = 5000
    y = rng.integers(-127, 128, (iv.DIM, n)).astype(np.int8)
    yi = iv.inv_norms(np.ascontiguousarray(y.T))
    print(f"\n## The product: {iv.kernel()} against float32 BLAS, cosines of q new rows and "
          f"{n:,} stored ones, one thread, best of {repeats} x 20\n")
    print("| new rows | int8 (ms) | float32 BLAS (ms) | speed-up | int8 G pairs x dims / s |\n"
          "|---|---|---|---|---|")
    for q in (1, 16, 47, 188, 750):
        x = rng.integers(-127, 128, (q, iv.DIM)).astype(np.int8)
        xi = iv.inv_norms(x)
        assert np.array_equal(iv.cosines(x, xi, y, yi), iv.float_cosines(x, xi, y, yi))
        t = {}
        for name, fn in (("int8", iv.cosines), ("float", iv.float_cosines)):
            best = np.inf
            for _ in range(repeats):
                c0 = time.process_time()
                for _ in range(20):
                    fn(x, xi, y, yi)
                best = min(best, (time.process_time() - c0) / 20)
            t[name] = best
        print(f"| {q} | {t['int8'] * 1e3:.2f} | {t['float'] * 1e3:.2f} | "
              f"{t['float'] / t['int8']:.1f}x | {q * n * iv.DIM / t['int8'] / 1e9:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--rewordings", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--work", type=Path, default=None, help="keep (and reuse) the tables here")
    ap.add_argument("--growth", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="the product alone: int8 against "
                    "float32 BLAS")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[20_000, 80_000, 320_000])
    ap.add_argument("--new", type=int, default=1000)
    ap.add_argument("--topics", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d')}")
    work = args.work or Path(tempfile.mkdtemp(prefix="semantic-dup-real-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.kernels:
            kernels(args.repeats)
        elif args.growth:
            growth(work, args.sizes, args.new, args.topics, args.repeats)
        else:
            quality(work, args.docs, args.rewordings, args.seed, args.backend)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
