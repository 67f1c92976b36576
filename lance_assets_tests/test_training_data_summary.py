"""The public summary of what a run read (``python -m lance_assets summary``, the
``training_data_summary`` asset): on a planted corpus (two sources, known domains, languages,
dates, personal data, a contaminated document, opt-out lists, a forget before the run and one
after it) every figure equals a recomputation from the run's read records; nothing quotes a
document or a url; a forget that releases the run's snapshot is said, not a crash."""

from __future__ import annotations

import json
import math
import os
import time
from urllib.parse import urlsplit

import dagster as dg
import lance
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.__main__ import main as cli
from lance_assets.curation import contamination as cont
from lance_assets.curation import dedup_flag, opted_out, personal_data, rules
from lance_assets.ingest.raw_text import ingest
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets.table import read_record as records
from lance_assets.table import snapshots as snaps
from lance_assets.table.forget import forget
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets_tests.helpers import quiet, write_fineweb_parquet

RULES = {"exact_dup": "NOT is_dup", "not_tiny": "n_tokens >= 40"}
SMALL = 30  # domains of one document each


def planted_urls() -> list[str]:
    urls = [f"https://www.bigsite.com/p{i}" for i in range(40)]
    urls += [f"https://news.bigsite.com/n{i}" for i in range(10)]
    urls += [f"https://shop.site.co.uk/item/{i}?ref=x" for i in range(20)]
    urls += [f"https://optout.org/private/{i}" for i in range(10)]
    urls += [f"https://optout.org/public/{i}" for i in range(10)]
    urls += [f"https://listed.net/{i}" for i in range(10)]
    urls += [f"https://tdm.io/a/{i}" for i in range(10)]
    urls += [f"http://s{k}.small{k}.org/x" for k in range(SMALL)]
    return urls


def registered(url: str) -> str:
    """The test's own rule: the last two labels, three under a country's co/com."""
    labels = urlsplit(url).hostname.split(".")
    return ".".join(labels[-3:] if labels[-2] in ("co", "com") and len(labels[-1]) == 2
                    else labels[-2:])


def run_record(root, name: str, tag: str | None, version: int, read: list[int],
               finished: float) -> None:
    write_run(paths.run_dir(root, name), tag, version, read, finished)


def write_run(run, tag: str | None, version: int, read: list[int], finished: float) -> None:
    """What a finished training run leaves: its read record and its summary."""
    run.mkdir(parents=True, exist_ok=True)
    order = run / "permutations" / "epoch-0.lance"
    lance.write_dataset(pa.table({"row_id": pa.array(read, pa.uint64())}), str(order))
    records.write(run, table_version=version, step=7, epochs=[
        {"epoch": 0, "rows": str(order), "split_sizes": [len(read)], "positions": None}])
    (run / "summary.json").write_text(json.dumps({"table_version": version, "table_tag": tag,
                                                  "filter": "x", "step": 7, "tokens_seen": 999}))
    os.utime(run / "summary.json", (finished, finished))


def next_second() -> None:
    time.sleep(1.05 - time.time() % 1)


