"""requirements.lock and pyproject.toml agree: every requirement of the project (and of its
``dev`` extra, what ``make setup`` installs) is pinned in the lock to a version it allows, the
lock holds no CUDA library (the CPU build of torch needs none), and ``scripts/lock.sh --check``
(what ``make lock-check`` runs) passes on the committed files and fails once pyproject.toml
asks for something the lock was not resolved with.

The re-resolution uses uv's cache first and the package index second; with neither (offline on
a machine that never ran a setup) it cannot say anything and the test is skipped, saying so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")
CUDA_PACKAGE = re.compile(r"^(nvidia-|cuda-|triton$)")


def locked_pins(text: str) -> dict[str, list[Version]]:
    """name -> the versions the lock pins it to (several when the universal lock forks)."""
    pins: dict[str, list[Version]] = {}
    for line in text.splitlines():
        if m := PIN.match(line):
            pins.setdefault(canonicalize_name(m.group(1)), []).append(Version(m.group(2)))
    return pins


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"],
                                     *project["optional-dependencies"]["dev"]]]


def test_every_requirement_is_pinned_to_a_version_pyproject_allows():
    pins = locked_pins(LOCK.read_text())
    problems = []
    for req in project_requirements():
        versions = pins.get(canonicalize_name(req.name))
        if not versions:
            problems.append(f"{req} is not in the lock")
        elif not all(req.specifier.contains(v, prereleases=True) for v in versions):
            problems.append(f"{req}: the lock pins {[str(v) for v in versions]}")
    assert not problems, "requirements.lock does not match pyproject.toml (run `make lock`): " \
        + "; ".join(problems)


def test_lock_pins_torch_once_and_no_cuda_library():
    pins = locked_pins(LOCK.read_text())
    assert len(pins["torch"]) == 1 and not pins["torch"][0].local  # the build comes from TORCH_INDEX
    assert "uv" in pins  # the bootstrap installs this uv before anything else
    assert not [name for name in pins if CUDA_PACKAGE.match(name)]


def find_uv() -> str:
    uv = Path(sys.executable).with_name("uv")
    found = str(uv) if uv.exists() else shutil.which("uv")
    if not found:
        pytest.fail("uv is not installed: `make setup` installs the version requirements.lock pins")
    return found


def lock_check(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/lock.sh", "--check"], cwd=folder, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "UV": find_uv()})


@pytest.fixture
def project_copy(tmp_path):
    """What scripts/lock.sh reads, copied, so the test can edit pyproject.toml."""
    for name in ("pyproject.toml", "requirements.lock", "README.md", "scripts/lock.sh",
                 "scripts/uv.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def checked(folder: Path) -> subprocess.CompletedProcess:
    done = lock_check(folder)
    if done.returncode == 2:
        pytest.skip("the lock could not be re-resolved here (no package index and no uv cache):\n"
                    + done.stderr[-2000:])
    return done


def test_lock_check_passes_on_the_committed_lock_and_fails_after_a_pyproject_edit(project_copy):
    done = checked(project_copy)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    # a new direct requirement (already in the lock as a dependency of dagster, so uv's cache
    # holds it and this works offline too)
    pyproject = project_copy / "pyproject.toml"
    text = pyproject.read_text()
    assert '    "tqdm>=4.66",\n' in text
    pyproject.write_text(text.replace('    "tqdm>=4.66",\n', '    "tqdm>=4.66",\n    "rich>=13",\n'))
    done = checked(project_copy)
    assert done.returncode == 1
    assert "does not match pyproject.toml: run 'make lock'" in done.stderr
    assert "+    #   lance-assets (pyproject.toml)" in done.stdout  # rich is now a direct requirement
