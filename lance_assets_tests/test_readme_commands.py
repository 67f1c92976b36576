"""Every ``dagster ...`` command in README.md's fenced blocks names what our definitions hold:
its ``--select`` goes through Dagster's own asset selection parser (the one ``dagster asset
materialize`` uses) against the ``Definitions`` its ``-m`` module loads, and its ``-j`` job
exists. A selection Dagster would reject fails here instead of in a reader's shell."""

import importlib
import importlib.metadata
import re
import shlex
from pathlib import Path

import dagster as dg
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
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


def dagster_commands() -> list[list[str]]:
    blocks = FENCE.findall(README.read_text())
    return [argv for block in blocks for argv in shell_commands(block) if argv[0] == "dagster"]


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
    selects = [option(argv, "--select") for argv in COMMANDS]
    assert len(COMMANDS) >= 5 and sum(s is not None for s in selects) >= 3, COMMANDS


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
    """What it is and the two commands, then the code map (with its asset -> library table),
    then the UI, the CLI and the schedule; troubleshooting, adding a column, hardware and the
    credits are there too. Configuration tables and the table write-up live in docs/."""
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    order = ["Two commands", "Code map", "The web UI", "The command line", "Schedule and sensor"]
    positions = [next((i for i, h in enumerate(headings) if h.startswith(name)), None)
                 for name in order]
    assert None not in positions, f"README lacks one of {order}: it has {headings}"
    assert positions == sorted(positions), f"README sections out of order: {headings}"
    for needed in ("Troubleshooting", "Add a column asset in four steps", "Hardware and disk",
                   "Credits"):
        assert any(h.startswith(needed) for h in headings), f"README lacks '## {needed}'"
    code_map = text.split("## Code map", 1)[1].split("\n## ", 1)[0]
    assert "| asset (group) | library call |" in code_map
    for page in ("docs/configuration.md", "docs/table.md"):
        assert f"]({page})" in text and (README.parent / page).is_file(), page


def test_every_link_in_the_readme_resolves():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert (README.parent / target).exists(), f"README links to missing {target}"


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


@pytest.mark.parametrize("argv", COMMANDS, ids=[command_id(a) for a in COMMANDS])
def test_documented_command_parses_with_the_dagster_cli(argv):
    parse_with_dagster_cli(argv)


def test_an_option_the_subcommand_lacks_is_refused():
    """The check above can fail: `dagster job execute` has no --config-json."""
    import click

    with pytest.raises(click.UsageError, match="config-json"):
        parse_with_dagster_cli(["dagster", "job", "execute", "-m", "lance_assets.definitions",
                                "-j", "ingest", "--config-json", "{}"])
