#!/usr/bin/env bash
# Resolve pyproject.toml (the project and its `dev` extra) into requirements.lock with uv: one
# exact version of every package, for every platform and Python >= 3.10 (`--universal`).
#
#   scripts/lock.sh            (make lock)         re-resolve after editing pyproject.toml; pins
#                                                  that still fit are kept
#   scripts/lock.sh --upgrade  (make lock-upgrade) the newest versions pyproject.toml allows
#   scripts/lock.sh --check    (make lock-check)   exit 1 when requirements.lock is not what
#                                                  pyproject.toml resolves to; exit 2 when it
#                                                  cannot be resolved (no network, no cache)
#
# torch stays at the locked version (TORCH_VERSION=2.14.1 scripts/lock.sh --upgrade moves it):
# its wheel comes from PyTorch's own index (scripts/bootstrap.sh), which holds the CPU and CUDA
# builds of each version. The CUDA libraries that PyPI's Linux torch pulls in (nvidia-*, cuda-*,
# triton) are left out of the lock: the CPU build does not need them, and a CUDA build brings
# its own from PyTorch's index.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LOCK=requirements.lock
# shellcheck source=scripts/uv.sh
source scripts/uv.sh
UV=${UV:-$(ensure_uv "$VENV")}

mode=${1:-}
case "$mode" in
  ""|--upgrade|--check) ;;
  *) echo "usage: $0 [--upgrade|--check]" >&2; exit 64 ;;
esac

TORCH_VERSION=${TORCH_VERSION:-$(locked_version torch)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# compile PREFERRED OUT [uv options...]: OUT starts as a copy of PREFERRED (a lock), whose pins
# uv keeps wherever they still fit.
compile() {
  local preferred=$1 out=$2
  shift 2
  if [ -f "$preferred" ]; then cp "$preferred" "$out"; else rm -f "$out"; fi
  "$UV" pip compile pyproject.toml --extra dev --universal --python-version 3.10 \
    --custom-compile-command "make lock" --quiet --output-file "$out" "$@"
}

# resolve PREFERRED OUT [uv options...]: the CUDA packages of PyPI's torch are found by a first
# pass and excluded from the second, so the lock names exactly what a CPU install needs.
resolve() {
  local preferred=$1 out=$2
  shift 2
  compile "$preferred" "$work/with-cuda.txt" "$@"
  { grep -oE '^(nvidia-[A-Za-z0-9_.-]+|cuda-[A-Za-z0-9_.-]+|triton)==' "$work/with-cuda.txt" || true; } \
    | sed 's/==$//' | sort -u > "$work/cuda-excludes.txt"
  compile "$preferred" "$out" --excludes "$work/cuda-excludes.txt" "$@"
}

if [ "$mode" = "--check" ]; then
  # uv's cache first (it holds the locked versions' metadata once a setup ran), then the index:
  # the pins are preferred either way, so both give the same answer.
  if ! resolve "$LOCK" "$work/fresh.txt" --offline 2> "$work/err.txt" \
      && ! resolve "$LOCK" "$work/fresh.txt" 2> "$work/err.txt"; then
    cat "$work/err.txt" >&2
    echo "[lock] could not resolve pyproject.toml (see above); $LOCK was not checked" >&2
    exit 2
  fi
  if ! diff -u "$LOCK" "$work/fresh.txt"; then
    echo "[lock] $LOCK does not match pyproject.toml: run 'make lock' and commit $LOCK" >&2
    exit 1
  fi
  echo "[lock] $LOCK matches pyproject.toml" >&2
  exit 0
fi

preferred=$LOCK
if [ "$mode" = "--upgrade" ]; then
  # everything to the newest allowed version but torch, held at TORCH_VERSION
  echo "torch==$TORCH_VERSION" > "$work/torch.txt"
  resolve /dev/null "$work/upgraded.txt" --upgrade --constraints "$work/torch.txt"
  preferred=$work/upgraded.txt
fi
# The lock is always written by this one command, so --check reproduces it byte for byte.
resolve "$preferred" "$work/fresh.txt"
mv "$work/fresh.txt" "$LOCK"
echo "[lock] wrote $LOCK ($(grep -cE '^[A-Za-z0-9]' "$LOCK") pins, torch==$(locked_version torch));" \
     "next: make test" >&2
