# Sourced by scripts/bootstrap.sh and scripts/lock.sh: `ensure_uv VENV` prints the path of the uv
# that requirements.lock pins, installed into VENV (created with the system Python when missing).
# uv is itself locked (the `dev` extra), so every machine resolves and installs with one version.

LOCK=${LOCK:-requirements.lock}
PYTHON=${PYTHON:-python3}

# The version `name` is pinned to in the lock (first match: a universal lock may fork by Python).
locked_version() {
  sed -n "s/^$1==\([^ ;]*\).*/\1/p" "$LOCK" | head -n 1
}

ensure_uv() {
  local venv=$1 want
  want=$(locked_version uv)
  if [ -z "$want" ]; then
    echo "[uv] $LOCK pins no uv: restore it from git (git checkout -- $LOCK)" >&2
    return 1
  fi
  if [ ! -x "$venv/bin/python" ]; then
    "$PYTHON" -m venv "$venv"
  fi
  if [ "$("$venv/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$want" ]; then
    echo "[uv] installing uv==$want into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$want" >&2
  fi
  echo "$venv/bin/uv"
}
