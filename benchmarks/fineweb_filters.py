"""FineWeb's quality filters: ``RULE_SETS["fineweb"]`` against datatrove, decision for decision.

    scripts/peers_venv.sh datatrove      # datatrove + spaCy in .venv-datatrove (once)
    python -m benchmarks.fineweb_filters [--real 2000] [--web 20000] [--rounds 2]

Two corpora: ``--real`` documents of real text found on this machine (the Python sources and
docs of the installed packages, the standard library and /usr/share/doc: the corpus
``benchmarks/tokenize_bench.py`` reads, in its order) and ``--web`` documents of the
FineWeb-shaped ``synthetic-web`` source. On each, in alternating rounds, two child processes
read the same parquet file:

- ours: ``quality_signals`` and ``fineweb_signals`` computed per batch of 2,048 documents
  (``compute_signals`` of both producers, what their column writes run per fragment);
- datatrove's four filters as FineWeb's pipeline sets them
  (``benchmarks/peers/datatrove_filters_arm.py``), each on every document.

Each side's CPU seconds are its own process's, loading and warm-up excluded (the best round);
documents per CPU-second and the ratio follow. Then each family's keep/drop is compared:
ours is the AND of the family's rules of ``RULE_SETS["fineweb"]`` evaluated by DuckDB on our
columns (the predicates as the training filter renders them), datatrove's its filter's verdict.
The project's own set (``RULE_SETS["lance_assets"]``, its rules grouped by family) is compared
the same way. ``--out FILE`` writes the report, each disagreeing document with its signals.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from lance_assets.curation import rules

REPO = Path(__file__).resolve().parents[1]
PEER_PYTHON = REPO / ".venv-datatrove" / "bin" / "python"
PEER_ARM = REPO / "benchmarks" / "peers" / "datatrove_filters_arm.py"
# the project's own rules, by the FineWeb family each stands for
OWN_FAMILIES = {
    "gopher_repetition": ["gopher_dup_lines", "gopher_dup_paragraphs", "gopher_top_ngrams",
                          "gopher_dup_ngrams"],
    "gopher_quality": ["gopher_word_count", "gopher_mean_word_length", "gopher_symbol_word_ratio",
                       "gopher_bullet_lines", "gopher_ellipsis_lines", "gopher_alpha_words",
                       "gopher_stop_words"],
    "c4": ["c4_lorem_ipsum", "c4_curly_bracket"],
    "fineweb": ["fineweb_line_punct", "fineweb_short_lines", "fineweb_dup_line_chars",
                "fineweb_newlines"],
}


def real_texts(n: int) -> list[str]:
    from benchmarks.tokenize_bench import local_texts

    return [text for _, _, text in itertools.islice(local_texts(), n)]


def web_texts(n: int) -> list[str]:
    from lance_assets.ingest import synthetic_web as sw

    spec = sw.WebSpec(rows=n)
    out: list[str] = []
    for block in range(spec.n_blocks):
        out += sw.generate_block(spec, block).column("text").to_pylist()
    return out[:n]


def our_arm(src: str, out: str) -> None:
    """The child process of our side: both producers' signals for every document."""
    import pyarrow.compute as pc

    from lance_assets.curation import quality_signals
    from lance_assets.fineweb import fineweb_signals

    texts = pq.read_table(src, columns=["text"]).column("text").combine_chunks()
    fineweb_signals.compute_signals(pa.array(["Warm up: load the word rules."]))
    wall, cpu = time.perf_counter(), {"quality_signals": 0.0, "fineweb_signals": 0.0}
    parts = []
    for start in range(0, len(texts), fineweb_signals.BATCH_ROWS):
        part = texts.slice(start, fineweb_signals.BATCH_ROWS)
        got = []
        for name, producer in (("quality_signals", quality_signals),
                               ("fineweb_signals", fineweb_signals)):
            t = time.process_time()
            got.append(producer.compute_signals(part))
            cpu[name] += time.process_time() - t
        parts.append(got)
    wall = time.perf_counter() - wall
    table = pa.concat_tables([
        pa.table({**{n: q.column(n) for n in q.schema.names},
                  **{n: f.column(n) for n in f.schema.names}}) for q, f in parts])
    table = table.append_column("n_chars", pc.cast(pc.utf8_length(texts), pa.int32()))
    pq.write_table(table, out)
    print(json.dumps({"docs": len(texts), "wall_s": wall, "cpu_s": sum(cpu.values()),
                      **{f"{k}_cpu_s": v for k, v in cpu.items()}}))


