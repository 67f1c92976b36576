"""Every ``dagster ...`` command in README.md (its fenced blocks and its command table) and in
the docs pages' fenced blocks names what our definitions hold: its ``--select`` goes through
Dagster's own asset selection parser (the one ``dagster asset materialize`` uses) against the
``Definitions`` its ``-m`` module loads, and its ``-j`` job exists. A selection Dagster would
reject fails here instead of in a reader's shell. The README itself stays a front door: at most
README_MAX_LINES lines, the rest in docs/, linked."""

import importlib
import importlib.metadata
import re
import shlex
import subprocess
from pathlib import Path

import dagster as dg
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS = sorted((README.parent / "docs").glob("*.md"))
README_MAX_LINES = 250
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
TABLE_CODE = re.compile(r"`([^`]+)`")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a shell block as argv lists: backslash continuations joined, a quoted
    string may span lines, comments dropped, leading VAR=value assignments skipped."""
    commands, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            argv = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        pending = ""
        while argv and ENV_ASSIGNMENT.match(argv[0]):
            argv = argv[1:]
        if argv:
            commands.append(argv)
    return commands


def documented_commands(program: str, pages=(README, *DOCS)) -> list[list[str]]:
    """``program``'s commands in the fenced blocks of ``pages`` and in the README's tables (a
    code span in a row's last cell that starts with the program's name: the CLI table's "run")."""
    found = [argv for page in pages for block in FENCE.findall(page.read_text())
             for argv in shell_commands(block)]
    if README in pages:
        cells = [line.rstrip(" |").rsplit(" | ", 1)[-1] for line in README.read_text().splitlines()
                 if line.startswith("|")]
        found += [shlex.split(span) for cell in cells for span in TABLE_CODE.findall(cell)
                  if span.startswith(program + " ")]
    return [argv for argv in found if argv and argv[0] == program]


# docs/write-a-tagger.md's commands select the asset its walk-through adds (test_write_a_tagger.py
# runs them on a copy of the package): they are parsed, not looked up in our definitions
TUTORIAL = README.parent / "docs" / "write-a-tagger.md"


def dagster_commands(pages=(README, *DOCS)) -> list[list[str]]:
    return documented_commands("dagster", pages=tuple(p for p in pages if p != TUTORIAL))


def option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def load_definitions(module: str) -> dg.Definitions:
    found = [v for v in vars(importlib.import_module(module)).values()
             if isinstance(v, dg.Definitions)]
    assert len(found) == 1, f"{module}: expected one Definitions object, found {len(found)}"
    return found[0]


def resolve_selection(defs: dg.Definitions, select: str) -> set[dg.AssetKey]:
    """What ``dagster asset materialize --select`` does with ``select`` (dagster/_cli/asset.py)."""
    graph = defs.get_repository_def().asset_graph
    return set(dg.AssetSelection.from_coercible(select.split(",")).resolve(graph))


COMMANDS = dagster_commands()


def test_readme_has_dagster_commands_with_selections():
    in_readme = documented_commands("dagster", pages=(README,))
    selects = [option(argv, "--select") for argv in in_readme]
    assert len(in_readme) >= 5 and sum(s is not None for s in selects) >= 2, in_readme
    assert any(argv[1] == "dev" for argv in in_readme), "the README shows no `dagster dev`"
    assert len(COMMANDS) >= 20, "the docs' commands are no longer found"


def command_id(argv: list[str]) -> str:
    return " ".join([*argv[1:3], option(argv, "--select") or option(argv, "-j") or ""])


@pytest.mark.parametrize("argv", COMMANDS, ids=[command_id(a) for a in COMMANDS])
def test_documented_command_names_real_assets_and_jobs(argv):
    module = option(argv, "-m", "--module-name")
    if module is None:  # e.g. `dagster dev` with the workspace file
        return
    defs = load_definitions(module)
    select = option(argv, "--select")
    if select is not None:
        assert resolve_selection(defs, select), f"--select {select!r} selects nothing"
    job = option(argv, "-j", "--job")
    if job is not None:
        assert job in {j.name for j in defs.get_repository_def().get_all_jobs()}, job


def test_a_space_separated_selection_is_refused():
    """The check above can fail: Dagster rejects the form the README once used."""
    defs = load_definitions("lance_assets.definitions")
    with pytest.raises(Exception, match="(?i)invalid selection"):
        resolve_selection(defs, "curation_rules pretrained_model")


def test_every_job_sensor_and_schedule_says_what_it_runs():
    """Descriptions show in the UI; a job's names every asset it runs (so it cannot go stale
    silently when the graph grows)."""
    repo = load_definitions("lance_assets.definitions").get_repository_def()
    for sensor in repo.sensor_defs:
        assert sensor.description, f"sensor {sensor.name} has no description"
    for schedule in repo.schedule_defs:
        assert schedule.description, f"schedule {schedule.name} has no description"
    for job in repo.get_all_jobs():
        if job.name.startswith("__"):  # Dagster's implicit asset job
            continue
        assert job.description, f"job {job.name} has no description"
        for key in job.asset_layer.selected_asset_keys:
            name = key.to_user_string()
            assert re.search(rf"\b{re.escape(name)}\b", job.description), \
                f"job {job.name} runs {name} but its description does not say so"


def test_readme_sections_come_in_the_order_a_newcomer_reads_them():
    """What it is and the two commands, what the demo shows, then the code map (with its asset
    -> library table), then the UI, the CLI and the schedule; troubleshooting, adding a column,
    hardware and the credits are there too. What does not fit a front door lives in docs/,
    linked from the section it belongs to."""
    text = README.read_text()
    lines = len(text.splitlines())
    assert lines <= README_MAX_LINES, f"README has {lines} lines; move detail to docs/"
    dated = [line for line in text.splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert len(dated) <= 1, f"the README is in the present: one dated line at most, not {dated}"
    figures = len((README.parent / "docs" / "benchmarks.md").read_text().splitlines())
    assert figures <= 700, f"docs/benchmarks.md has {figures} lines: current figures only"
    headings = re.findall(r"^## (.+)$", text, re.M)
    order = ["Two commands", "What the demo shows", "Code map", "The web UI", "The command line",
             "Schedule and sensor"]
    positions = [next((i for i, h in enumerate(headings) if h.startswith(name)), None)
                 for name in order]
    assert None not in positions, f"README lacks one of {order}: it has {headings}"
    assert positions == sorted(positions), f"README sections out of order: {headings}"
    for needed in ("Real data", "Scale out", "Troubleshooting", "Add a column asset: one file",
                   "Hardware and disk", "Credits"):
        assert any(h.startswith(needed) for h in headings), f"README lacks '## {needed}'"
    code_map = text.split("## Code map", 1)[1].split("\n## ", 1)[0]
    assert "| asset (group) | library call |" in code_map
    for page in ("docs/configuration.md", "docs/table.md", "docs/cli.md", "docs/automation.md",
                 "docs/real-data.md", "docs/install.md", "docs/troubleshooting.md",
                 "docs/multinode.md", "docs/training.md"):
        assert f"]({page}" in text and (README.parent / page).is_file(), page


def section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_the_readme_names_what_a_newcomer_looks_for():
    """The web UI, the environment, the schedule, real data and several GPUs: each named in its
    README section, with the page that has the rest."""
    text = README.read_text()
    assert "dagster dev -m lance_assets.definitions" in section(text, "## The web UI")
    cli = section(text, "## The command line")
    for variable in ("LANCE_ASSETS_DATA", "LANCE_ASSETS_SOURCE", "DAGSTER_HOME"):
        assert f"`{variable}`" in cli, variable
    assert "ingest_schedule" in section(text, "## Schedule and sensor")
    assert "LANCE_ASSETS_SOURCE=/datasets/fineweb-edu" in section(text, "## Real data")
    assert "nproc_per_node" in section(text, "## Scale out")


def markdown_links(page: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)#]+)\)", page.read_text()) if "://" not in t]


def test_every_link_in_the_readme_and_the_docs_resolves():
    for page in (README, *DOCS):
        for target in markdown_links(page):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_the_architecture_is_in_the_project_and_no_file_cites_a_document_outside_it():
    """docs/architecture.md holds the layers, the rules of the data layer and the walks through
    the files; the README links it, test_layers cites it, and no file of the repository names the
    design document it replaced."""
    repo = README.parent
    text = (repo / "docs" / "architecture.md").read_text()
    for heading in ("## Layers", "## Rules of the data layer", "## Packages and their faces",
                    "## Groups and folders", "## The life of a column",
                    "## The life of a training run"):
        assert f"\n{heading}\n" in text, heading
    assert "(docs/architecture.md)" in README.read_text()
    assert "docs/architecture.md" in (repo / "lance_assets_tests" / "test_layers.py").read_text()
    gone = ("DESIGN" + ".md").encode()  # in two parts, so that this file does not name it either
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=repo, capture_output=True, check=True).stdout.decode().split("\0")
    files = [repo / f for f in listed if f and (repo / f).is_file()]
    assert len(files) > 100
    naming = [str(f.relative_to(repo)) for f in files if gone in f.read_bytes()]
    assert not naming, f"these files cite a document outside the repository: {naming}"


def test_the_moved_readme_text_is_in_docs():
    """What left the README kept its figures and commands in docs/."""
    expectations = {
        "docs/install.md": ["1 min 22 s", "33 s", "16 s", "make lock-upgrade", "45 + 40 + 15 GB"],
        "docs/cli.md": ["### Selecting assets", "test_browser.py", "dg check defs"],
        "docs/real-data.md": ["hf:HuggingFaceFW/fineweb-edu:sample-10BT", "synthetic-web:2400000"],
        "docs/ablation.md": ["dedup-vs-gopher", "release_snapshots"],
        "docs/automation.md": ["dagster schedule start table_maintenance_schedule"],
        "docs/scaling.md": ["--rdzv-endpoint", "scripts/gpu_check.sh", "AWS_ALLOW_HTTP"],
        "docs/troubleshooting.md": ["TokenizerMismatchError", "LANCE_ASSETS_CHROMIUM"],
    }
    for page, needles in expectations.items():
        text = (README.parent / page).read_text()
        for needle in needles:
            assert needle in text, f"{page} lacks {needle!r}"


def dagster_cli():
    """The click group behind the `dagster` console script (what a reader's shell runs): the
    module its entry point names holds it as `cli`."""
    (entry,) = [e for e in importlib.metadata.entry_points(group="console_scripts")
                if e.name == "dagster"]
    return importlib.import_module(entry.module).cli


def parse_with_dagster_cli(argv: list[str]) -> None:
    """Parse ``argv`` as the `dagster` CLI would, without running it: an option the
    subcommand does not have raises click's usage error."""
    import click

    command, name, args = dagster_cli(), "dagster", list(argv[1:])
    while isinstance(command, click.Group):
        name, command, args = command.resolve_command(click.Context(command, info_name=name), args)
    command.make_context(name, args)


PARSED = COMMANDS + documented_commands("dagster", pages=(TUTORIAL,))


@pytest.mark.parametrize("argv", PARSED, ids=[command_id(a) for a in PARSED])
def test_documented_command_parses_with_the_dagster_cli(argv):
    parse_with_dagster_cli(argv)


def test_an_option_the_subcommand_lacks_is_refused():
    """The check above can fail: `dagster job execute` has no --config-json."""
    import click

    with pytest.raises(click.UsageError, match="config-json"):
        parse_with_dagster_cli(["dagster", "job", "execute", "-m", "lance_assets.definitions",
                                "-j", "ingest", "--config-json", "{}"])


# `dg` (dagster-dg-cli): the README's `dg ...` commands go through the `dg` CLI's own parser,
# their selections through the function that command hands them to, and one `dg list defs`
# runs for real from the repository root, so [tool.dg] in pyproject.toml is exercised too.

ROOT = README.parent


def dg_commands() -> list[list[str]]:
    return documented_commands("dg", pages=tuple(p for p in (README, *DOCS) if p != TUTORIAL))


DG_COMMANDS = dg_commands()


def dg_cli():
    """The click group behind the `dg` console script (its entry point is a `main` that calls
    the module's `cli`)."""
    (entry,) = [e for e in importlib.metadata.entry_points(group="console_scripts")
                if e.name == "dg"]
    return importlib.import_module(entry.module).cli


def parse_with_dg_cli(argv: list[str]):
    """Parse ``argv`` as the `dg` CLI would, without running it; returns the subcommand's
    name and its parsed options."""
    import click

    command, name, args = dg_cli(), "dg", list(argv[1:])
    path = []
    while isinstance(command, click.Group):
        name, command, args = command.resolve_command(click.Context(command, info_name=name), args)
        path.append(name)
    return " ".join(path), command.make_context(name, args).params


def pyproject_tool(name: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][name]


def test_readme_has_dg_commands():
    parsed = [parse_with_dg_cli(argv)[0] for argv in documented_commands("dg", pages=(README,))]
    for needed in ("launch", "list defs", "check defs"):
        assert needed in parsed, f"README documents no `dg {needed}`: {DG_COMMANDS}"


def test_dg_config_names_the_code_location():
    """What `dg` loads (dagster_dg_core's own reading of pyproject.toml): the same module and
    location name as [tool.dagster] and workspace.yaml, the defs folder as defs module."""
    from dagster_dg_core.context import DgContext

    assert pyproject_tool("dg")["directory_type"] == "project"
    context = DgContext.for_project_environment(ROOT, {})
    assert dict(context.target_args) == {"module_name": "lance_assets.definitions"}
    assert context.code_location_name == "lance_assets"
    assert context.defs_module_name == "lance_assets.defs"
    dagster = pyproject_tool("dagster")
    assert (dagster["module_name"], dagster["code_location_name"]) == (
        context.code_location_target_module_name, context.code_location_name)


@pytest.mark.parametrize("argv", DG_COMMANDS, ids=[" ".join(a[1:4]) for a in DG_COMMANDS])
def test_documented_dg_command_parses_and_names_real_assets_and_jobs(argv):
    command, params = parse_with_dg_cli(argv)
    defs = load_definitions(pyproject_tool("dg")["project"]["code_location_target_module"])
    if command == "launch":  # dagster_dg_cli/cli/launch.py: exactly one of the two
        assert (params["assets"] is None) != (params["job"] is None), argv
        if params["assets"] is not None:  # handed to asset_materialize_command_impl
            assert resolve_selection(defs, params["assets"]), argv
        if params["job"] is not None:
            assert params["job"] in {j.name for j in defs.get_repository_def().get_all_jobs()}
    elif command == "list defs" and params["assets"] is not None:
        # dagster/components/list: AssetSelection.from_string, no split at commas
        graph = defs.get_repository_def().asset_graph
        assert dg.AssetSelection.from_string(params["assets"]).resolve(graph), argv


TUTORIAL_DG = documented_commands("dg", pages=(TUTORIAL,))


@pytest.mark.parametrize("argv", TUTORIAL_DG, ids=[" ".join(a[1:4]) for a in TUTORIAL_DG])
def test_the_walk_through_dg_commands_parse(argv):
    parse_with_dg_cli(argv)


def test_an_option_dg_launch_lacks_is_refused():
    """The parse above can fail: `dg launch` takes --assets, not `dagster`'s --select."""
    import click

    with pytest.raises(click.UsageError, match="select"):
        parse_with_dg_cli(["dg", "launch", "--select", "raw_text"])


def readme_selections() -> list[str]:
    """Every selection in the first column of the selection table (docs/cli.md, linked from the
    README's command line section)."""
    section = (ROOT / "docs" / "cli.md").read_text().split("### Selecting assets", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [s for row in rows for s in re.findall(r"`([^`]+)`", row.split(" | ", 1)[0])]


SELECTIONS = readme_selections()


def test_readme_documents_the_selection_forms():
    for form in ("*samples", "token_ids*", "+samples", "key:raw_text", "group:curation",
                 "kind:pytorch"):
        assert form in SELECTIONS, f"the selection table lacks {form!r}: {SELECTIONS}"


@pytest.mark.parametrize("select", SELECTIONS)
def test_documented_selection_selects_something(select):
    defs = load_definitions("lance_assets.definitions")
    assert resolve_selection(defs, select), f"{select!r} selects nothing"


def test_selection_forms_mean_what_the_readme_says():
    """The `key:` form and the bare-name form differ on `+` and `*`; Dagster decides it, so a
    Dagster upgrade that changes either fails here rather than in the README."""
    defs = load_definitions("lance_assets.definitions")
    graph = defs.get_repository_def().asset_graph

    def sel(s):
        return resolve_selection(defs, s)

    def layers(start, step):  # start and every key `step` (parents or children) reaches
        seen, todo = {start}, [start]
        while todo:
            todo += [k for k in step(graph.get(todo.pop())) if k not in seen]
            seen |= set(todo)
        return seen

    samples, token_ids = dg.AssetKey("samples"), dg.AssetKey("token_ids")
    assert sel("*samples") == sel("+key:samples") == layers(samples, lambda n: n.parent_keys)
    assert sel("token_ids*") == sel("key:token_ids+") == layers(token_ids, lambda n: n.child_keys)
    assert sel("+samples") == sel("1+key:samples") == {samples, *graph.get(samples).parent_keys}
    assert sel("++samples") == sel("2+key:samples")
    assert sel("token_ids+") == sel("key:token_ids+1") == {token_ids,
                                                          *graph.get(token_ids).child_keys}
    assert sel("+samples") < sel("*samples") and sel("token_ids+") < sel("token_ids*")
    assert sel("raw_text,dedup_flag") == sel("key:raw_text or key:dedup_flag")
    assert sel("key:*_index") == {k for k in graph.get_all_asset_keys()
                                  if k.to_user_string().endswith("_index")}
    assert sel("*") == set(graph.get_all_asset_keys())
    with pytest.raises(Exception, match="(?i)invalid selection"):  # no commas in one expression
        dg.AssetSelection.from_string("raw_text,dedup_flag").resolve(graph)


def dg_env(tmp_path: Path, instance: str) -> dict[str, str]:
    """The environment of a reader's shell: `make`'s instance (DAGSTER_HOME=.dagster_home with
    the repository's dagster.yaml linked into it, as `make setup` does, here in a temporary
    folder), or a plain shell with no DAGSTER_HOME at all (Dagster then reads ./dagster.yaml and
    keeps a temporary instance under the working directory)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    if instance == "make":
        (tmp_path / "dagster.yaml").symlink_to(ROOT / "dagster.yaml")
        env["DAGSTER_HOME"] = str(tmp_path)
    return env


def run_dg(args: list[str], env: dict[str, str]):
    import subprocess
    import sys

    return subprocess.run([str(Path(sys.executable).parent / "dg"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("instance", ["unset", "make"])
def test_dg_list_defs_runs_from_the_repository_root(tmp_path, instance):
    """`dg list defs` as a reader runs it: the `dg` next to this Python, from the repository
    root, finds the project in pyproject.toml and lists what the selection resolves to, from a
    plain shell as under `make`."""
    import json

    select = "+key:token_ids"
    done = run_dg(["list", "defs", "--json", "--assets", select], dg_env(tmp_path, instance))
    assert done.returncode == 0, done.stderr[-4000:]
    listed = {a["asset_key"] for a in json.loads(done.stdout)["assets"]}
    defs = load_definitions("lance_assets.definitions")
    assert listed == {k.to_user_string() for k in resolve_selection(defs, select)}


def test_dg_check_defs_runs_from_a_plain_shell(tmp_path):
    """`dg check defs` from the repository root with no DAGSTER_HOME: the repository's
    dagster.yaml configures Dagster's temporary instance, so it must not need the variable."""
    done = run_dg(["check", "defs"], dg_env(tmp_path, "unset"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "All definitions loaded successfully" in done.stdout + done.stderr