def opt_out_lists(base) -> opted_out.OptOutSettings:
    robots = base / "robots"
    robots.mkdir()
    # GPTBot may not read /private/; every other agent may read everything
    (robots / "optout.org.txt").write_text("User-agent: GPTBot\nDisallow: /private/\n\n"
                                           "User-agent: *\nAllow: /\n")
    (robots / "bigsite.com.txt").write_text("User-agent: SomeOtherBot\nDisallow: /\n")
    tdm = base / "tdm"
    tdm.mkdir()
    (tdm / "tdm.io.json").write_text(json.dumps([{"location": "/a/*", "tdm-reservation": 1}]))
    (base / "domains.txt").write_text("# reserved by their owners\nlisted.net\n")
    return opted_out.OptOutSettings(robots_txt=str(robots), domain_lists=[str(base / "domains.txt")],
                                    tdm_reservations=str(tdm))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    base = tmp_path_factory.mktemp("summary")
    root = base / "data"
    texts = generate(SyntheticSpec(rows=240, seed=11)).column("text").to_pylist()
    urls = planted_urls()
    n_web = len(urls)
    web_texts = texts[:n_web]
    for i in (3, 8, 60):  # personal data
        web_texts[i] += " Write to jane.doe@mail.example.org for the details."
    (base / "web").mkdir()
    (base / "books").mkdir()
    langs = ["fr" if i % 5 == 0 else "de" if i % 7 == 0 else "en" for i in range(n_web)]
    web = write_fineweb_parquet(base / "web" / "crawl.parquet", web_texts, extra={
        "url": pa.array(urls),
        "date": pa.array([f"2023-{1 + i % 12:02d}-{1 + i % 28:02d}T10:00:00Z" for i in range(n_web)]),
        "language": pa.array(langs)})
    n_books = 40
    books = write_fineweb_parquet(base / "books" / "shelf.parquet", texts[n_web:n_web + n_books],
                                  extra={"url": pa.array([None] * n_books, pa.string()),
                                         "language": pa.array(["en"] * n_books)})
    table = Table.of(root)
    ingest(table, str(web), rows_per_fragment=100, log=quiet)
    ingest(table, str(books), rows_per_fragment=100, log=quiet)
    ds = table.newest()
    contaminated_id = 12  # a bigsite.com page an evaluation set quotes
    quoted = ds.to_table(columns=["text"], filter=f"id = {contaminated_id}").column(0)[0].as_py()
    (base / "eval.jsonl").write_text(json.dumps({"question": " ".join(quoted.split()[:40])}) + "\n")
    produce(dedup_flag.PRODUCER, table, log=quiet)
    produce(token_ids.PRODUCER, table, token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)
    produce(personal_data.PRODUCER, table, log=quiet)
    produce(cont.PRODUCER, table, cont.ContaminationSettings(
        eval_sets=[cont.EvalSetSpec("quiz", str(base / "eval.jsonl"), "question")]), log=quiet)
    produce(opted_out.PRODUCER, table, opt_out_lists(base), log=quiet)
    in_force = rules.put_in_force(table, RULES, keep_languages=[], drop_contaminated=True)
    # an earlier run, long finished; then a forget request; then the run summarised
    run_record(root, "r0", None, in_force.version, [0, 1], time.time() - 100)
    small = ds.to_table(columns=["id"], filter="url = 'http://s0.small0.org/x'").column(0)[0].as_py()
    forget(table, f"id = {small}", log=quiet)
    next_second()
    version = table.newest().version
    table.snapshots.hold("train-r1", version, owner="pretrained_model", kind=snaps.RUN)
    at_v = table.newest()
    kept = sorted(at_v.to_table(columns=["id"], filter=rules.training_filter(table))
                  .column(0).to_pylist())
    read = [i for i in kept if i % 3 != 0]
    run_record(root, "r1", "train-r1", version, read, time.time())
    before = {"version": version, "opt_out_config": table.get_config("lance_assets.opt_out"),
              "read": read, "small": small,
              "contaminated": contaminated_id, "rows": at_v.to_table(
                  columns=["id", "source", "url", "date", "language", "n_tokens", "n_bytes",
                           "is_dup", "opted_out", "opt_out_source", "contaminated",
                           "pii_email_count", "text"]).to_pylist()}
    # an ablation arm: two seeds, each reading part of what the arm kept
    table.snapshots.hold("ablation-a1", version, owner="curation_ablation", kind=snaps.ABLATION)
    arm_dir = paths.ablation_dir(root, "a1")
    arm_dir.mkdir(parents=True)
    (arm_dir / "plan.json").write_text(json.dumps({"tag": "ablation-a1", "version": version,
                                                   "arms": [{"name": "rules"}]}))
    seeds = [kept[0::4], kept[1::4]]
    for n, ids in enumerate(seeds):
        write_run(arm_dir / "rules-0123abcd" / f"seed-{n}", None, version, ids, time.time())
    capsys = _Capture()
    before["arm"] = json.loads(capsys.run(root, "a1/rules", "--json")[1])
    before["arm_read"] = sorted(set(seeds[0]) | set(seeds[1]))
    # a mixture search's arm: its plan names no arms, its runs are under verify/
    mix = paths.ablation_dir(root, "mixture-m1")
    mix.mkdir(parents=True)
    (mix / "plan.json").write_text(json.dumps({"tag": "ablation-a1", "version": version}))
    write_run(mix / "verify" / "natural-0123abcd" / "seed-0", None, version, kept[2::4],
              time.time())
    before["mixture"] = json.loads(capsys.run(root, "mixture-m1/natural", "--json")[1])
    before["mixture_read"] = kept[2::4]
    before["code"], before["json"] = capsys.run(root, "r1", "--json")
    _, before["markdown"] = capsys.run(root, "r1", "--top", "3")
    # the asset, once, in-process
    from lance_assets.definitions import defs
    from lance_assets.defs.resources import LanceStore

    result = dg.materialize([defs.get_assets_def("training_data_summary")],
                            resources={"lance_store": LanceStore(data_dir=str(root))},
                            run_config={"ops": {"training_data_summary": {"config": {
                                "run": "r1", "model_name": "tiny-1",
                                "source_kinds": {f"file:{base}/web": "crawled_and_scraped"}}}}})
    assert result.success
    before["asset"] = {k: v.value for k, v in
                       result.asset_materializations_for_node("training_data_summary")[0]
                       .metadata.items()}
    # a forget of a document the run read: its snapshot is released, the summary says so
    next_second()
    forget(table, f"id = {read[0]}", log=quiet)
    after = {}
    after["code"], after["json"] = capsys.run(root, "r1", "--json")
    _, after["markdown"] = capsys.run(root, "r1")
    return {"root": root, "before": before, "after": after}


