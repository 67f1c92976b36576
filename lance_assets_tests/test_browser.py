"""Browser smoke test of the web UI: `dagster dev` on 127.0.0.1, driven by Playwright through
Debian's Chromium.

The pages a person opens first must work: the asset graph holds every asset of the code location,
the `pretrained_model` launchpad opens with valid default config, a column asset's page lists
the columns that asset writes, each with its description, and plots its numeric metadata across
its materializations. The server runs on a fresh instance and data root in a temporary folder,
after a few column assets were materialized (the first two twice, the second time with new rows)
so their pages have materializations to show.

Chromium: `LANCE_ASSETS_CHROMIUM`, else `chromium` / `chromium-browser` on PATH
(`scripts/bootstrap.sh` installs Debian's `chromium` when run as root); Playwright's own browser
download is not used. A failing check leaves a screenshot in `$LANCE_ASSETS_SCREENSHOTS`
(default `test-artifacts/browser/`); passing checks leave one in the test's temporary folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from playwright.sync_api import expect, sync_playwright

from lance_assets.definitions import defs
from lance_assets.defs.resources import lance_store_from_env
from lance_assets.defs.training.torchrun import TorchrunPipesClient

# a server under start and page timeouts: never beside another timing test (conftest)
pytestmark = pytest.mark.xdist_group("timing")

REPO = Path(__file__).resolve().parents[1]
DAGSTER = Path(sys.executable).with_name("dagster")
# Materialized before the server starts: the first column assets of the corpus, in lineage order.
COLUMN_ASSETS = ["raw_text", "dedup_flag", "personal_data", "token_ids"]
SOURCE = "synthetic:200"
SERIES_ASSETS = ["raw_text", "dedup_flag"]  # materialized a second time, with MORE_ROWS
MORE_ROWS = "synthetic:60"
SERVER_START_TIMEOUT_S = 150  # `dagster dev` takes 20-40 s on two busy cores
STOP_TIMEOUT_S = 15  # a clean stop takes about 9 s
UI_TIMEOUT_MS = 60_000
VIEWPORT = {"width": 2400, "height": 2400}  # one expanded group and a metadata page fit whole
# The "Join the Dagster community" dialog that `dagster dev` shows on localhost, dismissed up front.
DISMISS_COMMUNITY_DIALOG = "window.localStorage.setItem('communityNux', '\"1\"')"
# Name rows of asset nodes in the graph, at every zoom level (CSS-module classes keep the name).
GRAPH_NODE_NAME = "svg foreignObject [class*='assetName']"
LOCATION_STATUS_QUERY = """{ workspaceOrError { __typename
  ... on Workspace { locationEntries { name loadStatus
    locationOrLoadError { __typename ... on PythonError { message } } } }
  ... on PythonError { message } } }"""


def find_chromium() -> str | None:
    """`LANCE_ASSETS_CHROMIUM`, else a Chromium on PATH (Debian: `chromium`)."""
    explicit = os.environ.get("LANCE_ASSETS_CHROMIUM")
    if explicit:
        if not os.access(explicit, os.X_OK):
            pytest.fail(f"LANCE_ASSETS_CHROMIUM={explicit!r} is not an executable file: point it "
                        "at a Chromium binary or unset it to use `chromium` from PATH")
        return explicit
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def location_status(url: str) -> tuple[str, str]:
    """(load status, load error) of the code location, from the server's GraphQL API."""
    request = urllib.request.Request(f"{url}/graphql", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"query": LOCATION_STATUS_QUERY}).encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        workspace = json.load(response)["data"]["workspaceOrError"]
    if workspace["__typename"] != "Workspace":
        return "ERROR", workspace.get("message", workspace["__typename"])
    entries = workspace["locationEntries"]
    if not entries:
        return "LOADING", ""
    error = entries[0]["locationOrLoadError"] or {}
    return entries[0]["loadStatus"], error.get("message", "")