def child(cmd: list[str]) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{cmd[1]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def decisions(signals: pa.Table, rule_set: dict[str, str], families: dict[str, list[str]]
              ) -> dict[str, list[bool]]:
    """Per family, the AND of its rules on every row (a NULL keeps nothing, as in training)."""
    from lance_assets.curation.predicate import safe_predicate

    con = duckdb.connect()
    con.register("signals", signals)
    out = {}
    for family, names in families.items():
        sql = " AND ".join(f"({safe_predicate(rule_set[n], signals.schema.names).duckdb})"
                           for n in names)
        out[family] = [bool(v) for (v,) in con.execute(
            f"SELECT coalesce({sql}, false) FROM signals").fetchall()]
    return out


def compare(name: str, texts: list[str], rounds: int, work: Path, report: dict) -> None:
    src = work / f"{name}.parquet"
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), src)
    ours_out, theirs_out = work / f"{name}_ours.parquet", work / f"{name}_datatrove.parquet"
    ours, theirs = [], []
    for r in range(rounds):  # alternate the sides, the best round of each counts
        ours.append(child([sys.executable, "-m", "benchmarks.fineweb_filters", "--arm", str(src),
                           str(ours_out)]))
        theirs.append(child([str(PEER_PYTHON), str(PEER_ARM), str(src), str(theirs_out)]))
        print(f"  {name} round {r + 1}: quality_signals {ours[-1]['quality_signals_cpu_s']:.1f} + "
              f"fineweb_signals {ours[-1]['fineweb_signals_cpu_s']:.1f} CPU s, datatrove "
              f"{theirs[-1]['cpu_s']:.1f} CPU s", flush=True)
    best_ours = min(o["cpu_s"] for o in ours)
    best_fineweb = min(o["fineweb_signals_cpu_s"] for o in ours)
    best_theirs = min(t["cpu_s"] for t in theirs)
    signals = pq.read_table(ours_out)
    peer = pq.read_table(theirs_out).to_pydict()
    fineweb = {f: list(rules.family_rules(rules.FINEWEB_RULES, f)) for f in rules.FAMILIES}
    sets = {"fineweb": decisions(signals, rules.FINEWEB_RULES, fineweb),
            "lance_assets": decisions(signals, rules.LANCE_ASSETS_RULES, OWN_FAMILIES)}
    n = len(texts)
    result = {"docs": n, "chars": sum(map(len, texts)),
              "ours_cpu_s": round(best_ours, 3), "datatrove_cpu_s": round(best_theirs, 3),
              "ours_docs_per_cpu_s": round(n / best_ours, 1),
              "datatrove_docs_per_cpu_s": round(n / best_theirs, 1),
              "ratio_per_cpu_s": round(best_theirs / best_ours, 2),
              "fineweb_signals_cpu_s": round(best_fineweb, 3),
              "fineweb_signals_docs_per_cpu_s": round(n / best_fineweb, 1),
              "fineweb_signals_ratio_per_cpu_s": round(best_theirs / best_fineweb, 2),
              "agreement": {},
              "datatrove_kept": {f: sum(peer[f]) for f in rules.FAMILIES}, "disagreements": []}
    for set_name, got in sets.items():
        agree = {f: sum(a == b for a, b in zip(got[f], peer[f])) / n for f in rules.FAMILIES}
        both = [all(got[f][i] for f in rules.FAMILIES) == all(peer[f][i] for f in rules.FAMILIES)
                for i in range(n)]
        agree["all four"] = sum(both) / n
        result["agreement"][set_name] = {k: round(v, 4) for k, v in agree.items()}
        result.setdefault("kept", {})[set_name] = {
            **{f: sum(got[f]) for f in rules.FAMILIES},
            "all four": sum(all(got[f][i] for f in rules.FAMILIES) for i in range(n))}
    result["kept"]["datatrove"] = {**result["datatrove_kept"], "all four": sum(
        all(peer[f][i] for f in rules.FAMILIES) for i in range(n))}
    fw = sets["fineweb"]
    for i in range(n):
        wrong = [f for f in rules.FAMILIES if fw[f][i] != peer[f][i]]
        if wrong:
            row = signals.slice(i, 1).to_pylist()[0]
            result["disagreements"].append({"doc": i, "families": wrong,
                                            "datatrove": {f: peer[f][i] for f in wrong},
                                            "text": texts[i][:300], "signals": row})
    report[name] = result
    print(f"{name}: {n:,} documents ({result['chars'] / n:,.0f} characters each)")
    print(f"  docs per CPU-s: datatrove's 4 filters {result['datatrove_docs_per_cpu_s']:,}; "
          f"fineweb_signals {result['fineweb_signals_docs_per_cpu_s']:,} "
          f"({result['fineweb_signals_ratio_per_cpu_s']}x); quality_signals + fineweb_signals "
          f"{result['ours_docs_per_cpu_s']:,} ({result['ratio_per_cpu_s']}x)")
    print("  same keep/drop as datatrove | " + " | ".join([*rules.FAMILIES, "all four"]))
    for set_name, agree in result["agreement"].items():
        print(f"  RULE_SETS[{set_name!r}] | " + " | ".join(f"{v:.2%}" for v in agree.values()))
    print("  documents kept | " + " | ".join([*rules.FAMILIES, "all four"]))
    for side, kept in result["kept"].items():
        print(f"  {side} | " + " | ".join(f"{v:,}" for v in kept.values()))
    print(f"  disagreements (fineweb set): {len(result['disagreements'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=int, default=2000, help="real documents (0: none)")
    parser.add_argument("--web", type=int, default=20000, help="synthetic-web documents (0: none)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="", help="write the report, disagreements included "
                        "(JSON), to this file")
    parser.add_argument("--arm", nargs=2, metavar=("TEXTS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        our_arm(*args.arm)
        return
    if not PEER_PYTHON.exists():
        raise SystemExit(f"no datatrove environment at {PEER_PYTHON.parent.parent}: run "
                         "scripts/peers_venv.sh datatrove")
    report: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:
            compare("real", real_texts(args.real), args.rounds, Path(tmp), report)
        if args.web:
            compare("synthetic-web", web_texts(args.web), args.rounds, Path(tmp), report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(f"report: {args.out}")


if __name__ == "__main__":
    main()
