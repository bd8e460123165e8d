#!/usr/bin/env bash
# Sets up .venv if needed (scripts/setup.sh), then runs the main job.
# Until the server lands the main job lists the installed model plugins.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/mstar models "$@"
