"""Opt-outs from text and data mining: ``opted_out`` (bool) and ``opt_out_source`` per document,
from lists read offline from local files (nothing is fetched):

- **robots.txt** files, one per domain (``<folder>/<domain>.txt`` or
  ``<folder>/<domain>/robots.txt``): a document whose url one of ``user_agents`` may not fetch
  (``urllib.robotparser``) is opted out. The default agents are the AI crawlers that publishers
  block: GPTBot, CCBot, Google-Extended, anthropic-ai, ClaudeBot, PerplexityBot, Bytespider,
  Applebot-Extended, meta-externalagent, cohere-ai;
- **domain lists**: text files, one domain a line (``#`` starts a comment); a listed domain opts
  out every url of it and of its subdomains;
- **TDM reservations** (W3C TDMRep): ``<folder>/<domain>.json`` in the format of a site's
  ``/.well-known/tdmrep.json``, a list of ``{"location": "/path*", "tdm-reservation": 1}``; the
  first location that matches a url's path decides, and ``1`` opts it out.

A file named after a domain applies to that host and every host under it that has no file of its
own. ``opt_out_source`` says which list decided (``domain_list:<file>``, ``tdmrep:<domain>``,
``robots.txt:<agent>``; a domain list first, then a reservation, then robots.txt), null when
none did.

The lists' sha256 digests are recorded in the table's config (``lance_assets.opt_out``). A run
with other lists (a changed file, an agent added) drops both columns first, so every row is
evaluated again against the new lists; the same lists leave written rows as they are. With any
list configured, ``curation_rules`` adds the rule ``opted_out: NOT opted_out``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib import robotparser
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets.curation.url_domain import hosts
from lance_assets.keys import OPT_OUT_KEY
from lance_assets.table import Table
from lance_assets.table.columns import ColumnWriteReport
from lance_assets.table.producer import ColumnProducer, Run, Step, setting
from lance_assets.table.settings import InputError

DEFAULT_USER_AGENTS = ("GPTBot", "CCBot", "Google-Extended", "anthropic-ai", "ClaudeBot",
                       "PerplexityBot", "Bytespider", "Applebot-Extended", "meta-externalagent",
                       "cohere-ai")
OPTED_OUT = pa.field("opted_out", pa.bool_())
OPT_OUT_SOURCE = pa.field("opt_out_source", pa.string())
FIELDS = [OPTED_OUT, OPT_OUT_SOURCE]
COLUMNS = [f.name for f in FIELDS]
DESCRIPTIONS = {
    "opted_out": "True when an opt-out list of the `opted_out` asset reserves the document's url "
                 "from text and data mining (robots.txt of its domain for an AI crawler, a "
                 "domain list, a TDMRep reservation); false otherwise, also without a url.",
    "opt_out_source": "Which list decided: domain_list:<file>, tdmrep:<domain> or "
                      "robots.txt:<user agent>; null when none did.",
}
BATCH_ROWS = 8192
_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62}\.)*[a-z0-9-]{1,63}$")


@dataclass(frozen=True)
class OptOutSettings:
    robots_txt: str = setting("", "Folder of robots.txt files, one per domain: <domain>.txt or "
                                  "<domain>/robots.txt. Empty: none.")
    user_agents: list[str] = setting(default_factory=lambda: list(DEFAULT_USER_AGENTS),
                                     help="The user agents whose robots.txt rules are honoured: "
                                          "a document one of them may not fetch is opted out.")
    domain_lists: list[str] = setting(default_factory=list,
                                      help="Text files of domains, one a line ('#' comments): "
                                           "every url of a listed domain or its subdomains is "
                                           "opted out.")
    tdm_reservations: str = setting("", "Folder of TDMRep files, <domain>.json in the format of "
                                        "/.well-known/tdmrep.json. Empty: none.")


@dataclass(frozen=True)
class Lists:
    """The opt-out lists, read and checked: what each fragment is evaluated against."""

    domains: dict[str, str] = field(default_factory=dict)  # domain -> its list's file name
    robots: dict[str, str] = field(default_factory=dict)  # domain -> robots.txt text
    tdm: dict[str, list] = field(default_factory=dict)  # domain -> [(regex, reserved)]
    agents: tuple[str, ...] = ()
    described: tuple[dict, ...] = ()  # for the table's config: kind, name, sha256, entries

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps([list(self.agents), list(self.described)],
                                         sort_keys=True).encode()).hexdigest()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _folder_files(folder: str, what: str) -> list[tuple[str, Path]]:
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise InputError(f"{what} {folder!r}: not a folder; give a folder of per-domain files, or "
                         "leave it empty")
    out = []
    for p in sorted(path.iterdir()):
        if p.is_file() and p.suffix in (".txt", ".json"):
            out.append((p.stem.lower(), p))
        elif p.is_dir() and (p / "robots.txt").is_file():
            out.append((p.name.lower(), p / "robots.txt"))
    return out


def _location_regex(location: str) -> re.Pattern:
    """A TDMRep location (robots.txt-like: ``*`` any run, a final ``$`` the end) as a regex."""
    end = location.endswith("$")
    body = re.escape(location[:-1] if end else location).replace(r"\*", ".*")
    return re.compile("^" + body + ("$" if end else ""))


def read_lists(settings: OptOutSettings) -> Lists:
    """Every configured list, checked (``InputError`` naming the file and the fix)."""
    domains, robots, tdm, described = {}, {}, {}, []
    agents = tuple(a.strip() for a in settings.user_agents if a.strip())
    for name in settings.domain_lists:
        path = Path(name).expanduser()
        try:
            data = path.read_bytes()
        except OSError as err:
            raise InputError(f"domain_lists: {name!r} cannot be read ({err.strerror}); give a "
                             "text file of domains, one a line") from None
        count = 0
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            domain = line.split("#", 1)[0].strip().lower().strip(".")
            if not domain:
                continue
            if not _DOMAIN.match(domain):
                raise InputError(f"domain_lists: {name} line {n}: {domain[:80]!r} is not a domain "
                                 "name (example.com); fix or remove the line")
            domains.setdefault(domain, path.name)
            count += 1
        described.append({"kind": "domain_list", "name": path.name, "sha256": _sha(data),
                          "entries": count})
    if settings.robots_txt:
        if not agents:
            raise InputError("user_agents: empty, so robots.txt files decide nothing; name the "
                             "agents to honour (default: the AI crawlers' list)")
        files = _folder_files(settings.robots_txt, "robots_txt")
        h = hashlib.sha256()
        for domain, path in files:
            data = path.read_bytes()
            robots[domain] = data.decode("utf-8", "replace")
            h.update(domain.encode() + b"\0" + _sha(data).encode())
        described.append({"kind": "robots.txt", "name": Path(settings.robots_txt).name,
                          "sha256": h.hexdigest(), "entries": len(files),
                          "user_agents": list(agents)})
    if settings.tdm_reservations:
        files = _folder_files(settings.tdm_reservations, "tdm_reservations")
        h = hashlib.sha256()
        for domain, path in files:
            data = path.read_bytes()
            try:
                records = json.loads(data)
                if isinstance(records, dict):
                    records = [records]
                rules = [(_location_regex(str(r.get("location", "/*"))),
                          int(r.get("tdm-reservation", 0)) == 1) for r in records]
            except (ValueError, TypeError, AttributeError) as err:
                raise InputError(f"tdm_reservations: {path}: not a TDMRep file ({err}); give a "
                                 "JSON list of {\"location\": ..., \"tdm-reservation\": 0|1}") from None
            tdm[domain] = rules
            h.update(domain.encode() + b"\0" + _sha(data).encode())
        described.append({"kind": "tdm-reservation", "name": Path(settings.tdm_reservations).name,
                          "sha256": h.hexdigest(), "entries": len(files)})
    return Lists(domains, robots, tdm, agents if settings.robots_txt else (), tuple(described))


def _owner(host: str, table: dict) -> str | None:
    """The entry of ``table`` for ``host`` or the nearest domain above it."""
    labels = host.split(".")
    for i in range(len(labels) - 1):
        name = ".".join(labels[i:])
        if name in table:
            return name
    return host if host in table else None


class ListsChangedError(RuntimeError):
    """Another run recorded other opt-out lists while this one was writing."""


@dataclass(frozen=True)
class Evaluate:
    """The per-fragment compute: each url against the lists (a small dataclass: Ray pickles it).
    It refuses to write once the table records other lists (a run with other lists started
    meanwhile and dropped the columns): no fragment holds values of two lists."""

    lists: Lists
    table: Table

    def decide(self, host: str, urls: list[str], parsers: dict) -> list[str | None]:
        lists = self.lists
        listed = _owner(host, lists.domains)
        if listed is not None:
            return [f"domain_list:{lists.domains[listed]}"] * len(urls)
        out: list[str | None] = [None] * len(urls)
        tdm = _owner(host, lists.tdm)
        robots = _owner(host, lists.robots)
        if robots is not None and robots not in parsers:
            parser = robotparser.RobotFileParser()
            parser.parse(lists.robots[robots].splitlines())
            parsers[robots] = parser
        for i, url in enumerate(urls):
            if tdm is not None:
                path = urlsplit(url).path or "/"
                hit = next((reserved for rx, reserved in lists.tdm[tdm] if rx.match(path)), False)
                if hit:
                    out[i] = f"tdmrep:{tdm}"
                    continue
            if robots is not None:
                agent = next((a for a in lists.agents if not parsers[robots].can_fetch(a, url)),
                             None)
                if agent is not None:
                    out[i] = f"robots.txt:{agent}"
        return out

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        stored = self.table.get_config(OPT_OUT_KEY) or {}
        if stored.get("digest") != self.lists.digest:
            raise ListsChangedError(
                f"{self.table.uri}: the opt-out lists changed while `opted_out` was writing "
                "(another run recorded other lists); run the asset again")
        schema = pa.schema(FIELDS)
        parsers: dict = {}
        for batch in frag.to_batches(columns=["url"], batch_size=BATCH_ROWS):
            source = np.full(batch.num_rows, None, dtype=object)
            if self.lists.domains or self.lists.robots or self.lists.tdm:
                urls = batch.column("url")
                host = hosts(urls)
                encoded = pc.dictionary_encode(host)
                codes = encoded.indices.to_numpy(zero_copy_only=False)
                url_list = urls.to_pylist()
                for code, h in enumerate(encoded.dictionary.to_pylist()):
                    if not h:
                        continue
                    rows = np.flatnonzero(codes == code)
                    got = self.decide(h, [url_list[i] for i in rows], parsers)
                    source[rows] = got
            flags = np.array([s is not None for s in source], dtype=bool)
            yield pa.RecordBatch.from_arrays([pa.array(flags), pa.array(source, pa.string())],
                                             schema=schema)


def record_lists(run: Run, before: None) -> tuple[Lists, Table]:
    """The state: the lists read and checked; when they differ from those recorded, both columns
    are dropped first (every row is evaluated again), then the new lists recorded."""
    lists = read_lists(run.settings)
    table = run.table
    stored = table.get_config(OPT_OUT_KEY)
    wanted = {"digest": lists.digest, "lists": list(lists.described),
              "user_agents": list(lists.agents)}
    if stored is None or stored.get("digest") != lists.digest:
        def drop(ds) -> None:
            present = [c for c in COLUMNS if c in ds.schema.names]
            if present:
                ds.drop_columns(present)

        if any(c in table.newest().schema.names for c in COLUMNS):
            run.log("opted_out: the opt-out lists changed; every row is evaluated again")
            table.commit("drop opted_out columns", drop)
        table.set_config(OPT_OUT_KEY, wanted)
    return lists, table


def summary(table: Table, report: ColumnWriteReport) -> dict:
    ds = table.newest()
    stored = table.get_config(OPT_OUT_KEY) or {}
    return {"rows_opted_out": ds.count_rows(filter="opted_out"),
            "opt_out_digest": stored.get("digest", ""),
            "opt_out_lists": len(stored.get("lists", []))}


PRODUCER = ColumnProducer(
    name="opted_out",
    doc="Opt-outs from text and data mining, read offline from local files: robots.txt per "
        "domain for the AI crawlers' user agents, domain lists, TDMRep reservations. "
        "`opted_out` and `opt_out_source` per document; a changed list evaluates every row "
        "again (the lists' digests are recorded in the table's config). With any list "
        "configured, `curation_rules` adds `NOT opted_out`.",
    steps=(Step(fields=FIELDS, state=record_lists,
                compute=lambda settings, state: Evaluate(*state)),),
    descriptions=DESCRIPTIONS, settings=OptOutSettings, summary=summary,
    reads={c: [("raw_text", "url")] for c in COLUMNS}, version="1")
