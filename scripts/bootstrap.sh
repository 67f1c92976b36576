#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv with exactly the versions of
# requirements.lock (installed by uv), and install Chromium (for the browser test) when it is
# missing and we are root.
# Idempotent: does nothing when .venv is newer than pyproject.toml and requirements.lock and
# Chromium is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LOCK=requirements.lock
# Where the locked torch version comes from: PyTorch's CPU index by default (a CPU-only build, no
# CUDA libraries). For GPUs, the CUDA index that matches the driver, e.g.
#   TORCH_INDEX=https://download.pytorch.org/whl/cu128 make setup
# (https://pypi.org/simple gives PyPI's default Linux build, CUDA included).
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

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
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt "$LOCK" ]; then
  exit 0
fi
# shellcheck source=scripts/uv.sh
source scripts/uv.sh
UV=$(ensure_uv "$VENV")
PY="$VENV/bin/python"
torch_version=$(locked_version torch)
echo "[bootstrap] installing $LOCK into $VENV (torch $torch_version from $TORCH_INDEX)" >&2

# torch first, from its own index: the lock's `torch==X` is then satisfied by this build (PyPI
# would give the CUDA build on Linux). The index's last path part names the build (cpu, cu128,
# rocm6.4, ...); a local wheelhouse that pip is pointed at (PIP_FIND_LINKS, or UV_FIND_LINKS)
# and already holds that build is used instead of downloading it.
install_torch() {
  local variant=${TORCH_INDEX%/} dir
  variant=${variant##*/}
  for dir in ${UV_FIND_LINKS:-} ${PIP_FIND_LINKS:-}; do
    if [ -d "$dir" ] && compgen -G "$dir/torch-$torch_version+$variant-*.whl" >/dev/null; then
      "$UV" pip install --quiet --compile-bytecode --python "$PY" --find-links "$dir" "torch==$torch_version+$variant"
      return
    fi
  done
  "$UV" pip install --quiet --compile-bytecode --python "$PY" --index-url "$TORCH_INDEX" "torch==$torch_version"
}
install_torch
# Bytecode compiled here, on every core, as pip does: otherwise each package is compiled on its
# first import, one process at a time (the test suite's first subprocesses pay minutes for it).
"$UV" pip install --quiet --compile-bytecode --python "$PY" -r "$LOCK"
"$UV" pip install --quiet --python "$PY" --no-deps -e .
# Every requirement of every installed package is met by what the lock installed: a dependency
# added to pyproject.toml without `make lock` fails here, not at import time.
if ! "$UV" pip check --quiet --python "$PY"; then
  echo "[bootstrap] the installed packages do not fit together (above): if pyproject.toml" \
       "changed, run 'make lock' to update $LOCK" >&2
  exit 1
fi
# The embeddings' CPU backend: all-MiniLM-L6-v2 exported to ONNX (float32 and int8) from the
# weights installed above, once, into the venv (lance_assets/embeddings/onnx_backend.py).
"$PY" -m lance_assets.embeddings.onnx_backend >&2
touch "$stamp"
echo "[bootstrap] ready: $VENV" >&2
