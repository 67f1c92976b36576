#!/usr/bin/env bash
# A separate environment for the MosaicML MDS arm of the loader benchmark: mosaicml-streaming
# pins numpy<2.2 and pulls vision/cloud extras, so it stays out of the main .venv.
# Idempotent; used by `make bench-loaders`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MDS_VENV:-.venv-mds}
PYTHON=${PYTHON:-python3}
# streaming imports torchvision at import time; PyPI's torchvision needs the matching PyPI torch
# (on x86_64 a CUDA build that also runs on the CPU). The loader benchmark runs *every* arm in
# this environment, so all arms share one torch.
MDS_TORCH_SPEC=${MDS_TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}
stamp="$VENV/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt scripts/mds_venv.sh ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install --quiet $MDS_TORCH_SPEC "numpy<2.2"
# The writer and StreamingDataset need only these of its dependencies (no cloud SDKs).
"$VENV/bin/python" -m pip install --quiet --no-deps "mosaicml-streaming==0.13.0"
"$VENV/bin/python" -m pip install --quiet "numpy<2.2" xxhash zstd python-snappy Brotli tqdm \
  catalogue "boto3<2" "paramiko<4" "transformers<5" pillow
# The trainer itself (lancedb etc.) without re-resolving torch or numpy.
"$VENV/bin/python" -m pip install --quiet "numpy<2.2" lancedb pylance pyarrow dagster-pipes
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
touch "$stamp"