def wait_until_serving(url: str, proc: subprocess.Popen, log: Path) -> None:
    """Poll `/server_info`, then the code location's load status, until loaded."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    status, error = "NOT STARTED", ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"`dagster dev` exited with {proc.returncode} before serving {url}:\n"
                        + log_tail(log))
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5):
                pass
            status, error = location_status(url)
        except (OSError, urllib.error.URLError, KeyError, ValueError):
            status = "NOT SERVING"
        if error:
            pytest.fail(f"the code location failed to load in `dagster dev`:\n{error}")
        if status == "LOADED":
            return
        time.sleep(0.5)
    pytest.fail(f"`dagster dev` did not serve a loaded code location at {url} within "
                f"{SERVER_START_TIMEOUT_S} s (last status: {status}):\n{log_tail(log)}")


@contextlib.contextmanager
def sigint_not_ignored():
    """Children inherit an ignored SIGINT (tests run as a shell's background job); `dagster dev`
    shuts down cleanly only on SIGINT, so start it with the default disposition."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_process_group(proc: subprocess.Popen) -> None:
    """Ctrl-C for `dagster dev` (it stops its webserver and daemon), then SIGKILL for whatever
    is left of its process group (code servers, or everything if it did not stop in time)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@dataclass
class WebUI:
    url: str
    dagster_home: Path
    screenshots: Path  # passing checks' screenshots


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory):
    """`dagster dev` on a fresh instance and data root, after COLUMN_ASSETS were materialized."""
    base = tmp_path_factory.mktemp("web_ui")
    home = base / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")  # the instance `make dev` runs on
    env = {**os.environ, "DAGSTER_HOME": str(home), "LANCE_ASSETS_DATA": str(base / "data"),
           "LANCE_ASSETS_SOURCE": SOURCE, "LANCE_LOG": "error",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # The column assets are materialized in this process, on the server's instance (the UI,
    # not the CLI, is the subject here): the location's multiprocess executor would start one
    # process per step, each importing the code location again.
    with pytest.MonkeyPatch.context() as patch, \
            dg.DagsterInstance.from_config(str(home)) as instance:
        for name in ("DAGSTER_HOME", "LANCE_ASSETS_DATA", "LANCE_ASSETS_SOURCE"):
            patch.setenv(name, env[name])
        resources = {"lance_store": lance_store_from_env(),
                     "pipes_subprocess_client": TorchrunPipesClient()}
        done = dg.materialize(defs.assets, selection=COLUMN_ASSETS, instance=instance,
                              resources=resources, raise_on_error=False)
        if not done.success:
            pytest.fail(f"materializing {COLUMN_ASSETS} failed: {done.all_events[-1]}")
        # a second materialization with new rows: numeric metadata becomes a series to plot
        done = dg.materialize(defs.assets, selection=SERIES_ASSETS, instance=instance,
                              resources=resources, raise_on_error=False, run_config={
                                  "ops": {"raw_text": {"config": {"source": MORE_ROWS}}}})
        if not done.success:
            pytest.fail(f"materializing {SERIES_ASSETS} again failed: {done.all_events[-1]}")

    # Dagster reads `.env` from the working directory: run in `base` so a developer's `.env`
    # cannot point the server at real data.
    url = f"http://127.0.0.1:{free_port()}"
    log = base / "dagster_dev.log"
    with open(log, "wb") as out, sigint_not_ignored():
        proc = subprocess.Popen(
            [str(DAGSTER), "dev", "-m", "lance_assets.definitions",
             "-h", "127.0.0.1", "-p", url.rsplit(":", 1)[1]],
            cwd=base, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_serving(url, proc, log)
        shots = base / "screenshots"
        shots.mkdir()
        yield WebUI(url=url, dagster_home=home, screenshots=shots)
    finally:
        stop_process_group(proc)


@pytest.fixture(scope="module")
def browser():
    path = find_chromium()
    if path is None:
        if os.geteuid() == 0:
            pytest.fail("no Chromium found (`chromium` on PATH or LANCE_ASSETS_CHROMIUM): "
                        "`make setup` installs it as root (`apt-get install -y chromium`)")
        pytest.skip("no Chromium found (`chromium` on PATH or LANCE_ASSETS_CHROMIUM); "
                    "install it with `sudo apt-get install chromium` to run the browser test")
    expect.set_options(timeout=UI_TIMEOUT_MS)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=path, args=["--disable-dev-shm-usage"], timeout=UI_TIMEOUT_MS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, dagster_ui):  # the browser first: no server is started when it is missing
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(UI_TIMEOUT_MS)
    context.add_init_script(DISMISS_COMMUNITY_DIALOG)
    try:
        yield context.new_page()
    finally:
        context.close()


def failure_screenshots() -> Path:
    folder = Path(os.environ.get("LANCE_ASSETS_SCREENSHOTS") or REPO / "test-artifacts" / "browser")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def screenshot(page, name: str, passing: Path, *, failing: Path | None = None):
    """A screenshot of the page after the block: into `passing`, or, when the block raises,
    into `failing` (default: the failure folder), named in the test's output."""
    try:
        yield
    except BaseException:
        path = (failing or failure_screenshots()) / f"{name}.png"
        with contextlib.suppress(Exception):
            page.screenshot(path=str(path))
            print(f"screenshot of the failing page: {path}")
        raise
    page.screenshot(path=str(passing / f"{name}.png"))


def shown_graph_assets(page) -> set[str]:
    return set(page.locator(GRAPH_NODE_NAME).all_text_contents())


def wait_for_graph_assets(page, expected: set[str], timeout_s: float) -> set[str]:
    deadline = time.monotonic() + timeout_s
    shown = shown_graph_assets(page)
    while not expected <= shown and time.monotonic() < deadline:
        page.wait_for_timeout(250)
        shown = shown_graph_assets(page)
    return shown


def test_asset_graph_shows_every_asset(page, dagster_ui):
    """Every asset of the Definitions is a node of the global asset graph (Lineage page), in its
    group. One group is expanded at a time (the graph's `expanded` URL parameter, what its
    "Expand all groups" shortcut writes): the whole graph expanded no longer fits one view, and
    nodes outside the view are not drawn."""
    graph = defs.resolve_asset_graph()
    by_group: dict[str, set[str]] = {}
    for key in graph.get_all_asset_keys():
        by_group.setdefault(graph.get(key).group_name, set()).add(key.path[-1])
    shown: set[str] = set()
    with screenshot(page, "asset_graph", dagster_ui.screenshots):
        for group, expected in sorted(by_group.items()):
            page.goto(f"{dagster_ui.url}/asset-groups?expanded="
                      + urllib.parse.quote(f"global@global:{group}"))
            page.locator("svg foreignObject").first.wait_for()
            in_view = wait_for_graph_assets(page, expected, timeout_s=UI_TIMEOUT_MS / 1000)
            assert expected <= in_view, (f"group {group}: the asset graph lacks "
                                         f"{sorted(expected - in_view)}; it shows {sorted(in_view)}")
            shown |= in_view
    every = {key.path[-1] for key in graph.get_all_asset_keys()}
    assert shown == every, f"shown but not defined: {sorted(shown - every)}"


def test_pretrained_model_launchpad_opens_without_config_errors(page, dagster_ui):
    """The launchpad of `pretrained_model` scaffolds its run config with no error, and its
    Materialize button is enabled (the test never presses it)."""
    with screenshot(page, "pretrained_model_launchpad", dagster_ui.screenshots):
        page.goto(f"{dagster_ui.url}/assets/pretrained_model")
        materialize = page.get_by_role("button", name=re.compile(r"Materialize$")).first
        expect(materialize).to_be_enabled()
        # Every setting has a default, so "Materialize" would launch a run at once; the menu
        # next to it opens the launchpad instead. The innermost element holding both buttons:
        split_button = page.locator("div").filter(has=materialize).filter(
            has=page.get_by_role("button", name="arrow_drop_down")).last
        split_button.get_by_role("button", name="arrow_drop_down").click()
        page.get_by_role("menuitem", name=re.compile("Open launchpad")).click()

        launchpad = page.get_by_role("dialog").filter(
            has=page.get_by_text(re.compile(r"^Launchpad\b")))  # not the menu's "Open launchpad"
        # Upstream assets never materialized here (curation_rules) ask for a confirmation first.
        confirm = page.get_by_role("dialog").filter(has_not_text="Launchpad").get_by_role(
            "button", name="Confirm")
        expect(launchpad.or_(confirm)).to_be_visible()
        if confirm.is_visible():
            confirm.click()
        expect(launchpad).to_be_visible()
        expect(launchpad.locator(".CodeMirror")).to_contain_text("pretrained_model")
        # The launch button is enabled once the server has validated the config, and only when
        # valid; "No errors" shows before validation too, so it is read after.
        launch = launchpad.get_by_role("button", name=re.compile(r"(Materialize|Launch run)$"))
        expect(launch).to_be_enabled()
        expect(launchpad.get_by_text("No errors", exact=True)).to_be_visible()


def reported_columns(dagster_home: Path, asset: str) -> dict[str, str]:
    """Column name -> description ('' when none) from the asset's latest materialization."""
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(asset))
    assert event is not None, f"{asset} has no materialization in {dagster_home}"
    schema = event.asset_materialization.metadata.get("dagster/column_schema")
    assert schema is not None, f"{asset}'s materialization reports no dagster/column_schema"
    schema = schema.value
    return {column.name: column.description or "" for column in schema.columns}


