#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv, and install Chromium (for the
# browser test) when it is missing and we are root.
# Idempotent: does nothing when .venv is newer than pyproject.toml and Chromium is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# A CPU build of PyTorch by default; override for GPUs, e.g.
#   TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

# Debian's Chromium for the browser smoke test (lance_assets_tests/test_browser.py; Playwright's
# own browser download is not used). Checked on every run: a PATH lookup when it is there.
ensure_chromium() {
  if [ -n "${LANCE_ASSETS_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1 \
      || command -v chromium-browser >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[bootstrap] installing Chromium (apt-get install chromium)" >&2
    export DEBIAN_FRONTEND=noninteractive
    # `apt-get update` only when the install fails, e.g. for want of package lists.
    if apt-get install -y -q chromium >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; then
      return 0
    fi
    echo "[bootstrap] could not install Chromium: the browser test will fail; see apt-get's error above" >&2
  else
    echo "[bootstrap] Chromium not found: the browser test will be skipped. Install it with" \
         "'sudo apt-get install chromium', or set LANCE_ASSETS_CHROMIUM=/path/to/chromium" >&2
  fi
}
ensure_chromium

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