class _Capture:
    """The CLI as typed, in-process, its standard output captured."""

    def run(self, root, *args) -> tuple[int, str]:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli(["summary", *args, "--data", str(root)])
        return code, out.getvalue()


def recompute(rows: list[dict], read: list[int]) -> dict:
    """Per source, domain and language: documents, tokens, bytes of what the run read."""
    got = [r for r in rows if r["id"] in set(read)]
    out: dict[str, dict] = {"source": {}, "domain": {}, "language": {}, "period": {}}

    def add(kind, key, r):
        d = out[kind].setdefault(key, [0, 0, 0])
        d[0] += 1
        d[1] += r["n_tokens"]
        d[2] += len(r["text"].encode())

    for r in got:
        folder = r["source"].removeprefix("file:").split("#")[0].rpartition("/")[0]
        add("source", f"{folder}/*.parquet", r)
        add("language", r["language"], r)
        if r["url"]:
            add("domain", registered(r["url"]), r)
        if r["date"]:
            lo, hi = out["period"].get(folder, (r["date"][:10], r["date"][:10]))
            out["period"][folder] = (min(lo, r["date"][:10]), max(hi, r["date"][:10]))
    return out


def test_every_figure_is_what_the_run_read(planted):
    b = planted["before"]
    assert b["code"] == 0
    s = json.loads(b["json"])
    want = recompute(b["rows"], b["read"])
    assert list(s) == ["format", "general_information", "data_sources", "data_processing", "run"]
    g = s["general_information"]
    size = g["training_data_size"]
    assert size["documents_read"] == size["documents_counted"] == len(b["read"])
    assert size["tokens"] == sum(v[1] for v in want["source"].values())
    assert size["bytes"] == sum(v[2] for v in want["source"].values())
    assert g["not_declared"] == ["provider_name", "provider_contact", "model_name", "model_version"]
    assert g["provider"] == {"name": None, "contact": None}
    assert {x["language"]: [x["documents"], x["tokens"], x["bytes"]] for x in g["languages"]} \
        == want["language"]
    sources = {x["source"].removeprefix("file:"): x for x in s["data_sources"]["sources"]}
    assert {k: [x["documents"], x["tokens"], x["bytes"]] for k, x in sources.items()} \
        == want["source"]
    assert {x["category"] for x in sources.values()} == {"other"}  # local files: not known
    web = next(x for k, x in sources.items() if k.endswith("/web/*.parquet"))
    lo, hi = next(iter(want["period"].values()))
    assert web["collection_period"] == {"from": lo, "to": hi, "from_column": "date"}
    books = next(x for k, x in sources.items() if k.endswith("/books/*.parquet"))
    assert books["collection_period"]["from"] is None
    dom = s["data_sources"]["crawled_domains"]
    ranked = sorted(want["domain"].items(), key=lambda kv: (-kv[1][2], kv[0]))
    assert dom["domains"] == len(want["domain"])
    assert dom["documents_without_url"] == want["source"][next(
        k for k in want["source"] if k.endswith("/books/*.parquet"))][0]
    assert [[x["domain"], x["documents"], x["tokens"], x["bytes"]] for x in dom["top_share"]] \
        == [[k, *v] for k, v in ranked[:math.ceil(0.1 * len(ranked))]]
    assert [x["domain"] for x in dom["top_n"]] == [k for k, _ in ranked[:10]]
    assert ranked[0][0] == "bigsite.com" and "site.co.uk" in want["domain"]
    # opted-out domains were not read; optout.org's public pages were
    assert "listed.net" not in want["domain"] and "tdm.io" not in want["domain"]
    assert "optout.org" in want["domain"]