def plain(text: str) -> str:
    """Text as the page shows Markdown: no emphasis or code marks, single spaces."""
    return " ".join(re.sub(r"[`*_]", "", text).split())


def columns_on_page(page) -> dict[str, str]:
    """The asset page's "Columns" table: column name -> description cell, as shown."""
    table = page.locator("table").filter(has=page.get_by_text("Column name", exact=True))
    expect(table.locator("tbody tr td:nth-child(3)").first,
           "the asset page shows no Columns table with rows").to_be_attached()
    table.scroll_into_view_if_needed()
    rows = table.locator("tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells, c => c.innerText))")
    return {cells[0].split("\n")[0].strip(): plain(cells[2]) for cells in rows if len(cells) >= 3}


@pytest.mark.parametrize("asset", COLUMN_ASSETS[1:])  # those with an upstream column asset
def test_column_asset_page_lists_its_own_columns_with_descriptions(page, dagster_ui, monkeypatch,
                                                                    asset):
    """A column asset's page lists exactly the columns it reports writing, each described,
    and none that an upstream asset wrote (`text` is not on `token_ids`' page)."""
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_ui.dagster_home))  # dagster.yaml reads it
    reported = reported_columns(dagster_ui.dagster_home, asset)
    ancestors = defs.resolve_asset_graph().get_ancestor_asset_keys(dg.AssetKey(asset))
    upstream = {name for other in COLUMN_ASSETS if dg.AssetKey(other) in ancestors
                for name in reported_columns(dagster_ui.dagster_home, other)}

    assert reported, f"{asset} reports no columns"
    with screenshot(page, f"{asset}_columns", dagster_ui.screenshots):
        page.goto(f"{dagster_ui.url}/assets/{asset}")
        shown = columns_on_page(page)
        deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
        while any(not shown.get(n) for n in reported) and time.monotonic() < deadline:
            page.wait_for_timeout(250)  # the descriptions can render after the rows
            shown = columns_on_page(page)
        for name, description in reported.items():
            assert name in shown, f"{asset}'s page lacks its column {name!r}; it shows {sorted(shown)}"
            assert plain(description) in shown[name], (
                f"{asset}'s page shows {shown[name]!r} as the description of {name!r}, "
                f"not {description!r}")
        assert set(shown) <= set(reported), (
            f"{asset}'s page shows columns it does not report: {sorted(set(shown) - set(reported))}")
        undocumented = sorted(name for name, description in reported.items() if not description)
        assert not undocumented, f"{asset} reports columns without a description: {undocumented}"
        written_upstream = sorted(upstream & (set(reported) | set(shown)))
        assert not written_upstream, (
            f"{asset} reports columns that upstream assets write: {written_upstream}")


