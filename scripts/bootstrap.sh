#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv.
# Idempotent: does nothing when .venv is newer than pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# A CPU build of PyTorch by default; override for GPUs, e.g.
#   TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
stamp="$VENV/.lance_assets-installed"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
echo "[bootstrap] creating $VENV (torch: $TORCH_SPEC)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch first, so the project's 'torch>=2.4' is already satisfied by this build.
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install --quiet $TORCH_SPEC
"$VENV/bin/python" -m pip install --quiet -e '.[dev]'
touch "$stamp"
echo "[bootstrap] ready: $VENV" >&2