def test_how_the_data_was_processed(planted):
    b = planted["before"]
    s = json.loads(b["json"])
    p = s["data_processing"]
    rows = b["rows"]
    names = [r["rule"] for r in p["rules"]["rules"]]
    assert names == ["exact_dup", "not_tiny", "not_contaminated", "opted_out"]
    assert p["rules"]["evaluated"] and p["rules"]["documents_in_version"] == len(rows)
    removed = {r["rule"]: r["documents_removed"] for r in p["rules"]["rules"]}
    assert removed == {"exact_dup": sum(r["is_dup"] for r in rows),
                       "not_tiny": sum(r["n_tokens"] < 40 for r in rows),
                       "not_contaminated": sum(r["contaminated"] for r in rows),
                       "opted_out": sum(r["opted_out"] for r in rows)}
    assert p["duplicates"]["rules"] == ["exact_dup"]
    assert p["duplicates"]["documents_removed_by_these_rules"] == removed["exact_dup"] > 0
    read = set(b["read"])
    assert p["personal_data"]["documents_read_with"]["email"] == sum(
        r["pii_email_count"] > 0 for r in rows if r["id"] in read) > 0
    assert p["personal_data"]["token_ids_redacted"] is False
    assert [e["name"] for e in p["contamination"]["evaluation_sets"]] == ["quiz"]
    assert p["contamination"]["flagged_in_version"] == sum(r["contaminated"] for r in rows) >= 1
    assert any(r["contaminated"] for r in rows if r["id"] == b["contaminated"])
    assert p["contamination"]["documents_read_flagged"] == 0
    opt = p["opt_outs"]
    recorded = b["opt_out_config"]
    assert opt["digest"] == recorded["digest"] and len(opt["lists"]) == 3
    assert {x["kind"] for x in opt["lists"]} == {"domain_list", "robots.txt", "tdm-reservation"}
    assert opt["flagged_in_version"] == 30 and opt["documents_read_flagged"] == 0
    assert opt["rules"] == ["opted_out"]
    fg = p["forget_requests"]  # the forget between r0 and r1, counted and dated
    assert [x["documents"] for x in fg["requests"]] == [1] and fg["after_the_run"]["requests"] == 0
    assert fg["since"] is not None and fg["requests"][0]["date"] >= fg["since"]
    assert set(fg["requests"][0]) == {"date", "documents", "rows_deleted", "snapshots_released",
                                      "snapshots_redacted"}