def numeric_series(dagster_home: Path, asset: str, key: str) -> list[float]:
    """The values of metadata ``key`` over the asset's materializations, oldest first."""
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        records = instance.fetch_materializations(dg.AssetKey(asset), limit=100).records
    return [r.asset_materialization.metadata[key].value for r in reversed(records)
            if key in r.asset_materialization.metadata]


@pytest.mark.parametrize("key", ["dagster/row_count", "null_share/is_dup"])
def test_column_asset_page_plots_its_numeric_metadata(page, dagster_ui, monkeypatch, key):
    """`dedup_flag`'s page (Overview -> Metadata -> Plots) draws a chart for each numeric entry
    over its materializations (the row count grew between the two, the null share is the
    metadata this column reports), and none for a text entry such as its URI."""
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_ui.dagster_home))  # dagster.yaml reads it
    series = numeric_series(dagster_ui.dagster_home, "dedup_flag", key)
    assert len(series) == 2 and all(isinstance(v, (int, float)) for v in series), series
    if key == "dagster/row_count":
        assert series[1] > series[0], series  # a series that moves
    with screenshot(page, f"dedup_flag_plot_{key.replace('/', '_')}", dagster_ui.screenshots):
        page.goto(f"{dagster_ui.url}/assets/dedup_flag")
        expect(page.get_by_placeholder("Filter metadata keys").first).to_be_visible()
        page.get_by_role("button", name="Plots").first.click()
        title = page.get_by_text(key, exact=True)
        expect(title).to_have_count(1)
        # the chart: the smallest block holding both the title and a drawn canvas
        chart = page.locator("div").filter(has=title).filter(has=page.locator("canvas")).last
        canvas = chart.locator("canvas")
        expect(canvas).to_have_count(1)
        expect(canvas).to_be_visible()
        box = canvas.bounding_box()
        assert box and box["width"] > 100 and box["height"] > 50, box
        expect(page.get_by_text("dagster/uri", exact=True)).to_have_count(0)  # text: no plot
