#!/usr/bin/env bash
# Separate environments for the peer arms of benchmarks/scale.py: HuggingFace datatrove's MinHash
# pipeline (pulls spacy, orjson and friends) and rensa (a Rust MinHash + LSH library). Each gets
# its own virtualenv so neither touches the project's .venv; scale.py runs them as subprocesses
# and skips an arm whose environment is missing. Idempotent.
#   scripts/peers_venv.sh            # both
#   scripts/peers_venv.sh rensa      # one of them
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DATATROVE_VENV=${DATATROVE_VENV:-.venv-datatrove}
RENSA_VENV=${RENSA_VENV:-.venv-rensa}
DATATROVE_SPEC=${DATATROVE_SPEC:-datatrove[processing]}
RENSA_SPEC=${RENSA_SPEC:-rensa}

make_venv() {  # make_venv DIR PACKAGES...
  local dir=$1; shift
  local stamp="$dir/.installed"
  if [ -f "$stamp" ] && [ "$stamp" -nt scripts/peers_venv.sh ]; then
    return 0
  fi
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade pip
  # shellcheck disable=SC2068
  "$dir/bin/python" -m pip install --quiet $@ numpy pyarrow
  touch "$stamp"
}

want=${1:-all}
if [ "$want" = all ] || [ "$want" = rensa ]; then
  make_venv "$RENSA_VENV" "$RENSA_SPEC"
fi
if [ "$want" = all ] || [ "$want" = datatrove ]; then
  make_venv "$DATATROVE_VENV" "$DATATROVE_SPEC" spacy orjson
fi
