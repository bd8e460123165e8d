#!/usr/bin/env bash
# Regenerates tests/vjepa2/fixtures/ from upstream facebookresearch/vjepa2 and transformers'
# VJEPA2VideoProcessor. Both run in a throw-away venv (REF_VENV): the project's venv pins a
# CPU torch with which the registry's torchvision cannot load; there a CUDA torch build
# (which runs on the CPU) and its matching torchvision are installed instead.
# Usage (repo root): UPSTREAM=/path/to/vjepa2-checkout bash mstar-models-vjepa2/tools/make_fixtures.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
ref="${REF_VENV:-/tmp/vjepa2-ref}"
: "${UPSTREAM:?set UPSTREAM to a checkout of github.com/facebookresearch/vjepa2 (tested at c2963a4)}"
if [ ! -x "$ref/bin/python" ] || ! "$ref/bin/python" -c "import timm, torchvision, transformers, av, scipy" 2>/dev/null; then
  python3 -m venv "$ref"
  "$ref/bin/pip" install --quiet torch==2.14.1 torchvision==0.29.1 timm transformers==5.24.0 av numpy \
    safetensors scipy tqdm
fi
"$ref/bin/python" mstar-models-vjepa2/tools/make_fixtures.py --upstream "$UPSTREAM" --out tests/vjepa2/fixtures "$@"
