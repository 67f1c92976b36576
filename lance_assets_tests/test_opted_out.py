"""Opt-outs as a column (``opted_out``): robots.txt per domain for the AI crawlers' agents, domain
lists and TDMRep reservations, read from local files; a changed list evaluates every row again;
the rule ``NOT opted_out`` comes with a configured list; ``forget --where "opted_out"`` works."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from lance_assets.__main__ import main as cli
from lance_assets.curation import opted_out as oo
from lance_assets.curation import rules
from lance_assets.ingest.raw_text import ingest
from lance_assets.keys import OPT_OUT_KEY
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.table.settings import InputError
from lance_assets_tests.helpers import quiet, write_fineweb_parquet

URLS = {  # url -> what the first lists decide
    "https://optout.org/private/1": "robots.txt:CCBot",  # disallowed for CCBot only
    "https://www.optout.org/private/2": "robots.txt:CCBot",  # a host under the domain
    "https://optout.org/public/1": None,
    "https://other.org/a": None,  # its robots.txt blocks an agent not in the list
    "https://listed.net/x": "domain_list:domains.txt",
    "https://deep.sub.listed.net/y": "domain_list:domains.txt",
    "https://notlisted.net/x": None,
    "https://tdm.io/a/1": "tdmrep:tdm.io",
    "https://tdm.io/b/1": None,  # reserved only under /a/
    None: None,
}


def rows(root) -> dict:
    got = Table.of(root).newest().to_table(columns=["url", "opted_out", "opt_out_source"])
    return {r["url"]: (r["opted_out"], r["opt_out_source"]) for r in got.to_pylist()}


def test_opted_out_follows_the_lists_and_a_changed_list(tmp_path, capsys):
    root = tmp_path / "data"
    urls = list(URLS)
    texts = [f"document number {i} about the sea and the ships" for i in range(len(urls))]
    path = write_fineweb_parquet(tmp_path / "web.parquet", texts,
                                 extra={"url": pa.array(urls, pa.string())})
    ingest(Table.of(root), str(path), log=quiet)
    robots, tdm = tmp_path / "robots", tmp_path / "tdm"
    robots.mkdir()
    tdm.mkdir()
    (robots / "optout.org.txt").write_text("User-agent: CCBot\nDisallow: /private/\n\n"
                                           "User-agent: *\nAllow: /\n")
    (robots / "other.org").mkdir()
    (robots / "other.org" / "robots.txt").write_text("User-agent: NotAnAiBot\nDisallow: /\n")
    (tdm / "tdm.io.json").write_text(json.dumps([{"location": "/a/*", "tdm-reservation": 1},
                                                 {"location": "/*", "tdm-reservation": 0}]))
    domains = tmp_path / "domains.txt"
    domains.write_text("# reserved\nlisted.net\n")
    settings = oo.OptOutSettings(robots_txt=str(robots), domain_lists=[str(domains)],
                                 tdm_reservations=str(tdm))
    table = Table.of(root)
    produce(oo.PRODUCER, table, settings, log=quiet)
    assert rows(root) == {u: (s is not None, s) for u, s in URLS.items()}
    first = table.get_config(OPT_OUT_KEY)
    assert [x["kind"] for x in first["lists"]] == ["domain_list", "robots.txt", "tdm-reservation"]
    assert first["lists"][1]["user_agents"] == list(oo.DEFAULT_USER_AGENTS)
    # the same lists again: nothing to do
    assert produce(oo.PRODUCER, table, settings, log=quiet).fragments_written == []
    # a changed list: every row evaluated again
    domains.write_text("listed.net\nother.org\n")
    again = produce(oo.PRODUCER, table, settings, log=quiet)
    assert len(again.fragments_written) == len(table.newest().get_fragments())
    want = {**{u: (s is not None, s) for u, s in URLS.items()},
            "https://other.org/a": (True, "domain_list:domains.txt")}
    assert rows(root) == want
    assert table.get_config(OPT_OUT_KEY)["digest"] != first["digest"]
    # a configured list brings the rule; forget --where "opted_out" removes them from history
    in_force = rules.put_in_force(table, {}, keep_languages=[], drop_contaminated=False)
    assert in_force.added == {"opted_out": "NOT opted_out"}
    assert in_force.evaluation.hits[0].removed == 6
    capsys.readouterr()
    assert cli(["forget", "--where", "opted_out", "--max-share", "1", "--json",
                "--data", str(root)]) == 0
    assert json.loads(capsys.readouterr().out)["rows_deleted"] == 6
    assert set(rows(root)) == {u for u, (out, _) in want.items() if not out}
    # no list at all: no rule
    produce(oo.PRODUCER, table, oo.OptOutSettings(), log=quiet)
    assert not any(out for out, _ in rows(root).values())
    assert rules.tagger_rules(table.newest(), keep_languages=[], drop_contaminated=False)[0] == {}
    # a writer whose lists another run replaced meanwhile writes nothing
    lists = oo.read_lists(settings)
    table.set_config(OPT_OUT_KEY, {"digest": "another run's lists", "lists": []})
    with pytest.raises(oo.ListsChangedError, match="the opt-out lists changed while"):
        list(oo.Evaluate(lists, table)(table.newest().get_fragments()[0]))


def test_a_bad_list_is_named_with_its_line(tmp_path):
    bad = tmp_path / "domains.txt"
    bad.write_text("fine.org\nnot a domain\n")
    with pytest.raises(InputError, match=r"domains.txt line 2: 'not a domain' is not a domain"):
        oo.read_lists(oo.OptOutSettings(domain_lists=[str(bad)]))
    with pytest.raises(InputError, match="robots_txt .*: not a folder"):
        oo.read_lists(oo.OptOutSettings(robots_txt=str(tmp_path / "missing")))
