"""Setup time on a fresh clone: `make setup` at a baseline commit (pip, before the lock) against
`make setup` at this commit (uv, from requirements.lock), one after the other in this run.

    python -m benchmarks.setup_time [--baseline REF] [--workdir /tmp/setup-bench] [--cold-uv-cache]

Each setup runs on its own fresh `git clone` of this repository (committed state only), with
`time make setup`'s wall clock measured here. `--cold-uv-cache` gives the uv setup an empty cache
(what a machine that never ran uv sees); otherwise uv's usual cache is used, as pip's is for the
baseline. Chromium is whatever the machine has (installed: a PATH lookup for both). Prints both
times and their ratio; the clones and their .venv are removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = "ab4a787"  # the last commit that installed with pip, before requirements.lock


def timed_setup(ref: str, folder: Path, env: dict[str, str]) -> float:
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(folder)], check=True)
    subprocess.run(["git", "checkout", "--quiet", ref], cwd=folder, check=True)
    start = time.perf_counter()
    done = subprocess.run(["make", "setup"], cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"`make setup` at {ref} failed:\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="commit installed with pip")
    parser.add_argument("--workdir", default=None, help="where the clones go (default: a temp dir)")
    parser.add_argument("--cold-uv-cache", action="store_true",
                        help="give the uv setup an empty cache")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="setup-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()};"
          f" load average before: {os.getloadavg()[0]:.2f}")
    try:
        pip_s = timed_setup(args.baseline, work / "baseline", env)
        shutil.rmtree(work / "baseline")
        uv_env = dict(env)
        if args.cold_uv_cache:
            uv_env["UV_CACHE_DIR"] = str(work / "uv-cache")
        uv_s = timed_setup(head, work / "locked", uv_env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cache = "empty uv cache" if args.cold_uv_cache else "uv's cache as it was"
    print(f"make setup at {args.baseline} (pip):            {pip_s:7.1f} s")
    print(f"make setup at {head} (uv, lock, {cache}): {uv_s:7.1f} s")
    print(f"ratio uv / pip: {uv_s / pip_s:.2f}x ({pip_s / uv_s:.1f}x faster)")


if __name__ == "__main__":
    main()
