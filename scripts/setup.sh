#!/usr/bin/env bash
# Creates .venv (if missing) and installs every distribution of the repo in editable mode.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt)
stamp=.venv/.mstar-setup-stamp
# Re-install only when a pyproject or the constraints changed since the last set-up.
if [ ! -f "$stamp" ] || [ -n "$(find . -path ./.venv -prune -o \( -name pyproject.toml -o -name constraints.txt \) -newer "$stamp" -print | head -n1)" ]; then
  "${pip[@]}" "torch==2.13.0"
  # The [ray] extra: the Ray placement tests (tests/e2e/test_ray_placement.py) run too.
  dists=(-e "./mstar-core[ray]")
  for d in mstar-models-*/ examples/mstar-models-*/; do
    [ -f "$d/pyproject.toml" ] && dists+=(-e "./$d")
  done
  "${pip[@]}" "${dists[@]}" -e ".[dev]"
  touch "$stamp"
fi
