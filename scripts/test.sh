#!/usr/bin/env bash
# Sets up .venv if needed (scripts/setup.sh), then runs the test suite.
# Arguments go to pytest, e.g. `bash scripts/test.sh tests/core/plugins -x`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
