#!/usr/bin/env bash
# Sets up .venv if needed (scripts/setup.sh), then runs the main job.
# The main job serves the example toy model on random weights (output is noise).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/mstar serve --model toy --random-weights "$@"