def test_the_summary_quotes_no_text_and_no_url(planted):
    b = planted["before"]
    saved = paths.reports_dir(planted["root"]) / "training_data_summary"
    outputs = [b["json"], b["markdown"], b["asset"]["summary"],
               json.dumps(b["asset"]["summary_json"]), planted["after"]["json"],
               planted["after"]["markdown"], (saved / "r1.md").read_text(),
               (saved / "r1.json").read_text()]
    for out in outputs:
        flat = " ".join(out.split())
        assert "://" not in out and "@mail.example" not in out
        for r in b["rows"]:
            assert r["url"] is None or urlsplit(r["url"]).path not in out.replace("/*.parquet", "")
            assert " ".join(r["text"].split()[:6]) not in flat
    md = b["markdown"]
    assert "## 1. General information" in md and "## 2. List of data sources" in md
    assert "## 3. Data processing aspects" in md and "_blank: a config value" in md
    assert "The top 3:" in md
    asset = b["asset"]
    assert asset["documents_read"] == len(b["read"]) and asset["snapshot"] == "readable"
    assert asset["summary_json"]["general_information"]["model"]["name"] == "tiny-1"
    assert "provider_name" in asset["summary_json"]["general_information"]["not_declared"]
    by_kind = asset["summary_json"]["data_sources"]["by_category"]  # declared, not guessed
    assert [s.rsplit("/", 2)[-2] for s in by_kind["crawled_and_scraped"]] == ["web"]
    assert [s.rsplit("/", 2)[-2] for s in by_kind["other"]] == ["books"]


def test_a_forget_of_a_document_the_run_read_is_said_on_the_redacted_snapshot(planted):
    a, b = planted["after"], planted["before"]
    assert a["code"] == 0
    s = json.loads(a["json"])
    snap = s["run"]["snapshot"]
    assert snap["state"] == "redacted" and snap["documents_read_forgotten"] == 1
    assert "forget removed 1 of the documents the run read" in snap["note"]
    size = s["general_information"]["training_data_size"]
    assert size["documents_read"] == len(b["read"])
    assert size["documents_counted"] == len(b["read"]) - 1  # the forgotten one is gone
    assert s["data_processing"]["rules"]["evaluated"]  # the rules of the snapshot, as they were
    assert s["data_processing"]["forget_requests"]["after_the_run"] == {"requests": 1,
                                                                        "documents": 1}
    assert "**Snapshot redacted.**" in a["markdown"]


def test_an_ablation_or_mixture_arm_is_summarised_from_what_its_seeds_read(planted):
    b = planted["before"]
    s = b["arm"]
    want = recompute(b["rows"], b["arm_read"])
    assert s["run"]["kind"] == "arm" and s["run"]["tag"] == "ablation-a1"
    assert s["general_information"]["training_data_size"]["documents_read"] == len(b["arm_read"])
    assert {x["source"].removeprefix("file:"): [x["documents"], x["tokens"], x["bytes"]]
            for x in s["data_sources"]["sources"]} == want["source"]
    mixture = b["mixture"]["general_information"]["training_data_size"]
    assert mixture["documents_read"] == len(b["mixture_read"])
    assert mixture["tokens"] == sum(v[1] for v in recompute(b["rows"], b["mixture_read"])[
        "source"].values())


def test_a_run_without_a_read_record_is_refused_by_name(planted, tmp_path, capsys):
    run = paths.run_dir(planted["root"], "no_record")
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"table_version": 1}))
    code = cli(["summary", "no_record", "--data", str(planted["root"])])
    err = capsys.readouterr().err
    assert code == 2 and "no exact read record" in err and "Traceback" not in err
    assert cli(["summary", "nope", "--data", str(planted["root"])]) == 2
    assert "training run 'nope'" in capsys.readouterr().err
    assert cli(["summary", "r1", "--top-share", "2", "--data", str(planted["root"])]) == 2
    assert cli(["summary", "r1", "--source-kind", "hf:=stolen", "--data",
                str(planted["root"])]) == 2
    assert "a category is one of publicly_available_datasets" in capsys.readouterr().err
